// The client half of secure aggregation (aggregation::SecAggClient) against
// a server that may lie.
//
// Input: a configuration byte (see secagg_cohort.h), the client's index,
// then up to kMaxSteps operation bytes: call a stage with the honest
// server message, with an edited copy (edits read from the input), or with
// an input vector of a chosen length. The client is rebuilt with the keys
// it had in the recorded round, so the honest messages fit it. Checks:
//  - calls out of stage order fail; after a failed in-order call every
//    call fails (the client has left the round);
//  - on honest messages, in order, every stage succeeds (except signing
//    and unmasking for the client that dropped);
//  - what ShareKeys seals goes only to neighbours, at the expected size;
//  - CheckShares complains only about senders it was given, and on the
//    honest inbound shares not at all;
//  - Unmask reveals one share per neighbour in the checked list, the
//    self-mask share for survivors and the mask-key share for the dropped
//    only, each with the proof it was dealt with (after an honest history,
//    the dealer's signature), at most once, and only for the survivor list
//    it signed.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "aggregation/secagg.h"
#include "crypto/aead.h"
#include "crypto/keys.h"
#include "crypto/shamir.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/secagg_cohort.h"

namespace cohort::fuzz {
namespace {

using aggregation::SecAggClient;

constexpr int kMaxSteps = 32;
// The AEAD blob (nonce, the two shares each with its commitment's salt,
// tag), the two commitments, then the dealer's one signature.
constexpr size_t kSealedSharesBytes = crypto::kAeadNonceBytes +
                                      2 * (crypto::kShamirShareBytes + 32) + crypto::kAeadTagBytes +
                                      2 * sizeof(aggregation::Commitment) + crypto::kSignatureBytes;

// The stages as the client should see them.
enum class Stage {
  kFresh,
  kAdvertised,
  kShared,
  kShareChecked,
  kReceivedChecked,
  kConfirmed,
  kMasked,
  kSigned,
  kUnmasked,
  kLeft
};

bool Contains(const std::vector<uint32_t>& sorted, uint32_t x) {
  return std::binary_search(sorted.begin(), sorted.end(), x);
}

class ClientRun {
 public:
  ClientRun(int config, uint32_t index, FuzzInput& in)
      : config_(config),
        h_(GetHonestRound(config)),
        index_(index),
        in_(in),
        client_(h_.params, index, &h_.identity_keys[index], h_.roster_proofs[index]) {}

  void Run() {
    for (int step = 0; step < kMaxSteps && !in_.empty(); ++step) {
      Step(static_cast<ClientOp>(in_.Byte() % static_cast<uint8_t>(ClientOp::kNumOps)));
    }
  }

 private:
  // Records the outcome of a call the client should accept only in stage
  // `from` (moving to `to`).
  void Outcome(const Status& status, Stage from, Stage to, bool honest_message) {
    const bool in_order = stage_ == from;
    if (!in_order) {
      FUZZ_CHECK(!status.ok(), "a call out of stage order (or after leaving) succeeded");
      return;
    }
    honest_ = honest_ && honest_message;
    if (status.ok()) {
      stage_ = to;
      return;
    }
    const bool may_fail = index_ == h_.dropped && (to == Stage::kSigned || to == Stage::kUnmasked);
    FUZZ_CHECK(!honest_ || may_fail, "an honest call in order failed: " + status.ToString());
    stage_ = Stage::kLeft;
  }

