#include "net/inprocess_transport.h"

#include <chrono>
#include <string>

namespace cohort::net {

using collective::Transport;

class InProcessTransport final : public Transport {
 public:
  InProcessTransport(InProcessHub* hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size_; }

  Status Send(int peer, std::span<const uint8_t> head, std::span<const uint8_t> body) override {
    if (peer < 0 || peer >= hub_->size_) {
      return InvalidArgumentError("send to rank " + std::to_string(peer) + " of " +
                                  std::to_string(hub_->size_));
    }
    InProcessHub::Inbox& box = *hub_->inboxes_[peer];
    {
      std::lock_guard<std::mutex> lock(box.mu);
      std::vector<uint8_t>& m = box.from[rank_].emplace_back(head.begin(), head.end());
      m.insert(m.end(), body.begin(), body.end());
    }
    box.cv.notify_all();
    return OkStatus();
  }

  StatusOr<collective::Message> Receive(int peer, TimeMs deadline) override {
    if (peer < 0 || peer >= hub_->size_) {
      return InvalidArgumentError("receive from rank " + std::to_string(peer) + " of " +
                                  std::to_string(hub_->size_));
    }
    InProcessHub::Inbox& box = *hub_->inboxes_[rank_];
    std::unique_lock<std::mutex> lock(box.mu);
    auto& queue = box.from[peer];
    for (;;) {
      if (!queue.empty()) {
        collective::Message m(std::move(queue.front()));
        queue.pop_front();
        return m;
      }
      if (hub_->dead_[peer]) return UnavailableError("rank " + std::to_string(peer) + " is gone");
      const TimeMs now = SteadyNowMs();
      if (now >= deadline) {
        return DeadlineExceededError("nothing from rank " + std::to_string(peer) + " in time");
      }
      box.cv.wait_for(lock, std::chrono::milliseconds(deadline - now));
    }
  }

 private:
  InProcessHub* hub_;
  int rank_;
};

InProcessHub::InProcessHub(int size) : size_(size), dead_(new std::atomic<bool>[size]) {
  for (int r = 0; r < size; ++r) {
    inboxes_.push_back(std::make_unique<Inbox>());
    inboxes_.back()->from.resize(size);
    dead_[r] = false;
  }
}

std::unique_ptr<Transport> InProcessHub::Connect(int rank) {
  return std::make_unique<InProcessTransport>(this, rank);
}

void InProcessHub::Kill(int rank) {
  dead_[rank] = true;
  for (auto& box : inboxes_) {
    std::lock_guard<std::mutex> lock(box->mu);
    box->cv.notify_all();
  }
}

}  // namespace cohort::net
