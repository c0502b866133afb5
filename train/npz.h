// NumPy's .npy and .npz formats, read (not written) for a model's initial
// values: `cohort coordinator --initial-model FILE` of a model the clients
// bring (model.external), as cohort.torch.save_initial or numpy.savez writes
// it. The archive is libzip's to open (stored or deflated entries); the .npy
// header (magic, version, a Python dict literal of descr, fortran_order and
// shape) is parsed here, since no Debian library reads it from C++.
//
// The file is untrusted: every size is checked against the caps before a
// byte is read into memory, and every error names the file and the entry.
#ifndef COHORT_TRAIN_NPZ_H_
#define COHORT_TRAIN_NPZ_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "proto/config.pb.h"

namespace cohort::train {

// One array of an .npz, its values as float32.
struct NpyArray {
  std::string name;             // The entry's name without ".npy".
  std::string dtype;            // As in the header: "<f4", "<i8", "|b1", ...
  std::vector<uint64_t> shape;  // Empty for a 0-d array (one value).
  bool floating = false;        // dtype f2/f4/f8: a tensor that trains.
  std::vector<float> values;    // Row-major (C order) values, as float32.
};

// One .npy file's bytes. Little-endian (or byte-sized) bool, int8-64,
// uint8-64, float16/32/64; C order only. `max_values` caps the elements.
StatusOr<NpyArray> ParseNpy(std::string_view name, std::string_view bytes, uint64_t max_values);

// Every array of the .npz at `path`, in archive order (np.savez keeps the
// order of its keyword arguments). At most `max_values` elements in all.
StatusOr<std::vector<NpyArray>> ReadNpz(const std::string& path, uint64_t max_values);

// An external model's initial flat vector from the .npz at `path`.
//   - With a layout: the arrays named by its tensors, in its order, each of
//     its shape (other arrays are ignored).
//   - Without: every floating-point array in archive order (integer and bool
//     arrays, e.g. BatchNorm's num_batches_tracked, do not train and are
//     left out, as cohort.torch.get_flat leaves them out).
// Its length must be model.num_params(), and every value finite. Errors
// name the file, the array and both sizes.
StatusOr<std::vector<float>> LoadInitialModel(const std::string& path,
                                              const config::ExternalModel& model);

}  // namespace cohort::train

#endif  // COHORT_TRAIN_NPZ_H_
