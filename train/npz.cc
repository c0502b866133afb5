#include "train/npz.h"

#include <fmt/format.h>
#include <zip.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "common/half.h"

namespace cohort::train {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr size_t kMaxHeaderBytes = 1 << 16;

// The value of `key` in the header's dict literal, e.g. "'<f4'" or "(2, 3)".
StatusOr<std::string> HeaderValue(std::string_view header, std::string_view key) {
  const std::string quoted = "'" + std::string(key) + "'";
  size_t at = header.find(quoted);
  if (at == std::string_view::npos) return InvalidArgumentError("header has no " + quoted);
  at = header.find(':', at + quoted.size());
  if (at == std::string_view::npos)
    return InvalidArgumentError("header's " + quoted + " has no value");
  size_t begin = header.find_first_not_of(' ', at + 1);
  if (begin == std::string_view::npos)
    return InvalidArgumentError("header's " + quoted + " has no value");
  size_t end;
  if (header[begin] == '(') {
    end = header.find(')', begin);
    if (end == std::string_view::npos) return InvalidArgumentError("header's shape is not closed");
    ++end;
  } else if (header[begin] == '\'') {
    end = header.find('\'', begin + 1);
    if (end == std::string_view::npos)
      return InvalidArgumentError("header's " + quoted + " is not closed");
    ++end;
  } else {
    end = header.find_first_of(",}", begin);
    if (end == std::string_view::npos) end = header.size();
  }
  return std::string(header.substr(begin, end - begin));
}

// "(2, 3)", "(5,)" or "()".
StatusOr<std::vector<uint64_t>> ParseShape(std::string_view text, uint64_t max_values) {
  std::vector<uint64_t> shape;
  uint64_t count = 1;
  std::string_view rest = text.substr(1, text.size() - 2);
  while (true) {
    const size_t first = rest.find_first_not_of(" ,");
    if (first == std::string_view::npos) break;
    rest.remove_prefix(first);
    uint64_t dim = 0;
    size_t digits = 0;
    while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') {
      dim = dim * 10 + static_cast<uint64_t>(rest[digits] - '0');
      if (++digits > 12)
        return InvalidArgumentError("shape " + std::string(text) + " is too large");
    }
    if (digits == 0)
      return InvalidArgumentError("shape " + std::string(text) + " is not a tuple of sizes");
    rest.remove_prefix(digits);
    shape.push_back(dim);
    count *= dim;
    if (shape.size() > 32 || count > max_values) {
      return InvalidArgumentError("shape " + std::string(text) + " holds more than " +
                                  std::to_string(max_values) + " values");
    }
  }
  return shape;
}

struct Dtype {
  char kind;  // 'f', 'i', 'u', 'b'.
  size_t bytes;
};

StatusOr<Dtype> ParseDtype(std::string_view descr) {
  // '<f4', '|u1', '|b1'; '>' (big-endian) only for single bytes.
  if (descr.size() != 5 || descr.front() != '\'' || descr.back() != '\'') {
    return InvalidArgumentError("dtype " + std::string(descr) + " is not a plain number type");
  }
  const char order = descr[1], kind = descr[2], size = descr[3];
  const size_t bytes = size >= '1' && size <= '8' ? static_cast<size_t>(size - '0') : 0;
  const bool ok_kind =
      (kind == 'f' && (bytes == 2 || bytes == 4 || bytes == 8)) ||
      ((kind == 'i' || kind == 'u') && (bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8)) ||
      (kind == 'b' && bytes == 1);
  if (!ok_kind) {
    return InvalidArgumentError("dtype " + std::string(descr) +
                                " is not supported (float16/32/64, int, uint or bool)");
  }
  if (order == '>' && bytes > 1) {
    return InvalidArgumentError("dtype " + std::string(descr) +
                                " is big-endian; save it little-endian");
  }
  if (order != '<' && order != '|' && order != '=' && order != '>') {
    return InvalidArgumentError("dtype " + std::string(descr) + " has no byte order");
  }
  return Dtype{kind, bytes};
}

template <typename T>
float Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return static_cast<float>(v);
}

float Convert(const Dtype& d, const char* p) {
  switch (d.kind) {
    case 'f':
      if (d.bytes == 2) {
        Fp16 h;
        std::memcpy(&h.bits, p, 2);
        return ToFloat(h);
      }
      return d.bytes == 4 ? Load<float>(p) : Load<double>(p);
    case 'i':
      switch (d.bytes) {
        case 1:
          return Load<int8_t>(p);
        case 2:
          return Load<int16_t>(p);
        case 4:
          return Load<int32_t>(p);
        default:
          return Load<int64_t>(p);
      }
    case 'u':
      switch (d.bytes) {
        case 1:
          return Load<uint8_t>(p);
        case 2:
          return Load<uint16_t>(p);
        case 4:
          return Load<uint32_t>(p);
        default:
          return Load<uint64_t>(p);
      }
    default:
      return *p != 0 ? 1.0f : 0.0f;
  }
}

