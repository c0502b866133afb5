// The run configuration: config::ParseRunConfig (text format, or JSON when
// the input starts with '{') and ValidateRunConfig.
//
// Input: the configuration text. Checks that an error names the source,
// and that an accepted configuration is valid and survives ToText and a
// second parse unchanged (the coordinator stores ToText in its run database
// and parses it again on resume).
#include <string>
#include <string_view>

#include "proto/config_io.h"
#include "tests/fuzz/fuzz_input.h"

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
  const std::string rendered = cohort::config::ToText(*config);
  auto again = ParseRunConfig(rendered, "rendered");
  FUZZ_CHECK(again.ok(), "ToText of an accepted config must parse again: " +
                             again.status().ToString() + "\n" + rendered);
  FUZZ_CHECK(cohort::config::ToText(*again) == rendered, "config changed in the round trip");
  return 0;
}
