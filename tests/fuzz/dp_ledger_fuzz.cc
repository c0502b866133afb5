// client::DpLedger on a ledger file made of the input: distributed DP's
// count of noised rounds, which a client reads before every noised update
// and which an operator, a full disk or another process may have damaged.
//
// Input: a flags byte (bit 0: write the body's true CRC-32 into the header,
// so the fuzzer reaches past the checksum; bit 1: a cap of one more round
// than the file holds, else none; bit 2: first try a cap the file has
// reached), the round to ask for (four bytes), then the file. Checks that an unreadable ledger is
// refused by every call, naming the file, and never written; that a readable one takes a new round
// once, counting it, and refuses it the second time.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "client/dp_ledger.h"
#include "common/bytes.h"
#include "tests/fuzz/fuzz_input.h"

namespace cohort::fuzz {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A directory of this process's own ($TMPDIR, else /tmp), removed when the
// process exits normally: Record replaces the file by rename, so the
// harness writes it by path each time.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    path_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/cohort-ledger-XXXXXX";
    FUZZ_CHECK(mkdtemp(path_.data()) != nullptr, "mkdtemp");
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const std::string& Dir() {
  static const ScratchDir dir;
  return dir.path();
}

void Run(FuzzInput& in) {
  const uint8_t flags = in.Byte();
  const uint32_t round = in.U32();
  const std::span<const uint8_t> rest = in.Rest();
  std::string data(reinterpret_cast<const char*>(rest.data()), rest.size());
  if ((flags & 1) != 0 && data.size() >= 20) {
    const uint32_t crc = Crc32({rest.data() + 20, rest.size() - 20});
    std::memcpy(data.data() + 16, &crc, 4);
  }
  const std::string path = client::DpLedgerPath(Dir());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;

  client::DpLedger ledger(path);
  const client::DpRunId run = client::DpRunIdOf("coordinator", "run", "nonce");
  const StatusOr<bool> contains = ledger.Contains(run, round);
  const StatusOr<size_t> total = ledger.Total();
  FUZZ_CHECK(contains.ok() == total.ok(), "Contains and Total disagree");
  if (!contains.ok()) {
    FUZZ_CHECK(contains.status().message().find(path) != std::string::npos,
               "the error must name the file: " + contains.status().ToString());
    const Status recorded = ledger.Record(run, round).status();
    FUZZ_CHECK(!recorded.ok(), "recorded a round into an unreadable ledger");
    FUZZ_CHECK(Slurp(path) == data, "an unreadable ledger was written");
    return;
  }
  // What was read must have been a whole ledger: its magic, and a CRC-32
  // that matches the body.
  FUZZ_CHECK(data.size() >= 20 && data.compare(0, 8, "CHTDPLG1") == 0, "read a non-ledger");
  uint32_t stored_crc = 0;
  std::memcpy(&stored_crc, data.data() + 16, 4);
  FUZZ_CHECK(Crc32({rest.data() + 20, rest.size() - 20}) == stored_crc,
             "read a ledger whose CRC-32 does not match its body");
  if ((flags & 4) != 0 && *total > 0 && !*contains) {
    // A cap the ledger has reached already: refused, nothing written.
    const Status full = ledger.Record(run, round, *total).status();
    FUZZ_CHECK(full.code() == StatusCode::kResourceExhausted, "a round past the cap was recorded");
    FUZZ_CHECK(Slurp(path) == data, "a refused round changed the ledger");
  }
  const size_t cap = (flags & 2) != 0 ? *total + 1 : 0;
  const StatusOr<size_t> recorded = ledger.Record(run, round, cap);
  if (*contains) {
    FUZZ_CHECK(recorded.status().code() == StatusCode::kAlreadyExists, "a repeat was recorded");
    FUZZ_CHECK(Slurp(path) == data, "a refused repeat changed the ledger");
    return;
  }
  FUZZ_CHECK(recorded.ok(), "a new round was refused: " + recorded.status().ToString());
  FUZZ_CHECK(*recorded >= 1 && *recorded <= *total + 1, "the run's count");
  FUZZ_CHECK(ledger.Total().value() == *total + 1, "the round was not added once");
  FUZZ_CHECK(ledger.Contains(run, round).value(), "the round is not in the ledger");
  FUZZ_CHECK(ledger.Record(run, round).status().code() == StatusCode::kAlreadyExists,
             "a round was recorded twice");
  if (cap != 0) {
    // The fuzzed file may hold this round of the other run already: a
    // repeat, refused as one before the cap is looked at.
    const client::DpRunId other = client::DpRunIdOf("coordinator", "other");
    const bool repeat = ledger.Contains(other, round).value();
    FUZZ_CHECK(ledger.Record(other, round, cap).status().code() ==
                   (repeat ? StatusCode::kAlreadyExists : StatusCode::kResourceExhausted),
               repeat ? "another run's repeat was recorded" : "a round past the cap was recorded");
    FUZZ_CHECK(ledger.Total().value() == *total + 1, "a refused round changed the total");
  }
}

}  // namespace
}  // namespace cohort::fuzz

COHORT_FUZZ_ENTRY_POINT(Run)
