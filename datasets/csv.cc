#include "datasets/csv.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/progress.h"

namespace cohort::datasets {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

bool ParseFloat(std::string_view s, float& out) {
  s = Trim(s);
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

// What to tell a person whose field holds another common delimiter: files
// written with ';' (where ',' is the decimal mark), tabs or '|' are read
// as one field per line, or as fields that are not numbers.
std::string DelimiterHint(std::string_view text) {
  for (const char c : {';', '\t', '|'}) {
    if (text.find(c) == std::string_view::npos) continue;
    const std::string name = c == '\t' ? "a tab" : std::string("'") + c + "'";
    return "; the delimiter looks like " + name +
           ", but Cohort reads comma-separated values only (convert the file, e.g. with tr)";
  }
  return "";
}

// A label name as written, without spaces or surrounding double quotes.
std::string_view LabelName(std::string_view field) {
  field = Trim(field);
  if (field.size() >= 2 && field.front() == '"' && field.back() == '"') {
    field = field.substr(1, field.size() - 2);
  }
  return field;
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 10; ++i) s += (i > 0 ? ", " : "") + names[i];
  return names.size() > 10 ? s + ", ..." : s;
}

// Reads the lines of one file in order (AddLine), then Finish().
class CsvReader {
 public:
  CsvReader(const std::string& path, const CsvOptions& options) : path_(path), o_(options) {
    for (size_t i = 0; i < o_.class_names.size(); ++i) {
      names_.emplace(o_.class_names[i], static_cast<int32_t>(i));
    }
  }
  Status AddLine(std::string_view line, size_t line_no);
  StatusOr<CsvTable> Finish();

 private:
  // "path:7" or "path:7, column 3" (1-based).
  std::string Where(size_t line_no, size_t column = 0) const {
    std::string s = path_ + ":" + std::to_string(line_no);
    return column == 0 ? s : s + ", column " + std::to_string(column);
  }
  bool LabelIsNumber(const std::vector<std::string_view>& fields) const;
  bool IsHeader(const std::vector<std::string_view>& fields) const;
  Status SetColumns(std::string_view line, size_t columns, size_t line_no);
  Status AddRow(std::string_view line, size_t line_no);
  Status AddLabel(std::string_view field, size_t line_no);
  Status AddNumberLabel(std::string_view field, size_t line_no);
  Status AddNameLabel(std::string_view field, size_t line_no);
  std::vector<std::string> SortNames();

  const std::string& path_;
  const CsvOptions& o_;
  Dataset data_;
  size_t columns_ = 0;
  size_t first_data_line_ = 0;
  size_t header_line_ = 0;
  bool seen_first_line_ = false;
  // A first line whose label is a name and features numbers: a header when
  // the next line's label is a number (then it is dropped), else data.
  std::string pending_;
  size_t pending_line_ = 0;
  // The first label of each kind, to name both when a file mixes them.
  size_t first_number_line_ = 0, first_name_line_ = 0;
  std::string first_number_, first_name_;
  int32_t max_label_ = -1;
  // The fixed mapping (o_.class_names), or the names found so far with ids
  // in order of first appearance (found_, until Finish sorts them).
  std::unordered_map<std::string, int32_t> names_;
  std::vector<std::string> found_;
};

bool CsvReader::LabelIsNumber(const std::vector<std::string_view>& fields) const {
  float v;
  const auto label = static_cast<size_t>(o_.label_column);
  return o_.label_column >= 0 && label < fields.size() && ParseFloat(fields[label], v);
}

// A header has a feature field that is not a number.
bool CsvReader::IsHeader(const std::vector<std::string_view>& fields) const {
  float v;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (static_cast<int>(i) != o_.label_column && !ParseFloat(fields[i], v)) return true;
  }
  return false;
}

