#include "datasets/standardize.h"

#include <cmath>
#include <cstdio>
#include <memory>

namespace cohort::datasets {

// Two passes in double (the mean, then the squared deviations from it):
// no cancellation however large the features' offset.
Standardization FitStandardization(const Dataset& train) {
  const size_t nf = train.num_features;
  Standardization s;
  s.rows = train.size();
  s.mean.assign(nf, 0.0);
  s.std.assign(nf, 0.0);
  for (size_t r = 0; r < train.size(); ++r) {
    const float* row = train.features.data() + r * nf;
    for (size_t j = 0; j < nf; ++j) s.mean[j] += row[j];
  }
  for (double& m : s.mean) m /= static_cast<double>(s.rows);
  for (size_t r = 0; r < train.size(); ++r) {
    const float* row = train.features.data() + r * nf;
    for (size_t j = 0; j < nf; ++j) {
      const double d = row[j] - s.mean[j];
      s.std[j] += d * d;
    }
  }
  for (size_t j = 0; j < nf; ++j) {
    s.std[j] = std::sqrt(s.std[j] / static_cast<double>(s.rows));
    if (s.std[j] == 0) {
      s.constant.push_back(static_cast<uint32_t>(j));
      s.mean[j] = 0;
      s.std[j] = 1;
    }
  }
  return s;
}

Status ApplyStandardization(const Standardization& s, Dataset& data) {
  const size_t nf = data.num_features;
  if (nf != s.mean.size()) {
    return InvalidArgumentError("standardize: the data has " + std::to_string(nf) +
                                " features, the figures " + std::to_string(s.mean.size()));
  }
  for (size_t r = 0; r < data.size(); ++r) {
    float* row = data.features.data() + r * nf;
    for (size_t j = 0; j < nf; ++j) {
      row[j] = static_cast<float>((static_cast<double>(row[j]) - s.mean[j]) / s.std[j]);
    }
  }
  return OkStatus();
}

Status WriteStandardization(const Standardization& s, int label_column, const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "w"), std::fclose);
  if (!f) return UnavailableError(path + ": cannot write");
  std::fprintf(f.get(), "feature,column,mean,std\n");
  for (size_t j = 0; j < s.mean.size(); ++j) {
    const size_t column = static_cast<int>(j) < label_column ? j : j + 1;
    std::fprintf(f.get(), "%zu,%zu,%.17g,%.17g\n", j, column, s.mean[j], s.std[j]);
  }
  if (std::fflush(f.get()) != 0 || std::ferror(f.get()))
    return UnavailableError(path + ": write failed");
  return OkStatus();
}

}  // namespace cohort::datasets
