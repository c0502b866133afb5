// The server half of secure aggregation (aggregation::SecAggServer) against
// clients that may lie.
//
// Input: a configuration byte (see secagg_cohort.h), then up to kMaxSteps
// steps, each an operation byte and a client byte (stage 0, every seed
// commitment, is delivered before them): deliver client i's
// honest message of a stage, deliver an edited copy (the edits read from
// the input), or close a stage. Checks, after every step:
//  - U5 ⊆ U3 ⊆ U2 ⊆ U1 ⊆ [0, n), each sorted and unique;
//  - what a Close returns matches those sets and the graph;
//  - after an abort, and after Finalize, every call fails;
//  - Finalize on honest messages only returns the exact sum of U3's inputs.
#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "aggregation/secagg.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/secagg_cohort.h"

namespace cohort::fuzz {
namespace {

using aggregation::SecAggServer;

constexpr int kMaxSteps = 64;

bool SortedUnique(const std::vector<uint32_t>& v, uint32_t n) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] >= n || (i > 0 && v[i] <= v[i - 1])) return false;
  }
  return true;
}

bool Subset(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  return std::includes(b.begin(), b.end(), a.begin(), a.end());
}

bool Contains(const std::vector<uint32_t>& sorted, uint32_t x) {
  return std::binary_search(sorted.begin(), sorted.end(), x);
}

void CheckSets(const SecAggServer& s, uint32_t n) {
  FUZZ_CHECK(SortedUnique(s.u1(), n) && SortedUnique(s.u2(), n) && SortedUnique(s.u3(), n) &&
                 SortedUnique(s.u4(), n) && SortedUnique(s.u6(), n),
             "client sets must be sorted, unique and < n");
  FUZZ_CHECK(Subset(s.u2(), s.u1()) && Subset(s.u3(), s.u2()) && Subset(s.u4(), s.u3()) &&
                 Subset(s.u6(), s.u4()),
             "client sets must nest");
  for (uint32_t u : s.u3()) FUZZ_CHECK(!s.excluded(u), "an excluded client is in U3");
}

class ServerRun {
 public:
  ServerRun(int config, FuzzInput& in)
      : h_(GetHonestRound(config)), in_(in), server_(h_.params, h_.identities) {
    for (const auto& c : h_.commits) FUZZ_CHECK(server_.OnSeedCommit(c).ok(), "seed commitment");
    auto roots = server_.CloseSeedCommit();
    FUZZ_CHECK(roots.ok() && roots->size() == h_.params.n, "seed roots");
  }

  void Run() {
    for (int step = 0; step < kMaxSteps && !in_.empty(); ++step) {
      const uint8_t op = in_.Byte() % static_cast<uint8_t>(ServerOp::kNumOps);
      const uint32_t i = in_.Below(h_.params.n);
      const bool was_done = done_;
      const Status status = Step(static_cast<ServerOp>(op), i);
      if (was_done) FUZZ_CHECK(!status.ok(), "a call succeeded after an abort or Finalize");
      if (status.code() == StatusCode::kFailedPrecondition &&
          status.message().find("secure aggregation aborted") != std::string::npos) {
        done_ = true;
      }
      CheckSets(server_, h_.params.n);
      CheckBlame(static_cast<ServerOp>(op));
    }
  }

