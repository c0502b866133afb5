#include <signal.h>
#include <sqlite3.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "common/bytes.h"
#include "store/run_store.h"

namespace cohort::store {
namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  config TEXT NOT NULL,
  seed INTEGER NOT NULL,
  code_version TEXT NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  last_round INTEGER NOT NULL,
  config_sha256 TEXT NOT NULL DEFAULT '',
  world_size INTEGER NOT NULL DEFAULT 0,
  devices TEXT NOT NULL DEFAULT '',
  run_nonce TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS rounds (
  round INTEGER PRIMARY KEY,
  participants INTEGER NOT NULL,
  selected INTEGER NOT NULL,
  dropped INTEGER NOT NULL,
  train_loss REAL NOT NULL,
  test_accuracy REAL NOT NULL,
  test_loss REAL NOT NULL,
  seconds REAL NOT NULL,
  coordinator_seconds REAL NOT NULL,
  committed_unix_ms INTEGER NOT NULL,
  clock_seconds REAL NOT NULL DEFAULT 0,
  aggregation TEXT NOT NULL DEFAULT 'plain',
  outcome TEXT NOT NULL DEFAULT 'committed',
  outcome_reason TEXT NOT NULL DEFAULT '',
  federated_eval_loss REAL NOT NULL DEFAULT -1,
  federated_eval_accuracy REAL NOT NULL DEFAULT -1,
  federated_eval_samples INTEGER NOT NULL DEFAULT 0,
  dp_sampling_rate REAL NOT NULL DEFAULT 0,
  dp_epsilon REAL NOT NULL DEFAULT -1,
  dp_clip_norm REAL NOT NULL DEFAULT 0,
  dp_next_clip_norm REAL NOT NULL DEFAULT 0,
  dp_epsilon_released_model REAL NOT NULL DEFAULT -1,
  scaffold_population INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS round_clients (
  round INTEGER NOT NULL,
  client TEXT NOT NULL,
  status TEXT NOT NULL,
  reason TEXT NOT NULL,
  num_samples INTEGER NOT NULL,
  train_loss REAL NOT NULL,
  train_accuracy REAL NOT NULL,
  train_seconds REAL NOT NULL,
  stage TEXT NOT NULL DEFAULT '',
  misbehaved INTEGER,
  data_sha256 TEXT NOT NULL DEFAULT '',
  upload_bytes INTEGER NOT NULL DEFAULT 0,
  download_bytes INTEGER NOT NULL DEFAULT 0,
  label_counts TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (round, client)
);
CREATE TABLE IF NOT EXISTS round_stages (
  round INTEGER NOT NULL,
  position INTEGER NOT NULL,
  stage TEXT NOT NULL,
  seconds REAL NOT NULL,
  bytes_in INTEGER NOT NULL,
  bytes_out INTEGER NOT NULL,
  PRIMARY KEY (round, position)
);
CREATE TABLE IF NOT EXISTS round_ranks (
  round INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  steps INTEGER NOT NULL,
  samples INTEGER NOT NULL,
  compute_seconds REAL NOT NULL,
  comm_seconds REAL NOT NULL,
  seconds REAL NOT NULL,
  device TEXT NOT NULL,
  PRIMARY KEY (round, rank)
);
CREATE TABLE IF NOT EXISTS checkpoints (
  round INTEGER PRIMARY KEY,
  model BLOB NOT NULL,
  velocity BLOB NOT NULL,
  model_crc32 INTEGER NOT NULL,
  velocity_crc32 INTEGER,
  optimizer_steps INTEGER NOT NULL DEFAULT 0
);
)sql";

uint32_t FloatsCrc(const std::vector<float>& v) {
  return Crc32({reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)});
}

uint32_t BytesCrc(const std::string& s) {
  return Crc32({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
}

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

// How builds before the misbehaved column marked a proven misbehaviour: in
// the reason, which the engine built from fixed text and numbers only (the
// marker cannot come from a client), possibly after a prefix such as "left
// during consistency: ".
bool MisbehavedByReason(const std::string& reason) {
  return reason.find("misbehaved: ") != std::string::npos;
}

// Label counts as the store keeps them: "12,0,5" ("" for none).
std::string JoinCounts(const std::vector<uint64_t>& counts) {
  std::string out;
  for (uint64_t c : counts) out += (out.empty() ? "" : ",") + std::to_string(c);
  return out;
}
// And back; a malformed text (a damaged row) reads as none.
std::vector<uint64_t> ParseCounts(const std::string& text) {
  std::vector<uint64_t> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    if (item.empty() || item.size() > 19 ||
        item.find_first_not_of("0123456789") != std::string::npos) {
      return {};
    }
    out.push_back(std::stoull(item));
    at = comma + 1;
  }
  return out;
}

// `path` as an SQLite file: URI (RFC 3986: every byte but the unreserved
// and '/' percent-encoded).
std::string FileUri(const std::string& path) {
  std::string uri = "file:";
  for (unsigned char c : path) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '.' || c == '_' || c == '~') {
      uri += static_cast<char>(c);
    } else {
      char escaped[4];
      std::snprintf(escaped, sizeof(escaped), "%%%02X", c);
      uri += escaped;
    }
  }
  return uri;
}

// The test hook of run_store.h: 0 when off.
StatusOr<uint32_t> KillInCommitRound() {
  const char* v = std::getenv("COHORT_FAULT_KILL_IN_COMMIT");
  if (v == nullptr || *v == '\0') return 0u;
  char* end = nullptr;
  const unsigned long round = std::strtoul(v, &end, 10);
  if (*end != '\0' || round == 0 || round > UINT32_MAX) {
    return InvalidArgumentError(
        std::string("COHORT_FAULT_KILL_IN_COMMIT: expected a round >= 1, got \"") + v + "\"");
  }
  return static_cast<uint32_t>(round);
}

