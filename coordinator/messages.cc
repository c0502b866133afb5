#include "coordinator/messages.h"

#include <array>

#include "aggregation/secagg_wire.h"
#include "common/bytes.h"
#include "crypto/key_files.h"

namespace cohort::coordinator {

wire::Header NewHeader() {
  wire::Header h;
  h.set_version(wire::VERSION_1);
  return h;
}

Outgoing To(const std::string& peer, wire::Header header) {
  Outgoing o;
  o.peer = peer;
  o.header = std::move(header);
  return o;
}

Outgoing ErrorMessage(const std::string& peer, wire::ErrorCode code, std::string message,
                      uint32_t round) {
  wire::Header h = NewHeader();
  auto* e = h.mutable_error();
  e->set_code(code);
  e->set_message(std::move(message));
  e->set_round(round);
  return To(peer, std::move(h));
}

Outgoing RejectMessage(const std::string& peer, const std::string& reason) {
  wire::Header h = NewHeader();
  h.mutable_reject()->set_reason(reason);
  return To(peer, std::move(h));
}

Outgoing WelcomeMessage(const std::string& peer, const std::string& name,
                        const config::RunConfig& config, uint32_t num_params,
                        const std::string& run_nonce) {
  wire::Header h = NewHeader();
  auto* welcome = h.mutable_welcome();
  welcome->set_run_name(config.name());
  welcome->set_run_nonce(run_nonce);
  welcome->set_client_id(Fnv1a64(name));
  *welcome->mutable_model() = config.model();
  welcome->set_num_params(num_params);
  welcome->set_heartbeat_s(config.net().heartbeat_s());
  return To(peer, std::move(h));
}

std::string NewRunNonce(Env& env) {
  std::array<uint8_t, 16> bytes;
  env.RandomBytes(bytes);
  return crypto::Hex(bytes);
}

std::string KeptOrNewRunNonce(const std::optional<store::RunInfo>& existing, Env& env) {
  if (existing.has_value() && !existing->run_nonce.empty()) return existing->run_nonce;
  return NewRunNonce(env);
}

Outgoing HeartbeatAckMessage(const std::string& peer) {
  wire::Header h = NewHeader();
  h.mutable_heartbeat_ack();
  return To(peer, std::move(h));
}

Outgoing FinishedMessage(const std::string& peer, uint32_t rounds) {
  wire::Header h = NewHeader();
  h.mutable_finished()->set_rounds(rounds);
  return To(peer, std::move(h));
}

Outgoing TaskMessage(const std::string& peer, uint32_t round, uint64_t task_id,
                     wire::RoundTask task, float deadline_s, const aggregation::SecAggSetup* setup,
                     std::shared_ptr<const std::vector<float>> model) {
  wire::Header h = NewHeader();
  auto* t = h.mutable_task();
  *t = std::move(task);
  t->set_round(round);
  t->set_task_id(task_id);
  t->set_deadline_s(deadline_s);
  if (setup != nullptr) *t->mutable_secagg() = aggregation::ToWire(*setup);
  Outgoing o = To(peer, std::move(h));
  o.payload = std::move(model);
  return o;
}

Outgoing SecAggStartMessage(const std::string& peer, uint32_t round, uint64_t task_id,
                            const aggregation::SecAggSetup& setup) {
  wire::Header h = NewHeader();
  auto* s = h.mutable_secagg_start();
  s->set_round(round);
  s->set_task_id(task_id);
  *s->mutable_setup() = aggregation::ToWire(setup);
  return To(peer, std::move(h));
}

}  // namespace cohort::coordinator
