#include "client/dp_ledger.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "client/daemon.h"
#include "client/local_trainer.h"

namespace cohort::client {
namespace {

std::string TempDir() {
  char dir_template[] = "/tmp/cohort-dp-ledger-XXXXXX";
  EXPECT_NE(mkdtemp(dir_template), nullptr);
  return dir_template;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

TEST(DpLedgerTest, ARunIdNamesTheCoordinatorKeyAndTheRunUnambiguously) {
  EXPECT_EQ(DpRunIdOf("key", "run"), DpRunIdOf("key", "run"));
  EXPECT_NE(DpRunIdOf("key", "run"), DpRunIdOf("key", "run2"));
  EXPECT_NE(DpRunIdOf("key", "run"), DpRunIdOf("other", "run"));
  EXPECT_NE(DpRunIdOf("ab", "c"), DpRunIdOf("a", "bc"));  // Length-prefixed.
  EXPECT_NE(DpRunIdOf("", "run"), DpRunIdOf("run", ""));
}

std::string HexOf(const DpRunId& id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (uint8_t b : id) hex += {kDigits[b >> 4], kDigits[b & 15]};
  return hex;
}

// The nonce (Welcome.run_nonce) makes a new run of the same key and name a
// new run; without one the id is the one ledgers held before the nonce
// (BLAKE2b-256 by Python's hashlib, over the same length-prefixed input).
TEST(DpLedgerTest, TheRunNonceTellsRunsOfOneNameApartAndNoNonceKeepsTheOldId) {
  EXPECT_EQ(HexOf(DpRunIdOf("key", "run")),
            "d1ef760dd1165a3aa34fb3b8cab03f7728da78c9af3a7826ef8a94a002a230b0");
  EXPECT_EQ(HexOf(DpRunIdOf("key", "run", "00112233445566778899aabbccddeeff")),
            "3c17f91f589a62e864e65ddd0119ffceaa53c135b735126c30db88d17366b345");
  EXPECT_EQ(DpRunIdOf("key", "run", ""), DpRunIdOf("key", "run"));
  EXPECT_NE(DpRunIdOf("key", "run", "a"), DpRunIdOf("key", "run", "b"));
  EXPECT_NE(DpRunIdOf("key", "run", "n"), DpRunIdOf("key", "runn"));
}

// The cap (cohort client --dp-max-rounds) counts every run together and
// adds nothing once reached.
TEST(DpLedgerTest, ACapOnAllRunsRefusesTheRoundPastItAndAddsNothing) {
  const std::string dir = TempDir();
  DpLedger ledger(DpLedgerPath(dir));
  const DpRunId a = DpRunIdOf("k", "a"), b = DpRunIdOf("k", "b");
  EXPECT_EQ(ledger.Record(a, 1, 3).value(), 1u);
  EXPECT_EQ(ledger.Record(b, 1, 3).value(), 1u);
  EXPECT_EQ(ledger.Record(a, 2, 3).value(), 2u);
  EXPECT_EQ(ledger.Total().value(), 3u);
  const Status full = ledger.Record(b, 2, 3).status();
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(full.message(), "3 rounds are in the ledger");
  EXPECT_EQ(ledger.Record(a, 2, 3).status().code(), StatusCode::kAlreadyExists);  // Repeat first.
  EXPECT_EQ(DpLedger(DpLedgerPath(dir)).Total().value(), 3u);
  EXPECT_EQ(ledger.Record(b, 2, 4).value(), 2u);
  EXPECT_EQ(ledger.Record(b, 3).value(), 3u);  // 0: no cap.
}

TEST(DpLedgerTest, ARoundIsCountedOncePerRun) {
  for (const bool on_disk : {false, true}) {
    SCOPED_TRACE(on_disk ? "file" : "memory");
    DpLedger ledger(on_disk ? DpLedgerPath(TempDir()) : "");
    const DpRunId run = DpRunIdOf("k", "a"), other = DpRunIdOf("k", "b");
    EXPECT_FALSE(ledger.Contains(run, 3).value());
    EXPECT_EQ(ledger.Record(run, 3).value(), 1u);
    EXPECT_TRUE(ledger.Contains(run, 3).value());
    StatusOr<size_t> again = ledger.Record(run, 3);
    EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
    EXPECT_EQ(again.status().message(), "round 3 is in the ledger already");
    EXPECT_FALSE(ledger.Contains(run, 4).value());
    EXPECT_FALSE(ledger.Contains(other, 3).value());
    EXPECT_EQ(ledger.Record(other, 3).value(), 1u);  // Another run's round 3.
    EXPECT_EQ(ledger.Record(run, 4).value(), 2u);    // Rounds of this run so far.
  }
}

// What one ledger object wrote, another (a restarted client, or a second
// process on the same state directory) reads; no temporary file is left.
TEST(DpLedgerTest, TheFileOutlivesTheObjectThatWroteIt) {
  const std::string dir = TempDir();
  const DpRunId run = DpRunIdOf("k", "a");
  {
    DpLedger first(DpLedgerPath(dir));
    ASSERT_TRUE(first.Record(run, 1).ok());
    ASSERT_TRUE(first.Record(run, 2).ok());
  }
  DpLedger second(DpLedgerPath(dir));
  EXPECT_TRUE(second.Contains(run, 1).value());
  EXPECT_TRUE(second.Contains(run, 2).value());
  EXPECT_EQ(second.Record(run, 2).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(second.Record(run, 7).value(), 3u);
  EXPECT_FALSE(std::filesystem::exists(DpLedgerPath(dir) + ".tmp"));
  // 20 header bytes and 36 per entry.
  EXPECT_EQ(std::filesystem::file_size(DpLedgerPath(dir)), 20u + 3 * 36u);
}

// A ledger that cannot be read is an error naming the file, never an
// empty ledger, and Record leaves it as it was.
TEST(DpLedgerTest, ACorruptFileIsAnErrorNamingItAndIsNeverOverwritten) {
  const std::string dir = TempDir(), path = DpLedgerPath(dir);
  const DpRunId run = DpRunIdOf("k", "a");
  {
    DpLedger ledger(path);
    ASSERT_TRUE(ledger.Record(run, 1).ok());
  }
  const std::string good = ReadAll(path);
  struct Case {
    std::string data, message;
  };
  std::string flipped = good;
  flipped.back() ^= 1;  // The round's last byte.
  std::string extra = good + "x";
  std::string miscounted = good;
  miscounted[8] = 2;  // Two entries claimed, one there.
  const Case cases[] = {
      {"", "not a ledger file (bad magic or cut short)"},
      {"CHTSCAF1" + good.substr(8), "not a ledger file (bad magic or cut short)"},
      {flipped, "CRC-32 mismatch"},
      {extra, "57 bytes for 1 entries"},
      {miscounted, "56 bytes for 2 entries"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    WriteAll(path, c.data);
    DpLedger ledger(path);
    StatusOr<bool> contains = ledger.Contains(run, 1);
    ASSERT_FALSE(contains.ok());
    EXPECT_EQ(contains.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(contains.status().message(),
              path + ": distributed DP's ledger of noised rounds: " + c.message);
    StatusOr<size_t> recorded = ledger.Record(run, 2);
    ASSERT_FALSE(recorded.ok());
    EXPECT_EQ(recorded.status().message(), contains.status().message());
    EXPECT_EQ(ReadAll(path), c.data);
  }
  // A directory where the file should be cannot be read as one either.
  std::filesystem::remove(path);
  std::filesystem::create_directory(path);
  StatusOr<bool> contains = DpLedger(path).Contains(run, 1);
  ASSERT_FALSE(contains.ok());
  EXPECT_EQ(contains.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(
      contains.status().message(),
      path + ": distributed DP's ledger of noised rounds: not a regular file of at most 64 MiB");
  // Nor a FIFO (which would block the open or the read for ever), nor a
  // symbolic link (to /dev/zero, say, which would be read for ever).
  std::filesystem::remove(path);
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  contains = DpLedger(path).Contains(run, 1);
  ASSERT_FALSE(contains.ok());
  EXPECT_EQ(
      contains.status().message(),
      path + ": distributed DP's ledger of noised rounds: not a regular file of at most 64 MiB");
  std::filesystem::remove(path);
  std::filesystem::create_symlink("/dev/zero", path);
  contains = DpLedger(path).Contains(run, 1);
  ASSERT_FALSE(contains.ok());
  EXPECT_EQ(contains.status().message(), path +
                                             ": distributed DP's ledger of noised rounds: cannot "
                                             "open it: Too many levels of symbolic links");
  // A dangling link is not a missing (empty) ledger either.
  std::filesystem::remove(path);
  std::filesystem::create_symlink(dir + "/nowhere", path);
  contains = DpLedger(path).Contains(run, 1);
  ASSERT_FALSE(contains.ok());
  EXPECT_NE(contains.status().message().find("Too many levels of symbolic links"),
            std::string::npos)
      << contains.status().message();
}

TEST(DpLedgerTest, AnUnwritableDirectoryIsAnErrorNamingTheFile) {
  DpLedger ledger(DpLedgerPath("/nonexistent-cohort-state"));
  EXPECT_FALSE(ledger.Contains(DpRunIdOf("k", "a"), 1).value());  // Missing: empty.
  StatusOr<size_t> recorded = ledger.Record(DpRunIdOf("k", "a"), 1);
  ASSERT_FALSE(recorded.ok());
  EXPECT_EQ(recorded.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(recorded.status().message().find("/nonexistent-cohort-state/dp_ledger.bin"),
            std::string::npos)
      << recorded.status().message();
}

// A trainer RunClient never gets to use.
class UnusedTrainer : public LocalTrainer {
 public:
  uint64_t num_samples() const override { return 1; }
  StatusOr<size_t> BuildModel(const config::ModelConfig&) override { return size_t{1}; }
  StatusOr<train::TrainResult> Train(const TrainTask&, std::span<float>,
                                     const std::atomic<bool>*) override {
    return UnimplementedError("unused");
  }
};

// The cap lives in the state directory's ledger: a library caller (not only
// the CLI) asking for it without one is refused before anything connects.
TEST(RunClientTest, ACapOnNoisedRoundsWithoutAStateDirIsRefused) {
  ClientOptions o;
  o.coordinator = "tcp://127.0.0.1:1";
  o.name = "c0";
  o.insecure = true;
  o.dp_max_rounds = 2;
  UnusedTrainer trainer;
  std::atomic<bool> stop{true};
  const Status s = RunClient(o, trainer, stop);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--dp-max-rounds requires --state-dir");
}

}  // namespace
}  // namespace cohort::client
