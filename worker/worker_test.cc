// Where a worker learns its rank, world, local rank and rendezvous when the
// flags leave them out: the environment conventions of torchrun and
// Kubeflow, Open MPI and Slurm.
#include "worker/worker.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "datasets/shard.h"
#include "datasets/synthetic.h"
#include "store/run_store.h"
#include "train/device.h"

namespace cohort::worker {
namespace {

// Clears every variable ResolveRank reads, sets `vars`, and restores
// nothing (each test sets what it needs).
void Environment(std::initializer_list<std::pair<const char*, const char*>> vars) {
  for (const char* name :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS",
        "SLURM_LOCALID", "SLURM_NODELIST"}) {
    unsetenv(name);
  }
  for (const auto& [name, value] : vars) setenv(name, value, 1);
}

TEST(ResolveRankTest, TorchrunAndKubeflowVariables) {
  Environment({{"RANK", "3"},
               {"WORLD_SIZE", "8"},
               {"LOCAL_RANK", "1"},
               {"MASTER_ADDR", "10.0.0.5"},
               {"MASTER_PORT", "29400"}});
  WorkerOptions o;
  ASSERT_TRUE(ResolveRank(o).ok());
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.world_size, 8);
  EXPECT_EQ(o.local_rank, 1);
  EXPECT_EQ(o.master, "tcp://10.0.0.5:29400");
  // Flags win over the environment.
  WorkerOptions flags;
  flags.rank = 0;
  flags.local_rank = 0;
  flags.master = "ipc:///tmp/m";
  ASSERT_TRUE(ResolveRank(flags).ok());
  EXPECT_EQ(flags.rank, 0);
  EXPECT_EQ(flags.local_rank, 0);
  EXPECT_EQ(flags.master, "ipc:///tmp/m");
}

TEST(ResolveRankTest, OpenMpiVariables) {
  Environment({{"OMPI_COMM_WORLD_RANK", "5"},
               {"OMPI_COMM_WORLD_SIZE", "6"},
               {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
               {"MASTER_ADDR", "head"}});
  WorkerOptions o;
  ASSERT_TRUE(ResolveRank(o).ok());
  EXPECT_EQ(o.rank, 5);
  EXPECT_EQ(o.world_size, 6);
  EXPECT_EQ(o.local_rank, 2);
  EXPECT_EQ(o.master, "tcp://head:29500");
}

TEST(ResolveRankTest, SlurmVariablesPutRankZeroOnTheFirstHost) {
  Environment({{"SLURM_PROCID", "7"},
               {"SLURM_NTASKS", "16"},
               {"SLURM_LOCALID", "3"},
               {"SLURM_NODELIST", "gpu[03-06,09],cpu01"}});
  WorkerOptions o;
  ASSERT_TRUE(ResolveRank(o).ok());
  EXPECT_EQ(o.rank, 7);
  EXPECT_EQ(o.world_size, 16);
  EXPECT_EQ(o.local_rank, 3);
  EXPECT_EQ(o.master, "tcp://gpu03:29500");
  EXPECT_EQ(FirstSlurmHost("node1,node2"), "node1");
  EXPECT_EQ(FirstSlurmHost("solo"), "solo");
  EXPECT_EQ(FirstSlurmHost("a01,b[1-2]"), "a01");
  EXPECT_EQ(FirstSlurmHost("b[7]"), "b7");
  EXPECT_EQ(FirstSlurmHost("broken[12"), "");
  Environment({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "broken[12"}});
  WorkerOptions bad;
  Status s = ResolveRank(bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("SLURM_NODELIST=broken[12: no first host"), std::string::npos) << s;
}

TEST(ResolveRankTest, MalformedOrMissingValuesAreNamed) {
  Environment({{"RANK", "two"}, {"WORLD_SIZE", "4"}});
  WorkerOptions o;
  Status s = ResolveRank(o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("RANK=two: not a rank or size"), std::string::npos) << s;
  Environment({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}});
  WorkerOptions past;
  EXPECT_NE(ResolveRank(past).message().find("rank 4 of a world of 4"), std::string::npos);
  Environment({});
  WorkerOptions none;
  EXPECT_NE(ResolveRank(none).message().find("no rank or world size"), std::string::npos);
}

TEST(LocalRankTest, EachLocalRankTakesItsOwnGpuModuloTheHosts) {
  EXPECT_EQ(train::GpuForLocalRank(-1, 8), 0);
  EXPECT_EQ(train::GpuForLocalRank(3, 8), 3);
  EXPECT_EQ(train::GpuForLocalRank(9, 8), 1);
  EXPECT_EQ(train::GpuForLocalRank(2, 0), 0);
}

