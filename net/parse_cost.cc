#include "net/parse_cost.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/message.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

namespace cohort::net {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// The chunk glibc's malloc hands out for `bytes`: 8 bytes of header,
// rounded up to 16, at least 32.
constexpr uint64_t Chunk(uint64_t bytes) {
  return std::max<uint64_t>(32, (bytes + 8 + 15) & ~uint64_t{15});
}

// A repeated field's first array (its header and first capacity), charged
// once per field with room to spare, then twice the element size per
// element (the array doubles as it grows).
constexpr uint64_t kRepeatedHeader = 96;
// A std::string allocated on its own (an element of a repeated string field,
// a set singular string, an unknown length-delimited field's value).
constexpr uint64_t kStringObject = Chunk(sizeof(std::string));
// An unknown field's entry in its UnknownFieldSet's vector, doubled.
constexpr uint64_t kUnknownEntry = 2 * 16;
// The first unknown field of a message allocates the set that holds them.
constexpr uint64_t kUnknownSet = 64;
// Protobuf's default recursion limit.
constexpr int kMaxDepth = 100;

// A string's heap buffer beyond its small-string buffer: libstdc++ grows a
// string to at least twice the 15 bytes it holds in place.
uint64_t StringContents(uint64_t len) {
  return len <= 15 ? 0 : Chunk(std::max<uint64_t>(len, 30) + 1);
}

uint64_t ScalarBytes(const FieldDescriptor& field) {
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT64:
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return 8;
    case FieldDescriptor::CPPTYPE_BOOL:
      return 1;
    default:
      return 4;
  }
}

class Walker {
 public:
  explicit Walker(uint64_t limit) : limit_(limit) {}

  uint64_t cost() const { return cost_; }

  // The message's own heap object, then its fields.
  Status Message(const Descriptor& type, const uint8_t* data, size_t size, int depth) {
    if (depth > kMaxDepth) {
      return InvalidArgumentError("messages nested deeper than " + std::to_string(kMaxDepth));
    }
    cost_ += ObjectBytes(type);
    CodedInputStream in(data, static_cast<int>(size));
    in.PushLimit(static_cast<int>(size));
    std::vector<int> repeated_seen;
    bool unknown_seen = false;
    while (cost_ <= limit_) {
      const uint32_t tag = in.ReadTagNoLastTag();
      if (tag == 0) break;
      const FieldDescriptor* field = type.FindFieldByNumber(WireFormatLite::GetTagFieldNumber(tag));
      const auto wire_type = WireFormatLite::GetTagWireType(tag);
      if (wire_type == WireFormatLite::WIRETYPE_START_GROUP ||
          wire_type == WireFormatLite::WIRETYPE_END_GROUP) {
        return InvalidArgumentError("a group (field " +
                                    std::to_string(WireFormatLite::GetTagFieldNumber(tag)) +
                                    " of " + type.name() + "), which this protocol never sends");
      }
      if (field != nullptr && field->is_repeated() &&
          std::find(repeated_seen.begin(), repeated_seen.end(), field->number()) ==
              repeated_seen.end()) {
        repeated_seen.push_back(field->number());
        cost_ += kRepeatedHeader;
      }
      Status s = Field(type, field, wire_type, in, data, depth, unknown_seen);
      if (!s.ok()) return s;
    }
    if (cost_ <= limit_ && !in.ConsumedEntireMessage()) {
      return InvalidArgumentError("a bad tag (read up to byte " +
                                  std::to_string(in.CurrentPosition()) + " of " + type.name() +
                                  ")");
    }
    return OkStatus();
  }

