#include "datasets/partition.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "common/rng.h"
#include "datasets/dataset.h"

namespace cohort::datasets {
namespace {

constexpr size_t kMinPerClient = 10;
constexpr int kMaxDraws = 1000;

std::vector<double> Dirichlet(Rng& rng, double alpha, size_t k) {
  std::vector<double> p(k);
  double sum = 0;
  for (double& v : p) sum += (v = rng.Gamma(alpha));
  if (sum <= 0) {
    std::fill(p.begin(), p.end(), 1.0 / k);
  } else {
    for (double& v : p) v /= sum;
  }
  return p;
}

// Splits `items` (in order) into parts with the cumulative proportions of `p`.
void SplitByProportions(const std::vector<uint32_t>& items, const std::vector<double>& p,
                        std::vector<std::vector<uint32_t>>& parts) {
  double cumulative = 0;
  size_t begin = 0;
  for (size_t j = 0; j < p.size(); ++j) {
    cumulative += p[j];
    size_t end = j + 1 == p.size()
                     ? items.size()
                     : std::min(items.size(), static_cast<size_t>(cumulative * items.size()));
    end = std::max(end, begin);
    parts[j].insert(parts[j].end(), items.begin() + begin, items.begin() + end);
    begin = end;
  }
}

std::vector<std::vector<uint32_t>> ByClass(std::span<const int32_t> labels, uint32_t classes) {
  std::vector<std::vector<uint32_t>> by_class(classes);
  for (uint32_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= 0 && static_cast<uint32_t>(labels[i]) < classes) {
      by_class[labels[i]].push_back(i);
    }
  }
  return by_class;
}

size_t MinSize(const std::vector<std::vector<uint32_t>>& parts) {
  size_t m = SIZE_MAX;
  for (const auto& p : parts) m = std::min(m, p.size());
  return m;
}

// iid: a permutation cut into equal parts; the first n % K parts get one
// extra (numpy array_split).
void SplitIid(size_t n, Rng& rng, std::vector<std::vector<uint32_t>>& parts) {
  const size_t num_clients = parts.size();
  std::vector<uint32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  rng.Shuffle(std::span<uint32_t>(perm));
  size_t begin = 0;
  for (size_t j = 0; j < num_clients; ++j) {
    const size_t size = n / num_clients + (j < n % num_clients ? 1 : 0);
    parts[j].assign(perm.begin() + begin, perm.begin() + begin + size);
    begin += size;
  }
}

// dirichlet: per class, proportions ~ Dir(alpha) over the clients not yet
// holding N/K samples; redrawn until each client has kMinPerClient.
Status SplitDirichlet(std::span<const int32_t> labels, uint32_t num_classes, double alpha, Rng& rng,
                      std::vector<std::vector<uint32_t>>& parts) {
  const auto num_clients = static_cast<uint32_t>(parts.size());
  auto by_class = ByClass(labels, num_classes);
  const double cap = static_cast<double>(labels.size()) / num_clients;
  int draws = 0;
  do {
    if (++draws > kMaxDraws) {
      return InvalidArgumentError(
          "partition dirichlet: no split with >= 10 samples per "
          "client after 1000 draws; use fewer clients or a larger "
          "alpha");
    }
    for (auto& p : parts) p.clear();
    for (auto& items : by_class) {
      rng.Shuffle(std::span<uint32_t>(items));
      std::vector<double> p = Dirichlet(rng, alpha, num_clients);
      double sum = 0;
      for (uint32_t j = 0; j < num_clients; ++j) {
        if (parts[j].size() >= cap) p[j] = 0;
        sum += p[j];
      }
      if (sum <= 0) continue;
      for (double& v : p) v /= sum;
      SplitByProportions(items, p, parts);
    }
  } while (MinSize(parts) < kMinPerClient);
  return OkStatus();
}

// shards:K: client j holds class j mod C and K - 1 random others; each
// class is split evenly among its holders.
Status SplitShards(std::span<const int32_t> labels, uint32_t num_classes, uint32_t k, Rng& rng,
                   std::vector<std::vector<uint32_t>>& parts) {
  if (k > num_classes) {
    return InvalidArgumentError("partition shards:" + std::to_string(k) + ": only " +
                                std::to_string(num_classes) + " classes");
  }
  const auto num_clients = static_cast<uint32_t>(parts.size());
  std::vector<std::vector<uint32_t>> holders(num_classes);
  for (uint32_t j = 0; j < num_clients; ++j) {
    std::vector<uint32_t> mine = {j % num_classes};
    while (mine.size() < k) {
      const auto c = static_cast<uint32_t>(rng.UniformInt(num_classes));
      if (std::find(mine.begin(), mine.end(), c) == mine.end()) mine.push_back(c);
    }
    for (uint32_t c : mine) holders[c].push_back(j);
  }
  auto by_class = ByClass(labels, num_classes);
  for (uint32_t c = 0; c < num_classes; ++c) {
    if (holders[c].empty()) continue;
    rng.Shuffle(std::span<uint32_t>(by_class[c]));
    std::vector<std::vector<uint32_t>> split(holders[c].size());
    std::vector<double> equal(holders[c].size(), 1.0 / holders[c].size());
    SplitByProportions(by_class[c], equal, split);
    for (size_t h = 0; h < holders[c].size(); ++h) {
      auto& dst = parts[holders[c][h]];
      dst.insert(dst.end(), split[h].begin(), split[h].end());
    }
  }
  return OkStatus();
}

// quantity: sizes ~ Dir(alpha), redrawn until each client has kMinPerClient.
Status SplitQuantity(size_t n, double alpha, Rng& rng, std::vector<std::vector<uint32_t>>& parts) {
  std::vector<uint32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  int draws = 0;
  do {
    if (++draws > kMaxDraws) {
      return InvalidArgumentError(
          "partition quantity: no split with >= 10 samples per "
          "client after 1000 draws");
    }
    for (auto& p : parts) p.clear();
    rng.Shuffle(std::span<uint32_t>(perm));
    SplitByProportions(perm, Dirichlet(rng, alpha, parts.size()), parts);
  } while (MinSize(parts) < kMinPerClient);
  return OkStatus();
}

}  // namespace