StatusOr<NpyArray> ParseNpyBody(std::string_view name, std::string_view bytes,
                                uint64_t max_values) {
  if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic) {
    return InvalidArgumentError("not a .npy array (no \\x93NUMPY magic)");
  }
  const auto major = static_cast<uint8_t>(bytes[6]);
  if (major < 1 || major > 3) {
    return InvalidArgumentError(".npy version " + std::to_string(major) + " is not known (1-3)");
  }
  size_t header_len =
      static_cast<uint8_t>(bytes[8]) | (size_t{static_cast<uint8_t>(bytes[9])} << 8);
  size_t offset = 10;
  if (major >= 2) {
    if (bytes.size() < 12) return InvalidArgumentError("truncated .npy header");
    header_len |= (size_t{static_cast<uint8_t>(bytes[10])} << 16) |
                  (size_t{static_cast<uint8_t>(bytes[11])} << 24);
    offset = 12;
  }
  if (header_len > kMaxHeaderBytes || offset + header_len > bytes.size()) {
    return InvalidArgumentError("truncated .npy header (" + std::to_string(header_len) + " bytes)");
  }
  const std::string_view header = bytes.substr(offset, header_len);
  NpyArray a;
  a.name = std::string(name);
  COHORT_ASSIGN_OR_RETURN(std::string descr, HeaderValue(header, "descr"));
  COHORT_ASSIGN_OR_RETURN(Dtype dtype, ParseDtype(descr));
  a.dtype = descr.substr(1, descr.size() - 2);
  a.floating = dtype.kind == 'f';
  COHORT_ASSIGN_OR_RETURN(std::string fortran, HeaderValue(header, "fortran_order"));
  if (fortran != "False") {
    return InvalidArgumentError(
        "array is in Fortran order; save it in C order (np.ascontiguousarray)");
  }
  COHORT_ASSIGN_OR_RETURN(std::string shape_text, HeaderValue(header, "shape"));
  if (shape_text.front() != '(')
    return InvalidArgumentError("shape " + shape_text + " is not a tuple");
  COHORT_ASSIGN_OR_RETURN(a.shape, ParseShape(shape_text, max_values));
  uint64_t count = 1;
  for (uint64_t d : a.shape) count *= d;
  const std::string_view data = bytes.substr(offset + header_len);
  if (data.size() != count * dtype.bytes) {
    return InvalidArgumentError("shape " + shape_text + " of " + a.dtype + " needs " +
                                std::to_string(count * dtype.bytes) +
                                " bytes of data, the entry has " + std::to_string(data.size()));
  }
  a.values.resize(count);
  for (uint64_t i = 0; i < count; ++i) a.values[i] = Convert(dtype, data.data() + i * dtype.bytes);
  return a;
}

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};
struct ZipFileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};

// Entry `index` of `zip`, at most `max_bytes` long.
StatusOr<std::string> ReadEntry(zip_t* zip, zip_uint64_t index, const std::string& entry,
                                uint64_t max_bytes) {
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_stat_index(zip, index, 0, &st) != 0 || (st.valid & ZIP_STAT_SIZE) == 0) {
    return InvalidArgumentError(entry + ": " + zip_strerror(zip));
  }
  if (st.size > max_bytes) {
    return InvalidArgumentError(entry + ": " + std::to_string(st.size) +
                                " bytes, more than the model's cap allows");
  }
  std::unique_ptr<zip_file_t, ZipFileCloser> file(zip_fopen_index(zip, index, 0));
  if (file == nullptr) return InvalidArgumentError(entry + ": " + zip_strerror(zip));
  std::string bytes(st.size, '\0');
  zip_uint64_t got = 0;
  while (got < st.size) {
    const zip_int64_t n = zip_fread(file.get(), bytes.data() + got, st.size - got);
    if (n <= 0)
      return InvalidArgumentError(entry + ": truncated or corrupt (" +
                                  std::string(zip_file_strerror(file.get())) + ")");
    got += static_cast<zip_uint64_t>(n);
  }
  return bytes;
}

}  // namespace

StatusOr<NpyArray> ParseNpy(std::string_view name, std::string_view bytes, uint64_t max_values) {
  StatusOr<NpyArray> a = ParseNpyBody(name, bytes, max_values);
  if (!a.ok()) return a.status().WithContext(std::string(name));
  return a;
}