 private:
  Status Step(ServerOp op, uint32_t i) {
    switch (op) {
      case ServerOp::kAdvert:
        return server_.OnAdvertise(h_.adverts[i]);
      case ServerOp::kEditedAdvert: {
        aggregation::KeyAdvert a = h_.adverts[i];
        MutateAdvert(in_, h_, a);
        tampered_ = true;
        return server_.OnAdvertise(a);
      }
      case ServerOp::kCloseAdvertise:
        return CloseAdvertise();
      case ServerOp::kShares:
        return server_.OnShares(h_.sealed[i]);
      case ServerOp::kEditedShares: {
        aggregation::SealedShares s = h_.sealed[i];
        MutateSealed(in_, h_, s);
        tampered_ = true;
        const Status status = server_.OnShares(s);
        if (status.ok()) edited_shares_ = true;
        return status;
      }
      case ServerOp::kCloseShares:
        return CloseShares();
      case ServerOp::kShareCheck:
        return server_.OnShareCheck(h_.checks[i]);
      case ServerOp::kEditedShareCheck: {
        aggregation::ShareCheck c = h_.checks[i];
        MutateShareCheck(in_, h_, c);
        tampered_ = true;
        last_check_from_ = c.from;
        return server_.OnShareCheck(c);
      }
      case ServerOp::kCloseShareCheck:
        return CloseShareCheck();
      case ServerOp::kConfirm:
        return server_.OnConfirmation(h_.confirmations[i]);
      case ServerOp::kEditedConfirm: {
        aggregation::CheckedConfirmation c = h_.confirmations[i];
        if (in_.Byte() % 4 == 0) c.from = in_.Below(h_.params.n + 2);
        MutateTags(in_, h_, c.tags);
        tampered_ = true;
        return server_.OnConfirmation(c);
      }
      case ServerOp::kCloseConfirmation:
        return CloseConfirmation();
      case ServerOp::kMasked:
        return server_.OnMaskedInput(h_.masked[i]);
      case ServerOp::kEditedMasked: {
        aggregation::MaskedInput m = h_.masked[i];
        MutateMasked(in_, h_, m);
        tampered_ = true;
        return server_.OnMaskedInput(m);
      }
      case ServerOp::kRawMasked: {  // Straight from a frame: any length, any alignment.
        const uint32_t from = in_.Below(h_.params.n + 2);
        const std::string frame = " " + in_.Bytes(in_.Below(8 * h_.params.length + 1));
        tampered_ = true;
        return server_.OnMaskedInput(
            from, {reinterpret_cast<const uint8_t*>(frame.data()) + 1, frame.size() - 1});
      }
      case ServerOp::kCloseMaskedInput:
        return CloseMaskedInput();
      case ServerOp::kSignature: {
        auto it = h_.signatures.find(i);
        if (it == h_.signatures.end()) return FailedPreconditionError("no honest signature");
        return server_.OnSignature(it->second);
      }
      case ServerOp::kEditedSignature: {
        auto it = h_.signatures.find(i);
        aggregation::SurvivorSignature s;
        s.from = i;
        if (it != h_.signatures.end()) s = it->second;
        MutateSignature(in_, h_, s);
        tampered_ = true;
        return server_.OnSignature(s);
      }
      case ServerOp::kCloseConsistency:
        return CloseConsistency();
      case ServerOp::kUnmask: {
        auto it = h_.responses.find(i);
        if (it == h_.responses.end()) return FailedPreconditionError("no honest response");
        return server_.OnUnmask(CopyResponse(it->second));
      }
      case ServerOp::kEditedUnmask: {
        auto it = h_.responses.find(i);
        aggregation::UnmaskResponse r = it != h_.responses.end()
                                            ? CopyResponse(it->second)
                                            : CopyResponse(h_.responses.begin()->second);
        MutateResponse(in_, h_, r);
        tampered_ = true;
        return server_.OnUnmask(std::move(r));
      }
      case ServerOp::kFinalize:
        return Finalize();
      case ServerOp::kNumOps:
        break;
    }
    return InternalError("unreachable");
  }

  // After every step: who was blamed. With honest sealed shares only, a
  // complaint is false, so only its sender can be blamed.
  void CheckBlame(ServerOp op) {
    for (const aggregation::Misbehaviour& m : server_.TakeMisbehaviour()) {
      FUZZ_CHECK(m.client < h_.params.n, "blamed a client outside the cohort");
      FUZZ_CHECK(blamed_.insert(m.client).second, "blamed one client twice");
      if (!edited_shares_ && op == ServerOp::kEditedShareCheck) {
        FUZZ_CHECK(m.client == last_check_from_,
                   "a complaint about honest shares blamed the accused: " + m.what);
      }
      // The seed needs every committed contribution: closing stage 1
      // without one names the silent committer (sparse graphs).
      if (op == ServerOp::kCloseAdvertise && m.what.find("never revealed") != std::string::npos) {
        FUZZ_CHECK(!Contains(server_.u1(), m.client), "a client in U1 blamed for silence");
        continue;
      }
      FUZZ_CHECK(tampered_, "honest messages got a client blamed: " + m.what);
    }
  }

  Status CloseAdvertise() {
    auto lists = server_.CloseAdvertise();
    if (!lists.ok()) return lists.status();
    std::vector<uint32_t> recipients;
    for (const auto& [u, list] : *lists) {
      recipients.push_back(u);
      FUZZ_CHECK(list.advert_root == lists->begin()->second.advert_root,
                 "two clients were shown different advert roots");
      for (const auto& e : list.entries) {
        FUZZ_CHECK(e.advert.has_value() == Contains(server_.u1(), e.index),
                   "a key list shows an advert outside U1 or hides one in it");
      }
    }
    FUZZ_CHECK(recipients == server_.u1(), "key lists must go to U1");
    FUZZ_CHECK(server_.u1().size() >= h_.params.t, "closed with fewer than t adverts");
    recorded_graph_ =
        lists->begin()->second.advert_root == h_.key_lists.begin()->second.advert_root;
    return OkStatus();
  }

