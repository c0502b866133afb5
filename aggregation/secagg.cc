#include "aggregation/secagg.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <thread>

#include "common/parallel.h"
#include "common/rng.h"
#include "crypto/aead.h"
#include "crypto/prg.h"

namespace cohort::aggregation {
namespace {

constexpr size_t kSealedSharesBytes =
    crypto::kAeadNonceBytes + 2 * crypto::kShamirShareBytes + crypto::kAeadTagBytes;

void PutU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }

std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::string AdvertMessage(const std::array<uint8_t, 32>& context, uint32_t index,
                          const crypto::X25519Public& enc, const crypto::X25519Public& mask) {
  std::string m = "cohort-secagg-advert";
  m.append(reinterpret_cast<const char*>(context.data()), context.size());
  PutU32(m, index);
  m.append(reinterpret_cast<const char*>(enc.data()), enc.size());
  m.append(reinterpret_cast<const char*>(mask.data()), mask.size());
  return m;
}

std::array<uint8_t, 32> SessionId(const std::array<uint8_t, 32>& context, const KeyList& list) {
  std::string all;
  for (const auto& a : list.adverts) {
    PutU32(all, a.index);
    all.append(reinterpret_cast<const char*>(a.enc_key.data()), a.enc_key.size());
    all.append(reinterpret_cast<const char*>(a.mask_key.data()), a.mask_key.size());
  }
  return crypto::Hash256({context, AsBytes(all)});
}

std::string ShareAd(const std::array<uint8_t, 32>& session, uint32_t from, uint32_t to) {
  std::string ad(reinterpret_cast<const char*>(session.data()), session.size());
  ad += "sharekeys";
  PutU32(ad, from);
  PutU32(ad, to);
  return ad;
}

std::string SurvivorMessage(const std::array<uint8_t, 32>& session,
                            const std::vector<uint32_t>& survivors) {
  std::string m = "cohort-secagg-survivors";
  m.append(reinterpret_cast<const char*>(session.data()), session.size());
  PutU32(m, static_cast<uint32_t>(survivors.size()));
  for (uint32_t s : survivors) PutU32(m, s);
  return m;
}

// The pairwise mask key: a hash of the X25519 agreement and the session.
StatusOr<SecretBytes> PairMaskKey(const SecretBytes& my_secret, const crypto::X25519Public& mine,
                                  const crypto::X25519Public& theirs,
                                  const std::array<uint8_t, 32>& session) {
  COHORT_ASSIGN_OR_RETURN(SecretBytes shared, crypto::AgreeX25519(my_secret, mine, theirs));
  auto h = crypto::Hash256({shared.bytes(), session});
  SecretBytes key(32);
  std::memcpy(key.bytes().data(), h.data(), 32);
  std::fill(h.begin(), h.end(), 0);
  return key;
}

bool SortedUnique(const std::vector<uint32_t>& v, uint32_t n) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] >= n || (i > 0 && v[i] <= v[i - 1])) return false;
  }
  return true;
}

bool Contains(const std::vector<uint32_t>& sorted, uint32_t x) {
  return std::binary_search(sorted.begin(), sorted.end(), x);
}

// log P[X = i] for X ~ Binomial(k, p).
double LogBinomialPmf(uint32_t k, uint32_t i, double p) {
  return std::lgamma(k + 1.0) - std::lgamma(i + 1.0) - std::lgamma(k - i + 1.0) + i * std::log(p) +
         (k - i) * std::log1p(-p);
}

double BinomialCdfBelow(uint32_t k, uint32_t t, double p) {  // P[X < t]
  double sum = 0;
  for (uint32_t i = 0; i < t; ++i) sum += std::exp(LogBinomialPmf(k, i, p));
  return sum;
}

uint32_t ThresholdFor(uint32_t k, double corrupt) {
  return std::max<uint32_t>(k / 2 + 1, static_cast<uint32_t>(std::floor(corrupt * k)) + 1);
}

}  // namespace

