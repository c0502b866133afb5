#include "store/run_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "store/run_reader.h"

namespace cohort::store {
namespace {

Checkpoint Cp(uint32_t round, float v) { return {round, std::vector<float>(5, v), {}}; }

// A fresh directory for a file-backed store, removed on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag)
      : path_(std::filesystem::temp_directory_path() /
              ("cohort_store_" + tag + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string db() const { return path_ + "/run.db"; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs `sql` on the store's file through a separate SQLite connection, as
// an outside party (a disk error, an operator) would change it.
void RawSql(const std::string& path, const std::string& sql,
            const std::vector<uint8_t>& blob = {}) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  if (!blob.empty()) sqlite3_bind_blob(stmt, 1, blob.data(), blob.size(), SQLITE_TRANSIENT);
  EXPECT_EQ(sqlite3_step(stmt), SQLITE_DONE) << sqlite3_errmsg(db);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

std::vector<uint32_t> CheckpointRounds(const std::string& path) {
  sqlite3* db = nullptr;
  std::vector<uint32_t> rounds;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(
      sqlite3_prepare_v2(db, "SELECT round FROM checkpoints ORDER BY round", -1, &stmt, nullptr),
      SQLITE_OK);
  while (sqlite3_step(stmt) == SQLITE_ROW) rounds.push_back(sqlite3_column_int(stmt, 0));
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return rounds;
}

std::vector<uint8_t> FloatBytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// Distinct values, so the model's bytes occur once in the file.
std::vector<float> Distinct(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + 0.001f * static_cast<float>(i);
  return v;
}

// The typed column is what counts, whatever the reason's text says.
TEST(RunStoreTest, MisbehaviourIsReadFromItsColumnNotFromTheReason) {
  auto store = std::move(OpenSqliteRunStore(":memory:")).value();
  ASSERT_TRUE(store->CreateRun({"c", 1, "v", 0}, Cp(0, 0)).ok());
  ClientRoundRecord forged;
  forged.client = "a";
  forged.status = "ok";
  forged.reason = "revealed a forged share";
  forged.misbehaved = true;
  ClientRoundRecord innocent;
  innocent.client = "b";
  innocent.status = "dropped";
  innocent.reason = "left: \"misbehaved: \" is only text here";
  RoundRecord r;
  r.round = 1;
  ASSERT_TRUE(store->CommitRound(r, {forged, innocent}, Cp(1, 1), 3).ok());
  auto clients = store->ClientRounds(1);
  ASSERT_TRUE(clients.ok()) << clients.status();
  ASSERT_EQ(clients->size(), 2u);
  EXPECT_TRUE((*clients)[0].misbehaved);
  EXPECT_FALSE((*clients)[1].misbehaved);
}

TEST(RunStoreTest, CommittedRoundsSurviveReopening) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("cohort_store_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/run.db";
  {
    auto store = std::move(OpenSqliteRunStore(path)).value();
    auto run = store->LoadRun();
    ASSERT_TRUE(run.ok());
    EXPECT_FALSE(run->has_value());
    ASSERT_TRUE(store->CreateRun({"name: \"x\"", 7, "v1", 0}, Cp(0, 0.5f)).ok());
    RoundRecord r;
    r.round = 1;
    r.participants = 2;
    r.selected = 3;
    r.dropped = 1;
    r.test_accuracy = 0.75;
    std::vector<ClientRoundRecord> clients(2);
    clients[0] = {"a", "ok", "", 10, 0.5, 0.8, 1.0, ""};
    clients[1].client = "b";
    clients[1].status = "dropped";
    clients[1].reason = "missed the round deadline";
    clients[1].stage = "share_keys";
    r.aggregation = "secagg+";
    r.seconds = 0.25;
    r.clock_seconds = 20.0;  // A simulated round: its own clock.
    ASSERT_TRUE(store->CommitRound(r, clients, Cp(1, 1.5f), 3).ok());
  }
  auto store = std::move(OpenSqliteRunStore(path)).value();
  auto run = store->LoadRun();
  ASSERT_TRUE(run.ok() && run->has_value());
  EXPECT_EQ((*run)->seed, 7u);
  EXPECT_EQ((*run)->last_round, 1u);
  auto cp = store->LatestCheckpoint();
  ASSERT_TRUE(cp.ok());
  EXPECT_EQ(cp->round, 1u);
  EXPECT_EQ(cp->model, std::vector<float>(5, 1.5f));
  auto rounds = store->Rounds();
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].dropped, 1u);
  EXPECT_DOUBLE_EQ((*rounds)[0].test_accuracy, 0.75);
  EXPECT_EQ((*rounds)[0].aggregation, "secagg+");
  EXPECT_EQ((*rounds)[0].outcome, "committed");
  EXPECT_DOUBLE_EQ((*rounds)[0].seconds, 0.25);
  EXPECT_DOUBLE_EQ((*rounds)[0].clock_seconds, 20.0);
  auto clients = store->ClientRounds(1);
  ASSERT_EQ(clients->size(), 2u);
  EXPECT_EQ((*clients)[1].reason, "missed the round deadline");
  EXPECT_EQ((*clients)[1].stage, "share_keys");
  std::filesystem::remove_all(dir);
}

TEST(RunStoreTest, OutOfOrderCommitIsRefusedAndChangesNothing) {
  auto store = std::move(OpenSqliteRunStore(":memory:")).value();
  ASSERT_TRUE(store->CreateRun({"c", 1, "v", 0}, Cp(0, 0)).ok());
  RoundRecord r;
  r.round = 2;
  EXPECT_EQ(store->CommitRound(r, {}, Cp(2, 2), 3).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->LatestCheckpoint()->round, 0u);
  EXPECT_TRUE(store->Rounds()->empty());
  EXPECT_EQ(store->CreateRun({"c", 1, "v", 0}, Cp(0, 0)).code(), StatusCode::kAlreadyExists);
}

// A run's config is fixed at its first committed round, not before.
TEST(RunStoreTest, AnUncommittedRunMayBeReplacedACommittedOneNot) {
  auto store = std::move(OpenSqliteRunStore(":memory:")).value();
  ASSERT_TRUE(store->CreateRun({"first", 1, "v", 0}, Cp(0, 0)).ok());
  ASSERT_TRUE(store->ReplaceUncommittedRun({"second", 2, "v", 0}, Cp(0, 7)).ok());
  EXPECT_EQ((*store->LoadRun())->config_text, "second");
  EXPECT_EQ((*store->LoadRun())->seed, 2u);
  EXPECT_EQ(store->LatestCheckpoint()->model[0], 7.0f);
  RoundRecord r;
  r.round = 1;
  ASSERT_TRUE(store->CommitRound(r, {}, Cp(1, 1), 3).ok());
  const Status fixed = store->ReplaceUncommittedRun({"third", 3, "v", 0}, Cp(0, 9));
  EXPECT_EQ(fixed.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(fixed.message().find("its config is fixed"), std::string::npos);
  EXPECT_EQ((*store->LoadRun())->config_text, "second");
  EXPECT_EQ(store->LatestCheckpoint()->round, 1u);
}

TEST(RunStoreTest, KeepsOnlyTheNewestCheckpoints) {
  ScratchDir dir("prune");
  auto store = std::move(OpenSqliteRunStore(dir.db())).value();
  ASSERT_TRUE(store->CreateRun({"c", 1, "v", 0}, Cp(0, 0)).ok());
  for (uint32_t i = 1; i <= 5; ++i) {
    RoundRecord r;
    r.round = i;
    ASSERT_TRUE(store->CommitRound(r, {}, Cp(i, static_cast<float>(i)), 2).ok());
    // The older checkpoints are gone from the file, not only shadowed.
    const std::vector<uint32_t> expected =
        i == 1 ? std::vector<uint32_t>{0, 1} : std::vector<uint32_t>{i - 1, i};
    EXPECT_EQ(CheckpointRounds(dir.db()), expected) << "after round " << i;
  }
  EXPECT_EQ(store->LatestCheckpoint()->model[0], 5.0f);
  EXPECT_EQ(store->Rounds()->size(), 5u);
  // keep = 0 would delete the checkpoint just written.
  RoundRecord r;
  r.round = 6;
  EXPECT_EQ(store->CommitRound(r, {}, Cp(6, 6), 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckpointRounds(dir.db()), (std::vector<uint32_t>{4, 5}));
}

// A kept round reads back by number, also through a read-only open; a
// pruned or never-committed one is kNotFound naming the round.
TEST(RunStoreTest, AKeptRoundsCheckpointReadsByItsNumber) {
  ScratchDir dir("by_round");
  {
    auto store = std::move(OpenSqliteRunStore(dir.db())).value();
    ASSERT_TRUE(store->CreateRun({"c", 1, "v", 0}, Cp(0, 0)).ok());
    for (uint32_t i = 1; i <= 4; ++i) {
      RoundRecord r;
      r.round = i;
      ASSERT_TRUE(store->CommitRound(r, {}, Cp(i, static_cast<float>(i)), 2).ok());
    }
  }
  auto store = std::move(OpenSqliteRunStoreReadOnly(dir.db())).value();
  EXPECT_EQ(*store->CheckpointRounds(), (std::vector<uint32_t>{3, 4}));
  auto three = store->CheckpointAt(3);
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  EXPECT_EQ(three->round, 3u);
  EXPECT_EQ(three->model, std::vector<float>(5, 3.0f));
  EXPECT_EQ(store->CheckpointAt(4)->model[0], 4.0f);
  for (uint32_t gone : {1u, 9u}) {
    const Status missing = store->CheckpointAt(gone).status();
    EXPECT_EQ(missing.code(), StatusCode::kNotFound);
    EXPECT_NE(missing.message().find("no checkpoint of round " + std::to_string(gone)),
              std::string::npos)
        << missing.ToString();
  }
}

// What a user asks of a run directory (cohort.torch.load_run, cohort
// export): the last committed round by default, any kept round by number,
// and errors naming the directory and what is missing.
TEST(RunReaderTest, ReadsTheLastCommittedRoundOrANamedOneAndNamesWhatIsMissing) {
  ScratchDir dir("reader");
  auto expect_error = [&](std::optional<uint32_t> round, StatusCode code, const std::string& what) {
    const Status s = ReadRunCheckpoint(dir.path(), round).status();
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(what), std::string::npos) << s.ToString();
    EXPECT_EQ(s.message().rfind(dir.path(), 0), 0u) << s.ToString();
  };
  expect_error(std::nullopt, StatusCode::kNotFound, "no run database (run.db)");
  {
    const Status s = ReadRunCheckpoint(dir.path() + "/nope").status();
    EXPECT_EQ(s.message(), dir.path() + "/nope: no such run directory");
  }
  auto store = std::move(OpenSqliteRunStore(dir.db())).value();
  ASSERT_TRUE(store->CreateRun({"cfg", 1, "v", 0}, Cp(0, 0.5f)).ok());
  expect_error(std::nullopt, StatusCode::kFailedPrecondition, "committed no round yet");
  EXPECT_EQ(ReadRunCheckpoint(dir.path(), 0)->checkpoint.model[0], 0.5f);
  for (uint32_t i = 1; i <= 3; ++i) {
    RoundRecord r;
    r.round = i;
    ASSERT_TRUE(store->CommitRound(r, {}, Cp(i, static_cast<float>(i)), 2).ok());
  }
  auto last = ReadRunCheckpoint(dir.path());
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(last->checkpoint.round, 3u);
  EXPECT_EQ(last->checkpoint.model[0], 3.0f);
  EXPECT_EQ(last->info.config_text, "cfg");
  EXPECT_EQ(ReadRunCheckpoint(dir.path(), 2)->checkpoint.model[0], 2.0f);
  expect_error(4, StatusCode::kOutOfRange, "round 4 is past the last committed round, 3");
  expect_error(1, StatusCode::kNotFound, "keeps the models of rounds 2 and 3");
}

TEST(RunStoreTest, VelocityIsCheckpointedWithTheModel) {
  auto store = std::move(OpenSqliteRunStore(":memory:")).value();
  ASSERT_TRUE(store->CreateRun({"c", 1, "v", 0}, Cp(0, 0)).ok());
  RoundRecord r;
  r.round = 1;
  Checkpoint cp{1, Distinct(7, 1.0f), Distinct(7, -2.0f)};
  ASSERT_TRUE(store->CommitRound(r, {}, cp, 3).ok());
  auto loaded = store->LatestCheckpoint();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->model, cp.model);
  EXPECT_EQ(loaded->velocity, cp.velocity);
}

TEST(RunStoreTest, AdamStateAndItsStepCountAreCheckpointed) {
  // A data-parallel run with Adam: both moments (twice the model) and the
  // step count its bias correction needs.
  auto store = std::move(OpenSqliteRunStore(":memory:")).value();
  ASSERT_TRUE(store->CreateRun({"c", 1, "v", 0}, Cp(0, 0)).ok());
  RoundRecord r;
  r.round = 1;
  Checkpoint cp{1, Distinct(7, 1.0f), Distinct(14, -2.0f), uint64_t{1} << 40};
  ASSERT_TRUE(store->CommitRound(r, {}, cp, 3).ok());
  auto loaded = store->LatestCheckpoint();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->velocity, cp.velocity);
  EXPECT_EQ(loaded->optimizer_steps, uint64_t{1} << 40);
}

// Writes round 1 with a distinct model and velocity into a file store.
void WriteOneRound(const std::string& path, const Checkpoint& cp) {
  auto store = std::move(OpenSqliteRunStore(path)).value();
  ASSERT_TRUE(store->CreateRun({"c", 1, "v", 0}, Cp(0, 0)).ok());
  RoundRecord r;
  r.round = 1;
  ASSERT_TRUE(store->CommitRound(r, {}, cp, 3).ok());
}

void ExpectDataLoss(const std::string& path, const std::string& needle) {
  auto store = OpenSqliteRunStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto cp = (*store)->LatestCheckpoint();
  ASSERT_FALSE(cp.ok()) << "a corrupted checkpoint was loaded";
  EXPECT_EQ(cp.status().code(), StatusCode::kDataLoss) << cp.status();
  EXPECT_NE(cp.status().message().find("round 1"), std::string::npos) << cp.status();
  EXPECT_NE(cp.status().message().find(needle), std::string::npos) << cp.status();
}

// Bit rot below SQLite: one bit flipped in the model's bytes in the database
// file. SQLite has no checksum of its own for row contents; ours catches it.
TEST(RunStoreTest, FlippedBitInTheFileIsDataLossNamingTheModel) {
  ScratchDir dir("bitrot");
  const Checkpoint cp{1, Distinct(64, 3.0f), {}};
  WriteOneRound(dir.db(), cp);  // Closing checkpoints the WAL into run.db.
  ASSERT_FALSE(std::filesystem::exists(dir.db() + "-wal"));
  std::string bytes;
  {
    std::ifstream in(dir.db(), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::vector<uint8_t> model = FloatBytes(cp.model);
  const std::string needle(model.begin(), model.end());
  int flipped = 0;
  for (size_t at = bytes.find(needle); at != std::string::npos; at = bytes.find(needle, at + 1)) {
    bytes[at + 101] ^= 0x10;
    ++flipped;
  }
  ASSERT_GE(flipped, 1) << "model bytes not found in the file";
  {
    std::ofstream out(dir.db(), std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  ExpectDataLoss(dir.db(), "model fails its CRC-32");
}

TEST(RunStoreTest, CorruptedVelocityOrTruncatedModelIsDataLoss) {
  const Checkpoint cp{1, Distinct(16, 3.0f), Distinct(16, -1.0f)};
  {
    ScratchDir dir("velocity");
    WriteOneRound(dir.db(), cp);
    std::vector<uint8_t> velocity = FloatBytes(cp.velocity);
    velocity[9] ^= 0x01;
    RawSql(dir.db(), "UPDATE checkpoints SET velocity = ? WHERE round = 1", velocity);
    ExpectDataLoss(dir.db(), "server velocity fails its CRC-32");
  }
  {
    ScratchDir dir("truncated");
    WriteOneRound(dir.db(), cp);
    std::vector<uint8_t> model = FloatBytes(cp.model);
    model.resize(model.size() - 2);
    RawSql(dir.db(), "UPDATE checkpoints SET model = ? WHERE round = 1", model);
    ExpectDataLoss(dir.db(), "model has 62 bytes");
  }
  {
    ScratchDir dir("short-velocity");
    WriteOneRound(dir.db(), cp);
    std::vector<uint8_t> velocity = FloatBytes(cp.velocity);
    velocity.resize(velocity.size() - 4);
    RawSql(dir.db(), "UPDATE checkpoints SET velocity = ? WHERE round = 1", velocity);
    ExpectDataLoss(dir.db(), "optimizer state has 60 bytes");
  }
}

// A FedBuff schedule commits with its checkpoint and reads back as it was
// written; a changed byte, or a schedule without its checksum, is data
// loss naming it, and the store's rounds stay.
TEST(RunStoreTest, FedBuffScheduleIsCommittedWithTheCheckpointAndChecked) {
  Checkpoint cp{1, Distinct(16, 3.0f), {}};
  cp.schedule = std::string("schedule\0bytes", 14);
  {
    ScratchDir dir("schedule");
    WriteOneRound(dir.db(), cp);
    auto store = std::move(OpenSqliteRunStore(dir.db())).value();
    auto loaded = store->LatestCheckpoint();
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->schedule, cp.schedule);
    EXPECT_TRUE(std::move(store->CheckpointAt(0)).value().schedule.empty());
  }
  {
    ScratchDir dir("schedule-flip");
    WriteOneRound(dir.db(), cp);
    std::vector<uint8_t> bytes(cp.schedule.begin(), cp.schedule.end());
    bytes[3] ^= 0x01;
    RawSql(dir.db(), "UPDATE checkpoints SET fedbuff_schedule = ? WHERE round = 1", bytes);
    ExpectDataLoss(dir.db(), "fedbuff schedule fails its CRC-32");
    auto store = std::move(OpenSqliteRunStore(dir.db())).value();
    EXPECT_EQ(std::move(store->Rounds()).value().size(), 1u);
  }
  {
    ScratchDir dir("schedule-no-crc");
    WriteOneRound(dir.db(), cp);
    RawSql(dir.db(), "UPDATE checkpoints SET fedbuff_schedule_crc32 = NULL WHERE round = 1");
    ExpectDataLoss(dir.db(), "fedbuff schedule fails its CRC-32 (stored none");
  }
  {
    // An emptied schedule whose checksum is still there is not "a version
    // without one": it fails the checksum too.
    ScratchDir dir("schedule-emptied");
    WriteOneRound(dir.db(), cp);
    RawSql(dir.db(), "UPDATE checkpoints SET fedbuff_schedule = x'' WHERE round = 1");
    ExpectDataLoss(dir.db(), "fedbuff schedule fails its CRC-32");
  }
}

// A store written before the velocity checksum existed still loads.
TEST(RunStoreTest, CheckpointWithoutVelocityChecksumLoads) {
  ScratchDir dir("old");
  const Checkpoint cp{1, Distinct(16, 3.0f), Distinct(16, -1.0f)};
  WriteOneRound(dir.db(), cp);
  RawSql(dir.db(), "UPDATE checkpoints SET velocity_crc32 = NULL");
  auto store = std::move(OpenSqliteRunStore(dir.db())).value();
  auto loaded = store->LatestCheckpoint();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->velocity, cp.velocity);
}

// The crash-test hook: a process killed inside round 2's commit, with the
// round's pages already in the WAL, leaves round 1 as the last committed
// round, and round 2 can then be committed again.
TEST(RunStoreTest, KillInsideTheCommitLosesTheWholeRoundAndNothingElse) {
  ScratchDir dir("kill");
  WriteOneRound(dir.db(), Checkpoint{1, Distinct(8, 1.0f), {}});
  RoundRecord r;
  r.round = 2;
  r.participants = 3;
  std::vector<ClientRoundRecord> clients(1);
  clients[0] = {"a", "ok", "", 10, 0.5, 0.8, 1.0, ""};
  const Checkpoint cp2{2, Distinct(8, 2.0f), Distinct(8, 0.5f)};
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("COHORT_FAULT_KILL_IN_COMMIT", "2", 1);
    auto store = OpenSqliteRunStore(dir.db());
    if (!store.ok()) _exit(2);
    (void)(*store)->CommitRound(r, clients, cp2, 3);
    _exit(3);  // Not reached: the hook raises SIGKILL.
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  // The round's pages did reach the WAL, without a commit record.
  ASSERT_TRUE(std::filesystem::exists(dir.db() + "-wal"));
  EXPECT_GT(std::filesystem::file_size(dir.db() + "-wal"), 0u);

  auto store = std::move(OpenSqliteRunStore(dir.db())).value();
  EXPECT_EQ((*store->LoadRun())->last_round, 1u);
  EXPECT_EQ(store->Rounds()->size(), 1u);
  EXPECT_TRUE(store->ClientRounds(2)->empty());
  auto cp = store->LatestCheckpoint();
  ASSERT_TRUE(cp.ok()) << cp.status();
  EXPECT_EQ(cp->round, 1u);
  EXPECT_EQ(cp->model, Distinct(8, 1.0f));
  ASSERT_TRUE(store->CommitRound(r, clients, cp2, 3).ok());
  EXPECT_EQ(store->LatestCheckpoint()->round, 2u);
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// `cohort status` on a run.db that is empty, or not SQLite at all: a clear
// error, and the file exactly as it was (the read-write open wrote a schema
// into the empty one).
TEST(RunStoreReadOnlyTest, AFileThatIsNoRunStoreIsNamedAndLeftAlone) {
  ScratchDir dir("ro_empty");
  { std::ofstream(dir.db(), std::ios::binary); }
  auto store = OpenSqliteRunStoreReadOnly(dir.db());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store.status().message(), dir.db() + ": not a Cohort run store (it has no runs table)");
  EXPECT_EQ(std::filesystem::file_size(dir.db()), 0u);
  EXPECT_FALSE(std::filesystem::exists(dir.db() + "-wal"));
  EXPECT_FALSE(std::filesystem::exists(dir.db() + "-journal"));

  const std::string text = "round,loss\n1,0.5\n";
  { std::ofstream(dir.db(), std::ios::binary | std::ios::trunc) << text; }
  store = OpenSqliteRunStoreReadOnly(dir.db());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find(dir.db() + ": not a Cohort run store ("),
            std::string::npos)
      << store.status();
  EXPECT_EQ(FileBytes(dir.db()), text);

  std::filesystem::remove(dir.db());
  store = OpenSqliteRunStoreReadOnly(dir.db());
  EXPECT_EQ(store.status().code(), StatusCode::kNotFound) << store.status();
  EXPECT_FALSE(std::filesystem::exists(dir.db()));  // Not created either.
}

TEST(RunStoreReadOnlyTest, ReadsARunAndRefusesToWriteIt) {
  ScratchDir dir("ro_run");
  const Checkpoint cp{1, Distinct(16, 3.0f), Distinct(16, -1.0f)};
  WriteOneRound(dir.db(), cp);
  const std::string before = FileBytes(dir.db());
  {
    auto store = OpenSqliteRunStoreReadOnly(dir.db());
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_EQ((*store)->Rounds()->size(), 1u);
    EXPECT_EQ((*(*store)->LoadRun())->last_round, 1u);
    auto loaded = (*store)->LatestCheckpoint();
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->model, cp.model);
    RoundRecord r;
    r.round = 2;
    const Status commit = (*store)->CommitRound(r, {}, Checkpoint{2, cp.model, {}}, 3);
    EXPECT_EQ(commit.code(), StatusCode::kFailedPrecondition) << commit;
    EXPECT_NE(commit.message().find("opened read-only"), std::string::npos) << commit;
    EXPECT_EQ((*store)->CreateRun({"c", 1, "v", 0}, Cp(0, 0)).code(),
              StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(FileBytes(dir.db()), before);
}

// A store from before the columns later builds add: read with their
// defaults, not altered to add them.
// A store as builds before the optional columns wrote it: round 1 has a
// client the engine marked misbehaving in its reason (the old rule) and one
// it did not.
void WriteOlderStore(const std::string& path) {
  RawSql(path,
         "CREATE TABLE runs (id INTEGER PRIMARY KEY, config TEXT NOT NULL, seed INTEGER NOT "
         "NULL, code_version TEXT NOT NULL, created_unix_ms INTEGER NOT NULL, last_round "
         "INTEGER NOT NULL)");
  RawSql(path,
         "CREATE TABLE rounds (round INTEGER PRIMARY KEY, participants INTEGER, selected "
         "INTEGER, dropped INTEGER, train_loss REAL, test_accuracy REAL, test_loss REAL, seconds "
         "REAL, coordinator_seconds REAL, committed_unix_ms INTEGER)");
  RawSql(path,
         "CREATE TABLE round_clients (round INTEGER, client TEXT, status TEXT, reason TEXT, "
         "num_samples INTEGER, train_loss REAL, train_accuracy REAL, train_seconds REAL)");
  RawSql(path,
         "CREATE TABLE checkpoints (round INTEGER PRIMARY KEY, model BLOB, velocity BLOB, "
         "model_crc32 INTEGER)");
  RawSql(path, "INSERT INTO rounds VALUES (1, 3, 4, 1, 0.5, 0.75, 0.6, 2.0, 0.1, 0)");
  RawSql(path, "INSERT INTO round_clients VALUES (1, 'a', 'ok', '', 10, 0.5, 0.8, 1.0)");
  RawSql(path,
         "INSERT INTO round_clients VALUES (1, 'm', 'rejected', 'left during consistency: "
         "misbehaved: dealt shares that do not rebuild', 10, 0, 0, 0)");
}

// A store from before the columns later builds add: read with their
// defaults, not altered to add them.
TEST(RunStoreReadOnlyTest, AnOlderStoreReadsWithTheMissingColumnsDefaults) {
  ScratchDir dir("ro_old");
  WriteOlderStore(dir.db());
  const std::string before = FileBytes(dir.db());
  {
    auto store = OpenSqliteRunStoreReadOnly(dir.db());
    ASSERT_TRUE(store.ok()) << store.status();
    auto rounds = (*store)->Rounds();
    ASSERT_TRUE(rounds.ok()) << rounds.status();
    ASSERT_EQ(rounds->size(), 1u);
    EXPECT_EQ((*rounds)[0].participants, 3u);
    EXPECT_EQ((*rounds)[0].aggregation, "plain");
    EXPECT_EQ((*rounds)[0].outcome, "committed");
    EXPECT_EQ((*rounds)[0].clock_seconds, 0.0);
    auto clients = (*store)->ClientRounds(1);
    ASSERT_TRUE(clients.ok()) << clients.status();
    ASSERT_EQ(clients->size(), 2u);
    EXPECT_EQ((*clients)[0].stage, "");
    EXPECT_FALSE((*clients)[0].misbehaved);
    EXPECT_TRUE((*clients)[1].misbehaved);  // Its reason says so: the old rule.
  }
  EXPECT_EQ(FileBytes(dir.db()), before);
}

// Opened for writing, an older store gains the misbehaved column; its old
// rows keep their text-marked bans, new rows carry the column.
TEST(RunStoreTest, AnOlderStoreOpensAndItsTextMarkedBansStillCount) {
  ScratchDir dir("old_bans");
  WriteOlderStore(dir.db());
  RawSql(dir.db(), "INSERT INTO runs VALUES (1, 'c', 1, 'v', 0, 1)");
  RawSql(dir.db(), "INSERT INTO checkpoints VALUES (1, ?, x'', 0)", FloatBytes({1, 2}));
  auto store = OpenSqliteRunStore(dir.db());
  ASSERT_TRUE(store.ok()) << store.status();
  auto old_clients = (*store)->ClientRounds(1);
  ASSERT_TRUE(old_clients.ok()) << old_clients.status();
  ASSERT_EQ(old_clients->size(), 2u);
  EXPECT_FALSE((*old_clients)[0].misbehaved);
  EXPECT_TRUE((*old_clients)[1].misbehaved);
  ClientRoundRecord banned;
  banned.client = "m";
  banned.status = "ok";
  banned.reason = "revealed a forged share";
  banned.misbehaved = true;
  RoundRecord r;
  r.round = 2;
  ASSERT_TRUE((*store)->CommitRound(r, {banned}, Cp(2, 2), 3).ok());
  auto new_clients = (*store)->ClientRounds(2);
  ASSERT_TRUE(new_clients.ok()) << new_clients.status();
  ASSERT_EQ(new_clients->size(), 1u);
  EXPECT_TRUE((*new_clients)[0].misbehaved);
}

// Lineage and timings (issue 33): the run's config hash, world size and
// devices; each round's stages and data-parallel ranks; each client's shard
// digest and traffic, all read back as committed, also read-only.
TEST(RunStoreTest, LineageAndTimingsAreCommittedWithTheRound) {
  ScratchDir dir("lineage");
  {
    auto store = OpenSqliteRunStore(dir.db());
    ASSERT_TRUE(store.ok()) << store.status();
    RunInfo info{"rounds { total: 2 }", 7, "0.9",        0,
                 std::string(64, 'a'),  3, "cpu,cuda:0", std::string(32, 'f')};
    ASSERT_TRUE((*store)->CreateRun(info, Cp(0, 0)).ok());
    RoundRecord r;
    r.round = 1;
    r.stages = {{"advertise_keys", 0.25, 1000, 2000}, {"masked_input", 1.5, 30000, 40}};
    r.ranks = {{0, 10, 640, 1.25, 0.5, 1.8, "cpu"}, {1, 10, 630, 1.0, 0.75, 1.8, "cuda:0"}};
    ClientRoundRecord c;
    c.client = "site-a";
    c.status = "ok";
    c.data_sha256 = std::string(64, 'b');
    c.upload_bytes = 12345;
    c.download_bytes = 678;
    c.label_counts = {5, 0, 12};
    ASSERT_TRUE((*store)->CommitRound(r, {c}, Cp(1, 1), 3).ok());
    RoundRecord plain;  // Nothing measured: no rows.
    plain.round = 2;
    ASSERT_TRUE((*store)->CommitRound(plain, {}, Cp(2, 2), 3).ok());
  }
  auto store = OpenSqliteRunStoreReadOnly(dir.db());
  ASSERT_TRUE(store.ok()) << store.status();
  auto info = (*store)->LoadRun();
  ASSERT_TRUE(info.ok() && info->has_value()) << info.status();
  EXPECT_EQ((*info)->config_sha256, std::string(64, 'a'));
  EXPECT_EQ((*info)->world_size, 3u);
  EXPECT_EQ((*info)->devices, "cpu,cuda:0");
  EXPECT_EQ((*info)->run_nonce, std::string(32, 'f'));
  auto rounds = (*store)->Rounds();
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->size(), 2u);
  const RoundRecord& r = (*rounds)[0];
  ASSERT_EQ(r.stages.size(), 2u);
  EXPECT_EQ(r.stages[0].stage, "advertise_keys");  // In the order committed.
  EXPECT_EQ(r.stages[1].stage, "masked_input");
  EXPECT_EQ(r.stages[1].seconds, 1.5);
  EXPECT_EQ(r.stages[1].bytes_in, 30000u);
  EXPECT_EQ(r.stages[0].bytes_out, 2000u);
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_EQ(r.ranks[1].rank, 1u);
  EXPECT_EQ(r.ranks[1].samples, 630u);
  EXPECT_EQ(r.ranks[1].comm_seconds, 0.75);
  EXPECT_EQ(r.ranks[1].device, "cuda:0");
  EXPECT_EQ(r.ranks[0].compute_seconds, 1.25);
  EXPECT_TRUE((*rounds)[1].stages.empty());
  EXPECT_TRUE((*rounds)[1].ranks.empty());
  auto clients = (*store)->ClientRounds(1);
  ASSERT_TRUE(clients.ok()) << clients.status();
  ASSERT_EQ(clients->size(), 1u);
  EXPECT_EQ((*clients)[0].data_sha256, std::string(64, 'b'));
  EXPECT_EQ((*clients)[0].upload_bytes, 12345u);
  EXPECT_EQ((*clients)[0].download_bytes, 678u);
  EXPECT_EQ((*clients)[0].label_counts, (std::vector<uint64_t>{5, 0, 12}));
}

// A store from before lineage and timings: read-only, it reads as none
// (no stage or rank rows, empty digests); opened for writing, it gains the
// tables and columns and commits them.
TEST(RunStoreTest, AStoreOlderThanTheTimingsReadsAsNoneAndThenGainsThem) {
  ScratchDir dir("old_timings");
  WriteOlderStore(dir.db());
  RawSql(dir.db(), "INSERT INTO runs VALUES (1, 'c', 1, 'v', 0, 1)");
  RawSql(dir.db(), "INSERT INTO checkpoints VALUES (1, ?, x'', 0)", FloatBytes({1, 2}));
  {
    auto store = OpenSqliteRunStoreReadOnly(dir.db());
    ASSERT_TRUE(store.ok()) << store.status();
    auto info = (*store)->LoadRun();
    ASSERT_TRUE(info.ok() && info->has_value()) << info.status();
    EXPECT_EQ((*info)->config_sha256, "");
    EXPECT_EQ((*info)->world_size, 0u);
    EXPECT_EQ((*info)->run_nonce, "");  // Welcome then sends none: the old run id.
    auto rounds = (*store)->Rounds();
    ASSERT_TRUE(rounds.ok()) << rounds.status();
    ASSERT_EQ(rounds->size(), 1u);
    EXPECT_TRUE((*rounds)[0].stages.empty());
    auto clients = (*store)->ClientRounds(1);
    ASSERT_TRUE(clients.ok()) << clients.status();
    EXPECT_EQ((*clients)[0].upload_bytes, 0u);
  }
  auto store = OpenSqliteRunStore(dir.db());
  ASSERT_TRUE(store.ok()) << store.status();
  RoundRecord r;
  r.round = 2;
  r.stages = {{"train", 2.0, 10, 20}};
  ASSERT_TRUE((*store)->CommitRound(r, {}, Cp(2, 2), 3).ok());
  auto rounds = (*store)->Rounds();
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->size(), 2u);
  ASSERT_EQ((*rounds)[1].stages.size(), 1u);
  EXPECT_EQ((*rounds)[1].stages[0].bytes_out, 20u);
}

// Central DP (issue 34): a round's sampling rate and the run's epsilon
// are committed with it; an older store reads "no privacy" (-1) and gains
// the columns when opened for writing.
TEST(RunStoreTest, PrivacyEpsilonIsCommittedAndOlderStoresReadNone) {
  ScratchDir dir("dp_columns");
  WriteOlderStore(dir.db());
  RawSql(dir.db(), "INSERT INTO runs VALUES (1, 'c', 1, 'v', 0, 1)");
  RawSql(dir.db(), "INSERT INTO checkpoints VALUES (1, ?, x'', 0)", FloatBytes({1, 2}));
  {
    auto store = OpenSqliteRunStoreReadOnly(dir.db());
    ASSERT_TRUE(store.ok()) << store.status();
    auto rounds = (*store)->Rounds();
    ASSERT_TRUE(rounds.ok()) << rounds.status();
    EXPECT_EQ((*rounds)[0].dp_epsilon, -1.0);
    EXPECT_EQ((*rounds)[0].dp_epsilon_released_model, -1.0);
    EXPECT_EQ((*rounds)[0].dp_sampling_rate, 0.0);
  }
  auto store = OpenSqliteRunStore(dir.db());
  ASSERT_TRUE(store.ok()) << store.status();
  RoundRecord r;
  r.round = 2;
  r.dp_sampling_rate = 0.25;
  r.dp_epsilon = 1.75;
  r.dp_epsilon_released_model = 0.5;  // Distributed DP's second view.
  ASSERT_TRUE((*store)->CommitRound(r, {}, Cp(2, 2), 3).ok());
  auto rounds = (*store)->Rounds();
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->size(), 2u);
  EXPECT_EQ((*rounds)[0].dp_epsilon, -1.0);
  EXPECT_EQ((*rounds)[1].dp_sampling_rate, 0.25);
  EXPECT_EQ((*rounds)[1].dp_epsilon, 1.75);
  EXPECT_EQ((*rounds)[0].dp_epsilon_released_model, -1.0);
  EXPECT_EQ((*rounds)[1].dp_epsilon_released_model, 0.5);
}

// SCAFFOLD's N: committed with its round (a resumed run divides by no
// fewer); an older store reads 0 and gains the column when opened for
// writing.
TEST(RunStoreTest, ScaffoldPopulationIsCommittedAndOlderStoresReadNone) {
  ScratchDir dir("scaffold_column");
  WriteOlderStore(dir.db());
  RawSql(dir.db(), "INSERT INTO runs VALUES (1, 'c', 1, 'v', 0, 1)");
  RawSql(dir.db(), "INSERT INTO checkpoints VALUES (1, ?, x'', 0)", FloatBytes({1, 2}));
  {
    auto store = OpenSqliteRunStoreReadOnly(dir.db());
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ(std::move((*store)->Rounds()).value().at(0).scaffold_population, 0u);
  }
  auto store = OpenSqliteRunStore(dir.db());
  ASSERT_TRUE(store.ok()) << store.status();
  RoundRecord r;
  r.round = 2;
  r.scaffold_population = (uint64_t{1} << 33) + 7;  // Beyond 32 bits.
  ASSERT_TRUE((*store)->CommitRound(r, {}, Cp(2, 2), 3).ok());
  const std::vector<RoundRecord> rounds = std::move((*store)->Rounds()).value();
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[0].scaffold_population, 0u);
  EXPECT_EQ(rounds[1].scaffold_population, (uint64_t{1} << 33) + 7);
}