Status CsvReader::AddLine(std::string_view line, size_t line_no) {
  if (Trim(line).empty()) return OkStatus();
  if (!seen_first_line_) {
    seen_first_line_ = true;
    const std::vector<std::string_view> fields = Split(line);
    if (IsHeader(fields)) {
      header_line_ = line_no;
      return OkStatus();
    }
    if (o_.class_names.empty() && fields.size() > 1 && !LabelIsNumber(fields)) {
      pending_ = std::string(line);
      pending_line_ = line_no;
      return OkStatus();
    }
  } else if (pending_line_ != 0) {
    const size_t first = pending_line_;
    pending_line_ = 0;
    if (LabelIsNumber(Split(line))) {
      header_line_ = first;
    } else {
      COHORT_RETURN_IF_ERROR(AddRow(pending_, first));
    }
  }
  return AddRow(line, line_no);
}

Status CsvReader::SetColumns(std::string_view line, size_t columns, size_t line_no) {
  columns_ = columns;
  first_data_line_ = line_no;
  if (columns < 2 && !DelimiterHint(line).empty()) {
    return InvalidArgumentError(Where(line_no) + ": one field" + DelimiterHint(line));
  }
  if (o_.label_column < 0 || static_cast<size_t>(o_.label_column) >= columns) {
    return InvalidArgumentError(Where(line_no) + ": label column " +
                                std::to_string(o_.label_column) + " but only " +
                                std::to_string(columns) + " columns");
  }
  if (columns < 2) return InvalidArgumentError(Where(line_no) + ": need a label and >= 1 feature");
  data_.num_features = static_cast<uint32_t>(columns - 1);
  return OkStatus();
}

Status CsvReader::AddRow(std::string_view line, size_t line_no) {
  const std::vector<std::string_view> fields = Split(line);
  if (columns_ == 0) COHORT_RETURN_IF_ERROR(SetColumns(line, fields.size(), line_no));
  if (fields.size() != columns_) {
    const size_t n = fields.size();
    return InvalidArgumentError(
        Where(line_no, std::min(n, columns_) + 1) + (n < columns_ ? ": missing" : ": extra") +
        " (" + std::to_string(n) + " columns, expected " + std::to_string(columns_) +
        " as on line " + std::to_string(first_data_line_) + ")" +
        (n == 1 ? DelimiterHint(line) : ""));
  }
  for (size_t i = 0; i < fields.size(); ++i) {
    if (static_cast<int>(i) == o_.label_column) {
      COHORT_RETURN_IF_ERROR(AddLabel(fields[i], line_no));
      continue;
    }
    float v;
    if (!ParseFloat(fields[i], v) || !std::isfinite(v)) {
      return InvalidArgumentError(Where(line_no, i + 1) + ": not a finite number: \"" +
                                  std::string(fields[i]) + "\"" + DelimiterHint(fields[i]));
    }
    data_.features.push_back(v * o_.scale);
  }
  return OkStatus();
}

Status CsvReader::AddLabel(std::string_view field, size_t line_no) {
  float v;
  if (o_.class_names.empty() && ParseFloat(field, v)) return AddNumberLabel(field, line_no);
  return AddNameLabel(field, line_no);
}

Status CsvReader::AddNumberLabel(std::string_view field, size_t line_no) {
  const std::string where = Where(line_no, static_cast<size_t>(o_.label_column) + 1);
  float v;
  ParseFloat(field, v);
  if (!std::isfinite(v)) {
    return InvalidArgumentError(where + ": not a finite number: \"" + std::string(field) + "\"");
  }
  if (v < 0 || v != std::floor(v) || v > 1e6) {
    return InvalidArgumentError(where + ": label \"" + std::string(field) +
                                "\" is not a class index");
  }
  if (first_name_line_ != 0) {
    return InvalidArgumentError(where + ": label \"" + std::string(Trim(field)) +
                                "\" is a class index, but line " +
                                std::to_string(first_name_line_) + "'s label \"" + first_name_ +
                                "\" is a name: a file's labels are all class indices or all names");
  }
  if (first_number_line_ == 0) {
    first_number_line_ = line_no;
    first_number_ = std::string(Trim(field));
  }
  data_.labels.push_back(static_cast<int32_t>(v));
  max_label_ = std::max(max_label_, data_.labels.back());
  return OkStatus();
}