  Status CloseShares() {
    auto inbound = server_.CloseShares();
    if (!inbound.ok()) return inbound.status();
    FUZZ_CHECK(server_.u2().size() >= h_.params.t, "closed with fewer than t share sets");
    std::vector<uint32_t> recipients;
    for (const auto& [v, shares] : *inbound) {
      recipients.push_back(v);
      for (const auto& [u, ct] : shares.from) {
        FUZZ_CHECK(Contains(server_.u2(), u), "relayed shares from a client not in U2");
        if (recorded_graph_) {
          FUZZ_CHECK(Contains(h_.neighbours[u], v), "relayed shares between non-neighbours");
        }
      }
    }
    FUZZ_CHECK(recipients == server_.u2(), "shares must go to exactly U2");
    return OkStatus();
  }

  Status CloseShareCheck() {
    auto list = server_.CloseShareCheck();
    if (!list.ok()) return list.status();
    FUZZ_CHECK(list->members == server_.u3(), "the checked list must be U3");
    FUZZ_CHECK(server_.u3().size() >= h_.params.t, "closed with fewer than t checked clients");
    return OkStatus();
  }

  Status CloseConfirmation() {
    auto confirmed = server_.CloseConfirmation();
    if (!confirmed.ok()) return confirmed.status();
    FUZZ_CHECK(confirmed->size() >= h_.params.t, "closed with fewer than t confirmations");
    for (const auto& [v, c] : *confirmed) {
      FUZZ_CHECK(Contains(server_.u3(), v), "confirmations sent outside U3");
      for (const auto& [u, tag] : c.from) {
        FUZZ_CHECK(Contains(server_.u3(), u), "a confirmation relayed from outside U3");
        if (recorded_graph_) {
          FUZZ_CHECK(Contains(h_.neighbours[u], v), "a confirmation relayed to a non-neighbour");
        }
      }
    }
    return OkStatus();
  }

  Status CloseMaskedInput() {
    auto list = server_.CloseMaskedInput();
    if (!list.ok()) return list.status();
    FUZZ_CHECK(list->survivors == server_.u4(), "the survivor list must be U4");
    FUZZ_CHECK(server_.u4().size() >= h_.params.t, "closed with fewer than t inputs");
    return OkStatus();
  }

  Status CloseConsistency() {
    auto requests = server_.CloseConsistency();
    if (!requests.ok()) return requests.status();
    FUZZ_CHECK(server_.u4().size() >= h_.params.t, "closed with fewer than t survivors");
    std::vector<uint32_t> dropped, recipients;
    std::set_difference(server_.u3().begin(), server_.u3().end(), server_.u4().begin(),
                        server_.u4().end(), std::back_inserter(dropped));
    for (const auto& [u, request] : *requests) {
      recipients.push_back(u);
      FUZZ_CHECK(request.survivors == server_.u4(), "the request's survivors must be U4");
      FUZZ_CHECK(request.dropped == dropped, "the request's dropped list must be U3 \\ U4");
      for (const auto& s : request.signatures) {
        FUZZ_CHECK(Contains(server_.u4(), s.from), "a signature from outside U4");
        FUZZ_CHECK(s.identity == h_.identities[s.from], "a signature under another's key");
      }
    }
    FUZZ_CHECK(recipients == server_.u4(), "unmask requests must go to U4");
    return OkStatus();
  }

  Status Finalize() {
    auto sum = server_.Finalize();
    if (!sum.ok()) return sum.status();
    FUZZ_CHECK(sum->size() == h_.params.length, "sum length");
    if (!tampered_) {
      std::vector<uint32_t> expected(h_.params.length, 0);
      for (uint32_t u : server_.u4()) {
        for (size_t j = 0; j < expected.size(); ++j) expected[j] += h_.inputs[u][j];
      }
      FUZZ_CHECK(*sum == expected, "honest messages gave a wrong sum");
    }
    done_ = true;
    return OkStatus();
  }

  const HonestRound& h_;
  FuzzInput& in_;
  SecAggServer server_;
  bool recorded_graph_ = false;  // U1 is the recorded key list (so is the graph).
  bool tampered_ = false;        // An edited message was delivered.
  bool edited_shares_ = false;   // An edited set of sealed shares was accepted.
  uint32_t last_check_from_ = 0;
  std::set<uint32_t> blamed_;
  bool done_ = false;  // Aborted or finalized.
};

}  // namespace
}  // namespace cohort::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cohort::fuzz::FuzzInput in(data, size);
  const int config = in.Byte() % cohort::fuzz::kNumConfigs;
  (void)cohort::fuzz::GetHonestRound(config);  // Built once, under its own seeds.
  cohort::fuzz::SeedRandom(size);              // So each input runs alike in every process.
  cohort::fuzz::ServerRun(config, in).Run();
  return 0;
}
