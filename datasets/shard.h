// Shard files: one client's private data, written by `cohort partition`.
//
// Layout (all integers little-endian):
//   offset  size  field
//        0     8  magic "COHSHARD"
//        8     4  version (1)
//       12     4  feature encoding: 0 = float32, 1 = uint8 (value / 255)
//       16     8  num_samples
//       24     4  num_features
//       28     4  num_classes
//       32     4  CRC-32 of the label section
//       36     4  CRC-32 of the feature section
//       40     4  CRC-32 of bytes 0..39
//       44     4  reserved (0)
//       48        labels: num_samples x int32
//                 features: num_samples x num_features x (4 or 1 bytes)
// The file size must match the header exactly.
#ifndef COHORT_DATASETS_SHARD_H_
#define COHORT_DATASETS_SHARD_H_

#include <string>

#include "common/status.h"
#include "datasets/dataset.h"

namespace cohort::datasets {

enum class FeatureEncoding : uint32_t { kFloat32 = 0, kUint8 = 1 };

inline constexpr size_t kShardHeaderBytes = 48;

// kUint8 requires every feature to be k/255 for an integer k in [0, 255]
// (as IDX pixels are); kInvalidArgument otherwise. Writes atomically
// (temporary file + rename).
Status WriteShard(const Dataset& data, const std::string& path,
                  FeatureEncoding encoding = FeatureEncoding::kFloat32);

// Every header field, size and checksum is verified; the error names the file
// and what is wrong with it.
StatusOr<Dataset> ReadShard(const std::string& path);

}  // namespace cohort::datasets

#endif  // COHORT_DATASETS_SHARD_H_
