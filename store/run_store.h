// RunStore: the coordinator's durable state. A round commits in one
// transaction (metrics, per-client records, checkpoint), so a coordinator
// killed at any instant restarts from the last committed round.
#ifndef COHORT_STORE_RUN_STORE_H_
#define COHORT_STORE_RUN_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/status.h"

namespace cohort::store {

struct RunInfo {
  std::string config_text;  // Text-format RunConfig.
  uint64_t seed = 0;
  std::string code_version;
  uint32_t last_round = 0;  // 0: only the initial model is committed.
  // Lineage: the SHA-256 of config_text (64 lowercase hex digits; empty in
  // stores older than it), the participants the run was set up for (a
  // federated run's configured clients, a data-parallel run's ranks) and the
  // devices its creator trained or evaluated on (the coordinator's "cpu"
  // where it evaluates; a data-parallel run's backend names, one per rank,
  // "; "-separated).
  std::string config_sha256{};
  uint32_t world_size = 0;
  std::string devices{};
  // 32 lowercase hex digits drawn when the run is created (empty in stores
  // older than it), sent in every Welcome: it tells one run from another
  // that has the same coordinator key and name, so a client's ledger of
  // noised rounds (client/dp_ledger.h) does not refuse an honest new run.
  // Not a secret: anyone the coordinator welcomes learns it.
  std::string run_nonce{};
};

// One stage of a round as the coordinator saw it: a secure round's
// protocol stages (aggregation/secagg_stage.h names), a plain round's
// "train" (tasks out to the last update in), and "aggregate" (the
// coordinator's own sum, server step, evaluation). Seconds are on the
// protocol's clock (RoundRecord::clock_seconds); bytes are the messages'
// encoded sizes (header and payload) at the coordinator.
struct StageRecord {
  std::string stage;
  double seconds = 0;
  uint64_t bytes_in = 0;   // Received by the coordinator.
  uint64_t bytes_out = 0;  // Sent by the coordinator.
};

// One data-parallel rank's share of an epoch.
struct RankRecord {
  uint32_t rank = 0;
  uint64_t steps = 0;
  uint64_t samples = 0;
  double compute_seconds = 0;  // Forward, backward and the optimizer step.
  double comm_seconds = 0;     // Waiting in collectives (all-reduce, broadcast).
  double seconds = 0;          // The rank's whole epoch.
  std::string device;          // "cpu", "cuda:0 ...".
};

struct RoundRecord {
  uint32_t round = 0;
  uint32_t participants = 0;  // Updates aggregated.
  uint32_t selected = 0;
  uint32_t dropped = 0;  // Selected but missing or rejected.
  double train_loss = 0;
  double test_accuracy = -1;  // -1: no central evaluation.
  double test_loss = -1;
  double seconds = 0;              // Round wall time, tasks sent to commit.
  double coordinator_seconds = 0;  // Aggregate + evaluate + commit.
  // The round on the protocol's clock (the engine's `now`, start to
  // commit): the wall time in the daemons, the virtual time in the
  // simulator. 0 where nothing kept it (data-parallel epochs, older stores).
  double clock_seconds = 0;
  int64_t committed_unix_ms = 0;
  std::string aggregation = "plain";  // "plain", "secagg" or "secagg+".
  // "committed", or "aborted" (secure aggregation fell below its threshold:
  // the model is unchanged and nothing about the inputs was revealed).
  std::string outcome = "committed";
  // Why an aborted round was aborted (too few clients at a stage, a model
  // or metric that is not finite); empty for a committed one.
  std::string outcome_reason;
  // Federated evaluation (rounds.federated_eval_every) of the model this
  // round started from (round - 1's): the clients' test-sample-weighted
  // means and their test samples. -1 / 0: none this round.
  double federated_eval_loss = -1;
  double federated_eval_accuracy = -1;
  uint64_t federated_eval_samples = 0;
  // Central differential privacy (config privacy; coordinator/strategy_dp.h):
  // the sampling rate q of the noise this round drew (0: none: a run
  // without privacy, or a round aborted before its aggregate), and the
  // run's ε after the round at privacy.target_delta (-1: a run without
  // privacy, or a store older than it).
  double dp_sampling_rate = 0;
  double dp_epsilon = -1;
  // Adaptive clipping (privacy.adaptive_clip): the clip norm C the round
  // clipped at and the one the next round clips at (0: a fixed clip, or a
  // store older than it). A resumed run takes C from the last record.
  double dp_clip_norm = 0;
  double dp_next_clip_norm = 0;
  // Distributed DP (privacy.mechanism DISTRIBUTED_SKELLAM) has two views:
  // dp_epsilon is the one against the coordinator (no amplification), this
  // the one for the released model (amplified by the cohort's sampling at
  // dp_sampling_rate; docs/privacy.md). -1: central DP (one view, in
  // dp_epsilon), no privacy, or a store older than it.
  double dp_epsilon_released_model = -1;
  // SCAFFOLD (train.scaffold): N, the clients the round's c step divided
  // by (coordinator/strategy_scaffold.h); 0: not SCAFFOLD, or a store older
  // than it. A resumed run takes N no lower than the last record's.
  uint64_t scaffold_population = 0;
  // Timings (round_stages and round_ranks tables; empty in older stores and
  // where nothing measured them): per stage at the coordinator, per rank of
  // a data-parallel epoch.
  std::vector<StageRecord> stages;
  std::vector<RankRecord> ranks;
};

struct ClientRoundRecord {
  std::string client;
  std::string status;  // "ok", "dropped" or "rejected".
  std::string reason;
  uint64_t num_samples = 0;
  double train_loss = 0;
  double train_accuracy = 0;
  double train_seconds = 0;
  // Secure aggregation: the stage at which the client left the round
  // ("advertise_keys", "share_keys", "masked_input", "consistency",
  // "unmasking"); empty if it stayed to the end. A client that left after
  // its masked input still counts ("ok"): its input is in the sum.
  std::string stage;
  // Whether the coordinator proved this client misbehaving in that round
  // (`reason` says how). Such a client is excluded for the rest of the run,
  // also after the coordinator restarts; `cohort status` names it. Rows
  // written before the store had this column read it from their reason
  // (the "misbehaved: " the engine wrote there).
  bool misbehaved = false;
  // Lineage and traffic: the SHA-256 its client reported of its training
  // shard (hex; empty: none reported), and the bytes the coordinator
  // received from and sent to it in the round (headers and payloads).
  std::string data_sha256{};
  // Its training samples per class where it shared them (opt-in; every
  // client of `cohort simulate`); empty: not shared.
  std::vector<uint64_t> label_counts{};
  uint64_t upload_bytes = 0;
  uint64_t download_bytes = 0;
};

struct Checkpoint {
  uint32_t round = 0;
  std::vector<float> model;
  // Optimizer state; may be empty. The coordinator's server momentum (the
  // model's size); a data-parallel run's optimizer (train::Optimizer::
  // SaveState: one or two model sizes).
  std::vector<float> velocity;
  uint64_t optimizer_steps = 0;  // Steps behind `velocity` (Adam's bias correction).
  // A FedBuff run's schedule at this version (a serialized
  // checkpoint.FedBuffSchedule, coordinator/fedbuff_engine.h), committed in
  // the same transaction as the model; empty: none (synchronous rounds,
  // older stores). The store checks only its CRC-32.
  std::string schedule{};
};

// Not thread-safe. Errors are kUnavailable / kDataLoss with SQLite's message.
class RunStore {
 public:
  virtual ~RunStore() = default;
  RunStore(const RunStore&) = delete;
  RunStore& operator=(const RunStore&) = delete;

