// What parsing an untrusted protobuf would cost in memory, found by walking
// its wire format before anything is allocated. A parsed message can be far
// larger than its bytes: an empty entry of a repeated message field is 2
// bytes on the wire and a heap object of a hundred or more once parsed, so a
// 64 MiB header of them takes over 3 GiB. DecodeEnvelope refuses a header
// whose cost is out of proportion to the header limit, before it parses.
//
// Protobuf has no such estimate (its SpaceUsedLong needs the parsed message),
// so this walks the tags with CodedInputStream against the type's descriptor.
#ifndef COHORT_NET_PARSE_COST_H_
#define COHORT_NET_PARSE_COST_H_

#include <google/protobuf/descriptor.h>

#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace cohort::net {

// An upper bound on the heap bytes that parsing `wire` as `type` takes with
// the C++ runtime (objects, repeated-field arrays at twice their length,
// strings, unknown fields, and each allocation's malloc overhead): at least
// the parsed message's SpaceUsedLong(). kInvalidArgument where the bytes
// are not a well-formed message (bad tag or length, groups, nesting deeper
// than protobuf's limit of 100), naming what was wrong.
//
// The walk stops once the cost passes `limit` and returns what it reached,
// so refusing a hostile message takes no longer than accepting a fair one.
// Map fields are charged as repeated messages, which may not bound them (the
// wire protocol has none).
StatusOr<uint64_t> ParseCost(const google::protobuf::Descriptor& type, std::string_view wire,
                             uint64_t limit);

}  // namespace cohort::net

#endif  // COHORT_NET_PARSE_COST_H_