StatusOr<PartitionSpec> ParsePartitionSpec(std::string_view text) {
  PartitionSpec spec;
  const size_t colon = text.find(':');
  const std::string_view name = text.substr(0, colon);
  const std::string_view arg =
      colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("partition \"" + std::string(text) + "\": " + why);
  };
  if (name == "iid") {
    if (!arg.empty()) return bad("iid takes no argument");
    spec.kind = PartitionSpec::Kind::kIid;
    return spec;
  }
  if (name == "dirichlet" || name == "quantity") {
    spec.kind =
        name == "dirichlet" ? PartitionSpec::Kind::kDirichlet : PartitionSpec::Kind::kQuantity;
    double alpha = 0;
    auto [ptr, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), alpha);
    if (arg.empty() || ec != std::errc() || ptr != arg.data() + arg.size() ||
        !std::isfinite(alpha) || alpha <= 0 || alpha > 1e6) {
      return bad("ALPHA must be a number > 0, as in " + std::string(name) + ":0.5");
    }
    spec.alpha = alpha;
    return spec;
  }
  if (name == "shards") {
    uint32_t k = 0;
    auto [ptr, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), k);
    if (arg.empty() || ec != std::errc() || ptr != arg.data() + arg.size() || k == 0) {
      return bad("K must be an integer >= 1, as in shards:2");
    }
    spec.kind = PartitionSpec::Kind::kShards;
    spec.classes = k;
    return spec;
  }
  return bad("unknown scheme; use iid, dirichlet:ALPHA, shards:K or quantity:ALPHA");
}

StatusOr<std::vector<std::vector<uint32_t>>> Partition(std::span<const int32_t> labels,
                                                       uint32_t num_classes, uint32_t num_clients,
                                                       const PartitionSpec& spec, uint64_t seed) {
  const size_t n = labels.size();
  if (num_clients == 0) return InvalidArgumentError("partition: zero clients");
  if (num_clients > n) {
    return InvalidArgumentError("partition: " + std::to_string(num_clients) + " clients but only " +
                                std::to_string(n) + " samples");
  }
  Rng rng(DeriveSeed(seed, 0x9a27));
  std::vector<std::vector<uint32_t>> parts(num_clients);
  switch (spec.kind) {
    case PartitionSpec::Kind::kIid:
      SplitIid(n, rng, parts);
      break;
    case PartitionSpec::Kind::kDirichlet:
      COHORT_RETURN_IF_ERROR(SplitDirichlet(labels, num_classes, spec.alpha, rng, parts));
      break;
    case PartitionSpec::Kind::kShards:
      COHORT_RETURN_IF_ERROR(SplitShards(labels, num_classes, spec.classes, rng, parts));
      break;
    case PartitionSpec::Kind::kQuantity:
      COHORT_RETURN_IF_ERROR(SplitQuantity(n, spec.alpha, rng, parts));
      break;
  }
  for (auto& p : parts) std::sort(p.begin(), p.end());
  return parts;
}

StatusOr<std::vector<std::vector<uint32_t>>> ReadAssignment(const std::string& path,
                                                            size_t num_samples) {
  COHORT_RETURN_IF_ERROR(CheckRegularFile(path));
  std::ifstream in(path);
  if (!in) return NotFoundError(path + ": cannot open assignment file");
  std::vector<std::vector<uint32_t>> parts;
  std::vector<bool> seen(num_samples, false);
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::istringstream fields(line);
    std::string token;
    std::vector<uint32_t> part;
    while (fields >> token) {
      uint64_t index = 0;
      auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), index);
      const std::string where = path + ":" + std::to_string(line_no);
      if (ec != std::errc() || ptr != token.data() + token.size()) {
        return InvalidArgumentError(where + ": \"" + token + "\" is not a sample index");
      }
      if (index >= num_samples) {
        return InvalidArgumentError(where + ": index " + token +
                                    " >= " + std::to_string(num_samples) + " samples");
      }
      if (seen[index]) return InvalidArgumentError(where + ": index " + token + " assigned twice");
      seen[index] = true;
      part.push_back(static_cast<uint32_t>(index));
    }
    std::sort(part.begin(), part.end());
    parts.push_back(std::move(part));
  }
  if (parts.empty()) return InvalidArgumentError(path + ": no clients in assignment file");
  return parts;
}

}  // namespace cohort::datasets