Status CsvReader::AddNameLabel(std::string_view field, size_t line_no) {
  const size_t column = static_cast<size_t>(o_.label_column) + 1;
  const std::string name(LabelName(field));
  if (name.empty()) return InvalidArgumentError(Where(line_no, column) + ": the label is empty");
  if (first_number_line_ != 0) {
    return InvalidArgumentError(Where(line_no, column) + ": label \"" + name +
                                "\" is a name, but line " + std::to_string(first_number_line_) +
                                "'s label \"" + first_number_ +
                                "\" is a class index: a file's labels are all class indices or "
                                "all names");
  }
  if (first_name_line_ == 0) {
    first_name_line_ = line_no;
    first_name_ = name;
  }
  auto it = names_.find(name);
  if (it == names_.end() && !o_.class_names.empty()) {
    return InvalidArgumentError(Where(line_no, column) + ": label \"" + name +
                                "\" is not a class of the training file (" +
                                JoinNames(o_.class_names) + ")");
  }
  if (it == names_.end()) {
    if (found_.size() >= kMaxCsvClassNames) {
      return InvalidArgumentError(
          Where(line_no, column) + ": more than " + std::to_string(kMaxCsvClassNames) +
          " distinct labels: is column " + std::to_string(column) + " (--label-column " +
          std::to_string(o_.label_column) + ") the label?");
    }
    it = names_.emplace(name, static_cast<int32_t>(found_.size())).first;
    found_.push_back(name);
  }
  data_.labels.push_back(it->second);
  return OkStatus();
}

// The names found, sorted; labels renumbered to match.
std::vector<std::string> CsvReader::SortNames() {
  std::vector<int32_t> order(found_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return found_[a] < found_[b]; });
  std::vector<int32_t> rank(found_.size());
  std::vector<std::string> sorted(found_.size());
  for (size_t r = 0; r < order.size(); ++r) {
    rank[order[r]] = static_cast<int32_t>(r);
    sorted[r] = found_[order[r]];
  }
  for (int32_t& y : data_.labels) y = rank[y];
  return sorted;
}

StatusOr<CsvTable> CsvReader::Finish() {
  if (pending_line_ != 0) COHORT_RETURN_IF_ERROR(AddRow(pending_, pending_line_));
  if (data_.labels.empty()) {
    return InvalidArgumentError(
        path_ + ": no samples: " +
        (header_line_ != 0 ? "line " + std::to_string(header_line_) +
                                 " is a header (a feature field that is not a number) and no "
                                 "line follows it"
                           : std::string("the file has no lines")));
  }
  CsvTable table;
  if (!found_.empty()) {
    table.class_names = SortNames();
  } else if (!o_.class_names.empty()) {
    table.class_names = o_.class_names;
  }
  uint32_t classes = table.class_names.empty() ? static_cast<uint32_t>(max_label_ + 1)
                                               : static_cast<uint32_t>(table.class_names.size());
  if (o_.num_classes != 0) classes = o_.num_classes;
  data_.num_classes = std::max(classes, 2u);
  COHORT_RETURN_IF_ERROR(Validate(data_, path_));
  table.data = std::move(data_);
  return table;
}

}  // namespace

StatusOr<CsvTable> ReadCsvTable(const std::string& path, const CsvOptions& options) {
  COHORT_RETURN_IF_ERROR(CheckRegularFile(path));
  std::ifstream in(path);
  if (!in) return NotFoundError(path + ": cannot open");
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  std::optional<Progress> progress;
  if (options.progress != nullptr && !ec && size >= options.progress_min_bytes) {
    ProgressOptions mib;
    mib.unit = "MiB";
    mib.scale = 1 << 20;
    progress.emplace("reading " + path, size, options.progress, mib);
  }
  CsvReader reader(path, options);
  std::string line;
  size_t line_no = 0;
  uint64_t bytes = 0;
  while (std::getline(in, line)) {
    COHORT_RETURN_IF_ERROR(reader.AddLine(line, ++line_no));
    bytes += line.size() + 1;
    if (progress) progress->Update(bytes);
  }
  if (progress) progress->Finish(std::to_string(line_no) + " lines");
  return reader.Finish();
}

StatusOr<Dataset> ReadCsv(const std::string& path, const CsvOptions& options) {
  COHORT_ASSIGN_OR_RETURN(CsvTable table, ReadCsvTable(path, options));
  return std::move(table.data);
}

}  // namespace cohort::datasets
