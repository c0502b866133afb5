// The one translation between the secure-aggregation wire messages
// (proto/wire.proto) and the protocol structs of aggregation/secagg.h, used
// by the coordinator and the client alike. Every FromWire takes untrusted
// bytes: a field of the wrong size is kInvalidArgument naming it. The sender
// of a client message is the index of its authenticated connection, never a
// field of the message.
#ifndef COHORT_AGGREGATION_SECAGG_WIRE_H_
#define COHORT_AGGREGATION_SECAGG_WIRE_H_

#include <cstdint>
#include <span>
#include <string>

#include "aggregation/secagg.h"
#include "common/status.h"
#include "proto/wire.pb.h"

namespace cohort::aggregation {

// The round's setup, coordinator -> client. FromWire checks only sizes and
// the mask generator's range ("secagg setup: ..."); whether the numbers are
// safe to take part with is the client's own check.
StatusOr<aggregation::SecAggSetup> FromWire(const wire::SecAggSetup& m);
wire::SecAggSetup ToWire(const aggregation::SecAggSetup& setup);

// The digest of a secure round's task (SecAggSetup::task_digest): the
// model's architecture (the ModelConfig of the Welcome, which says what the
// payload's values are), its training settings, whether it asks for the
// federated evaluation, and its payload (the parameters; with SCAFFOLD the
// server's variate after them). Not the per-client train_seed or deadline.
// The coordinator hashes what it sends, each client what it built and
// received; BLAKE2b, one pass over the payload.
crypto::Digest TaskDigest(const config::ModelConfig& model, const config::TrainConfig& train,
                          bool evaluate, std::span<const float> payload);

// A message's bytes with every field that holds its default left out (and
// message fields left empty): equal for two messages that
// MessageDifferencer's EQUIVALENT calls equal (the resume check's), however
// a config spells them. Neither config message has map fields, so the
// serialization is otherwise its fields in number order.
std::string CanonicalBytes(const google::protobuf::Message& m);

// Client -> coordinator.
StatusOr<aggregation::SeedCommit> FromWire(const wire::SecAggSeed& m, uint32_t from);
StatusOr<aggregation::CheckedConfirmation> FromWire(const wire::SecAggConfirm& m, uint32_t from);
StatusOr<aggregation::KeyAdvert> FromWire(const wire::SecAggKeys& m, uint32_t from);
StatusOr<aggregation::SealedShares> FromWire(const wire::SecAggShares& m, uint32_t from);
StatusOr<aggregation::ShareCheck> FromWire(const wire::SecAggShareCheck& m, uint32_t from);
StatusOr<aggregation::SurvivorSignature> FromWire(const wire::SecAggSignature& m, uint32_t from);
StatusOr<aggregation::UnmaskResponse> FromWire(const wire::SecAggUnmask& m, uint32_t from);

// Coordinator -> client.
StatusOr<aggregation::SeedRoot> FromWire(const wire::SecAggSeed& m);
StatusOr<aggregation::Confirmations> FromWire(const wire::SecAggConfirm& m);
StatusOr<aggregation::KeyList> FromWire(const wire::SecAggKeys& m);
StatusOr<aggregation::InboundShares> FromWire(const wire::SecAggShares& m);
aggregation::CheckedList FromWire(const wire::SecAggChecked& m);
aggregation::SurvivorList FromWire(const wire::SecAggSurvivors& m);
StatusOr<aggregation::UnmaskRequest> FromWire(const wire::SecAggUnmaskRequest& m);

// A server's stage message (`h` one of the bodies above), as the client's
// Handle takes it; kInvalidArgument for any other body. Each list is first
// held to what a cohort of `n` clients with `k` neighbours each can send
// (the key list to k + 1 entries, relayed shares and tags to k, member,
// survivor and seed lists and signatures to n), naming the list: an empty
// entry is 2 bytes on the wire and can be a few hundred bytes copied.
StatusOr<aggregation::SecAggServerMessage> ServerMessageFromWire(const wire::Header& h, uint32_t n,
                                                                 uint32_t k);

// A client's stage message (`h` one of the bodies above), as the server's
// Handle takes it; kInvalidArgument for any other body.
StatusOr<aggregation::SecAggClientMessage> ClientMessageFromWire(const wire::Header& h,
                                                                 uint32_t from);

// Headers (version set) for each direction; `round` and `task_id` name the
// session. SealedShares go to the coordinator keyed by recipient,
// InboundShares to a client keyed by sender.
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::SeedCommit& commit);
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::SeedRoot& root);
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::CheckedConfirmation& c);
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::Confirmations& c);
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::KeyAdvert& advert);
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::KeyList& list);
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::SealedShares& shares);
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::InboundShares& shares);
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::ShareCheck& check);
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::SurvivorSignature& sig);
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::UnmaskRequest& request);
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::UnmaskResponse& response);
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::CheckedList& checked);
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::SurvivorList& survivors);
// Whichever message the server's Close returned.
wire::Header ToWire(uint32_t round, uint64_t task_id, const aggregation::SecAggServerMessage& m);

}  // namespace cohort::aggregation

#endif  // COHORT_AGGREGATION_SECAGG_WIRE_H_
