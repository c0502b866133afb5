// Secure aggregation: SecAgg (Bonawitz et al., CCS 2017) over the k-regular
// Harary graph of SecAgg+ (Bell et al., CCS 2020), as two sans-I/O state
// machines, hardened against a malicious server and malicious clients.
// Messages are plain structs; the daemons carry them over the wire.
//
// The server learns only the sum (mod 2^32) of the inputs of the clients
// that survived to the masked-input stage. Clients are indexed 0..n-1; client
// i uses Shamir x-coordinate i + 1.
//
// Stages:
//   0 CommitSeed      client -> server: a commitment to a fresh 32-byte
//                     contribution to the neighbour graph's seed.
//     server -> each: the Merkle root over every commitment (one leaf per
//                     roster position, empty where none came) and the
//                     client's own proof. The server fixes the root before
//                     it has seen any contribution, so it cannot choose
//                     among graph seeds (docs/architecture.md).
//   1 AdvertiseKeys   client -> server: its seed contribution, a fresh
//                     ristretto255 encryption key,
//                     an X25519 mask key (derived from a 32-byte seed) and a
//                     commitment to a fresh self-mask seed b, signed with the
//                     client's Ed25519 identity. The server checks every key.
//     server -> each: the Merkle root over every advert (U1; one leaf per
//                     roster position, empty where none came), the
//                     client's own and its neighbours' adverts with their
//                     identity keys, each proven against that root and the
//                     roster's, and every committed contribution (32 bytes
//                     a client). Each client rebuilds the commitment root
//                     from them; the graph is seeded by all of them, and
//                     each party computes its own neighbours in O(k)
//                     (harary_graph.h). No message to a client grows with n
//                     but the contributions and the survivor lists.
//   2 ShareKeys       client -> server: for each neighbour in U1, its shares
//                     of the mask seed and of b, sealed with
//                     XChaCha20-Poly1305, beside salted commitments to both
//                     shares, under one dealer signature over the sealed
//                     blob's hash and the two commitments.
//     server -> each: the ciphertexts addressed to it from U2.
//   3 CheckShares     client -> server: the shares it could not open, each a
//                     complaint the server can verify (a bad signature, or
//                     the shared point with a proof). The server drops
//                     whichever side lied. Only these shares' signatures
//                     are verified: shares that open are the dealer's.
//     server -> all:  U3, the clients of U2 that passed the check.
//   3b ConfirmChecked client -> server: for each neighbour in U3, a tag over
//                     U3 keyed by the pair's sealing key (as in stage 5).
//     server -> each: the tags addressed to it. A client masks only when t
//                     of its neighbours confirmed the very U3 it holds, so
//                     the server cannot show it a checked list of its own.
//   4 MaskedInput     client -> server: x + PRG(b) + sum over neighbours v
//                     in U3 of +-PRG(k_uv) (mod 2^32; + when u < v).
//     server -> all:  U4 (who sent a masked input).
//   5 Consistency     client -> server: a signature over U4, and for each
//                     neighbour in U4 a tag over U4 keyed by the pair's
//                     sealing key (SurvivorTag).
//   6 Unmasking       server -> U4: U4, dropped D = U3 \ U4, the signatures
//                     of its neighbours' neighbours with their identity keys
//                     proven against the roster root, and the tags those
//                     signers made for the recipient. A tag that checks
//                     stands for its signature; a bad one costs only the
//                     signature's check.
//                     client -> server: per neighbour exactly one share: b
//                     for survivors, the mask seed for the dropped.
//
// Threat model (docs/architecture.md): a server colluding with at most
// c_max of any client's k neighbours learns nothing about an honest
// client's input beyond the sum. The threshold is t = floor((k + c_max)/2)
// + 1, so no two disjoint sets of honest neighbours can each complete a
// threshold with the corrupt ones: a server that shows different clients
// different lists still collects t shares of at most one of b_v and the
// mask seed of v. On top, a client reveals a share about v only when t of
// v's neighbours signed the same U4.
//
// Where each part lives: secagg_params.h (choosing and checking n, k, t),
// secagg_messages.h (the stage messages), secagg_derivations.h (what every
// party derives alike), secagg_client.h and secagg_server.h (the two
// machines), secagg_wire.h (their wire form). This header includes them all.
#ifndef COHORT_AGGREGATION_SECAGG_H_
#define COHORT_AGGREGATION_SECAGG_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "aggregation/aggregator.h"
#include "aggregation/fixed_point.h"
#include "aggregation/secagg_client.h"
#include "aggregation/secagg_derivations.h"
#include "aggregation/secagg_messages.h"
#include "aggregation/secagg_params.h"
#include "aggregation/secagg_server.h"
#include "common/env.h"
#include "common/status.h"
#include "crypto/keys.h"

namespace cohort::aggregation {

// Distributed DP (privacy/skellam.h): dp_grid > 0 says the delta's words
// are the clients' noised integers on that grid.
// count_grid > 0: adaptive clipping's count word follows the delta (the
// clients' noised bits on that grid, privacy::EncodeClipBit).
struct DistributedDpDecoding {
  double dp_grid = 0;
  double dp_denominator = 0;
  double count_grid = 0;
};

// The hub's secure sum behind the Aggregator interface (aggregator.h):
// Accept takes a masked input, Finalize unmasks and decodes the weighted
// means (the delta, and the metrics from the slots after it). The stages
// around the input are driven through secagg(). `params.length` is
// num_params + kSecureMetricSlots (+ kSecureEvalSlots with the federated
// evaluation, + kSecureFedNovaSlots with FedNova, fednova.h, in that
// order); `cohort_weight` is W, the sum of the
// cohort's registered sample counts that clients weigh their inputs by.
//
// With `ddp`.dp_grid > 0 the delta is decoded as int32(sum) /
// dp_grid / dp_denominator (the cohort: DP-FedAvg's fixed denominator,
// coordinator/strategy_dp.h) instead of the weighted mean. With
// `ddp`.count_grid > 0 the word after the delta is the count's
// (params.length has one more), decoded into RoundMean::dp_clip_count as
// int32(sum) / count_grid, and the slots follow it.
StatusOr<std::unique_ptr<Aggregator>> NewSecureAggregator(
    const SecAggParams& params, std::vector<crypto::Ed25519Public> identities,
    const FixedPoint& fixed_point, double cohort_weight, size_t num_params,
    Env* env = Env::Default(), DistributedDpDecoding ddp = {});

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_SECAGG_H_
