// The coordinator's own time per round: everything except client training.
// Drives the real RoundEngine over a real SQLite run store (WAL, synchronous
// FULL) with the real test-set evaluator, and puts every message through the
// wire encoding: encode N tasks (model copies), decode N updates, aggregate,
// server step, evaluate on the 10k Fashion-MNIST test images, commit.
// Client deltas are made once up front (they stand for client training).
//
//   round_bench [--clients N] [--rounds R] [--params mlp|logreg]
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "common/clock.h"
#include "common/rng.h"
#include "coordinator/round_engine.h"
#include "datasets/idx.h"
#include "net/zmq_codec.h"
#include "store/run_store.h"
#include "train/backend.h"
#include "train/model.h"
#include "train/model_config.h"
#include "train/trainer.h"

using namespace cohort;

int main(int argc, char** argv) {
  int clients = 10, rounds = 5;
  std::string arch = "mlp";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--clients"))
      clients = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds"))
      rounds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--model"))
      arch = argv[i + 1];
  }
  spdlog::set_level(spdlog::level::warn);
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  auto host_test =
      datasets::ReadIdx(dir + "/t10k-images-idx3-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz");
  if (!host_test.ok()) return 1;
  config::RunConfig cfg;
  // The plain round: secure aggregation (the default) needs identity keys
  // and the five-stage protocol, which secagg_bench measures.
  cfg.mutable_secagg()->set_aggregation(config::PLAIN);
  cfg.mutable_model()->set_arch(arch);
  if (arch == "mlp") {
    cfg.mutable_model()->add_hidden(200);
    cfg.mutable_model()->add_hidden(200);
  }
  auto backend = std::move(train::NewCpuBackend(1)).value();
  auto model = std::move(train::BuildModel(cfg.model(), backend.get())).value();
  auto test = std::move(train::DeviceDataset::Upload(backend.get(), *host_test)).value();
  std::vector<float> init(model->num_params());
  model->Init(init, 0);
  cfg.mutable_rounds()->set_num_rounds(rounds);
  cfg.mutable_rounds()->set_min_clients(clients);
  const std::string run_dir =
      std::filesystem::temp_directory_path() / ("cohort_round_bench_" + std::to_string(getpid()));
  std::filesystem::create_directories(run_dir);
  auto store = std::move(store::OpenSqliteRunStore(run_dir + "/run.db")).value();
  coordinator::Evaluator eval =
      [&](std::span<const float> p) -> StatusOr<coordinator::EvalMetrics> {
    COHORT_ASSIGN_OR_RETURN(train::EvalResult r, train::Evaluate(*model, p, *test));
    return coordinator::EvalMetrics{r.loss, r.accuracy};
  };
  auto engine =
      std::move(coordinator::RoundEngine::Create(cfg, init, store.get(), eval, "bench")).value();
  // Pre-made client deltas (small random steps).
  Rng rng(1);
  std::vector<std::vector<float>> deltas(clients, std::vector<float>(init.size()));
  for (auto& d : deltas)
    for (float& v : d) v = static_cast<float>(rng.Normal()) * 1e-3f;
  const net::Limits limits = engine->limits();

  std::vector<coordinator::Outgoing> pending;
  auto deliver = [&](const std::string& peer, const net::Envelope& e) {
    for (auto& o : engine->OnMessage(peer, e, SteadyNowMs())) pending.push_back(std::move(o));
  };
  for (int k = 0; k < clients; ++k) {
    net::Envelope hello;
    hello.header.set_version(wire::VERSION_1);
    hello.header.mutable_hello()->set_client_name("c" + std::to_string(k));
    hello.header.mutable_hello()->set_num_samples(6000);
    deliver("p" + std::to_string(k), hello);
  }
  std::vector<double> per_round, closing;
  while (!engine->done()) {
    const double t0 = WallSeconds();
    // Encode the tasks the engine asked for (what the daemon puts on the wire).
    std::vector<std::pair<std::string, wire::RoundTask>> tasks;
    size_t bytes = 0;
    for (auto& o : pending) {
      if (!o.header.has_task()) continue;
      auto frames = net::EncodeEnvelope(o.header, o.payload);
      for (auto& f : frames) bytes += f.size();
      tasks.emplace_back(o.peer, o.header.task());
    }
    pending.clear();
    double outside = 0;  // Time spent building client updates: not ours.
    for (size_t i = 0; i < tasks.size(); ++i) {
      const double c0 = WallSeconds();
      wire::Header h;
      h.set_version(wire::VERSION_1);
      h.mutable_update()->set_round(tasks[i].second.round());
      h.mutable_update()->set_task_id(tasks[i].second.task_id());
      h.mutable_update()->set_num_samples(6000);
      h.mutable_update()->set_train_loss(0.5);
      auto frames = net::EncodeEnvelope(h, deltas[i]);
      outside += WallSeconds() - c0;
      auto env = net::DecodeEnvelope(frames, limits);
      if (!env.ok()) return 1;
      deliver(tasks[i].first, *env);
    }
    per_round.push_back(WallSeconds() - t0 - outside);
    auto committed = engine->TakeCommitted();
    if (!committed.empty()) closing.push_back(committed.back().coordinator_seconds);
  }
  std::sort(per_round.begin(), per_round.end());
  std::sort(closing.begin(), closing.end());
  std::printf(
      "{\"bench\":\"coordinator_round\",\"impl\":\"cohort\",\"model\":\"%s\",\"params\":%zu,"
      "\"clients\":%d,\"rounds\":%zu,\"median_s\":%.4f,\"min_s\":%.4f,\"max_s\":%.4f,"
      "\"aggregate_eval_commit_median_s\":%.4f}\n",
      arch.c_str(), init.size(), clients, per_round.size(), per_round[per_round.size() / 2],
      per_round.front(), per_round.back(), closing[closing.size() / 2]);
  std::filesystem::remove_all(run_dir);
  return 0;
}
