#include "tests/fuzz/secagg_cohort.h"

#include <sodium.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace cohort::fuzz {
namespace {

using aggregation::CheckedList;
using aggregation::Complaint;
using aggregation::InboundShares;
using aggregation::KeyAdvert;
using aggregation::KeyList;
using aggregation::MaskedInput;
using aggregation::SealedShares;
using aggregation::SecAggClient;
using aggregation::SecAggParams;
using aggregation::SecAggServer;
using aggregation::ShareCheck;
using aggregation::SurvivorSignature;
using aggregation::UnmaskRequest;
using aggregation::UnmaskResponse;
using aggregation::UnmaskShare;

// --- Seeded randomness (SplitMix64) ------------------------------------------

uint64_t g_random_state = 0;

uint64_t NextRandom() {
  uint64_t z = (g_random_state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

const char* RandomName() { return "cohort-fuzz-seeded"; }
uint32_t RandomU32() { return static_cast<uint32_t>(NextRandom()); }
void RandomBuf(void* const buf, const size_t size) {
  auto* out = static_cast<uint8_t*>(buf);
  for (size_t i = 0; i < size; i += 8) {
    const uint64_t v = NextRandom();
    std::memcpy(out + i, &v, std::min<size_t>(8, size - i));
  }
}

randombytes_implementation g_seeded = {RandomName, RandomU32, nullptr, nullptr, RandomBuf, nullptr};

// --- The honest round ----------------------------------------------------------

[[noreturn]] void Fail(const char* what, const Status& status) {
  std::fprintf(stderr, "honest secagg round failed at %s: %s\n", what, status.ToString().c_str());
  std::abort();
}

template <typename T>
T Must(StatusOr<T> value, const char* what) {
  if (!value.ok()) Fail(what, value.status());
  return std::move(*value);
}

void Must(const Status& status, const char* what) {
  if (!status.ok()) Fail(what, status);
}

HonestRound Build(int config) {
  HonestRound h;
  SecAggParams& p = h.params;
  if (config == 0) {
    p.n = 5;
    p.k = 4;
    p.t = aggregation::SecureThreshold(5, 4, 0.1);  // 3
    // The default PRG; AES-256 runs the same kernels with more rounds.
    p.prg = crypto::MaskPrg::kAes128Ctr;
  } else {
    p.n = 6;
    p.k = 4;
    p.t = 3;
    p.prg = crypto::MaskPrg::kChaCha20;
  }
  p.length = 8;
  for (uint32_t i = 0; i < p.n; ++i) {
    SeedRandom(0x1d000 + 64 * config + i);
    h.identity_keys.push_back(Must(crypto::GenerateEd25519(), "identity keys"));
    h.identities.push_back(h.identity_keys.back().public_key);
  }
  const crypto::MerkleTree roster = aggregation::RosterTree(h.identities);
  p.roster = roster.root();
  for (uint32_t i = 0; i < p.n; ++i) h.roster_proofs.push_back(roster.Proof(i));
  const std::array<uint8_t, 16> nonce = {1, 2, 3, static_cast<uint8_t>(config)};
  p.context = aggregation::SecAggContext(nonce, /*round=*/1, /*task_id=*/1, p, /*clip=*/4.0f,
                                         /*scale=*/65536.0, /*total_weight=*/10.0);
  for (uint32_t i = 0; i < p.n; ++i) {
    h.inputs.emplace_back(p.length);
    for (size_t j = 0; j < p.length; ++j) h.inputs[i][j] = 1000u * (i + 1) + 7919u * j;
  }
  h.dropped = p.n - 1;

  SecAggServer server(p, h.identities);
  std::vector<std::unique_ptr<SecAggClient>> clients;
  for (uint32_t i = 0; i < p.n; ++i) {
    clients.push_back(
        std::make_unique<SecAggClient>(p, i, &h.identity_keys[i], h.roster_proofs[i]));
    SeedRandom(ClientSeed(config, i));
    h.commits.push_back(Must(clients[i]->CommitSeed(), "CommitSeed"));
    Must(server.OnSeedCommit(h.commits[i]), "OnSeedCommit");
  }
  h.seed_roots = Must(server.CloseSeedCommit(), "CloseSeedCommit");
  for (uint32_t i = 0; i < p.n; ++i) {
    SeedRandom(ClientSeed(config, i) + kAdvertSeedOffset);
    h.adverts.push_back(Must(clients[i]->AdvertiseKeys(h.seed_roots.at(i)), "AdvertiseKeys"));
    Must(server.OnAdvertise(h.adverts[i]), "OnAdvertise");
  }
  h.key_lists = Must(server.CloseAdvertise(), "CloseAdvertise");
  for (uint32_t i = 0; i < p.n; ++i) {
    h.sealed.push_back(Must(clients[i]->ShareKeys(h.key_lists.at(i)), "ShareKeys"));
    h.neighbours.push_back(clients[i]->neighbours());
    Must(server.OnShares(h.sealed[i]), "OnShares");
  }
  h.inbound = Must(server.CloseShares(), "CloseShares");
  for (uint32_t i = 0; i < p.n; ++i) {
    h.checks.push_back(Must(clients[i]->CheckShares(h.inbound[i]), "CheckShares"));
    if (!h.checks[i].complaints.empty()) {
      Fail("CheckShares", InternalError("an honest client complained"));
    }
    Must(server.OnShareCheck(h.checks[i]), "OnShareCheck");
  }
  h.checked = Must(server.CloseShareCheck(), "CloseShareCheck");
  if (!server.TakeMisbehaviour().empty()) {
    Fail("CloseShareCheck", InternalError("an honest client was blamed"));
  }
  for (uint32_t i = 0; i < p.n; ++i) {
    h.confirmations.push_back(Must(clients[i]->ReceiveChecked(h.checked), "ReceiveChecked"));
    Must(server.OnConfirmation(h.confirmations[i]), "OnConfirmation");
  }
  h.confirmed = Must(server.CloseConfirmation(), "CloseConfirmation");
  for (uint32_t i = 0; i < p.n; ++i) {
    Must(clients[i]->ReceiveConfirmations(h.confirmed.at(i)), "ReceiveConfirmations");
    h.masked.push_back(Must(clients[i]->MaskInput(h.inputs[i]), "MaskInput"));
    if (i != h.dropped) Must(server.OnMaskedInput(h.masked[i]), "OnMaskedInput");
  }
  h.survivors = Must(server.CloseMaskedInput(), "CloseMaskedInput");
  for (uint32_t u : h.survivors.survivors) {
    h.signatures[u] = Must(clients[u]->SignSurvivors(h.survivors), "SignSurvivors");
    Must(server.OnSignature(h.signatures[u]), "OnSignature");
  }
  h.requests = Must(server.CloseConsistency(), "CloseConsistency");
  for (uint32_t u : h.survivors.survivors) {
    h.responses[u] = Must(clients[u]->Unmask(h.requests.at(u)), "Unmask");
    Must(server.OnUnmask(CopyResponse(h.responses[u])), "OnUnmask");
  }
  h.sum = Must(server.Finalize(), "Finalize");
  std::vector<uint32_t> expected(p.length, 0);
  for (uint32_t u : h.survivors.survivors) {
    for (size_t j = 0; j < p.length; ++j) expected[j] += h.inputs[u][j];
  }
  if (h.sum != expected) Fail("Finalize", InternalError("the honest sum is wrong"));
  if (!server.TakeMisbehaviour().empty()) {
    Fail("Finalize", InternalError("an honest client was blamed"));
  }
  return h;
}

// --- Edits ---------------------------------------------------------------------

uint32_t AnyIndex(FuzzInput& in, const HonestRound& h) { return in.Below(h.params.n + 2); }

int Edits(FuzzInput& in) { return 1 + in.Byte() % 3; }

void Flip(FuzzInput& in, uint8_t* bytes, size_t size) {
  if (size > 0) bytes[in.Below(static_cast<uint32_t>(size))] ^= in.Byte() | 1;
}

template <typename T>
void FlipArray(FuzzInput& in, T& array) {
  Flip(in, array.data(), array.size());
}

// Overwrites an array with input bytes (zeros past the end of the input).
template <typename T>
void FillArray(FuzzInput& in, T& array) {
  array.fill(0);
  const std::string bytes = in.Bytes(array.size());
  std::memcpy(array.data(), bytes.data(), bytes.size());
}

void EditBytes(FuzzInput& in, std::string& s) {
  switch (in.Byte() % 4) {
    case 0:
      Flip(in, reinterpret_cast<uint8_t*>(s.data()), s.size());
      break;
    case 1:
      s.resize(in.Below(static_cast<uint32_t>(s.size()) + 1));
      break;
    case 2:
      s += in.Bytes(in.Byte() % 64);
      break;
    default:
      s = in.Bytes(in.Byte());
      break;
  }
}

SecretBytes CopySecret(const SecretBytes& s) {
  SecretBytes out(s.size());
  if (!s.empty()) std::memcpy(out.bytes().data(), s.bytes().data(), s.size());
  return out;
}

// The entry at a chosen position of a non-empty map.
template <typename Map>
auto Pick(FuzzInput& in, Map& map) {
  auto it = map.begin();
  std::advance(it, in.Below(static_cast<uint32_t>(map.size())));
  return it;
}

template <typename Vector>
size_t PickIndex(FuzzInput& in, const Vector& v) {
  return in.Below(static_cast<uint32_t>(v.size()));
}

// Ciphertexts keyed by a client index (SealedShares::to, InboundShares::from).
void EditCiphertexts(FuzzInput& in, const HonestRound& h, std::map<uint32_t, std::string>& map) {
  const uint8_t op = in.Byte() % 4;
  if (map.empty() || op == 0) {
    std::string ct = map.empty() ? in.Bytes(in.Byte()) : Pick(in, map)->second;
    map[AnyIndex(in, h)] = std::move(ct);
    return;
  }
  auto it = Pick(in, map);
  switch (op) {
    case 1:
      map.erase(it);
      break;
    case 2:
      EditBytes(in, it->second);
      break;
    default: {  // Re-address.
      std::string ct = std::move(it->second);
      map.erase(it);
      map[AnyIndex(in, h)] = std::move(ct);
      break;
    }
  }
}

}  // namespace

void SeedRandom(uint64_t seed) {
  static const bool installed = [] {
    // Before sodium_init, as libsodium asks.
    return randombytes_set_implementation(&g_seeded) == 0;
  }();
  if (!installed) std::abort();
  g_random_state = seed;
}

const HonestRound& GetHonestRound(int config) {
  static const std::array<HonestRound, kNumConfigs>* rounds = [] {
    auto* out = new std::array<HonestRound, kNumConfigs>;
    for (int c = 0; c < kNumConfigs; ++c) (*out)[c] = Build(c);
    return out;
  }();
  return (*rounds)[config];
}

uint64_t ClientSeed(int config, uint32_t index) { return 0x5ec0000 + 64 * config + index; }

UnmaskResponse CopyResponse(const UnmaskResponse& r) {
  UnmaskResponse out;
  out.from = r.from;
  for (const UnmaskShare& s : r.shares) {
    out.shares.push_back({s.about, s.is_self_mask, CopySecret(s.share), s.proof});
  }
  return out;
}

void MutateAdvert(FuzzInput& in, const HonestRound& h, KeyAdvert& a) {
  for (int e = Edits(in); e > 0; --e) {
    const KeyAdvert& other = h.adverts[in.Below(h.params.n)];
    switch (in.Byte() % 8) {
      case 7:
        if (in.Bool()) {
          FlipArray(in, a.seed);  // No longer what its commitment hides.
        } else {
          FlipArray(in, a.self_commitment);
        }
        break;
      case 0:
        a.index = AnyIndex(in, h);
        break;
      case 1:
        FlipArray(in, a.enc_key);
        break;
      case 2:
        FlipArray(in, a.mask_key);
        break;
      case 3:
        FlipArray(in, a.signature);
        break;
      case 4:  // Another client's key.
        (in.Bool() ? a.enc_key : a.mask_key) = in.Bool() ? other.enc_key : other.mask_key;
        break;
      case 5:
        a.mask_key = a.enc_key;
        break;
      default:  // A low-order point.
        (in.Bool() ? a.enc_key : a.mask_key).fill(0);
        break;
    }
  }
}

// Changes one byte of one digest of a proof, or its length.
void MutateProof(FuzzInput& in, crypto::MerkleProof& proof);
aggregation::SurvivorTag AnyTag(FuzzInput& in, const HonestRound& h);

void MutateSeedRoot(FuzzInput& in, const HonestRound& h, aggregation::SeedRoot& r) {
  for (int e = Edits(in); e > 0; --e) {
    if (in.Bool()) {
      FlipArray(in, r.root);
    } else if (in.Bool()) {
      MutateProof(in, r.proof);
    } else {
      r = Pick(in, h.seed_roots)->second;  // Another client's.
    }
  }
}

void MutateTags(FuzzInput& in, const HonestRound& h,
                std::map<uint32_t, std::array<uint8_t, 32>>& tags) {
  for (int e = Edits(in); e > 0; --e) {
    const uint8_t op = in.Byte() % 3;
    if (op == 0 && !tags.empty()) {
      FlipArray(in, Pick(in, tags)->second);
    } else if (op == 1 && !tags.empty()) {
      tags.erase(Pick(in, tags));
    } else {
      tags[AnyIndex(in, h)] = AnyTag(in, h);
    }
  }
}

void MutateProof(FuzzInput& in, crypto::MerkleProof& proof) {
  if (proof.empty() || in.Bool()) {
    if (!proof.empty() && in.Bool()) {
      proof.pop_back();
    } else {
      proof.push_back({});
    }
    return;
  }
  FlipArray(in, proof[PickIndex(in, proof)]);
}

void MutateKeyList(FuzzInput& in, const HonestRound& h, KeyList& list) {
  for (int e = Edits(in); e > 0; --e) {
    auto& v = list.entries;
    const uint8_t op = in.Byte() % 10;
    if (v.empty() || op == 0) {  // Another client's entry.
      const KeyList& other = Pick(in, h.key_lists)->second;
      if (!other.entries.empty()) v.push_back(other.entries[PickIndex(in, other.entries)]);
      continue;
    }
    const size_t i = PickIndex(in, v);
    const size_t j = PickIndex(in, v);
    switch (op) {
      case 1:
        v.erase(v.begin() + i);
        break;
      case 2:
        v.insert(v.begin() + i, v[j]);
        break;
      case 3:
        std::swap(v[i], v[j]);
        break;
      case 4:
        if (v[i].advert && v[j].advert) std::swap(v[i].advert->enc_key, v[j].advert->enc_key);
        break;
      case 5:
        if (v[i].advert) {
          MutateAdvert(in, h, *v[i].advert);
        } else {
          v[i].advert = h.adverts[v[i].index];
        }
        break;
      case 6:
        v[i].advert.reset();
        break;
      case 7:
        v[i].identity = h.identities[in.Below(h.params.n)];
        break;
      case 8:
        MutateProof(in, in.Bool() ? v[i].identity_proof : v[i].advert_proof);
        break;
      default:
        FlipArray(in, list.advert_root);
        break;
    }
  }
}

void MutateSealed(FuzzInput& in, const HonestRound& h, SealedShares& s) {
  for (int e = Edits(in); e > 0; --e) {
    if (in.Byte() % 4 == 0) {
      s.from = AnyIndex(in, h);
    } else {
      EditCiphertexts(in, h, s.to);
    }
  }
}

void MutateInbound(FuzzInput& in, const HonestRound& h, InboundShares& s) {
  for (int e = Edits(in); e > 0; --e) EditCiphertexts(in, h, s.from);
}

void MutateShareCheck(FuzzInput& in, const HonestRound& h, ShareCheck& c) {
  for (int e = Edits(in); e > 0; --e) {
    auto& v = c.complaints;
    const uint8_t op = in.Byte() % 6;
    if (op == 0) {
      c.from = AnyIndex(in, h);
      continue;
    }
    if (v.empty() || op == 1) {  // A complaint about anyone, maybe with a point.
      Complaint complaint;
      complaint.about = AnyIndex(in, h);
      if (in.Bool()) {
        complaint.point.emplace();
        FillArray(in, *complaint.point);
        FillArray(in, complaint.proof);
      }
      v.push_back(complaint);
      continue;
    }
    Complaint& complaint = v[PickIndex(in, v)];
    switch (op) {
      case 2:
        v.erase(v.begin() + PickIndex(in, v));
        break;
      case 3:
        v.push_back(complaint);
        break;
      case 4:
        complaint.about = AnyIndex(in, h);
        break;
      default:  // Add, drop or edit the point and proof.
        if (!complaint.point) {
          complaint.point.emplace();
          FillArray(in, *complaint.point);
        } else if (in.Bool()) {
          complaint.point.reset();
        } else {
          if (in.Bool()) {
            FlipArray(in, *complaint.point);
          } else {
            FlipArray(in, complaint.proof);
          }
        }
        break;
    }
  }
}

void MutateChecked(FuzzInput& in, const HonestRound& h, CheckedList& list) {
  MutateIndexList(in, h, list.members);
}

void MutateMasked(FuzzInput& in, const HonestRound& h, MaskedInput& m) {
  for (int e = Edits(in); e > 0; --e) {
    switch (in.Byte() % 4) {
      case 0:
        m.from = AnyIndex(in, h);
        break;
      case 1:
        m.values.resize(in.Below(static_cast<uint32_t>(2 * h.params.length + 1)));
        break;
      case 2:
        if (!m.values.empty()) m.values[PickIndex(in, m.values)] ^= in.U32() | 1;
        break;
      default:
        m.values = h.masked[in.Below(h.params.n)].values;
        break;
    }
  }
}

void MutateIndexList(FuzzInput& in, const HonestRound& h, std::vector<uint32_t>& v) {
  for (int e = Edits(in); e > 0; --e) {
    const uint8_t op = in.Byte() % 6;
    if (v.empty() || op == 0) {
      v.push_back(AnyIndex(in, h));
      continue;
    }
    const size_t i = PickIndex(in, v);
    switch (op) {
      case 1:
        v.erase(v.begin() + i);
        break;
      case 2:
        v.insert(v.begin() + i, AnyIndex(in, h));
        break;
      case 3:
        v[i] = AnyIndex(in, h);
        break;
      case 4:
        std::swap(v[i], v[PickIndex(in, v)]);
        break;
      default:
        v.clear();
        break;
    }
  }
}

// A tag the recorded round made (some signer's, for some neighbour), or
// input bytes when there is none.
aggregation::SurvivorTag AnyTag(FuzzInput& in, const HonestRound& h) {
  aggregation::SurvivorTag tag{};
  const SurvivorSignature* sig = h.signatures.empty() ? nullptr : &Pick(in, h.signatures)->second;
  if (sig && !sig->tags.empty()) return Pick(in, sig->tags)->second;
  FillArray(in, tag);
  return tag;
}

void MutateSignature(FuzzInput& in, const HonestRound& h, SurvivorSignature& s) {
  for (int e = Edits(in); e > 0; --e) {
    const uint8_t op = in.Byte() % 7;
    if (op == 5) {  // The tag a request carries for its recipient.
      if (s.tag && in.Bool()) {
        FlipArray(in, *s.tag);
      } else {
        s.tag = in.Bool() ? std::optional(AnyTag(in, h)) : std::nullopt;
      }
    } else if (op == 6) {  // The tags a signer sends.
      if (!s.tags.empty() && in.Bool()) {
        s.tags.erase(Pick(in, s.tags));
      } else {
        s.tags[AnyIndex(in, h)] = AnyTag(in, h);
      }
    } else if (op == 0) {
      s.from = AnyIndex(in, h);
    } else if (op == 3) {
      s.identity = h.identities[in.Below(h.params.n)];
    } else if (op == 4) {
      MutateProof(in, s.identity_proof);
    } else if (op == 1 || h.signatures.empty()) {
      FlipArray(in, s.signature);
    } else {
      s.signature = Pick(in, h.signatures)->second.signature;
    }
  }
}

void MutateRequest(FuzzInput& in, const HonestRound& h, UnmaskRequest& r) {
  for (int e = Edits(in); e > 0; --e) {
    switch (in.Byte() % 6) {
      case 0:
        MutateIndexList(in, h, r.survivors);
        break;
      case 1:
        MutateIndexList(in, h, r.dropped);
        break;
      case 2: {  // Move one client to the other list.
        const bool from_survivors = in.Bool();
        auto& a = from_survivors ? r.survivors : r.dropped;
        auto& b = from_survivors ? r.dropped : r.survivors;
        if (a.empty()) break;
        const size_t i = PickIndex(in, a);
        b.insert(std::upper_bound(b.begin(), b.end(), a[i]), a[i]);
        if (in.Bool()) a.erase(a.begin() + i);
        break;
      }
      case 3:
        if (!r.signatures.empty())
          r.signatures.erase(r.signatures.begin() + PickIndex(in, r.signatures));
        break;
      case 4:
        if (!r.signatures.empty())
          r.signatures.push_back(r.signatures[PickIndex(in, r.signatures)]);
        break;
      default:
        if (!r.signatures.empty())
          MutateSignature(in, h, r.signatures[PickIndex(in, r.signatures)]);
        break;
    }
  }
}

void MutateResponse(FuzzInput& in, const HonestRound& h, UnmaskResponse& r) {
  for (int e = Edits(in); e > 0; --e) {
    auto& v = r.shares;
    const uint8_t op = in.Byte() % 9;
    if (op == 0) {
      r.from = AnyIndex(in, h);
      continue;
    }
    if (v.empty() || op == 1) {  // Another responder's share.
      const UnmaskResponse& other = Pick(in, h.responses)->second;
      if (other.shares.empty()) continue;
      const UnmaskShare& s = other.shares[PickIndex(in, other.shares)];
      v.push_back({s.about, s.is_self_mask, CopySecret(s.share), s.proof});
      continue;
    }
    UnmaskShare& s = v[PickIndex(in, v)];
    switch (op) {
      case 2:
        v.erase(v.begin() + PickIndex(in, v));
        break;
      case 3:
        v.push_back({s.about, s.is_self_mask, CopySecret(s.share), s.proof});
        break;
      case 4:
        s.is_self_mask = !s.is_self_mask;
        break;
      case 5:
        s.about = AnyIndex(in, h);
        break;
      case 6:
        Flip(in, s.share.bytes().data(), s.share.size());
        break;
      case 7:
        // Any byte of the proof: signature, salt, commitment or blob hash.
        static_assert(std::is_trivially_copyable_v<aggregation::DealProof>);
        Flip(in, reinterpret_cast<uint8_t*>(&s.proof), sizeof(s.proof));
        break;
      default: {  // Shorter or longer.
        SecretBytes resized(in.Below(2 * crypto::kShamirShareBytes));
        const size_t keep = std::min(resized.size(), s.share.size());
        if (keep > 0) std::memcpy(resized.bytes().data(), s.share.bytes().data(), keep);
        s.share = std::move(resized);
        break;
      }
    }
  }
}

}  // namespace cohort::fuzz