StatusOr<SecAggParams> ChooseSecAggParams(uint32_t n, double dropout, double corrupt, bool complete,
                                          size_t length) {
  if (n < 2) return InvalidArgumentError("secagg: need at least 2 clients");
  if (!(dropout >= 0 && dropout < 1) || !(corrupt >= 0 && corrupt < 0.5)) {
    return InvalidArgumentError("secagg: dropout must be in [0, 1) and corrupt in [0, 0.5)");
  }
  SecAggParams p;
  p.n = n;
  p.length = length;
  p.k = n - 1;
  if (!complete && n > 16) {
    // Union bounds over the clients. Security (t corrupt neighbours would
    // reveal a client's secrets) gets 2^-20; correctness (too few
    // neighbours survive, so the round aborts and the next one runs) gets
    // 2^-10: an abort costs one round, not privacy.
    const double security_budget = std::ldexp(1.0, -20) / n;
    const double abort_budget = std::ldexp(1.0, -10) / n;
    for (uint32_t k = 4; k < n - 1; k += 2) {
      const uint32_t t = ThresholdFor(k, corrupt);
      if (t > k) continue;
      const double too_few = BinomialCdfBelow(k, t, 1.0 - dropout);
      const double too_corrupt = corrupt > 0 ? 1.0 - BinomialCdfBelow(k, t, corrupt) : 0.0;
      if (too_few <= abort_budget && too_corrupt <= security_budget) {
        p.k = k;
        break;
      }
    }
  }
  p.t = ThresholdFor(p.k, corrupt);
  if (p.t > p.k)
    return InvalidArgumentError("secagg: no threshold fits " + std::to_string(n) + " clients");
  return p;
}

