#include "net/envelope.h"

#include <algorithm>

namespace cohort::net {

int64_t MaxFrameBytes(size_t max_header_bytes) {
  return static_cast<int64_t>(std::max(max_header_bytes, kPayloadChunkBytes) + kFrameSlackBytes);
}

std::string BodyName(const wire::Header& header) {
  const auto* field = header.GetDescriptor()->FindFieldByNumber(header.body_case());
  return field != nullptr ? field->name() : "unknown";
}

}  // namespace cohort::net