// Finalizes on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

class SqliteRunStore final : public RunStore {
 public:
  SqliteRunStore(sqlite3* db, uint32_t kill_in_commit_round, bool read_only, Env* env)
      : db_(db), kill_in_commit_round_(kill_in_commit_round), read_only_(read_only), env_(env) {}
  ~SqliteRunStore() override { sqlite3_close(db_); }

  Status Init() {
    COHORT_RETURN_IF_ERROR(Exec("PRAGMA journal_mode=WAL"));
    // FULL: a committed round survives power loss, not only a process kill.
    COHORT_RETURN_IF_ERROR(Exec("PRAGMA synchronous=FULL"));
    COHORT_RETURN_IF_ERROR(Exec("PRAGMA busy_timeout=5000"));
    COHORT_RETURN_IF_ERROR(Exec(kSchema));
    // Stores written before secure aggregation lack these columns.
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("rounds", "aggregation", "TEXT NOT NULL DEFAULT 'plain'"));
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("rounds", "outcome", "TEXT NOT NULL DEFAULT 'committed'"));
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("rounds", "outcome_reason", "TEXT NOT NULL DEFAULT ''"));
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("round_clients", "stage", "TEXT NOT NULL DEFAULT ''"));
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("rounds", "clock_seconds", "REAL NOT NULL DEFAULT 0"));
    // NULL in the rows of older builds: their reason says (MisbehavedByReason).
    COHORT_RETURN_IF_ERROR(AddColumnIfMissing("round_clients", "misbehaved", "INTEGER"));
    // Stores written before it have no velocity checksum (NULL: not checked).
    COHORT_RETURN_IF_ERROR(AddColumnIfMissing("checkpoints", "velocity_crc32", "INTEGER"));
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("checkpoints", "optimizer_steps", "INTEGER NOT NULL DEFAULT 0"));
    // FedBuff's schedule at each version (empty: none).
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("checkpoints", "fedbuff_schedule", "BLOB NOT NULL DEFAULT x''"));
    COHORT_RETURN_IF_ERROR(AddColumnIfMissing("checkpoints", "fedbuff_schedule_crc32", "INTEGER"));
    // Federated evaluation (issue 32); -1: none that round.
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("rounds", "federated_eval_loss", "REAL NOT NULL DEFAULT -1"));
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("rounds", "federated_eval_accuracy", "REAL NOT NULL DEFAULT -1"));
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("rounds", "federated_eval_samples", "INTEGER NOT NULL DEFAULT 0"));
    // Central differential privacy (issue 34): the round's q, the run's ε.
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("rounds", "dp_sampling_rate", "REAL NOT NULL DEFAULT 0"));
    COHORT_RETURN_IF_ERROR(AddColumnIfMissing("rounds", "dp_epsilon", "REAL NOT NULL DEFAULT -1"));
    // Adaptive clipping: the round's C and the next round's.
    for (const char* column : {"dp_clip_norm", "dp_next_clip_norm"}) {
      COHORT_RETURN_IF_ERROR(AddColumnIfMissing("rounds", column, "REAL NOT NULL DEFAULT 0"));
    }
    // Distributed DP's released-model view.
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("rounds", "dp_epsilon_released_model", "REAL NOT NULL DEFAULT -1"));
    // SCAFFOLD's N (0: not SCAFFOLD, or a store older than it).
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("rounds", "scaffold_population", "INTEGER NOT NULL DEFAULT 0"));
    // Lineage and traffic (issue 33).
    // run_nonce: issue 34 (RunInfo::run_nonce).
    for (const char* column : {"config_sha256", "devices", "run_nonce"}) {
      COHORT_RETURN_IF_ERROR(AddColumnIfMissing("runs", column, "TEXT NOT NULL DEFAULT ''"));
    }
    COHORT_RETURN_IF_ERROR(AddColumnIfMissing("runs", "world_size", "INTEGER NOT NULL DEFAULT 0"));
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("round_clients", "data_sha256", "TEXT NOT NULL DEFAULT ''"));
    for (const char* column : {"upload_bytes", "download_bytes"}) {
      COHORT_RETURN_IF_ERROR(
          AddColumnIfMissing("round_clients", column, "INTEGER NOT NULL DEFAULT 0"));
    }
    COHORT_RETURN_IF_ERROR(
        AddColumnIfMissing("round_clients", "label_counts", "TEXT NOT NULL DEFAULT ''"));
    return ResolveColumns();
  }

  // For a read-only store: no pragma that writes, no schema. The tables
  // must all be there (else this is not a run store, or not yet one: the
  // coordinator creates them when it opens); columns that stores older than
  // this build lack read as the defaults Init would add them with.
  Status InitReadOnly() {
    sqlite3_busy_timeout(db_, 5000);  // A coordinator may be committing.
    for (const char* table : {"runs", "rounds", "round_clients", "checkpoints"}) {
      Statement s(db_, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?");
      if (!s.ok()) return Unreadable();
      sqlite3_bind_text(s.get(), 1, table, -1, SQLITE_STATIC);
      const int rc = sqlite3_step(s.get());
      if (rc == SQLITE_DONE) return NotARunStore(std::string("it has no ") + table + " table");
      if (rc != SQLITE_ROW) return Unreadable();
    }
    COHORT_RETURN_IF_ERROR(CheckIntact());
    return ResolveColumns();
  }

  // Why the file cannot be read: not SQLite at all, or a damaged database.
  Status Unreadable() {
    const int code = sqlite3_errcode(db_);
    if (code == SQLITE_NOTADB) return NotARunStore("not an SQLite database");
    if (code == SQLITE_CORRUPT) return Damaged(sqlite3_errmsg(db_));
    return NotARunStore(sqlite3_errmsg(db_));
  }
  static Status Damaged(const std::string& what) {
    return DataLossError("the run store is damaged (" + what +
                         "): restore it from a backup; the file was left as it is");
  }
  // SQLite's quick_check over every page (a truncated or overwritten file
  // can still open and answer some queries with rows missing).
  Status CheckIntact() {
    Statement s(db_, "PRAGMA quick_check(1)");
    if (!s.ok()) return Unreadable();
    const int rc = sqlite3_step(s.get());
    if (rc != SQLITE_ROW) return Unreadable();
    const std::string verdict = Text(s.get(), 0);
    return verdict == "ok" ? OkStatus() : Damaged(verdict);
  }

  StatusOr<std::optional<RunInfo>> LoadRun() override {
    const std::string sql = "SELECT config, seed, code_version, last_round, " +
                            columns_["runs.config_sha256"] + ", " + columns_["runs.world_size"] +
                            ", " + columns_["runs.devices"] + ", " + columns_["runs.run_nonce"] +
                            " FROM runs WHERE id = 1";
    Statement s(db_, sql.c_str());
    if (!s.ok()) return Error("load run");
    const int rc = sqlite3_step(s.get());
    if (rc == SQLITE_DONE) return std::optional<RunInfo>();
    if (rc != SQLITE_ROW) return Error("load run");
    RunInfo info;
    info.config_text = Text(s.get(), 0);
    info.seed = static_cast<uint64_t>(sqlite3_column_int64(s.get(), 1));
    info.code_version = Text(s.get(), 2);
    info.last_round = static_cast<uint32_t>(sqlite3_column_int64(s.get(), 3));
    info.config_sha256 = Text(s.get(), 4);
    info.world_size = static_cast<uint32_t>(sqlite3_column_int64(s.get(), 5));
    info.devices = Text(s.get(), 6);
    info.run_nonce = Text(s.get(), 7);
    return std::optional<RunInfo>(std::move(info));
  }

  Status CreateRun(const RunInfo& info, const Checkpoint& initial) override {
    if (read_only_) return ReadOnlyError("create run");
    COHORT_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    return Finish(InsertRun(info, initial));
  }

  Status ReplaceUncommittedRun(const RunInfo& info, const Checkpoint& initial) override {
    if (read_only_) return ReadOnlyError("replace run");
    COHORT_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    Status status = [&]() -> Status {
      Statement s(db_, "SELECT last_round FROM runs WHERE id = 1");
      if (!s.ok()) return Error("replace run");
      const int rc = sqlite3_step(s.get());
      if (rc == SQLITE_ROW && sqlite3_column_int64(s.get(), 0) != 0) {
        return FailedPreconditionError("the run has committed rounds; its config is fixed");
      }
      if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("replace run");
      COHORT_RETURN_IF_ERROR(Exec("DELETE FROM checkpoints"));
      COHORT_RETURN_IF_ERROR(Exec("DELETE FROM runs"));
      return InsertRun(info, initial);
    }();
    return Finish(status);
  }

  Status CommitRound(const RoundRecord& r, const std::vector<ClientRoundRecord>& clients,
                     const Checkpoint& checkpoint, uint32_t keep) override {
    if (read_only_) return ReadOnlyError("commit round");
    if (keep == 0) return InvalidArgumentError("run store: keep at least 1 checkpoint");
    COHORT_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    Status status = [&]() -> Status {
      Statement last(db_, "SELECT last_round FROM runs WHERE id = 1");
      if (!last.ok() || sqlite3_step(last.get()) != SQLITE_ROW) return Error("commit round");
      const auto last_round = static_cast<uint32_t>(sqlite3_column_int64(last.get(), 0));
      if (r.round != last_round + 1 || checkpoint.round != r.round) {
        return FailedPreconditionError("commit of round " + std::to_string(r.round) +
                                       " after round " + std::to_string(last_round));
      }
      Statement s(db_,
                  "INSERT INTO rounds (round, participants, selected, dropped, train_loss, "
                  "test_accuracy, test_loss, seconds, coordinator_seconds, committed_unix_ms, "
                  "aggregation, outcome, outcome_reason, clock_seconds, federated_eval_loss, "
                  "federated_eval_accuracy, federated_eval_samples, dp_sampling_rate, "
                  "dp_epsilon, dp_clip_norm, dp_next_clip_norm, dp_epsilon_released_model, "
                  "scaffold_population) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
      if (!s.ok()) return Error("commit round");
      sqlite3_bind_int64(s.get(), 1, r.round);
      sqlite3_bind_int64(s.get(), 2, r.participants);
      sqlite3_bind_int64(s.get(), 3, r.selected);
      sqlite3_bind_int64(s.get(), 4, r.dropped);
      sqlite3_bind_double(s.get(), 5, r.train_loss);
      sqlite3_bind_double(s.get(), 6, r.test_accuracy);
      sqlite3_bind_double(s.get(), 7, r.test_loss);
      sqlite3_bind_double(s.get(), 8, r.seconds);
      sqlite3_bind_double(s.get(), 9, r.coordinator_seconds);
      sqlite3_bind_int64(s.get(), 10,
                         r.committed_unix_ms != 0 ? r.committed_unix_ms : env_->UnixMillis());
      sqlite3_bind_text(s.get(), 11, r.aggregation.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(s.get(), 12, r.outcome.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(s.get(), 13, r.outcome_reason.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_double(s.get(), 14, r.clock_seconds);
      sqlite3_bind_double(s.get(), 15, r.federated_eval_loss);
      sqlite3_bind_double(s.get(), 16, r.federated_eval_accuracy);
      sqlite3_bind_int64(s.get(), 17, static_cast<int64_t>(r.federated_eval_samples));
      sqlite3_bind_double(s.get(), 18, r.dp_sampling_rate);
      sqlite3_bind_double(s.get(), 19, r.dp_epsilon);
      sqlite3_bind_double(s.get(), 20, r.dp_clip_norm);
      sqlite3_bind_double(s.get(), 21, r.dp_next_clip_norm);
      sqlite3_bind_double(s.get(), 22, r.dp_epsilon_released_model);
      sqlite3_bind_int64(s.get(), 23, static_cast<int64_t>(r.scaffold_population));
      if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("commit round");
      COHORT_RETURN_IF_ERROR(PutClients(r.round, clients));
      COHORT_RETURN_IF_ERROR(PutTimings(r));
      COHORT_RETURN_IF_ERROR(PutCheckpoint(checkpoint));
      Statement prune(db_, "DELETE FROM checkpoints WHERE round <= ?");
      sqlite3_bind_int64(prune.get(), 1, static_cast<int64_t>(r.round) - keep);
      if (!prune.ok() || sqlite3_step(prune.get()) != SQLITE_DONE) return Error("prune");
      Statement up(db_, "UPDATE runs SET last_round = ? WHERE id = 1");
      sqlite3_bind_int64(up.get(), 1, r.round);
      if (!up.ok() || sqlite3_step(up.get()) != SQLITE_DONE) return Error("commit round");
      return OkStatus();
    }();
    if (status.ok() && r.round == kill_in_commit_round_) {
      // Test hook: die with the round's pages in the WAL but no commit record.
      sqlite3_db_cacheflush(db_);
      std::fprintf(stderr, "run store: fault injection: SIGKILL before the commit of round %u\n",
                   r.round);
      raise(SIGKILL);
    }
    return Finish(status);
  }

  StatusOr<Checkpoint> LatestCheckpoint() override {
    Statement s(db_, CheckpointSql("ORDER BY round DESC LIMIT 1").c_str());
    if (!s.ok()) return Error("load checkpoint");
    const int rc = sqlite3_step(s.get());
    if (rc == SQLITE_DONE) return NotFoundError("run store has no checkpoint");
    if (rc != SQLITE_ROW) return Error("load checkpoint");
    return CheckpointFromRow(s.get());
  }

  StatusOr<Checkpoint> CheckpointAt(uint32_t round) override {
    Statement s(db_, CheckpointSql("WHERE round = ?").c_str());
    if (!s.ok()) return Error("load checkpoint");
    sqlite3_bind_int64(s.get(), 1, round);
    const int rc = sqlite3_step(s.get());
    if (rc == SQLITE_DONE) {
      return NotFoundError("run store has no checkpoint of round " + std::to_string(round));
    }
    if (rc != SQLITE_ROW) return Error("load checkpoint");
    return CheckpointFromRow(s.get());
  }

  StatusOr<std::vector<uint32_t>> CheckpointRounds() override {
    Statement s(db_, "SELECT round FROM checkpoints ORDER BY round");
    if (!s.ok()) return Error("read checkpoint rounds");
    std::vector<uint32_t> out;
    int rc;
    while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
      out.push_back(static_cast<uint32_t>(sqlite3_column_int64(s.get(), 0)));
    }
    if (rc != SQLITE_DONE) return Error("read checkpoint rounds");
    return out;
  }

  StatusOr<std::vector<RoundRecord>> Rounds() override {
    const std::string sql =
        "SELECT round, participants, selected, dropped, train_loss, test_accuracy, "
        "test_loss, seconds, coordinator_seconds, committed_unix_ms, " +
        columns_["rounds.aggregation"] + ", " + columns_["rounds.outcome"] + ", " +
        columns_["rounds.outcome_reason"] + ", " + columns_["rounds.clock_seconds"] + ", " +
        columns_["rounds.federated_eval_loss"] + ", " + columns_["rounds.federated_eval_accuracy"] +
        ", " + columns_["rounds.federated_eval_samples"] + ", " +
        columns_["rounds.dp_sampling_rate"] + ", " + columns_["rounds.dp_epsilon"] + ", " +
        columns_["rounds.dp_clip_norm"] + ", " + columns_["rounds.dp_next_clip_norm"] + ", " +
        columns_["rounds.dp_epsilon_released_model"] + ", " +
        columns_["rounds.scaffold_population"] + " FROM rounds ORDER BY round";
    Statement s(db_, sql.c_str());
    if (!s.ok()) return Error("read rounds");
    std::vector<RoundRecord> out;
    int rc;
    while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
      RoundRecord r;
      r.round = static_cast<uint32_t>(sqlite3_column_int64(s.get(), 0));
      r.participants = static_cast<uint32_t>(sqlite3_column_int64(s.get(), 1));
      r.selected = static_cast<uint32_t>(sqlite3_column_int64(s.get(), 2));
      r.dropped = static_cast<uint32_t>(sqlite3_column_int64(s.get(), 3));
      r.train_loss = sqlite3_column_double(s.get(), 4);
      r.test_accuracy = sqlite3_column_double(s.get(), 5);
      r.test_loss = sqlite3_column_double(s.get(), 6);
      r.seconds = sqlite3_column_double(s.get(), 7);
      r.coordinator_seconds = sqlite3_column_double(s.get(), 8);
      r.committed_unix_ms = sqlite3_column_int64(s.get(), 9);
      r.aggregation = Text(s.get(), 10);
      r.outcome = Text(s.get(), 11);
      r.outcome_reason = Text(s.get(), 12);
      r.clock_seconds = sqlite3_column_double(s.get(), 13);
      r.federated_eval_loss = sqlite3_column_double(s.get(), 14);
      r.federated_eval_accuracy = sqlite3_column_double(s.get(), 15);
      r.federated_eval_samples = static_cast<uint64_t>(sqlite3_column_int64(s.get(), 16));
      r.dp_sampling_rate = sqlite3_column_double(s.get(), 17);
      r.dp_epsilon = sqlite3_column_double(s.get(), 18);
      r.dp_clip_norm = sqlite3_column_double(s.get(), 19);
      r.dp_next_clip_norm = sqlite3_column_double(s.get(), 20);
      r.dp_epsilon_released_model = sqlite3_column_double(s.get(), 21);
      r.scaffold_population = static_cast<uint64_t>(sqlite3_column_int64(s.get(), 22));
      out.push_back(r);
    }
    if (rc != SQLITE_DONE) return Error("read rounds");
    COHORT_RETURN_IF_ERROR(ReadTimings(out));
    return out;
  }

  StatusOr<std::vector<ClientRoundRecord>> ClientRounds(uint32_t round) override {
    const std::string sql =
        "SELECT client, status, reason, num_samples, train_loss, train_accuracy, "
        "train_seconds, " +
        columns_["round_clients.stage"] + ", " + columns_["round_clients.misbehaved"] + ", " +
        columns_["round_clients.data_sha256"] + ", " + columns_["round_clients.upload_bytes"] +
        ", " + columns_["round_clients.download_bytes"] + ", " +
        columns_["round_clients.label_counts"] +
        " FROM round_clients WHERE round = ? ORDER BY client";
    Statement s(db_, sql.c_str());
    if (!s.ok()) return Error("read round clients");
    sqlite3_bind_int64(s.get(), 1, round);
    std::vector<ClientRoundRecord> out;
    int rc;
    while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
      ClientRoundRecord c;
      c.client = Text(s.get(), 0);
      c.status = Text(s.get(), 1);
      c.reason = Text(s.get(), 2);
      c.num_samples = static_cast<uint64_t>(sqlite3_column_int64(s.get(), 3));
      c.train_loss = sqlite3_column_double(s.get(), 4);
      c.train_accuracy = sqlite3_column_double(s.get(), 5);
      c.train_seconds = sqlite3_column_double(s.get(), 6);
      c.stage = Text(s.get(), 7);
      c.misbehaved = sqlite3_column_type(s.get(), 8) == SQLITE_NULL
                         ? MisbehavedByReason(c.reason)
                         : sqlite3_column_int64(s.get(), 8) != 0;
      c.data_sha256 = Text(s.get(), 9);
      c.upload_bytes = static_cast<uint64_t>(sqlite3_column_int64(s.get(), 10));
      c.download_bytes = static_cast<uint64_t>(sqlite3_column_int64(s.get(), 11));
      c.label_counts = ParseCounts(Text(s.get(), 12));
      out.push_back(std::move(c));
    }
    if (rc != SQLITE_DONE) return Error("read round clients");
    return out;
  }

 private:
  // The checkpoint columns CheckpointFromRow reads, then `tail`.
  std::string CheckpointSql(const std::string& tail) {
    return "SELECT round, model, velocity, model_crc32, " + columns_["checkpoints.velocity_crc32"] +
           ", " + columns_["checkpoints.optimizer_steps"] + ", " +
           columns_["checkpoints.fedbuff_schedule"] + ", " +
           columns_["checkpoints.fedbuff_schedule_crc32"] + " FROM checkpoints " + tail;
  }

  // One row of CheckpointSql, its sizes and checksums verified.
  StatusOr<Checkpoint> CheckpointFromRow(sqlite3_stmt* row) {
    Checkpoint cp;
    cp.round = static_cast<uint32_t>(sqlite3_column_int64(row, 0));
    const std::string what = "run store: checkpoint of round " + std::to_string(cp.round);
    const int model_bytes = sqlite3_column_bytes(row, 1);
    const int velocity_bytes = sqlite3_column_bytes(row, 2);
    if (model_bytes == 0 || model_bytes % sizeof(float) != 0) {
      return DataLossError(what + ": model has " + std::to_string(model_bytes) +
                           " bytes, not a positive multiple of 4");
    }
    if (velocity_bytes != 0 && velocity_bytes != model_bytes && velocity_bytes != 2 * model_bytes) {
      return DataLossError(what + ": optimizer state has " + std::to_string(velocity_bytes) +
                           " bytes, not 0, 1 or 2 times the model's " +
                           std::to_string(model_bytes));
    }
    cp.model = Floats(row, 1);
    cp.velocity = Floats(row, 2);
    const int64_t steps = sqlite3_column_int64(row, 5);
    if (steps < 0) return DataLossError(what + ": negative optimizer step count");
    cp.optimizer_steps = static_cast<uint64_t>(steps);
    const auto stored_model_crc = static_cast<uint32_t>(sqlite3_column_int64(row, 3));
    if (const uint32_t crc = FloatsCrc(cp.model); crc != stored_model_crc) {
      return DataLossError(what + ": model fails its CRC-32 (stored " + Hex32(stored_model_crc) +
                           ", computed " + Hex32(crc) + ")");
    }
    if (sqlite3_column_type(row, 4) != SQLITE_NULL) {
      const auto stored = static_cast<uint32_t>(sqlite3_column_int64(row, 4));
      if (const uint32_t crc = FloatsCrc(cp.velocity); crc != stored) {
        return DataLossError(what + ": server velocity fails its CRC-32 (stored " + Hex32(stored) +
                             ", computed " + Hex32(crc) + ")");
      }
    }
    return ScheduleFromRow(row, what, std::move(cp));
  }

  // The fedbuff schedule of CheckpointSql's row (columns 6 and 7) into cp.
  StatusOr<Checkpoint> ScheduleFromRow(sqlite3_stmt* row, const std::string& what, Checkpoint cp) {
    const void* p = sqlite3_column_blob(row, 6);
    const int bytes = sqlite3_column_bytes(row, 6);
    if (p != nullptr && bytes > 0) cp.schedule.assign(static_cast<const char*>(p), bytes);
    // No schedule and no checksum: a version without one (or an older
    // store). A checksum over an emptied schedule is checked like any.
    if (cp.schedule.empty() && sqlite3_column_type(row, 7) == SQLITE_NULL) return cp;
    const uint32_t crc = BytesCrc(cp.schedule);
    if (sqlite3_column_type(row, 7) == SQLITE_NULL ||
        static_cast<uint32_t>(sqlite3_column_int64(row, 7)) != crc) {
      return DataLossError(what + ": fedbuff schedule fails its CRC-32 (stored " +
                           (sqlite3_column_type(row, 7) == SQLITE_NULL
                                ? std::string("none")
                                : Hex32(static_cast<uint32_t>(sqlite3_column_int64(row, 7)))) +
                           ", computed " + Hex32(crc) + ")");
    }
    return cp;
  }

  // Each column that older stores lack, as a query reads it: the column,
  // or the default Init adds it with.
  Status ResolveColumns() {
    static constexpr const char* kOptional[][3] = {
        {"rounds", "aggregation", "'plain'"},
        {"rounds", "outcome", "'committed'"},
        {"rounds", "outcome_reason", "''"},
        {"rounds", "clock_seconds", "0"},
        {"round_clients", "stage", "''"},
        {"round_clients", "misbehaved", "NULL"},
        {"checkpoints", "velocity_crc32", "NULL"},
        {"checkpoints", "optimizer_steps", "0"},
        {"checkpoints", "fedbuff_schedule", "x''"},
        {"checkpoints", "fedbuff_schedule_crc32", "NULL"},
        {"rounds", "federated_eval_loss", "-1"},
        {"rounds", "federated_eval_accuracy", "-1"},
        {"rounds", "federated_eval_samples", "0"},
        {"rounds", "dp_sampling_rate", "0"},
        {"rounds", "dp_epsilon", "-1"},
        {"rounds", "dp_clip_norm", "0"},
        {"rounds", "dp_next_clip_norm", "0"},
        {"rounds", "dp_epsilon_released_model", "-1"},
        {"rounds", "scaffold_population", "0"},
        {"runs", "config_sha256", "''"},
        {"runs", "world_size", "0"},
        {"runs", "devices", "''"},
        {"runs", "run_nonce", "''"},
        {"round_clients", "data_sha256", "''"},
        {"round_clients", "upload_bytes", "0"},
        {"round_clients", "download_bytes", "0"},
        {"round_clients", "label_counts", "''"},
    };
    for (const auto& [table, column, fallback] : kOptional) {
      Statement s(db_, "SELECT 1 FROM pragma_table_info(?) WHERE name = ?");
      if (!s.ok()) return Error("inspect schema");
      sqlite3_bind_text(s.get(), 1, table, -1, SQLITE_STATIC);
      sqlite3_bind_text(s.get(), 2, column, -1, SQLITE_STATIC);
      const int rc = sqlite3_step(s.get());
      if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("inspect schema");
      columns_[std::string(table) + "." + column] = rc == SQLITE_ROW ? column : fallback;
    }
    // Stores older than the timings have neither table (read as none).
    Statement t(db_,
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
                "name IN ('round_stages', 'round_ranks')");
    if (!t.ok() || sqlite3_step(t.get()) != SQLITE_ROW) return Error("inspect schema");
    has_timings_ = sqlite3_column_int64(t.get(), 0) == 2;
    return OkStatus();
  }
  // The run's row and its round-0 checkpoint, inside the caller's transaction.
  Status InsertRun(const RunInfo& info, const Checkpoint& initial) {
    Statement s(
        db_,
        "INSERT INTO runs (id, config, seed, code_version, created_unix_ms, last_round, "
        "config_sha256, world_size, devices, run_nonce) VALUES (1, ?, ?, ?, ?, 0, ?, ?, ?, ?)");
    if (!s.ok()) return Error("create run");
    sqlite3_bind_text(s.get(), 1, info.config_text.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(s.get(), 2, static_cast<int64_t>(info.seed));
    sqlite3_bind_text(s.get(), 3, info.code_version.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(s.get(), 4, env_->UnixMillis());
    sqlite3_bind_text(s.get(), 5, info.config_sha256.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(s.get(), 6, info.world_size);
    sqlite3_bind_text(s.get(), 7, info.devices.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s.get(), 8, info.run_nonce.c_str(), -1, SQLITE_TRANSIENT);
    const int rc = sqlite3_step(s.get());
    if (rc == SQLITE_CONSTRAINT) return AlreadyExistsError("run store already holds a run");
    if (rc != SQLITE_DONE) return Error("create run");
    return PutCheckpoint(initial);
  }

  Status NotARunStore(const std::string& why) {
    return InvalidArgumentError("not a Cohort run store (" + why + ")");
  }
  static Status ReadOnlyError(const std::string& what) {
    return FailedPreconditionError("run store: " + what + ": opened read-only");
  }
  Status AddColumnIfMissing(const std::string& table, const std::string& column,
                            const std::string& type) {
    Statement s(db_, ("SELECT 1 FROM pragma_table_info('" + table + "') WHERE name = ?").c_str());
    if (!s.ok()) return Error("inspect schema");
    sqlite3_bind_text(s.get(), 1, column.c_str(), -1, SQLITE_TRANSIENT);
    const int rc = sqlite3_step(s.get());
    if (rc == SQLITE_ROW) return OkStatus();
    if (rc != SQLITE_DONE) return Error("inspect schema");
    return Exec(("ALTER TABLE " + table + " ADD COLUMN " + column + " " + type).c_str());
  }
  Status Exec(const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      std::string message = err != nullptr ? err : sqlite3_errmsg(db_);
      sqlite3_free(err);
      return UnavailableError("run store: " + message);
    }
    return OkStatus();
  }
  Status Error(const std::string& what) {
    return UnavailableError("run store: " + what + ": " + sqlite3_errmsg(db_));
  }
  Status Finish(const Status& status) {
    if (!status.ok()) {
      (void)Exec("ROLLBACK");
      return status;
    }
    return Exec("COMMIT");
  }
  Status PutCheckpoint(const Checkpoint& cp) {
    Statement s(db_,
                "INSERT OR REPLACE INTO checkpoints (round, model, velocity, model_crc32, "
                "velocity_crc32, optimizer_steps, fedbuff_schedule, fedbuff_schedule_crc32) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
    if (!s.ok()) return Error("write checkpoint");
    sqlite3_bind_int64(s.get(), 1, cp.round);
    BindFloats(s.get(), 2, cp.model);
    BindFloats(s.get(), 3, cp.velocity);
    sqlite3_bind_int64(s.get(), 4, FloatsCrc(cp.model));
    sqlite3_bind_int64(s.get(), 5, FloatsCrc(cp.velocity));
    sqlite3_bind_int64(s.get(), 6, static_cast<int64_t>(cp.optimizer_steps));
    sqlite3_bind_blob64(s.get(), 7, cp.schedule.data(), cp.schedule.size(), SQLITE_STATIC);
    if (cp.schedule.empty()) {
      sqlite3_bind_null(s.get(), 8);
    } else {
      sqlite3_bind_int64(s.get(), 8, BytesCrc(cp.schedule));
    }
    if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("write checkpoint");
    return OkStatus();
  }
  // An empty vector binds as a zero-length blob, not NULL.
  static void BindFloats(sqlite3_stmt* s, int col, const std::vector<float>& v) {
    if (v.empty()) {
      sqlite3_bind_zeroblob(s, col, 0);
    } else {
      sqlite3_bind_blob64(s, col, v.data(), v.size() * sizeof(float), SQLITE_STATIC);
    }
  }
  static std::string Text(sqlite3_stmt* s, int col) {
    const auto* p = sqlite3_column_text(s, col);
    return p != nullptr ? reinterpret_cast<const char*>(p) : "";
  }
  static std::vector<float> Floats(sqlite3_stmt* s, int col) {
    const void* p = sqlite3_column_blob(s, col);
    const int bytes = sqlite3_column_bytes(s, col);
    std::vector<float> out(bytes / sizeof(float));
    if (p != nullptr && bytes > 0) std::memcpy(out.data(), p, out.size() * sizeof(float));
    return out;
  }

  // The round's client rows, inside CommitRound's transaction.
  Status PutClients(uint32_t round, const std::vector<ClientRoundRecord>& clients) {
    Statement c(db_,
                "INSERT INTO round_clients (round, client, status, reason, num_samples, "
                "train_loss, train_accuracy, train_seconds, stage, misbehaved, data_sha256, "
                "upload_bytes, download_bytes, label_counts) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    if (!c.ok()) return Error("commit round clients");
    for (const ClientRoundRecord& cr : clients) {
      sqlite3_reset(c.get());
      sqlite3_bind_int64(c.get(), 1, round);
      sqlite3_bind_text(c.get(), 2, cr.client.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(c.get(), 3, cr.status.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(c.get(), 4, cr.reason.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(c.get(), 5, static_cast<int64_t>(cr.num_samples));
      sqlite3_bind_double(c.get(), 6, cr.train_loss);
      sqlite3_bind_double(c.get(), 7, cr.train_accuracy);
      sqlite3_bind_double(c.get(), 8, cr.train_seconds);
      sqlite3_bind_text(c.get(), 9, cr.stage.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int(c.get(), 10, cr.misbehaved ? 1 : 0);
      sqlite3_bind_text(c.get(), 11, cr.data_sha256.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(c.get(), 12, static_cast<int64_t>(cr.upload_bytes));
      sqlite3_bind_int64(c.get(), 13, static_cast<int64_t>(cr.download_bytes));
      const std::string counts = JoinCounts(cr.label_counts);
      sqlite3_bind_text(c.get(), 14, counts.c_str(), -1, SQLITE_TRANSIENT);
      if (sqlite3_step(c.get()) != SQLITE_DONE) return Error("commit round clients");
    }
    return OkStatus();
  }

  // The round's stage and rank rows, inside CommitRound's transaction.
  // Not inlined, so that bench/observability_share.sh can count it by name.
  [[gnu::noinline]] Status PutTimings(const RoundRecord& r) {
    Statement st(db_,
                 "INSERT INTO round_stages (round, position, stage, seconds, bytes_in, bytes_out) "
                 "VALUES (?, ?, ?, ?, ?, ?)");
    if (!st.ok()) return Error("commit round stages");
    for (size_t i = 0; i < r.stages.size(); ++i) {
      const StageRecord& stage = r.stages[i];
      sqlite3_reset(st.get());
      sqlite3_bind_int64(st.get(), 1, r.round);
      sqlite3_bind_int64(st.get(), 2, static_cast<int64_t>(i));
      sqlite3_bind_text(st.get(), 3, stage.stage.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_double(st.get(), 4, stage.seconds);
      sqlite3_bind_int64(st.get(), 5, static_cast<int64_t>(stage.bytes_in));
      sqlite3_bind_int64(st.get(), 6, static_cast<int64_t>(stage.bytes_out));
      if (sqlite3_step(st.get()) != SQLITE_DONE) return Error("commit round stages");
    }
    Statement rk(db_,
                 "INSERT INTO round_ranks (round, rank, steps, samples, compute_seconds, "
                 "comm_seconds, seconds, device) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
    if (!rk.ok()) return Error("commit round ranks");
    for (const RankRecord& rank : r.ranks) {
      sqlite3_reset(rk.get());
      sqlite3_bind_int64(rk.get(), 1, r.round);
      sqlite3_bind_int64(rk.get(), 2, rank.rank);
      sqlite3_bind_int64(rk.get(), 3, static_cast<int64_t>(rank.steps));
      sqlite3_bind_int64(rk.get(), 4, static_cast<int64_t>(rank.samples));
      sqlite3_bind_double(rk.get(), 5, rank.compute_seconds);
      sqlite3_bind_double(rk.get(), 6, rank.comm_seconds);
      sqlite3_bind_double(rk.get(), 7, rank.seconds);
      sqlite3_bind_text(rk.get(), 8, rank.device.c_str(), -1, SQLITE_TRANSIENT);
      if (sqlite3_step(rk.get()) != SQLITE_DONE) return Error("commit round ranks");
    }
    return OkStatus();
  }

  // Fills each round's stages and ranks (`rounds` ascending by round).
  Status ReadTimings(std::vector<RoundRecord>& rounds) {
    if (!has_timings_ || rounds.empty()) return OkStatus();
    std::map<uint32_t, RoundRecord*> by_round;
    for (RoundRecord& r : rounds) by_round[r.round] = &r;
    Statement st(db_,
                 "SELECT round, stage, seconds, bytes_in, bytes_out FROM round_stages "
                 "ORDER BY round, position");
    if (!st.ok()) return Error("read round stages");
    int rc;
    while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
      auto it = by_round.find(static_cast<uint32_t>(sqlite3_column_int64(st.get(), 0)));
      if (it == by_round.end()) continue;
      it->second->stages.push_back({Text(st.get(), 1), sqlite3_column_double(st.get(), 2),
                                    static_cast<uint64_t>(sqlite3_column_int64(st.get(), 3)),
                                    static_cast<uint64_t>(sqlite3_column_int64(st.get(), 4))});
    }
    if (rc != SQLITE_DONE) return Error("read round stages");
    Statement rk(db_,
                 "SELECT round, rank, steps, samples, compute_seconds, comm_seconds, seconds, "
                 "device FROM round_ranks ORDER BY round, rank");
    if (!rk.ok()) return Error("read round ranks");
    while ((rc = sqlite3_step(rk.get())) == SQLITE_ROW) {
      auto it = by_round.find(static_cast<uint32_t>(sqlite3_column_int64(rk.get(), 0)));
      if (it == by_round.end()) continue;
      it->second->ranks.push_back({static_cast<uint32_t>(sqlite3_column_int64(rk.get(), 1)),
                                   static_cast<uint64_t>(sqlite3_column_int64(rk.get(), 2)),
                                   static_cast<uint64_t>(sqlite3_column_int64(rk.get(), 3)),
                                   sqlite3_column_double(rk.get(), 4),
                                   sqlite3_column_double(rk.get(), 5),
                                   sqlite3_column_double(rk.get(), 6), Text(rk.get(), 7)});
    }
    if (rc != SQLITE_DONE) return Error("read round ranks");
    return OkStatus();
  }

  sqlite3* db_;
  const uint32_t kill_in_commit_round_;
  const bool read_only_;
  Env* const env_;                              // Stamps records with the time they were made.
  std::map<std::string, std::string> columns_;  // "table.column": what a query reads.
  bool has_timings_ = false;                    // The round_stages and round_ranks tables.
};

}  // namespace

StatusOr<std::unique_ptr<RunStore>> OpenSqliteRunStore(const std::string& path, Env* env) {
  COHORT_ASSIGN_OR_RETURN(const uint32_t kill_in_commit_round, KillInCommitRound());
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string message = db != nullptr ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return UnavailableError(path + ": cannot open run store: " + message);
  }
  auto store = std::make_unique<SqliteRunStore>(db, kill_in_commit_round, /*read_only=*/false, env);
  COHORT_RETURN_IF_ERROR(store->Init().WithContext(path));
  return std::unique_ptr<RunStore>(std::move(store));
}

StatusOr<std::unique_ptr<RunStore>> OpenSqliteRunStoreReadOnly(const std::string& path,
                                                               bool follow) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return std::filesystem::exists(path, ec)
               ? InvalidArgumentError(path + ": not a Cohort run store (not a regular file)")
               : NotFoundError(path + ": no run store here");
  }
  // A store no one writes is a plain file: immutable=1 reads it without
  // locks or the -wal and -shm files a WAL database otherwise gets.
  const bool live = follow || std::filesystem::exists(path + "-wal", ec);
  const std::string uri = FileUri(path) + (live ? "" : "?immutable=1");
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      uri.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_URI, nullptr);
  if (rc != SQLITE_OK) {
    std::string message = db != nullptr ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return UnavailableError(path + ": cannot open run store: " + message);
  }
  auto store = std::make_unique<SqliteRunStore>(db, 0, /*read_only=*/true, Env::Default());
  COHORT_RETURN_IF_ERROR(store->InitReadOnly().WithContext(path));
  return std::unique_ptr<RunStore>(std::move(store));
}

}  // namespace cohort::store