std::array<uint8_t, 32> SecAggContext(std::span<const uint8_t> nonce, uint32_t round,
                                      uint64_t task_id, const SecAggParams& params, float clip,
                                      double scale, double total_weight,
                                      std::span<const crypto::Ed25519Public> identities) {
  std::string m = "cohort-secagg-context-v2";
  m.append(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  auto put = [&m](const auto& v) { m.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(round);
  put(task_id);
  put(params.n);
  put(params.k);
  put(params.t);
  put(params.graph_seed);
  put(static_cast<uint64_t>(params.length));
  put(static_cast<uint8_t>(params.consistency_check));
  put(static_cast<uint8_t>(params.prg));
  put(clip);
  put(scale);
  put(total_weight);
  for (const auto& id : identities) m.append(reinterpret_cast<const char*>(id.data()), id.size());
  return crypto::Hash256({AsBytes(m)});
}

std::vector<std::vector<uint32_t>> HararyNeighbours(uint32_t n, uint32_t k, uint64_t seed) {
  std::vector<std::vector<uint32_t>> out(n);
  if (k >= n - 1) {
    for (uint32_t i = 0; i < n; ++i) {
      for (uint32_t j = 0; j < n; ++j) {
        if (j != i) out[i].push_back(j);
      }
    }
    return out;
  }
  std::vector<uint32_t> ring(n);
  for (uint32_t i = 0; i < n; ++i) ring[i] = i;
  Rng rng(DeriveSeed(seed, 0x4a7a));
  rng.Shuffle(std::span<uint32_t>(ring));
  for (uint32_t pos = 0; pos < n; ++pos) {
    for (uint32_t d = 1; d <= k / 2; ++d) {
      out[ring[pos]].push_back(ring[(pos + d) % n]);
      out[ring[pos]].push_back(ring[(pos + n - d) % n]);
    }
  }
  for (auto& list : out) {
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
  }
  return out;
}

// --- Client -----------------------------------------------------------------

SecAggClient::SecAggClient(const SecAggParams& params, uint32_t index,
                           const crypto::Ed25519KeyPair* identity,
                           std::vector<crypto::Ed25519Public> identities)
    : params_(params), index_(index), identity_(identity), identities_(std::move(identities)) {
  neighbours_ = HararyNeighbours(params.n, params.k, params.graph_seed)[index];
}

StatusOr<KeyAdvert> SecAggClient::AdvertiseKeys() {
  if (stage_ != 0) return FailedPreconditionError("secagg client: keys already advertised");
  COHORT_ASSIGN_OR_RETURN(enc_, crypto::GenerateX25519());
  mask_seed_ = crypto::RandomSecret(crypto::kX25519SecretBytes);
  COHORT_ASSIGN_OR_RETURN(mask_, crypto::X25519FromSeed(mask_seed_));
  KeyAdvert advert;
  advert.index = index_;
  advert.enc_key = enc_.public_key;
  advert.mask_key = mask_.public_key;
  const std::string msg = AdvertMessage(params_.context, index_, enc_.public_key, mask_.public_key);
  COHORT_ASSIGN_OR_RETURN(advert.signature, crypto::Sign(*identity_, AsBytes(msg)));
  stage_ = 1;
  return advert;
}

StatusOr<SealedShares> SecAggClient::ShareKeys(const KeyList& list) {
  if (stage_ != 1) return FailedPreconditionError("secagg client: ShareKeys out of order");
  stage_ = -1;  // Any early return leaves the round.
  std::set<crypto::X25519Public> keys;
  bool own = false;
  uint32_t previous = 0;
  for (size_t i = 0; i < list.adverts.size(); ++i) {
    const KeyAdvert& a = list.adverts[i];
    if (a.index >= params_.n || (i > 0 && a.index <= previous)) {
      return InvalidArgumentError("key list: indices not sorted, unique and < n");
    }
    previous = a.index;
    if (!keys.insert(a.enc_key).second || !keys.insert(a.mask_key).second) {
      return InvalidArgumentError("key list: repeated public key (client " +
                                  std::to_string(a.index) + ")");
    }
    if (a.index == index_) {
      if (a.enc_key != enc_.public_key || a.mask_key != mask_.public_key) {
        return InvalidArgumentError("key list: this client's keys were replaced");
      }
      own = true;
    } else if (std::binary_search(neighbours_.begin(), neighbours_.end(), a.index)) {
      neighbour_adverts_[a.index] = a;
    }
  }
  std::vector<const KeyAdvert*> to_check;
  for (const auto& [v, a] : neighbour_adverts_) to_check.push_back(&a);
  COHORT_RETURN_IF_ERROR(ParallelFor(to_check.size(), [&](size_t i) -> Status {
    const KeyAdvert& a = *to_check[i];
    const std::string msg = AdvertMessage(params_.context, a.index, a.enc_key, a.mask_key);
    if (!crypto::Verify(identities_[a.index], AsBytes(msg), a.signature)) {
      return InvalidArgumentError("key list: bad signature on client " + std::to_string(a.index));
    }
    return OkStatus();
  }));
  if (!own) return InvalidArgumentError("key list: this client's own keys are missing");
  if (neighbour_adverts_.size() < params_.t) {
    return FailedPreconditionError("key list: " + std::to_string(neighbour_adverts_.size()) +
                                   " neighbours, below the threshold " + std::to_string(params_.t));
  }
  session_ = SessionId(params_.context, list);
  self_seed_ = crypto::RandomSecret(32);
  std::vector<uint32_t> xs;
  for (const auto& [v, a] : neighbour_adverts_) xs.push_back(v + 1);
  COHORT_ASSIGN_OR_RETURN(auto mask_shares, crypto::ShamirSplit(mask_seed_, params_.t, xs));
  COHORT_ASSIGN_OR_RETURN(auto self_shares, crypto::ShamirSplit(self_seed_, params_.t, xs));
  SealedShares out;
  out.from = index_;
  const std::vector<const KeyAdvert*>& recipients = to_check;  // Sorted by index, as xs.
  std::vector<std::string> sealed(recipients.size());
  COHORT_RETURN_IF_ERROR(ParallelFor(recipients.size(), [&](size_t i) -> Status {
    const KeyAdvert& a = *recipients[i];
    COHORT_ASSIGN_OR_RETURN(SecretBytes key,
                            crypto::AgreeX25519(enc_.secret_key, enc_.public_key, a.enc_key));
    SecretBytes plain(2 * crypto::kShamirShareBytes);
    std::memcpy(plain.bytes().data(), mask_shares[i].bytes().data(), crypto::kShamirShareBytes);
    std::memcpy(plain.bytes().data() + crypto::kShamirShareBytes, self_shares[i].bytes().data(),
                crypto::kShamirShareBytes);
    const std::string ad = ShareAd(session_, index_, a.index);
    COHORT_ASSIGN_OR_RETURN(sealed[i], crypto::Seal(key, plain.bytes(), AsBytes(ad)));
    return OkStatus();
  }));
  for (size_t i = 0; i < recipients.size(); ++i)
    out.to[recipients[i]->index] = std::move(sealed[i]);
  stage_ = 2;
  return out;
}

StatusOr<MaskedInput> SecAggClient::MaskInput(const InboundShares& inbound,
                                              std::vector<uint32_t> input) {
  COHORT_RETURN_IF_ERROR(ReceiveShares(inbound));
  return MaskInput(std::move(input));
}

Status SecAggClient::ReceiveShares(const InboundShares& inbound) {
  if (stage_ != 2 || shares_received_) {
    return FailedPreconditionError("secagg client: ReceiveShares out of order");
  }
  stage_ = -1;
  std::vector<std::pair<uint32_t, const std::string*>> items;
  for (const auto& [v, sealed] : inbound.from) {
    if (neighbour_adverts_.count(v) == 0) {
      return InvalidArgumentError("shares from client " + std::to_string(v) +
                                  ", not a neighbour that advertised keys");
    }
    items.emplace_back(v, &sealed);
  }
  std::vector<SecretBytes> mask_shares(items.size()), self_shares(items.size());
  COHORT_RETURN_IF_ERROR(ParallelFor(items.size(), [&](size_t i) -> Status {
    const uint32_t v = items[i].first;
    const std::string where = "shares from client " + std::to_string(v);
    COHORT_ASSIGN_OR_RETURN(SecretBytes key, crypto::AgreeX25519(enc_.secret_key, enc_.public_key,
                                                                 neighbour_adverts_.at(v).enc_key));
    const std::string ad = ShareAd(session_, v, index_);
    auto plain = crypto::Open(key, AsBytes(*items[i].second), AsBytes(ad));
    if (!plain.ok()) return plain.status().WithContext(where);
    if (plain->size() != 2 * crypto::kShamirShareBytes) {
      return InvalidArgumentError(where + " have the wrong size");
    }
    mask_shares[i] = SecretBytes(crypto::kShamirShareBytes);
    self_shares[i] = SecretBytes(crypto::kShamirShareBytes);
    std::memcpy(mask_shares[i].bytes().data(), plain->bytes().data(), crypto::kShamirShareBytes);
    std::memcpy(self_shares[i].bytes().data(), plain->bytes().data() + crypto::kShamirShareBytes,
                crypto::kShamirShareBytes);
    if (crypto::ShamirShareX(mask_shares[i]) != index_ + 1 ||
        crypto::ShamirShareX(self_shares[i]) != index_ + 1) {
      return InvalidArgumentError(where + " are not addressed to this client");
    }
    return OkStatus();
  }));
  for (size_t i = 0; i < items.size(); ++i) {
    held_mask_shares_[items[i].first] = std::move(mask_shares[i]);
    held_self_shares_[items[i].first] = std::move(self_shares[i]);
  }
  if (held_mask_shares_.size() < params_.t) {
    return FailedPreconditionError(std::to_string(held_mask_shares_.size()) +
                                   " neighbours shared keys, below the threshold " +
                                   std::to_string(params_.t));
  }
  shares_received_ = true;
  stage_ = 2;
  return OkStatus();
}

StatusOr<MaskedInput> SecAggClient::MaskInput(std::vector<uint32_t> input) {
  if (stage_ != 2 || !shares_received_) {
    return FailedPreconditionError("secagg client: MaskInput out of order");
  }
  stage_ = -1;
  if (input.size() != params_.length) {
    return InvalidArgumentError("input has " + std::to_string(input.size()) + " values, expected " +
                                std::to_string(params_.length));
  }
  MaskedInput out;
  out.from = index_;
  out.values = std::move(input);  // Masked in place.
  std::vector<uint32_t> peers;
  for (const auto& [v, share] : held_mask_shares_) peers.push_back(v);
  std::vector<SecretBytes> pair_keys(peers.size());
  COHORT_RETURN_IF_ERROR(ParallelFor(peers.size(), [&](size_t i) -> Status {
    COHORT_ASSIGN_OR_RETURN(pair_keys[i],
                            PairMaskKey(mask_.secret_key, mask_.public_key,
                                        neighbour_adverts_.at(peers[i]).mask_key, session_));
    return OkStatus();
  }));
  std::vector<crypto::MaskJob> jobs = {{&self_seed_, false}};
  for (size_t i = 0; i < peers.size(); ++i) {
    // The smaller index adds, the larger subtracts: the pair cancels.
    jobs.push_back({&pair_keys[i], /*subtract=*/peers[i] < index_});
  }
  COHORT_RETURN_IF_ERROR(
      crypto::AddMasks(jobs, out.values, 0, crypto::PrgImpl::kAuto, params_.prg));
  self_seed_.Reset();
  stage_ = 3;
  return out;
}

StatusOr<SurvivorSignature> SecAggClient::SignSurvivors(const SurvivorList& list) {
  if (stage_ != 3) return FailedPreconditionError("secagg client: SignSurvivors out of order");
  stage_ = -1;
  if (!SortedUnique(list.survivors, params_.n)) {
    return InvalidArgumentError("survivor list: not sorted, unique and < n");
  }
  if (!Contains(list.survivors, index_)) {
    return FailedPreconditionError("survivor list omits this client, which sent its input");
  }
  uint32_t neighbours_left = 0;
  for (uint32_t v : list.survivors) {
    if (v == index_ || !std::binary_search(neighbours_.begin(), neighbours_.end(), v)) continue;
    if (held_mask_shares_.count(v) == 0) {
      return FailedPreconditionError("survivor list names client " + std::to_string(v) +
                                     ", which never shared keys with this client");
    }
    ++neighbours_left;
  }
  if (neighbours_left < params_.t) {
    return FailedPreconditionError("survivor list: " + std::to_string(neighbours_left) +
                                   " neighbours left, below the threshold");
  }
  signed_survivors_ = list.survivors;
  SurvivorSignature out;
  out.from = index_;
  COHORT_ASSIGN_OR_RETURN(
      out.signature, crypto::Sign(*identity_, AsBytes(SurvivorMessage(session_, list.survivors))));
  stage_ = 4;
  return out;
}

StatusOr<UnmaskResponse> SecAggClient::Unmask(const UnmaskRequest& request) {
  const int expected = params_.consistency_check ? 4 : 3;
  if (stage_ != expected) return FailedPreconditionError("secagg client: Unmask out of order");
  stage_ = -1;
  if (!SortedUnique(request.survivors, params_.n) || !SortedUnique(request.dropped, params_.n)) {
    return InvalidArgumentError("unmask request: lists not sorted, unique and < n");
  }
  for (uint32_t v : request.dropped) {
    if (Contains(request.survivors, v)) {
      return FailedPreconditionError(
          "unmask request names client " + std::to_string(v) +
          " both as survivor and as dropped: refusing to reveal both shares");
    }
  }
  if (!Contains(request.survivors, index_)) {
    return FailedPreconditionError("unmask request omits this client from the survivors");
  }
  if (params_.consistency_check) {
    if (request.survivors != signed_survivors_) {
      return FailedPreconditionError("unmask request's survivor list differs from the one signed");
    }
    const std::string msg = SurvivorMessage(session_, request.survivors);
    std::set<uint32_t> valid;
    for (const auto& s : request.signatures) {
      if (s.from < params_.n && Contains(request.survivors, s.from) &&
          crypto::Verify(identities_[s.from], AsBytes(msg), s.signature)) {
        valid.insert(s.from);
      }
    }
    if (valid.size() < params_.t) {
      return FailedPreconditionError("unmask request carries " + std::to_string(valid.size()) +
                                     " valid survivor signatures, below the threshold");
    }
  }
  // Every neighbour whose shares this client holds must be in exactly one list,
  // and the lists may name no neighbour it holds nothing for.
  for (const auto* list : {&request.survivors, &request.dropped}) {
    for (uint32_t v : *list) {
      if (v != index_ && std::binary_search(neighbours_.begin(), neighbours_.end(), v) &&
          held_mask_shares_.count(v) == 0) {
        return FailedPreconditionError("unmask request names client " + std::to_string(v) +
                                       ", which never shared keys with this client");
      }
    }
  }
  uint32_t surviving_neighbours = 0;
  UnmaskResponse out;
  out.from = index_;
  for (auto& [v, share] : held_self_shares_) {
    const bool survived = Contains(request.survivors, v);
    if (!survived && !Contains(request.dropped, v)) {
      return FailedPreconditionError("unmask request leaves out neighbour " + std::to_string(v));
    }
    surviving_neighbours += survived ? 1 : 0;
  }
  if (surviving_neighbours < params_.t) {
    return FailedPreconditionError("only " + std::to_string(surviving_neighbours) +
                                   " neighbours survive, below the threshold");
  }
  for (auto& [v, share] : held_self_shares_) {
    UnmaskShare s;
    s.about = v;
    s.is_self_mask = Contains(request.survivors, v);
    s.share = s.is_self_mask ? std::move(share) : std::move(held_mask_shares_[v]);
    out.shares.push_back(std::move(s));
  }
  // Nothing secret is needed any more.
  held_self_shares_.clear();
  held_mask_shares_.clear();
  enc_.secret_key.Reset();
  mask_.secret_key.Reset();
  mask_seed_.Reset();
  stage_ = 5;
  return out;
}

// --- Server -----------------------------------------------------------------

SecAggServer::SecAggServer(const SecAggParams& params,
                           std::vector<crypto::Ed25519Public> identities)
    : params_(params),
      identities_(std::move(identities)),
      neighbours_(HararyNeighbours(params.n, params.k, params.graph_seed)),
      sum_(params.length, 0) {}

Status SecAggServer::Abort(const std::string& why) {
  aborted_ = true;
  sum_.assign(sum_.size(), 0);
  return FailedPreconditionError("secure aggregation aborted: " + why);
}

Status SecAggServer::OnAdvertise(const KeyAdvert& a) {
  if (aborted_ || stage_ != 1)
    return FailedPreconditionError("advert outside the AdvertiseKeys stage");
  if (a.index >= params_.n) return InvalidArgumentError("advert from unknown index");
  if (adverts_.count(a.index))
    return InvalidArgumentError("second advert from client " + std::to_string(a.index));
  for (const auto& [i, other] : adverts_) {
    if (other.enc_key == a.enc_key || other.mask_key == a.mask_key || other.enc_key == a.mask_key ||
        other.mask_key == a.enc_key || a.enc_key == a.mask_key) {
      return InvalidArgumentError("advert repeats a public key");
    }
  }
  const std::string msg = AdvertMessage(params_.context, a.index, a.enc_key, a.mask_key);
  if (!crypto::Verify(identities_[a.index], AsBytes(msg), a.signature)) {
    return InvalidArgumentError("advert signature does not match client " +
                                std::to_string(a.index) + "'s identity");
  }
  adverts_[a.index] = a;
  return OkStatus();
}

StatusOr<KeyList> SecAggServer::CloseAdvertise() {
  if (aborted_ || stage_ != 1) return FailedPreconditionError("CloseAdvertise out of order");
  for (const auto& [i, a] : adverts_) u1_.push_back(i);
  if (u1_.size() < params_.t) {
    return Abort(std::to_string(u1_.size()) + " clients advertised keys, need " +
                 std::to_string(params_.t));
  }
  KeyList list;
  for (const auto& [i, a] : adverts_) list.adverts.push_back(a);
  session_ = SessionId(params_.context, list);
  stage_ = 2;
  return list;
}

Status SecAggServer::OnShares(const SealedShares& s) {
  if (aborted_ || stage_ != 2) return FailedPreconditionError("shares outside the ShareKeys stage");
  if (!Contains(u1_, s.from)) return InvalidArgumentError("shares from a client not in U1");
  if (shares_.count(s.from)) return InvalidArgumentError("second set of shares");
  size_t expected = 0;
  for (uint32_t v : neighbours_[s.from]) {
    if (!Contains(u1_, v)) continue;
    ++expected;
    auto it = s.to.find(v);
    if (it == s.to.end())
      return InvalidArgumentError("no shares for neighbour " + std::to_string(v));
    if (it->second.size() != kSealedSharesBytes) {
      return InvalidArgumentError("sealed shares for " + std::to_string(v) +
                                  " have the wrong size");
    }
  }
  if (s.to.size() != expected) return InvalidArgumentError("shares addressed to non-neighbours");
  shares_[s.from] = s;
  return OkStatus();
}

StatusOr<std::map<uint32_t, InboundShares>> SecAggServer::CloseShares() {
  if (aborted_ || stage_ != 2) return FailedPreconditionError("CloseShares out of order");
  for (const auto& [u, s] : shares_) u2_.push_back(u);
  if (u2_.size() < params_.t) {
    return Abort(std::to_string(u2_.size()) + " clients shared keys, need " +
                 std::to_string(params_.t));
  }
  std::map<uint32_t, InboundShares> out;
  for (uint32_t v : u2_) out[v];
  for (const auto& [u, s] : shares_) {
    for (const auto& [v, ct] : s.to) {
      if (Contains(u2_, v)) out[v].from[u] = ct;
    }
  }
  shares_.clear();
  stage_ = 3;
  return out;
}

Status SecAggServer::OnMaskedInput(const MaskedInput& in) {
  return OnMaskedInput(in.from, {reinterpret_cast<const uint8_t*>(in.values.data()),
                                 in.values.size() * sizeof(uint32_t)});
}

Status SecAggServer::OnMaskedInput(uint32_t from, std::span<const uint8_t> words) {
  if (aborted_ || stage_ != 3)
    return FailedPreconditionError("input outside the MaskedInput stage");
  if (!Contains(u2_, from)) return InvalidArgumentError("masked input from a client not in U2");
  if (Contains(u3_, from)) return InvalidArgumentError("second masked input");
  if (words.size() != params_.length * sizeof(uint32_t)) {
    return InvalidArgumentError("masked input has " + std::to_string(words.size() / 4) +
                                " values, expected " + std::to_string(params_.length));
  }
  // Through a small buffer: the frame's bytes need not be uint32 objects.
  constexpr size_t kChunk = 2048;
  uint32_t chunk[kChunk];
  for (size_t begin = 0; begin < sum_.size(); begin += kChunk) {
    const size_t n = std::min(kChunk, sum_.size() - begin);
    std::memcpy(chunk, words.data() + begin * sizeof(uint32_t), n * sizeof(uint32_t));
    uint32_t* s = sum_.data() + begin;
    for (size_t i = 0; i < n; ++i) s[i] += chunk[i];
  }
  u3_.insert(std::upper_bound(u3_.begin(), u3_.end(), from), from);
  return OkStatus();
}

StatusOr<SurvivorList> SecAggServer::CloseMaskedInput() {
  if (aborted_ || stage_ != 3) return FailedPreconditionError("CloseMaskedInput out of order");
  if (u3_.size() < params_.t) {
    return Abort(std::to_string(u3_.size()) + " masked inputs, need " + std::to_string(params_.t));
  }
  stage_ = params_.consistency_check ? 4 : 5;
  return SurvivorList{u3_};
}

Status SecAggServer::OnSignature(const SurvivorSignature& s) {
  if (aborted_ || stage_ != 4)
    return FailedPreconditionError("signature outside the consistency stage");
  if (!Contains(u3_, s.from)) return InvalidArgumentError("signature from a client not in U3");
  if (!crypto::Verify(identities_[s.from], AsBytes(SurvivorMessage(session_, u3_)), s.signature)) {
    return InvalidArgumentError("bad survivor signature from client " + std::to_string(s.from));
  }
  signatures_[s.from] = s;
  return OkStatus();
}

StatusOr<UnmaskRequest> SecAggServer::CloseConsistency() {
  if (aborted_ || (stage_ != 4 && stage_ != 5))
    return FailedPreconditionError("CloseConsistency out of order");
  if (params_.consistency_check && signatures_.size() < params_.t) {
    return Abort(std::to_string(signatures_.size()) + " survivor signatures, need " +
                 std::to_string(params_.t));
  }
  UnmaskRequest req;
  req.survivors = u3_;
  for (uint32_t u : u2_) {
    if (!Contains(u3_, u)) req.dropped.push_back(u);
  }
  for (const auto& [i, s] : signatures_) req.signatures.push_back(s);
  stage_ = 5;
  return req;
}

Status SecAggServer::OnUnmask(UnmaskResponse r) {
  if (aborted_ || stage_ != 5) return FailedPreconditionError("unmask outside the Unmasking stage");
  if (!Contains(u3_, r.from)) return InvalidArgumentError("unmask from a client not in U3");
  if (params_.consistency_check && signatures_.count(r.from) == 0) {
    return InvalidArgumentError("unmask from a client that did not sign the survivor list");
  }
  if (unmasks_.count(r.from)) return InvalidArgumentError("second unmask response");
  std::set<uint32_t> seen;
  for (const auto& s : r.shares) {
    if (!seen.insert(s.about).second) return InvalidArgumentError("two shares about one client");
    if (!std::binary_search(neighbours_[r.from].begin(), neighbours_[r.from].end(), s.about) ||
        !Contains(u2_, s.about)) {
      return InvalidArgumentError("share about a client that is not a neighbour in U2");
    }
    if (s.is_self_mask != Contains(u3_, s.about)) {
      return InvalidArgumentError("share of the wrong kind about client " +
                                  std::to_string(s.about));
    }
    if (crypto::ShamirShareX(s.share) != r.from + 1) return InvalidArgumentError("malformed share");
  }
  const uint32_t from = r.from;
  unmasks_.emplace(from, std::move(r));
  u5_.insert(std::upper_bound(u5_.begin(), u5_.end(), from), from);
  return OkStatus();
}

StatusOr<std::vector<uint32_t>> SecAggServer::Finalize() {
  if (aborted_ || stage_ != 5) return FailedPreconditionError("Finalize out of order");
  // Shares by (subject, kind), from the responders.
  std::map<std::pair<uint32_t, bool>, std::vector<const SecretBytes*>> by_subject;
  for (const auto& [from, r] : unmasks_) {
    for (const auto& s : r.shares) by_subject[{s.about, s.is_self_mask}].push_back(&s.share);
  }
  crypto::ShamirCombiner combiner;
  // Every mask to take out of the sum: survivors' self masks, and the pair
  // masks survivors shared with dropped neighbours.
  std::vector<SecretBytes> keys;
  std::vector<bool> subtract;
  for (uint32_t u : u3_) {
    const auto& shares = by_subject[{u, true}];
    if (shares.size() < params_.t) {
      return Abort(std::to_string(shares.size()) + " shares of client " + std::to_string(u) +
                   "'s self mask, need " + std::to_string(params_.t));
    }
    auto b = combiner.Combine(shares, params_.t);
    if (!b.ok()) return Abort(b.status().message());
    keys.push_back(std::move(*b));
    subtract.push_back(true);
  }
  struct Pair {
    const crypto::X25519KeyPair* dropped;
    uint32_t survivor;
    bool survivor_first;
  };
  std::vector<crypto::X25519KeyPair> rebuilt_keys;
  rebuilt_keys.reserve(u2_.size());
  std::vector<Pair> pairs;
  for (uint32_t v : u2_) {
    if (Contains(u3_, v)) continue;
    const auto& shares = by_subject[{v, false}];
    if (shares.size() < params_.t) {
      return Abort(std::to_string(shares.size()) + " shares of dropped client " +
                   std::to_string(v) + "'s mask key, need " + std::to_string(params_.t));
    }
    auto seed = combiner.Combine(shares, params_.t);
    if (!seed.ok()) return Abort(seed.status().message());
    COHORT_ASSIGN_OR_RETURN(crypto::X25519KeyPair rebuilt, crypto::X25519FromSeed(*seed));
    if (rebuilt.public_key != adverts_[v].mask_key) {
      return Abort("rebuilt mask key of client " + std::to_string(v) +
                   " does not match its advert");
    }
    rebuilt_keys.push_back(std::move(rebuilt));
    for (uint32_t u : neighbours_[v]) {
      if (Contains(u3_, u)) pairs.push_back({&rebuilt_keys.back(), u, u < v});
    }
  }
  // The X25519 agreements are the other big cost: spread them over the cores.
  const size_t first_pair = keys.size();
  keys.resize(first_pair + pairs.size());
  for (const Pair& p : pairs) subtract.push_back(p.survivor_first);  // u added +PRG when u < v.
  COHORT_RETURN_IF_ERROR(ParallelFor(pairs.size(), [&](size_t i) -> Status {
    COHORT_ASSIGN_OR_RETURN(keys[first_pair + i],
                            PairMaskKey(pairs[i].dropped->secret_key, pairs[i].dropped->public_key,
                                        adverts_.at(pairs[i].survivor).mask_key, session_));
    return OkStatus();
  }));
  std::vector<crypto::MaskJob> jobs;
  jobs.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) jobs.push_back({&keys[i], subtract[i]});
  COHORT_RETURN_IF_ERROR(crypto::AddMasks(jobs, sum_, 0, crypto::PrgImpl::kAuto, params_.prg));
  unmasks_.clear();
  stage_ = 6;
  return std::move(sum_);
}

}  // namespace cohort::aggregation
