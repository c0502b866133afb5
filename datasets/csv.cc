#include "datasets/csv.h"

#include <charconv>
#include <cmath>
#include <fstream>
#include <string_view>
#include <vector>

namespace cohort::datasets {
namespace {

bool ParseFloat(std::string_view s, float& out) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

std::vector<std::string_view> Split(std::string_view line) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = line.find(',', start);
    out.push_back(line.substr(start, comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

StatusOr<Dataset> ReadCsv(const std::string& path, const CsvOptions& options) {
  COHORT_RETURN_IF_ERROR(CheckRegularFile(path));
  std::ifstream in(path);
  if (!in) return NotFoundError(path + ": cannot open");
  Dataset data;
  std::string line;
  size_t line_no = 0;
  size_t columns = 0;
  int32_t max_label = -1;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line == "\r") continue;
    auto fields = Split(line);
    const std::string where = path + ":" + std::to_string(line_no);
    std::vector<float> values(fields.size());
    bool numeric = true;
    for (size_t i = 0; i < fields.size(); ++i)
      numeric = numeric && ParseFloat(fields[i], values[i]);
    if (!numeric && columns == 0 && data.labels.empty()) {
      continue;  // Header line.
    }
    if (columns == 0) {
      columns = fields.size();
      if (options.label_column < 0 || static_cast<size_t>(options.label_column) >= columns) {
        return InvalidArgumentError(where + ": label column " +
                                    std::to_string(options.label_column) + " but only " +
                                    std::to_string(columns) + " columns");
      }
      if (columns < 2) return InvalidArgumentError(where + ": need a label and >= 1 feature");
      data.num_features = static_cast<uint32_t>(columns - 1);
    }
    if (fields.size() != columns) {
      return InvalidArgumentError(where + ": " + std::to_string(fields.size()) +
                                  " columns, expected " + std::to_string(columns));
    }
    for (size_t i = 0; i < fields.size(); ++i) {
      float v;
      if (!ParseFloat(fields[i], v) || !std::isfinite(v)) {
        return InvalidArgumentError(where + ", column " + std::to_string(i + 1) +
                                    ": not a finite number: \"" + std::string(fields[i]) + "\"");
      }
      if (static_cast<int>(i) == options.label_column) {
        if (v < 0 || v != std::floor(v) || v > 1e6) {
          return InvalidArgumentError(where + ": label \"" + std::string(fields[i]) +
                                      "\" is not a class index");
        }
        data.labels.push_back(static_cast<int32_t>(v));
        max_label = std::max(max_label, data.labels.back());
      } else {
        data.features.push_back(v * options.scale);
      }
    }
  }
  if (data.labels.empty()) return InvalidArgumentError(path + ": no samples");
  data.num_classes =
      options.num_classes != 0 ? options.num_classes : static_cast<uint32_t>(max_label + 1);
  if (data.num_classes < 2) data.num_classes = 2;
  COHORT_RETURN_IF_ERROR(Validate(data, path));
  return data;
}

}  // namespace cohort::datasets
