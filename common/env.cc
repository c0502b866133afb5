#include "common/env.h"

#include <sodium.h>

#include <chrono>
#include <cstdlib>

#include "common/parallel.h"

namespace cohort {
namespace {

class RealEnv final : public Env {
 public:
  RealEnv() {
    if (sodium_init() < 0) std::abort();  // randombytes needs it on some systems.
  }
  double MonotonicSeconds() override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  uint64_t Random64() override {
    uint64_t v;
    randombytes_buf(&v, sizeof(v));
    return v;
  }
  void RandomBytes(std::span<uint8_t> out) override { randombytes_buf(out.data(), out.size()); }
  spdlog::logger& Log() override { return *spdlog::default_logger_raw(); }
  Status ParallelFor(size_t n, const std::function<Status(size_t)>& fn) override {
    return cohort::ParallelFor(n, fn, 0, /*min_per_thread=*/1);
  }
};

}  // namespace

int64_t Env::UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Env* Env::Default() {
  static RealEnv* env = new RealEnv();  // Never destroyed: used until exit.
  return env;
}

}  // namespace cohort