  void Step(ClientOp op) {
    switch (op) {
      case ClientOp::kAdvertise:
      case ClientOp::kEditedAdvertise: {
        if (stage_ == Stage::kFresh) {
          SeedRandom(ClientSeed(config_, index_));  // The recorded round's contribution.
          auto commit = client_.CommitSeed();
          FUZZ_CHECK(commit.ok() && commit->commitment == h_.commits[index_].commitment,
                     "the seeded client committed to another seed than in the recorded round");
        }
        aggregation::SeedRoot root = h_.seed_roots.at(index_);
        if (op == ClientOp::kEditedAdvertise) MutateSeedRoot(in_, h_, root);
        const bool honest_root = root.root == h_.seed_roots.at(index_).root &&
                                 root.proof == h_.seed_roots.at(index_).proof;
        SeedRandom(ClientSeed(config_, index_) + kAdvertSeedOffset);  // And keys.
        auto advert = client_.AdvertiseKeys(root);
        if (advert.ok()) {
          const auto& recorded = h_.adverts[index_];
          FUZZ_CHECK(advert->enc_key == recorded.enc_key && advert->mask_key == recorded.mask_key,
                     "the seeded client made other keys than in the recorded round");
        }
        Outcome(advert.status(), Stage::kFresh, Stage::kAdvertised, honest_root);
        break;
      }
      case ClientOp::kReceiveConfirmations:
      case ClientOp::kEditedReceiveConfirmations: {
        aggregation::Confirmations c = h_.confirmed.at(index_);
        if (op == ClientOp::kEditedReceiveConfirmations) MutateTags(in_, h_, c.from);
        const Status status = client_.ReceiveConfirmations(c);
        if (status.ok() && stage_ == Stage::kReceivedChecked) {
          // Accepted: t of its neighbours' tags are in it, and checked_.
          uint32_t from_neighbours = 0;
          for (const auto& [u, tag] : c.from) {
            from_neighbours += Contains(h_.neighbours[index_], u) ? 1 : 0;
          }
          FUZZ_CHECK(from_neighbours >= h_.params.t, "masked on fewer than t confirmations");
        }
        Outcome(status, Stage::kReceivedChecked, Stage::kConfirmed,
                op == ClientOp::kReceiveConfirmations);
        break;
      }
      case ClientOp::kShareKeys:
      case ClientOp::kEditedShareKeys: {
        aggregation::KeyList list = h_.key_lists.at(index_);
        if (op == ClientOp::kEditedShareKeys) MutateKeyList(in_, h_, list);
        auto sealed = client_.ShareKeys(list);
        if (sealed.ok()) CheckSealed(*sealed, list);
        Outcome(sealed.status(), Stage::kAdvertised, Stage::kShared, op == ClientOp::kShareKeys);
        break;
      }
      case ClientOp::kCheckShares:
      case ClientOp::kEditedCheckShares: {
        aggregation::InboundShares inbound = h_.inbound.at(index_);
        if (op == ClientOp::kEditedCheckShares) MutateInbound(in_, h_, inbound);
        auto check = client_.CheckShares(inbound);
        if (check.ok()) {
          FUZZ_CHECK(check->from == index_, "share check names another client");
          std::set<uint32_t> about;
          for (const auto& c : check->complaints) {
            FUZZ_CHECK(inbound.from.count(c.about) == 1, "complaint about a client not heard");
            FUZZ_CHECK(about.insert(c.about).second, "two complaints about one client");
          }
          // Only after an honest history: a key list edited where this client
          // does not check it (a non-neighbour's advert) moves the session,
          // and then the honest shares rightly fail their signatures.
          if (op == ClientOp::kCheckShares && honest_) {
            FUZZ_CHECK(check->complaints.empty(), "complained about honest shares");
          }
        }
        Outcome(check.status(), Stage::kShared, Stage::kShareChecked, op == ClientOp::kCheckShares);
        break;
      }
      case ClientOp::kReceiveChecked:
      case ClientOp::kEditedReceiveChecked: {
        aggregation::CheckedList list = h_.checked;
        if (op == ClientOp::kEditedReceiveChecked) MutateChecked(in_, h_, list);
        const Status status = client_.ReceiveChecked(list).status();
        if (status.ok() && stage_ == Stage::kShareChecked) {
          FUZZ_CHECK(Contains(list.members, index_), "accepted a checked list without itself");
          checked_ = list.members;
        }
        Outcome(status, Stage::kShareChecked, Stage::kReceivedChecked,
                op == ClientOp::kReceiveChecked);
        break;
      }
      case ClientOp::kMaskInput: {
        std::vector<uint32_t> input = h_.inputs[index_];
        const bool right_length = in_.Byte() % 4 != 0;
        if (!right_length) input.resize(in_.Below(2 * h_.params.length + 1));
        const bool honest_input = input.size() == h_.params.length;
        auto masked = client_.MaskInput(input);
        if (masked.ok()) {
          FUZZ_CHECK(masked->values.size() == h_.params.length, "masked length");
          if (honest_ && honest_input) {
            FUZZ_CHECK(masked->values == h_.masked[index_].values,
                       "honest messages gave another masked input than recorded");
          }
        }
        Outcome(masked.status(), Stage::kConfirmed, Stage::kMasked, honest_input);
        break;
      }
      case ClientOp::kSignSurvivors:
      case ClientOp::kEditedSignSurvivors: {
        aggregation::SurvivorList list = h_.survivors;
        if (op == ClientOp::kEditedSignSurvivors) MutateIndexList(in_, h_, list.survivors);
        auto signature = client_.SignSurvivors(list);
        if (signature.ok()) {
          FUZZ_CHECK(Contains(list.survivors, index_), "signed a list without this client");
          signed_ = list.survivors;
        }
        Outcome(signature.status(), Stage::kMasked, Stage::kSigned, op == ClientOp::kSignSurvivors);
        break;
      }
      case ClientOp::kUnmask:
      case ClientOp::kEditedUnmask: {
        aggregation::UnmaskRequest request = HonestRequest();
        if (op == ClientOp::kEditedUnmask) MutateRequest(in_, h_, request);
        auto response = client_.Unmask(request);
        if (response.ok()) CheckResponse(*response, request);
        Outcome(response.status(), Stage::kSigned, Stage::kUnmasked, op == ClientOp::kUnmask);
        break;
      }
      case ClientOp::kNumOps:
        break;
    }
  }