// The device-path vote as the all-reduce sums it: each rank casts into a
// zeroed vector, and the votes add up.
std::vector<int64_t> Tally(const std::vector<std::pair<bool, uint64_t>>& ranks) {
  const int world = static_cast<int>(ranks.size());
  std::vector<int64_t> sum(DeviceVoteLength(world), 0);
  for (int r = 0; r < world; ++r) {
    std::vector<int64_t> one(sum.size(), 0);
    CastDeviceVote(one, r, ranks[r].first, ranks[r].second);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += one[i];
  }
  return sum;
}

TEST(DeviceVoteTest, NcclOnlyWhenEveryRankCanAndEachHasItsOwnDevice) {
  // Two GPUs of one host, and of two hosts (keys differ in any 16 bits).
  const uint64_t gpu0 = 0x1234'0000'0001'0000, gpu1 = 0x1234'0000'0002'0000;
  EXPECT_EQ(DeviceVoteVerdict(Tally({{true, gpu0}, {true, gpu1}}), 2), "");
  EXPECT_EQ(DeviceVoteVerdict(Tally({{true, 1}, {true, uint64_t{1} << 63}, {true, 7}}), 3), "");
  EXPECT_EQ(DeviceVoteVerdict(Tally({{true, gpu0}}), 1), "");
  // Two ranks on one GPU: NCCL would hang or fail there.
  const std::string shared =
      DeviceVoteVerdict(Tally({{true, gpu0}, {true, gpu1}, {true, gpu1}}), 3);
  EXPECT_NE(shared.find("ranks 1 and 2 share one device"), std::string::npos) << shared;
  // One rank whose backend cannot (a CPU rank, or one with --collectives host).
  const std::string cannot = DeviceVoteVerdict(Tally({{true, gpu0}, {false, gpu1}}), 2);
  EXPECT_NE(cannot.find("not every rank's backend"), std::string::npos) << cannot;
}

// A data-parallel group of `world` ranks as threads of this process,
// meeting over shared memory, on a synthetic shard of 480 samples (batch 8
// per rank: equal parts in every step). Returns each rank's result and
// leaves the run in `dir`/`run`.
class GroupRun {
 public:
  GroupRun()
      : dir_(std::filesystem::temp_directory_path() /
             ("cohort-worker-test-" + std::to_string(getpid()))) {
    std::filesystem::create_directories(dir_);
    EXPECT_TRUE(datasets::WriteShard(datasets::MakeSynthetic({.num_samples = 480, .seed = 9}),
                                     dir_ / "train.shard")
                    .ok());
  }
  ~GroupRun() { std::filesystem::remove_all(dir_); }

  std::vector<Status> Run(const std::string& run, int world, const std::string& data_parallel) {
    const std::string config = dir_ / (run + ".textproto");
    std::ofstream(config) << "seed: 7\nmode: DATA_PARALLEL\n"
                          << "data { train_shard: \"" << (dir_ / "train.shard").string() << "\" }\n"
                          << "model { arch: \"mlp\" input_dim: 20 num_classes: 4 hidden: 16 }\n"
                          << "train { batch_size: 8 learning_rate: 0.05 momentum: 0.5 }\n"
                          << "data_parallel { epochs: 2 timeout_s: 30 " << data_parallel << " }\n";
    std::vector<Status> results(world);
    std::vector<std::thread> ranks;
    const std::atomic<bool> stop{false};
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        WorkerOptions o;
        o.config = config;
        o.run_dir = dir_ / run;
        o.rank = r;
        o.world_size = world;
        o.master = "ipc://" + (dir_ / (run + "-meet")).string();
        results[r] = RunWorker(o, stop);
      });
    }
    for (std::thread& t : ranks) t.join();
    return results;
  }
  std::vector<float> FinalModel(const std::string& run) {
    auto store = store::OpenSqliteRunStore(dir_ / run / "run.db");
    if (!store.ok()) return {};
    auto cp = (*store)->LatestCheckpoint();
    return cp.ok() ? cp->model : std::vector<float>{};
  }

 private:
  std::filesystem::path dir_;
};

double WorstDifference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  }
  return worst;
}

// Local SGD averaging the models after every step is synchronous SGD up to
// rounding (momentum included: both are linear in the gradients), with 3
// ranks as with 2: the average divides by the world and counts every rank.
// (Divided by 2, the model would grow by half at every step; a rank left out
// would pull the average off its gradient.)
TEST(LocalSgdTest, AveragingEveryStepWithThreeRanksIsSynchronousSgd) {
  GroupRun group;
  for (const Status& s : group.Run("sync", 3, "")) EXPECT_TRUE(s.ok()) << s;
  for (const Status& s : group.Run("local", 3, "local_sgd_steps: 1")) EXPECT_TRUE(s.ok()) << s;
  const std::vector<float> sync = group.FinalModel("sync"), local = group.FinalModel("local");
  ASSERT_FALSE(sync.empty());
  const double worst = WorstDifference(sync, local);
  std::printf("3 ranks, local SGD every step vs synchronous: worst weight difference %.3g\n",
              worst);
  EXPECT_LT(worst, 1e-5);
}

}  // namespace
}  // namespace cohort::worker
