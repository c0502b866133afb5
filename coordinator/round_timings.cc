#include "coordinator/round_timings.h"

#include <utility>

namespace cohort::coordinator {

uint64_t EncodedBytes(const net::Envelope& envelope) {
  uint64_t bytes = envelope.header.ByteSizeLong();
  for (const auto& payload : envelope.payloads) bytes += payload.size() * sizeof(float);
  return bytes;
}

uint64_t EncodedBytes(const Outgoing& message) {
  uint64_t bytes = message.header.ByteSizeLong();
  if (message.payload) bytes += message.payload->size() * sizeof(float);
  return bytes;
}

void RoundTimings::Start(TimeMs now, std::string stage) {
  active_ = true;
  stages_.clear();
  clients_.clear();
  stage_started_ = now;
  stages_.push_back({std::move(stage), 0, 0, 0});
}

void RoundTimings::Enter(TimeMs now, std::string stage) {
  if (!active_) return;
  stages_.back().seconds = double(now - stage_started_) / 1000.0;
  stage_started_ = now;
  stages_.push_back({std::move(stage), 0, 0, 0});
}

void RoundTimings::Received(const std::string* client, uint64_t bytes) {
  if (!active_) return;
  stages_.back().bytes_in += bytes;
  if (client != nullptr) clients_[*client].up += bytes;
}

void RoundTimings::Sent(const std::string* client, uint64_t bytes) {
  if (!active_) return;
  stages_.back().bytes_out += bytes;
  if (client != nullptr) clients_[*client].down += bytes;
}

std::vector<store::StageRecord> RoundTimings::Finish(TimeMs now, double aggregate_seconds) {
  if (!active_) return {};
  active_ = false;
  stages_.back().seconds = double(now - stage_started_) / 1000.0;
  stages_.push_back({"aggregate", aggregate_seconds, 0, 0});
  return std::exchange(stages_, {});
}

uint64_t RoundTimings::UploadBytes(const std::string& client) const {
  auto it = clients_.find(client);
  return it == clients_.end() ? 0 : it->second.up;
}

uint64_t RoundTimings::DownloadBytes(const std::string& client) const {
  auto it = clients_.find(client);
  return it == clients_.end() ? 0 : it->second.down;
}

}  // namespace cohort::coordinator