// Adaptive clipping: each round's C and the next are committed bit for bit
// (a resumed run clips at the stored double); an older store reads 0 (no
// adaptive clipping) and gains the columns when opened for writing.
TEST(RunStoreTest, AdaptiveClipNormsAreCommittedAndOlderStoresReadNone) {
  ScratchDir dir("clip_columns");
  WriteOlderStore(dir.db());
  RawSql(dir.db(), "INSERT INTO runs VALUES (1, 'c', 1, 'v', 0, 1)");
  RawSql(dir.db(), "INSERT INTO checkpoints VALUES (1, ?, x'', 0)", FloatBytes({1, 2}));
  {
    auto store = OpenSqliteRunStoreReadOnly(dir.db());
    ASSERT_TRUE(store.ok()) << store.status();
    auto rounds = (*store)->Rounds();
    ASSERT_TRUE(rounds.ok()) << rounds.status();
    EXPECT_EQ((*rounds)[0].dp_clip_norm, 0.0);
    EXPECT_EQ((*rounds)[0].dp_next_clip_norm, 0.0);
  }
  auto store = OpenSqliteRunStore(dir.db());
  ASSERT_TRUE(store.ok()) << store.status();
  RoundRecord r;
  r.round = 2;
  r.dp_clip_norm = 0.1;
  r.dp_next_clip_norm = 0.1 * std::exp(0.2 / 3);  // Not a short decimal.
  ASSERT_TRUE((*store)->CommitRound(r, {}, Cp(2, 2), 3).ok());
  auto rounds = (*store)->Rounds();
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->size(), 2u);
  EXPECT_EQ((*rounds)[0].dp_clip_norm, 0.0);
  EXPECT_EQ((*rounds)[1].dp_clip_norm, 0.1);
  EXPECT_EQ((*rounds)[1].dp_next_clip_norm, 0.1 * std::exp(0.2 / 3));
}

TEST(RunStoreTest, MalformedKillHookValueIsRefused) {
  setenv("COHORT_FAULT_KILL_IN_COMMIT", "soon", 1);
  auto store = OpenSqliteRunStore(":memory:");
  unsetenv("COHORT_FAULT_KILL_IN_COMMIT");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("COHORT_FAULT_KILL_IN_COMMIT"), std::string::npos);
}

}  // namespace
}  // namespace cohort::store