  // Empty optional when no run was created in this store yet.
  virtual StatusOr<std::optional<RunInfo>> LoadRun() = 0;
  // Creates the run and commits `initial` as round 0. kAlreadyExists if a run
  // is present.
  virtual Status CreateRun(const RunInfo& info, const Checkpoint& initial) = 0;
  // Replaces a run that has committed no round yet (its config is not fixed
  // until the first commit) by `info` and `initial`, as CreateRun would
  // make it; kFailedPrecondition once a round is committed.
  virtual Status ReplaceUncommittedRun(const RunInfo& info, const Checkpoint& initial) = 0;
  // Commits round `record.round` (must be last_round + 1, else
  // kFailedPrecondition) with its checkpoint; keeps the newest `keep`
  // checkpoints (kInvalidArgument when `keep` is 0) and deletes the others.
  virtual Status CommitRound(const RoundRecord& record,
                             const std::vector<ClientRoundRecord>& clients,
                             const Checkpoint& checkpoint, uint32_t keep) = 0;
  // The newest checkpoint. kDataLoss, naming the round and the part, when
  // the model, the server velocity or the schedule fails its CRC-32 or has
  // an impossible size; kNotFound when there is none.
  virtual StatusOr<Checkpoint> LatestCheckpoint() = 0;
  // The checkpoint of `round`, checked as LatestCheckpoint's; kNotFound,
  // naming the round, when the store holds none for it (never committed, or
  // pruned by keep).
  virtual StatusOr<Checkpoint> CheckpointAt(uint32_t round) = 0;
  // The rounds whose checkpoints the store holds, ascending.
  virtual StatusOr<std::vector<uint32_t>> CheckpointRounds() = 0;
  virtual StatusOr<std::vector<RoundRecord>> Rounds() = 0;
  virtual StatusOr<std::vector<ClientRoundRecord>> ClientRounds(uint32_t round) = 0;

 protected:
  RunStore() = default;
};

// Opens (creating if needed) a SQLite store in WAL mode. ":memory:" gives an
// in-memory store for tests.
//
// Test hook, for crash tests only: when the environment variable
// COHORT_FAULT_KILL_IN_COMMIT is N (a round >= 1) at open, the process
// raises SIGKILL inside round N's CommitRound, after every row of the round
// is written and flushed to the WAL, and before COMMIT. A restarted
// coordinator must then find round N - 1 as the last committed round. Any
// other non-empty value makes the open fail with kInvalidArgument.
// `env` (not owned; outlives the store) stamps the run's and each round's
// creation and commit times.
StatusOr<std::unique_ptr<RunStore>> OpenSqliteRunStore(const std::string& path,
                                                       Env* env = Env::Default());

// Opens an existing store for reading only (SQLITE_OPEN_READONLY), as
// `cohort status` does: the file is left exactly as it was (no schema, no
// journal mode), also when it is not a run store; a coordinator may be
// committing meanwhile. A store from an older build reads with the
// defaults of the columns it lacks. kNotFound when there is no file;
// kInvalidArgument, naming the file, when it is not a Cohort run store (not
// SQLite, or without the run's tables); kDataLoss when SQLite finds it
// damaged (truncated, overwritten); CreateRun and CommitRound are
// kFailedPrecondition.
//
// Nothing beside the file is created either: while no coordinator has the
// store open (no PATH-wal beside it) it is read as an immutable file, so
// SQLite makes no -wal or -shm files. `follow` (a reader that stays open
// for commits still to come, `status --follow`) opens it as a live WAL
// database instead, which creates them when missing.
StatusOr<std::unique_ptr<RunStore>> OpenSqliteRunStoreReadOnly(const std::string& path,
                                                               bool follow = false);

}  // namespace cohort::store

#endif  // COHORT_STORE_RUN_STORE_H_