  // The recorded request to this client; the dropped client, which got
  // none, is shown another's.
  const aggregation::UnmaskRequest& HonestRequest() const {
    auto it = h_.requests.find(index_);
    return it != h_.requests.end() ? it->second : h_.requests.begin()->second;
  }

  void CheckSealed(const aggregation::SealedShares& sealed, const aggregation::KeyList& list) {
    FUZZ_CHECK(sealed.from == index_, "sealed shares name another sender");
    std::set<uint32_t> listed;
    for (const auto& e : list.entries) {
      if (e.advert) listed.insert(e.index);
    }
    for (const auto& [v, ct] : sealed.to) {
      FUZZ_CHECK(Contains(client_.neighbours(), v) && listed.count(v) == 1,
                 "shares sealed for a client that is not a listed neighbour");
      FUZZ_CHECK(ct.size() == kSealedSharesBytes, "sealed shares of the wrong size");
    }
  }

  void CheckResponse(const aggregation::UnmaskResponse& r,
                     const aggregation::UnmaskRequest& request) {
    FUZZ_CHECK(!unmasked_, "Unmask answered twice");
    unmasked_ = true;
    FUZZ_CHECK(r.from == index_, "response names another client");
    FUZZ_CHECK(Contains(request.survivors, index_), "answered a request that drops this client");
    FUZZ_CHECK(request.survivors == signed_, "answered for a survivor list it did not sign");
    size_t checked_neighbours = 0;
    for (uint32_t v : client_.neighbours()) checked_neighbours += Contains(checked_, v) ? 1 : 0;
    FUZZ_CHECK(r.shares.size() == checked_neighbours, "one share per neighbour in U3");
    std::set<uint32_t> about;
    uint32_t self_shares = 0;
    for (const auto& s : r.shares) {
      FUZZ_CHECK(about.insert(s.about).second, "two shares about one client");
      FUZZ_CHECK(Contains(client_.neighbours(), s.about) && Contains(checked_, s.about),
                 "a share about a client that is not a neighbour in U3");
      const bool survivor = Contains(request.survivors, s.about);
      const bool dropped = Contains(request.dropped, s.about);
      FUZZ_CHECK(survivor != dropped, "a share about a client in both or neither list");
      FUZZ_CHECK(s.is_self_mask == survivor, "revealed the wrong secret's share");
      FUZZ_CHECK(crypto::ShamirShareX(s.share) == index_ + 1, "a share with the wrong x");
      self_shares += s.is_self_mask ? 1 : 0;
    }
    FUZZ_CHECK(self_shares >= h_.params.t, "answered with fewer than t surviving neighbours");
    const aggregation::UnmaskRequest& honest_request = HonestRequest();
    if (honest_ && request.survivors == honest_request.survivors &&
        request.dropped == honest_request.dropped) {
      // The recorded round's shares, each with the dealer's signature.
      const aggregation::UnmaskResponse& recorded = h_.responses.at(index_);
      FUZZ_CHECK(r.shares.size() == recorded.shares.size(), "not the recorded response");
      for (size_t j = 0; j < r.shares.size(); ++j) {
        const auto& a = r.shares[j];
        const auto& b = recorded.shares[j];
        FUZZ_CHECK(a.about == b.about && a.is_self_mask == b.is_self_mask &&
                       a.proof.signature == b.proof.signature && a.proof.other == b.proof.other &&
                       a.proof.blob_hash == b.proof.blob_hash && a.proof.salt == b.proof.salt &&
                       std::equal(a.share.bytes().begin(), a.share.bytes().end(),
                                  b.share.bytes().begin(), b.share.bytes().end()),
                   "honest messages gave another unmask response than recorded");
      }
    }
  }

  const int config_;
  const HonestRound& h_;
  const uint32_t index_;
  FuzzInput& in_;
  SecAggClient client_;
  Stage stage_ = Stage::kFresh;
  bool honest_ = true;             // Every in-order call so far had honest input.
  std::vector<uint32_t> checked_;  // The checked list (U3) it accepted.
  std::vector<uint32_t> signed_;   // The survivor list it signed.
  bool unmasked_ = false;
};

}  // namespace
}  // namespace cohort::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cohort::fuzz::FuzzInput in(data, size);
  const int config = in.Byte() % cohort::fuzz::kNumConfigs;
  const uint32_t index = in.Below(cohort::fuzz::GetHonestRound(config).params.n);
  cohort::fuzz::SeedRandom(size);  // So each input runs alike in every process.
  cohort::fuzz::ClientRun(config, index, in).Run();
  return 0;
}