StatusOr<std::vector<NpyArray>> ReadNpz(const std::string& path, uint64_t max_values) {
  int error = 0;
  std::unique_ptr<zip_t, ZipCloser> zip(zip_open(path.c_str(), ZIP_RDONLY, &error));
  if (zip == nullptr) {
    zip_error_t e;
    zip_error_init_with_code(&e, error);
    std::string why = zip_error_strerror(&e);
    zip_error_fini(&e);
    if (error == ZIP_ER_NOENT || error == ZIP_ER_OPEN || error == ZIP_ER_READ) {
      return NotFoundError(path + ": " + why);
    }
    return InvalidArgumentError(path +
                                ": not an .npz (a zip of .npy arrays, as numpy.savez or "
                                "cohort.torch.save_initial writes): " +
                                why);
  }
  std::vector<NpyArray> arrays;
  uint64_t total = 0;
  const zip_int64_t entries = zip_get_num_entries(zip.get(), 0);
  for (zip_int64_t i = 0; i < entries; ++i) {
    std::string entry = zip_get_name(zip.get(), static_cast<zip_uint64_t>(i), 0);
    if (entry.size() < 4 || entry.substr(entry.size() - 4) != ".npy") {
      return InvalidArgumentError(path + ": entry '" + entry + "' is not an .npy array");
    }
    const uint64_t left = max_values - total;
    COHORT_ASSIGN_OR_RETURN(std::string bytes,
                            ReadEntry(zip.get(), static_cast<zip_uint64_t>(i), path + ": " + entry,
                                      left * 8 + kMaxHeaderBytes + 12));
    StatusOr<NpyArray> a = ParseNpy(entry.substr(0, entry.size() - 4), bytes, left);
    if (!a.ok()) return a.status().WithContext(path);
    total += a->values.size();
    arrays.push_back(std::move(a).value());
  }
  if (arrays.empty()) return InvalidArgumentError(path + ": the .npz holds no array");
  return arrays;
}

namespace {

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// The layout's tensors, by name, in the layout's order.
StatusOr<std::vector<const NpyArray*>> PickByLayout(const std::string& path,
                                                    const std::vector<NpyArray>& arrays,
                                                    const config::ExternalModel& model) {
  std::map<std::string, const NpyArray*> by_name;
  for (const NpyArray& a : arrays) by_name[a.name] = &a;
  std::vector<const NpyArray*> picked;
  for (const auto& t : model.layout()) {
    auto it = by_name.find(t.name());
    if (it == by_name.end()) {
      return InvalidArgumentError(path + ": holds no array '" + t.name() +
                                  "' (model.external.layout names it)");
    }
    const std::vector<uint64_t> want(t.shape().begin(), t.shape().end());
    if (it->second->shape != want) {
      return InvalidArgumentError(path + ": array '" + t.name() + "' has shape " +
                                  ShapeText(it->second->shape) + "; model.external.layout says " +
                                  ShapeText(want));
    }
    picked.push_back(it->second);
  }
  return picked;
}

}  // namespace

StatusOr<std::vector<float>> LoadInitialModel(const std::string& path,
                                              const config::ExternalModel& model) {
  COHORT_ASSIGN_OR_RETURN(std::vector<NpyArray> arrays,
                          ReadNpz(path, std::max<uint64_t>(model.num_params(), 1) * 2 + 1024));
  std::vector<const NpyArray*> picked;
  if (model.layout_size() > 0) {
    COHORT_ASSIGN_OR_RETURN(picked, PickByLayout(path, arrays, model));
  } else {
    for (const NpyArray& a : arrays) {
      if (a.floating) picked.push_back(&a);
    }
  }
  uint64_t total = 0;
  for (const NpyArray* a : picked) total += a->values.size();
  if (total != model.num_params()) {
    return InvalidArgumentError(
        path + " holds " + std::to_string(total) + " values (floating-point arrays" +
        (model.layout_size() > 0 ? " of the layout" : "") + "); the run's model has " +
        std::to_string(model.num_params()) + " (model.external.num_params)");
  }
  std::vector<float> flat;
  flat.reserve(total);
  for (const NpyArray* a : picked) {
    for (size_t i = 0; i < a->values.size(); ++i) {
      if (!std::isfinite(a->values[i])) {
        return InvalidArgumentError(path + ": array '" + a->name + "' value " + std::to_string(i) +
                                    " is not finite (" + fmt::format("{}", a->values[i]) + ")");
      }
    }
    flat.insert(flat.end(), a->values.begin(), a->values.end());
  }
  return flat;
}

}  // namespace cohort::train