 private:
  Status Field(const Descriptor& type, const FieldDescriptor* field,
               WireFormatLite::WireType wire_type, CodedInputStream& in, const uint8_t* data,
               int depth, bool& unknown_seen) {
    const bool delimited = wire_type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    uint32_t len = 0;
    if (delimited &&
        (!in.ReadVarint32(&len) || len > static_cast<uint32_t>(in.BytesUntilLimit()))) {
      return InvalidArgumentError("a length past the end of " + type.name());
    }
    const uint8_t* value = data + in.CurrentPosition();
    if (delimited) {
      in.Skip(static_cast<int>(len));
    } else if (!SkipScalar(wire_type, in)) {
      return InvalidArgumentError("a field value cut short in " + type.name());
    }
    if (field == nullptr || !Matches(*field, wire_type)) {
      Unknown(1, unknown_seen);
      if (delimited) cost_ += kStringObject + StringContents(len);
      return OkStatus();
    }
    const uint64_t slot = field->is_repeated() ? 2 * sizeof(void*) : 0;
    switch (field->type()) {
      case FieldDescriptor::TYPE_MESSAGE:
        cost_ += slot;
        return Message(*field->message_type(), value, len, depth + 1);
      case FieldDescriptor::TYPE_STRING:
      case FieldDescriptor::TYPE_BYTES:
        cost_ += slot + kStringObject + StringContents(len);
        return OkStatus();
      default:
        break;
    }
    const uint64_t count = delimited ? PackedCount(*field, value, len) : 1;
    // A closed (proto2) enum keeps a value it does not name as an unknown
    // field, singular or not.
    if (field->type() == FieldDescriptor::TYPE_ENUM) Unknown(count, unknown_seen);
    if (field->is_repeated()) cost_ += 2 * ScalarBytes(*field) * count;
    return OkStatus();
  }

  void Unknown(uint64_t count, bool& unknown_seen) {
    cost_ += count * kUnknownEntry + (unknown_seen ? 0 : kUnknownSet);
    unknown_seen = true;
  }

  // Whether the parser takes this wire type for the field (else it keeps
  // the value as an unknown field): its own, or packed for a repeated
  // scalar.
  static bool Matches(const FieldDescriptor& field, WireFormatLite::WireType wire_type) {
    const auto own =
        WireFormatLite::WireTypeForFieldType(static_cast<WireFormatLite::FieldType>(field.type()));
    if (wire_type == own) return true;
    return wire_type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED && field.is_repeated() &&
           own != WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
  }

  static bool SkipScalar(WireFormatLite::WireType wire_type, CodedInputStream& in) {
    uint64_t v64 = 0;
    uint32_t v32 = 0;
    switch (wire_type) {
      case WireFormatLite::WIRETYPE_VARINT:
        return in.ReadVarint64(&v64);
      case WireFormatLite::WIRETYPE_FIXED64:
        return in.ReadLittleEndian64(&v64);
      case WireFormatLite::WIRETYPE_FIXED32:
        return in.ReadLittleEndian32(&v32);
      default:
        return false;
    }
  }

  // The elements a packed run of `len` bytes can hold: one per varint (a
  // byte without the continuation bit ends one), or len / width.
  static uint64_t PackedCount(const FieldDescriptor& field, const uint8_t* value, uint32_t len) {
    switch (WireFormatLite::WireTypeForFieldType(
        static_cast<WireFormatLite::FieldType>(field.type()))) {
      case WireFormatLite::WIRETYPE_FIXED32:
        return len / 4 + 1;
      case WireFormatLite::WIRETYPE_FIXED64:
        return len / 8 + 1;
      default:
        return std::count_if(value, value + len, [](uint8_t b) { return b < 0x80; }) + 1;
    }
  }

  // The heap chunk of a message type's object, as its default instance
  // reports its size.
  uint64_t ObjectBytes(const Descriptor& type) {
    for (const auto& [t, bytes] : objects_) {
      if (t == &type) return bytes;
    }
    const google::protobuf::Message* prototype =
        google::protobuf::MessageFactory::generated_factory()->GetPrototype(&type);
    const uint64_t bytes = Chunk(prototype != nullptr ? prototype->SpaceUsedLong() : 256);
    objects_.emplace_back(&type, bytes);
    return bytes;
  }

  uint64_t limit_;
  uint64_t cost_ = 0;
  std::vector<std::pair<const Descriptor*, uint64_t>> objects_;
};

}  // namespace

StatusOr<uint64_t> ParseCost(const Descriptor& type, std::string_view wire, uint64_t limit) {
  if (wire.size() > static_cast<size_t>(INT_MAX)) {
    return InvalidArgumentError("a message of " + std::to_string(wire.size()) +
                                " bytes, more than protobuf parses");
  }
  Walker walker(limit);
  Status s = walker.Message(type, reinterpret_cast<const uint8_t*>(wire.data()), wire.size(), 0);
  if (!s.ok()) return s;
  return walker.cost();
}

}  // namespace cohort::net
