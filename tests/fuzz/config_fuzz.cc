// The run configuration: config::ParseRunConfig (text format, or JSON when
// the input starts with '{') and ValidateRunConfig.
//
// Input: the configuration text. Checks that an error names the source,
// and that an accepted configuration is valid and survives ToText and a
// second parse unchanged (the coordinator stores ToText in its run database
// and parses it again on resume).
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/unknown_field_set.h>

#include <string>
#include <string_view>
#include <vector>

#include "proto/config_io.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

// True when `m` or a message below it holds fields the schema does not know.
bool HasUnknownFields(const google::protobuf::Message& m) {
  const google::protobuf::Reflection* reflection = m.GetReflection();
  if (!reflection->GetUnknownFields(m).empty()) return true;
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(m, &fields);
  for (const auto* field : fields) {
    if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (field->is_repeated()) {
      for (int i = 0; i < reflection->FieldSize(m, field); ++i) {
        if (HasUnknownFields(reflection->GetRepeatedMessage(m, field, i))) return true;
      }
    } else if (HasUnknownFields(reflection->GetMessage(m, field))) {
      return true;
    }
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using cohort::config::ParseRunConfig;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = ParseRunConfig(text, "fuzz.textproto");
  if (!config.ok()) {
    FUZZ_CHECK(config.status().message().find("fuzz.textproto") != std::string::npos,
               "the error must name the source: " + config.status().ToString());
    return 0;
  }
  FUZZ_CHECK(cohort::config::ValidateRunConfig(*config).ok(), "accepted but not valid");
  FUZZ_CHECK(!HasUnknownFields(*config), "accepted a field the schema does not know");
  const std::string rendered = cohort::config::ToText(*config);
  auto again = ParseRunConfig(rendered, "rendered");
  FUZZ_CHECK(again.ok(), "ToText of an accepted config must parse again: " +
                             again.status().ToString() + "\n" + rendered);
  FUZZ_CHECK(cohort::config::ToText(*again) == rendered, "config changed in the round trip");
  return 0;
}
