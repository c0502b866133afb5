// aggregation/secagg_wire.h's translations of every secure-aggregation message a
// peer can send, from untrusted bytes to the structs the state machines
// take: what the coordinator and the client run before secagg_server_fuzz
// and secagg_client_fuzz's handlers see anything.
//
// Input: one byte, the client index the coordinator attributes the message
// to (its connection's), then a serialized wire.Header. Every translation
// that applies to the header's body runs (an advert and a key list share
// wire.SecAggKeys, sealed and inbound shares wire.SecAggShares). Checks:
//  - a refused message gets an error that says what was wrong;
//  - a message translated from a client is that client's (the struct's
//    sender, an advert's index), whatever the message says;
//  - a translated struct survives ToWire + FromWire: it translates again,
//    to the same wire bytes.
#include <google/protobuf/stubs/logging.h>

#include <string>
#include <utility>

#include "aggregation/secagg_wire.h"
#include "tests/fuzz/fuzz_input.h"

namespace cohort::fuzz {
namespace {

constexpr uint32_t kRound = 7;
constexpr uint64_t kTask = 9;

template <typename Repeated>
size_t Count(const Repeated& r) {
  return static_cast<size_t>(r.size());
}

// Refused: says why. Accepted: `kept(x, header)` holds for the message and
// for ToWire's rendering of x, and `translate` on that rendering gives a
// struct with the same wire form.
template <typename T, typename Translate, typename Kept>
void RoundTrip(const StatusOr<T>& x, const wire::Header& h, Translate translate, Kept kept) {
  if (!x.ok()) {
    FUZZ_CHECK(!x.status().message().empty(), "a refusal must say what was wrong");
    return;
  }
  kept(*x, h);
  const wire::Header once = aggregation::ToWire(kRound, kTask, *x);
  kept(*x, once);
  const StatusOr<T> again = translate(once);
  FUZZ_CHECK(again.ok(), "ToWire's output must translate: " + again.status().ToString());
  FUZZ_CHECK(
      aggregation::ToWire(kRound, kTask, *again).SerializeAsString() == once.SerializeAsString(),
      "the struct changed in a ToWire + FromWire round trip");
}

void KeptAdvert(const aggregation::KeyAdvert& a, const wire::Header& h, uint32_t from) {
  FUZZ_CHECK(a.index == from && h.secagg_keys().adverts_size() == 1 &&
                 h.secagg_keys().adverts(0).index() == from,
             "an advert is its sender's");
}

void KeptSealed(const aggregation::SealedShares& s, const wire::Header& h, uint32_t from) {
  FUZZ_CHECK(s.from == from, "sealed shares are their sender's");
  FUZZ_CHECK(s.to.size() == Count(h.secagg_shares().shares()),
             "every sealed share is kept, none twice");
}

void KeptCheck(const aggregation::ShareCheck& c, const wire::Header& h, uint32_t from) {
  FUZZ_CHECK(c.from == from, "complaints are their sender's");
  const auto& w = h.secagg_share_check().complaints();
  FUZZ_CHECK(c.complaints.size() == Count(w), "every complaint is kept");
  for (int i = 0; i < w.size(); ++i) {
    FUZZ_CHECK(c.complaints[i].about == w.Get(i).about() &&
                   c.complaints[i].point.has_value() == !w.Get(i).point().empty(),
               "a complaint keeps whom it is about and its point");
  }
}

void KeptSignature(const aggregation::SurvivorSignature& s, const wire::Header& h, uint32_t from) {
  FUZZ_CHECK(s.from == from, "a survivor signature is its sender's");
  const auto& w = h.secagg_signature().tags();
  FUZZ_CHECK(s.tags.size() == Count(w), "every tag is kept, none twice");
  for (const auto& t : w) FUZZ_CHECK(s.tags.count(t.to()) == 1, "a tag keeps its recipient");
}

void KeptResponse(const aggregation::UnmaskResponse& r, const wire::Header& h, uint32_t from) {
  FUZZ_CHECK(r.from == from, "unmasking shares are their sender's");
  const auto& w = h.secagg_unmask().shares();
  FUZZ_CHECK(r.shares.size() == Count(w), "every unmasking share is kept");
  for (int i = 0; i < w.size(); ++i) {
    FUZZ_CHECK(
        r.shares[i].about == w.Get(i).about() && r.shares[i].is_self_mask == w.Get(i).self_mask(),
        "a share keeps whom it is about and its kind");
  }
}

void KeptCommit(const aggregation::SeedCommit& c, const wire::Header&, uint32_t from) {
  FUZZ_CHECK(c.from == from, "a seed commitment is its sender's");
}

void KeptConfirmation(const aggregation::CheckedConfirmation& c, const wire::Header& h,
                      uint32_t from) {
  FUZZ_CHECK(c.from == from, "a confirmation is its sender's");
  FUZZ_CHECK(c.tags.size() == Count(h.secagg_confirm().tags()), "every tag is kept, none twice");
}

void KeptRoot(const aggregation::SeedRoot& r, const wire::Header& h) {
  FUZZ_CHECK(r.proof.size() == Count(h.secagg_seed().proof()), "every proof sibling is kept");
}

void KeptConfirmations(const aggregation::Confirmations& c, const wire::Header& h) {
  FUZZ_CHECK(c.from.size() == Count(h.secagg_confirm().tags()), "every tag is kept, none twice");
}

void KeptList(const aggregation::KeyList& l, const wire::Header& h) {
  FUZZ_CHECK(l.seeds.size() == Count(h.secagg_keys().seeds()), "every seed contribution is kept");
  const auto& w = h.secagg_keys().listed();
  FUZZ_CHECK(l.entries.size() == Count(w), "every entry is kept");
  for (int i = 0; i < w.size(); ++i) {
    FUZZ_CHECK(l.entries[i].index == w.Get(i).index() &&
                   l.entries[i].advert.has_value() == w.Get(i).has_advert(),
               "an entry keeps its index and whether it has an advert");
  }
}

void KeptInbound(const aggregation::InboundShares& s, const wire::Header& h) {
  FUZZ_CHECK(s.from.size() == Count(h.secagg_shares().shares()),
             "every inbound share is kept, none twice");
}

void KeptRequest(const aggregation::UnmaskRequest& r, const wire::Header& h) {
  const auto& m = h.secagg_unmask_request();
  FUZZ_CHECK(r.survivors.size() == Count(m.survivors()) && r.dropped.size() == Count(m.dropped()),
             "both lists are kept");
  FUZZ_CHECK(r.signatures.size() == Count(m.signatures()), "every signature is kept");
  for (int i = 0; i < m.signatures_size(); ++i) {
    FUZZ_CHECK(r.signatures[i].from == m.signatures(i).index() &&
                   r.signatures[i].tag.has_value() == !m.signatures(i).tag().empty(),
               "a signature keeps its signer and its tag");
  }
}

// What the coordinator translates, as from client `from`.
void FromClient(const wire::Header& h, uint32_t from) {
  auto with_from = [from](auto kept) {
    return [from, kept](const auto& x, const wire::Header& w) { kept(x, w, from); };
  };
  switch (h.body_case()) {
    case wire::Header::kSecaggSeed:
      RoundTrip(
          aggregation::FromWire(h.secagg_seed(), from), h,
          [&](const wire::Header& w) { return aggregation::FromWire(w.secagg_seed(), from); },
          with_from(KeptCommit));
      return;
    case wire::Header::kSecaggConfirm:
      RoundTrip(
          aggregation::FromWire(h.secagg_confirm(), from), h,
          [&](const wire::Header& w) { return aggregation::FromWire(w.secagg_confirm(), from); },
          with_from(KeptConfirmation));
      return;
    case wire::Header::kSecaggKeys:
      RoundTrip(
          aggregation::FromWire(h.secagg_keys(), from), h,
          [&](const wire::Header& w) { return aggregation::FromWire(w.secagg_keys(), from); },
          with_from(KeptAdvert));
      return;
    case wire::Header::kSecaggShares:
      RoundTrip(
          aggregation::FromWire(h.secagg_shares(), from), h,
          [&](const wire::Header& w) { return aggregation::FromWire(w.secagg_shares(), from); },
          with_from(KeptSealed));
      return;
    case wire::Header::kSecaggShareCheck:
      RoundTrip(
          aggregation::FromWire(h.secagg_share_check(), from), h,
          [&](const wire::Header& w) {
            return aggregation::FromWire(w.secagg_share_check(), from);
          },
          with_from(KeptCheck));
      return;
    case wire::Header::kSecaggSignature:
      RoundTrip(
          aggregation::FromWire(h.secagg_signature(), from), h,
          [&](const wire::Header& w) { return aggregation::FromWire(w.secagg_signature(), from); },
          with_from(KeptSignature));
      return;
    case wire::Header::kSecaggUnmask:
      RoundTrip(
          aggregation::FromWire(h.secagg_unmask(), from), h,
          [&](const wire::Header& w) { return aggregation::FromWire(w.secagg_unmask(), from); },
          with_from(KeptResponse));
      return;
    default:
      return;
  }
}

// What a client translates.
void FromCoordinator(const wire::Header& h) {
  switch (h.body_case()) {
    case wire::Header::kSecaggSeed:
      RoundTrip(
          aggregation::FromWire(h.secagg_seed()), h,
          [](const wire::Header& w) { return aggregation::FromWire(w.secagg_seed()); }, KeptRoot);
      return;
    case wire::Header::kSecaggConfirm:
      RoundTrip(
          aggregation::FromWire(h.secagg_confirm()), h,
          [](const wire::Header& w) { return aggregation::FromWire(w.secagg_confirm()); },
          KeptConfirmations);
      return;
    case wire::Header::kSecaggKeys:
      RoundTrip(
          aggregation::FromWire(h.secagg_keys()), h,
          [](const wire::Header& w) { return aggregation::FromWire(w.secagg_keys()); }, KeptList);
      return;
    case wire::Header::kSecaggShares:
      RoundTrip(
          aggregation::FromWire(h.secagg_shares()), h,
          [](const wire::Header& w) { return aggregation::FromWire(w.secagg_shares()); },
          KeptInbound);
      return;
    case wire::Header::kSecaggUnmaskRequest:
      RoundTrip(
          aggregation::FromWire(h.secagg_unmask_request()), h,
          [](const wire::Header& w) { return aggregation::FromWire(w.secagg_unmask_request()); },
          KeptRequest);
      return;
    case wire::Header::kSecaggChecked:
      FUZZ_CHECK(aggregation::FromWire(h.secagg_checked()).members.size() ==
                     Count(h.secagg_checked().members()),
                 "every member is kept");
      return;
    case wire::Header::kSecaggSurvivors:
      FUZZ_CHECK(aggregation::FromWire(h.secagg_survivors()).survivors.size() ==
                     Count(h.secagg_survivors().survivors()),
                 "every survivor is kept");
      return;
    default:
      return;
  }
}

void Run(FuzzInput& in) {
  // Headers that fail to parse would each log an error line.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  const uint32_t from = in.Byte();
  const std::span<const uint8_t> bytes = in.Rest();
  wire::Header h;
  if (!h.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  FromClient(h, from);
  FromCoordinator(h);
}

}  // namespace
}  // namespace cohort::fuzz

COHORT_FUZZ_ENTRY_POINT(Run)
