// The collectives (collective/collective.h) with N ranks as threads, over
// each transport of net/.
#include "collective/collective.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>

#include "collective/bucket_reducer.h"
#include "common/rng.h"
#include "net/inprocess_transport.h"
#include "net/rendezvous.h"
#include "net/shm_transport.h"
#include "net/tcp_transport.h"
#include "net/zmq_transport.h"

namespace cohort::net {
namespace {

using collective::Algorithm;
using collective::Communicator;

enum class Kind { kInProcess, kZmqTcp, kZmqIpc, kShm, kTcp };
const char* Name(Kind k) {
  return k == Kind::kInProcess ? "in-process"
         : k == Kind::kZmqTcp  ? "zmq tcp"
         : k == Kind::kZmqIpc  ? "zmq ipc"
         : k == Kind::kTcp     ? "tcp"
                               : "shm";
}

// `size` connected transports of one kind (ZeroMQ: loopback or ipc files
// in a fresh directory, ports from 0).
struct Group {
  Group(Kind kind, int size) : hub(size), context(1) {
    if (kind == Kind::kInProcess) {
      for (int r = 0; r < size; ++r) transports.push_back(hub.Connect(r));
      return;
    }
    if (kind == Kind::kShm) {
      std::vector<std::string> endpoints;
      std::vector<ShmTransport*> shm;
      for (int r = 0; r < size; ++r) {
        auto t = std::move(ShmTransport::Create(r, size)).value();
        endpoints.push_back(t->endpoint());
        shm.push_back(t.get());
        transports.push_back(std::move(t));
      }
      for (ShmTransport* t : shm) EXPECT_TRUE(t->Connect(endpoints).ok());
      for (ShmTransport* t : shm) t->Unlink();
      return;
    }
    if (kind == Kind::kTcp) {
      // Each rank connects to the higher ranks and accepts the lower ones:
      // concurrently, as separate processes would.
      std::vector<std::string> endpoints;
      std::vector<TcpTransport*> tcp;
      for (int r = 0; r < size; ++r) {
        auto t = std::move(TcpTransport::Listen(r, size, "127.0.0.1")).value();
        endpoints.push_back(t->endpoint());
        tcp.push_back(t.get());
        transports.push_back(std::move(t));
      }
      std::vector<std::thread> threads;
      for (TcpTransport* t : tcp) {
        threads.emplace_back(
            [&, t] { EXPECT_TRUE(t->Connect(endpoints, {}, SteadyNowMs() + 10000).ok()); });
      }
      for (auto& th : threads) th.join();
      return;
    }
    static int instance = 0;
    const std::string dir =
        "/tmp/cohort-collective-" + std::to_string(getpid()) + "-" + std::to_string(instance++);
    std::vector<std::string> endpoints;
    std::vector<ZmqTransport*> zmq;
    for (int r = 0; r < size; ++r) {
      const std::string bind = kind == Kind::kZmqTcp ? std::string("tcp://127.0.0.1:0")
                                                     : "ipc://" + dir + "-" + std::to_string(r);
      auto t = std::move(ZmqTransport::Bind(context, r, size, bind)).value();
      endpoints.push_back(t->endpoint());
      zmq.push_back(t.get());
      transports.push_back(std::move(t));
    }
    for (ZmqTransport* t : zmq) EXPECT_TRUE(t->Connect(endpoints).ok());
  }
  InProcessHub hub;
  zmq::context_t context;
  std::vector<std::unique_ptr<collective::Transport>> transports;
};

// Runs body(rank, communicator) on `size` threads; returns each rank's status.
std::vector<Status> RunRanks(int size, const std::function<Status(int, Communicator&)>& body,
                             Kind kind = Kind::kInProcess) {
  Group group(kind, size);
  std::vector<Status> results(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Communicator comm(group.transports[r].get());
      results[r] = body(r, comm);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

std::vector<float> Input(int rank, size_t n) {
  Rng rng(1000 + rank);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.Normal());
  return v;
}

// Every schedule: each rank ends with the serial sum (float rounding), and
// every rank with the same bits.
class CollectiveTest : public ::testing::TestWithParam<Kind> {};

TEST_P(CollectiveTest, AllReduceEqualsTheSerialSumForEveryWorldSizeAndLength) {
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kRecursiveDoubling, Algorithm::kAuto}) {
    for (int size = 1; size <= 8; ++size) {
      for (size_t n : {size_t{1}, size_t{2}, size_t{7}, size_t{1000}, size_t{65539}}) {
        SCOPED_TRACE("algorithm " + std::to_string(int(algorithm)) + ", size " +
                     std::to_string(size) + ", n " + std::to_string(n));
        std::vector<std::vector<float>> data(size);
        std::vector<double> expected(n, 0.0);
        for (int r = 0; r < size; ++r) {
          data[r] = Input(r, n);
          for (size_t i = 0; i < n; ++i) expected[i] += data[r][i];
        }
        auto st = RunRanks(
            size,
            [&](int r, Communicator& c) { return c.AllReduce(data[r], {.algorithm = algorithm}); },
            GetParam());
        for (int r = 0; r < size; ++r) ASSERT_TRUE(st[r].ok()) << st[r];
        for (size_t i = 0; i < n; ++i) {
          ASSERT_NEAR(data[0][i], expected[i], 1e-5 * (1 + std::fabs(expected[i]))) << i;
        }
        for (int r = 1; r < size; ++r) ASSERT_EQ(data[r], data[0]) << "rank " << r;
      }
    }
  }
}

// 16-bit wire types: every rank ends with the same bits, within the
// rounding of size - 1 adds at the type's precision of the serial sum of
// the rounded inputs.
TEST_P(CollectiveTest, SixteenBitFloatsSumWithinTheirRoundingForEveryWorldSize) {
  using collective::WireType;
  for (WireType wire : {WireType::kBf16, WireType::kFp16}) {
    const double unit = wire == WireType::kBf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    auto round = [&](float x) {
      return wire == WireType::kBf16 ? ToFloat(ToBf16(x)) : ToFloat(ToFp16(x));
    };
    for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kRecursiveDoubling}) {
      for (int size = 1; size <= 8; ++size) {
        for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{65539}}) {
          SCOPED_TRACE("wire " + std::to_string(int(wire)) + ", algorithm " +
                       std::to_string(int(algorithm)) + ", size " + std::to_string(size) + ", n " +
                       std::to_string(n));
          std::vector<std::vector<float>> data(size);
          std::vector<double> expected(n, 0.0), magnitude(n, 0.0);
          for (int r = 0; r < size; ++r) {
            data[r] = Input(r, n);
            for (size_t i = 0; i < n; ++i) {
              expected[i] += round(data[r][i]);
              magnitude[i] += std::fabs(data[r][i]);
            }
          }
          auto st = RunRanks(
              size,
              [&](int r, Communicator& c) {
                return c.AllReduce(data[r], {.algorithm = algorithm, .wire = wire});
              },
              GetParam());
          for (int r = 0; r < size; ++r) ASSERT_TRUE(st[r].ok()) << st[r];
          for (size_t i = 0; i < n; ++i) {
            ASSERT_NEAR(data[0][i], expected[i], size * unit * magnitude[i] + 1e-30) << i;
            ASSERT_EQ(data[0][i], round(data[0][i])) << "not a 16-bit value at " << i;
          }
          for (int r = 1; r < size; ++r) ASSERT_EQ(data[r], data[0]) << "rank " << r;
        }
      }
    }
  }
}

TEST_P(CollectiveTest, SixteenBitVectorsAndMismatchedTypesAreNamed) {
  // A bfloat16 vector all-reduced as itself.
  std::vector<std::vector<Bf16>> halves(3, std::vector<Bf16>(1001));
  for (int r = 0; r < 3; ++r) {
    for (Bf16& h : halves[r]) h = ToBf16(0.5f * float(r + 1));
  }
  auto st = RunRanks(
      3, [&](int r, Communicator& c) { return c.AllReduce(std::span<Bf16>(halves[r])); },
      GetParam());
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    for (Bf16 h : halves[r]) ASSERT_EQ(ToFloat(h), 3.0f);
  }
  // One rank sends float16 where the other expects bfloat16.
  std::vector<float> v(64, 1.0f), w(64, 1.0f);
  st = RunRanks(
      2,
      [&](int r, Communicator& c) {
        return c.AllReduce(
            r == 0 ? std::span<float>(v) : std::span<float>(w),
            {.algorithm = Algorithm::kRecursiveDoubling,
             .timeout_ms = 1000,
             .wire = r == 0 ? collective::WireType::kBf16 : collective::WireType::kFp16});
      },
      GetParam());
  EXPECT_EQ(st[0].code(), StatusCode::kInvalidArgument) << st[0];
  EXPECT_NE(st[0].message().find("64 float16 values from 0 in"), std::string::npos) << st[0];
  EXPECT_NE(st[0].message().find("(expected 64 bfloat16 values from 0)"), std::string::npos)
      << st[0];
  // Exact mode sums fixed point made from float32, nothing narrower.
  Status exact = RunRanks(1, [&](int, Communicator& c) {
    return c.AllReduce(v, {.exact = true, .wire = collective::WireType::kBf16});
  })[0];
  EXPECT_EQ(exact.code(), StatusCode::kInvalidArgument) << exact;
}

TEST_P(CollectiveTest, LargeBuffersUpTo64MiB) {
  for (int size : {2, 5}) {
    const size_t n = (size_t{64} << 20) / sizeof(float) + 3;  // 64 MiB and not divisible.
    std::vector<std::vector<float>> data(size);
    for (int r = 0; r < size; ++r) data[r].assign(n, float(r + 1));
    auto st = RunRanks(
        size, [&](int r, Communicator& c) { return c.AllReduce(data[r]); }, GetParam());
    const float expected = float(size * (size + 1) / 2);
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r];
      EXPECT_EQ(data[r].front(), expected);
      EXPECT_EQ(data[r][n / 2], expected);
      EXPECT_EQ(data[r].back(), expected);
    }
  }
}

TEST_P(CollectiveTest, IntegersAndExactModeAreBitIdenticalWhateverTheAlgorithm) {
  const int size = 6;
  const size_t n = 4099;
  std::vector<std::vector<int64_t>> ints(size);
  std::vector<int64_t> int_sum(n, 0);
  for (int r = 0; r < size; ++r) {
    Rng rng(r);
    for (size_t i = 0; i < n; ++i) {
      ints[r].push_back(static_cast<int64_t>(rng.Next() >> 4) - (int64_t{1} << 58));
      int_sum[i] += ints[r][i];
    }
  }
  auto st = RunRanks(
      size, [&](int r, Communicator& c) { return c.AllReduce(ints[r]); }, GetParam());
  for (int r = 0; r < size; ++r) EXPECT_EQ(ints[r], int_sum);

  std::vector<float> results[2];
  int k = 0;
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kRecursiveDoubling}) {
    std::vector<std::vector<float>> data(size);
    for (int r = 0; r < size; ++r) data[r] = Input(r, n);
    st = RunRanks(
        size,
        [&](int r, Communicator& c) {
          return c.AllReduce(data[r], {.algorithm = algorithm, .exact = true});
        },
        GetParam());
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r];
      EXPECT_EQ(data[r], data[0]);
    }
    results[k++] = data[0];
  }
  // Float sums in another order differ in the last bits; exact ones do not.
  EXPECT_EQ(results[0], results[1]);
}

// Product, min, max and the bitwise ops: the serial reduction, and the
// same bits on every rank, whatever the schedule and world size.
TEST_P(CollectiveTest, OtherReduceOpsEqualTheSerialReductionOnEveryRank) {
  using collective::ReduceOp;
  const ReduceOp float_ops[] = {ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};
  const ReduceOp int_ops[] = {ReduceOp::kProduct, ReduceOp::kMin,   ReduceOp::kMax,
                              ReduceOp::kBitAnd,  ReduceOp::kBitOr, ReduceOp::kBitXor};
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kRecursiveDoubling}) {
    for (int size : {1, 2, 3, 5, 8}) {
      for (size_t n : {size_t{1}, size_t{7}, size_t{65539}}) {
        SCOPED_TRACE("algorithm " + std::to_string(int(algorithm)) + ", size " +
                     std::to_string(size) + ", n " + std::to_string(n));
        // [rank][op] inputs; products of values near 1 stay in range.
        std::vector<std::vector<std::vector<float>>> floats(size);
        std::vector<std::vector<std::vector<int64_t>>> ints(size);
        std::vector<std::vector<Bf16>> halves(size);
        std::vector<std::vector<float>> wired(size);  // Travel as float16.
        for (int r = 0; r < size; ++r) {
          wired[r] = Input(r, n);
          for (ReduceOp op : float_ops) {
            floats[r].push_back(Input(r, n));
            if (op == ReduceOp::kProduct) {
              for (float& x : floats[r].back()) x = 1.0f + x / 64;
            }
          }
          Rng rng(50 + r);
          for (size_t k = 0; k < std::size(int_ops); ++k) {
            ints[r].emplace_back(n);
            for (int64_t& x : ints[r].back()) x = static_cast<int64_t>(rng.Next());
          }
          for (float x : Input(r, n)) halves[r].push_back(ToBf16(x));
        }
        const auto float_in = floats;
        const auto int_in = ints;
        const auto half_in = halves;
        const auto wired_in = wired;
        auto st = RunRanks(
            size,
            [&](int r, Communicator& c) -> Status {
              for (size_t k = 0; k < std::size(float_ops); ++k) {
                COHORT_RETURN_IF_ERROR(
                    c.AllReduce(floats[r][k], {.algorithm = algorithm, .op = float_ops[k]}));
              }
              for (size_t k = 0; k < std::size(int_ops); ++k) {
                COHORT_RETURN_IF_ERROR(
                    c.AllReduce(ints[r][k], {.algorithm = algorithm, .op = int_ops[k]}));
              }
              COHORT_RETURN_IF_ERROR(c.AllReduce(wired[r], {.algorithm = algorithm,
                                                            .wire = collective::WireType::kFp16,
                                                            .op = ReduceOp::kMin}));
              return c.AllReduce(std::span<Bf16>(halves[r]),
                                 {.algorithm = algorithm, .op = ReduceOp::kMax});
            },
            GetParam());
        for (int r = 0; r < size; ++r) ASSERT_TRUE(st[r].ok()) << st[r];
        for (size_t i = 0; i < n; ++i) {
          double product = 1.0;
          float lo = INFINITY, hi = -INFINITY, half_hi = -INFINITY, wired_lo = INFINITY;
          uint64_t int_product = 1, all = ~uint64_t{0}, any = 0, odd = 0;
          int64_t int_lo = INT64_MAX, int_hi = INT64_MIN;
          for (int r = 0; r < size; ++r) {
            product *= float_in[r][0][i];
            lo = std::min(lo, float_in[r][1][i]);
            hi = std::max(hi, float_in[r][2][i]);
            half_hi = std::max(half_hi, ToFloat(half_in[r][i]));
            wired_lo = std::min(wired_lo, ToFloat(ToFp16(wired_in[r][i])));
            const auto at = [&](size_t k) { return int_in[r][k][i]; };
            int_product *= static_cast<uint64_t>(at(0));
            int_lo = std::min(int_lo, at(1));
            int_hi = std::max(int_hi, at(2));
            all &= static_cast<uint64_t>(at(3));
            any |= static_cast<uint64_t>(at(4));
            odd ^= static_cast<uint64_t>(at(5));
          }
          ASSERT_NEAR(floats[0][0][i], product, 1e-5 * product) << i;
          ASSERT_EQ(floats[0][1][i], lo) << i;
          ASSERT_EQ(floats[0][2][i], hi) << i;
          ASSERT_EQ(static_cast<uint64_t>(ints[0][0][i]), int_product) << i;
          ASSERT_EQ(ints[0][1][i], int_lo) << i;
          ASSERT_EQ(ints[0][2][i], int_hi) << i;
          ASSERT_EQ(static_cast<uint64_t>(ints[0][3][i]), all) << i;
          ASSERT_EQ(static_cast<uint64_t>(ints[0][4][i]), any) << i;
          ASSERT_EQ(static_cast<uint64_t>(ints[0][5][i]), odd) << i;
          ASSERT_EQ(ToFloat(halves[0][i]), half_hi) << i;
          ASSERT_EQ(wired[0][i], wired_lo) << i;
        }
        for (int r = 1; r < size; ++r) {
          ASSERT_EQ(floats[r], floats[0]) << "rank " << r;
          ASSERT_EQ(ints[r], ints[0]) << "rank " << r;
          ASSERT_EQ(wired[r], wired[0]) << "rank " << r;
          for (size_t i = 0; i < n; ++i) ASSERT_EQ(halves[r][i].bits, halves[0][i].bits);
        }
      }
    }
  }
}

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Min and max give every rank the same bits where operands compare equal
// or not at all: one quiet NaN, and +0 over -0 (max) or -0 over +0 (min).
// A rank passing another op, or an op its values cannot take, is named.
TEST_P(CollectiveTest, MinAndMaxAgreeOnNaNAndSignedZeroAndMismatchedOpsAreNamed) {
  using collective::ReduceOp;
  const float nan = std::nanf("7");  // A NaN with a payload: not the one returned.
  const std::vector<std::vector<float>> in = {
      {nan, -0.0f, 1.0f, 4.0f}, {2.0f, 0.0f, -0.0f, -nan}, {3.0f, -0.0f, 0.0f, 5.0f}};
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kRecursiveDoubling}) {
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      std::vector<std::vector<float>> data = in;
      auto st = RunRanks(
          3,
          [&](int r, Communicator& c) {
            return c.AllReduce(data[r], {.algorithm = algorithm, .op = op});
          },
          GetParam());
      const float q = std::numeric_limits<float>::quiet_NaN();
      const std::vector<float> want =
          op == ReduceOp::kMax ? std::vector{q, 0.0f, 1.0f, q} : std::vector{q, -0.0f, -0.0f, q};
      for (int r = 0; r < 3; ++r) {
        ASSERT_TRUE(st[r].ok()) << st[r];
        for (size_t i = 0; i < want.size(); ++i) {
          EXPECT_EQ(BitsOf(data[r][i]), BitsOf(want[i]))
              << collective::ReduceOpName(op) << ", rank " << r << ", value " << i;
        }
      }
    }
  }
  // A product's NaN (from NaNs of other bits, or inf * 0) is that quiet NaN
  // too, also as 16-bit floats on the wire.
  for (auto wire :
       {collective::WireType::kFloat32, collective::WireType::kBf16, collective::WireType::kFp16}) {
    std::vector<std::vector<float>> data = {
        {nan, INFINITY, 2.0f}, {-nan, 0.0f, 3.0f}, {1.0f, 1.0f, 1.0f}};
    auto st = RunRanks(
        3,
        [&](int r, Communicator& c) {
          return c.AllReduce(
              data[r],
              {.algorithm = Algorithm::kRecursiveDoubling, .wire = wire, .op = ReduceOp::kProduct});
        },
        GetParam());
    const float q = std::numeric_limits<float>::quiet_NaN();
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r];
      EXPECT_EQ(BitsOf(data[r][0]), BitsOf(q)) << "rank " << r << ", wire " << int(wire);
      EXPECT_EQ(BitsOf(data[r][1]), BitsOf(q)) << "rank " << r << ", wire " << int(wire);
      EXPECT_EQ(data[r][2], 6.0f);
    }
  }
  std::vector<std::vector<float>> data = in;
  auto st = RunRanks(
      2,
      [&](int r, Communicator& c) {
        return c.AllReduce(data[r], {.algorithm = Algorithm::kRecursiveDoubling,
                                     .timeout_ms = 10000,
                                     .op = r == 0 ? ReduceOp::kMax : ReduceOp::kSum});
      },
      GetParam());
  EXPECT_EQ(st[0].code(), StatusCode::kInvalidArgument) << st[0];
  EXPECT_NE(st[0].message().find("rank 1 sent values to combine by sum (expected max: every rank "
                                 "must pass the same reduce op)"),
            std::string::npos)
      << st[0];
  for (auto wire : {collective::WireType::kFloat32, collective::WireType::kBf16}) {
    Status bitwise = RunRanks(1, [&](int, Communicator& c) {
      return c.AllReduce(data[0], {.wire = wire, .op = ReduceOp::kBitAnd});
    })[0];
    EXPECT_EQ(bitwise.code(), StatusCode::kInvalidArgument) << bitwise;
    EXPECT_EQ(bitwise.message(),
              "all-reduce: no bitwise and of float32 values (bitwise ops take integers)");
  }
  std::vector<Fp16> halves(3);
  Status half_bitwise = RunRanks(1, [&](int, Communicator& c) {
    return c.AllReduce(std::span<Fp16>(halves), {.op = ReduceOp::kBitXor});
  })[0];
  EXPECT_EQ(half_bitwise.message(),
            "float16 all-reduce: no bitwise xor of float16 values (bitwise ops take integers)");
  Status unknown = RunRanks(1, [&](int, Communicator& c) {
    return c.AllReduce(data[0], {.op = static_cast<ReduceOp>(9)});
  })[0];
  EXPECT_EQ(unknown.message(), "all-reduce: unknown reduce op 9");
  Status exact = RunRanks(1, [&](int, Communicator& c) {
    return c.AllReduce(data[0], {.exact = true, .op = ReduceOp::kMax});
  })[0];
  EXPECT_EQ(exact.code(), StatusCode::kInvalidArgument) << exact;
  EXPECT_EQ(exact.message(), "exact all-reduce: fixed point sums only, not max");
}

// Gradient buckets (collective/bucket_reducer.h): reduced on a thread of
// their own, last first as a backward pass writes them, while the caller
// goes on; in exact mode the same bits as one all-reduce of the whole.
TEST_P(CollectiveTest, BucketsReducedOnTheirOwnThreadEqualOneAllReduce) {
  const int size = 4;
  const size_t n = 10007;
  const size_t cuts[] = {10007, 9000, 5003, 4999, 17, 0};  // Suffixes, as layers finish.
  for (bool exact : {true, false}) {
    std::vector<std::vector<float>> whole(size), bucketed(size);
    for (int r = 0; r < size; ++r) whole[r] = bucketed[r] = Input(r, n);
    auto st = RunRanks(
        size, [&](int r, Communicator& c) { return c.AllReduce(whole[r], {.exact = exact}); },
        GetParam());
    for (int r = 0; r < size; ++r) ASSERT_TRUE(st[r].ok()) << st[r];
    st = RunRanks(
        size,
        [&](int r, Communicator& c) {
          collective::BucketReducer reducer(&c, {.exact = exact});
          for (size_t b = 0; b + 1 < std::size(cuts); ++b) {
            reducer.Submit(
                std::span<float>(bucketed[r]).subspan(cuts[b + 1], cuts[b] - cuts[b + 1]));
          }
          uint64_t saturated = 1;
          Status s = reducer.Wait(&saturated);
          EXPECT_EQ(saturated, 0u);
          return s;
        },
        GetParam());
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r];
      ASSERT_EQ(bucketed[r], bucketed[0]) << "rank " << r;
    }
    if (exact) {
      EXPECT_EQ(bucketed[0], whole[0]);
    } else {
      for (size_t i = 0; i < n; ++i) ASSERT_NEAR(bucketed[0][i], whole[0][i], 1e-5f) << i;
    }
  }
}

TEST_P(CollectiveTest, ExactModeSaturatesAndCountsValuesItCannotHold) {
  const int size = 3;
  std::vector<std::vector<float>> data(size, {1.5f, std::nanf(""), 1e30f, -1e30f});
  std::vector<uint64_t> saturated(size);
  auto st = RunRanks(
      size,
      [&](int r, Communicator& c) {
        Status s = c.AllReduce(data[r], {.exact = true});
        saturated[r] = c.saturated();
        return s;
      },
      GetParam());
  const double limit = std::ldexp(1.0, 62) / size / std::ldexp(1.0, 32);  // Per rank.
  for (int r = 0; r < size; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    EXPECT_EQ(saturated[r], 3u);  // NaN, +1e30, -1e30.
    EXPECT_EQ(data[r][0], 4.5f);
    EXPECT_EQ(data[r][1], 0.0f);  // NaN counts as 0.
    EXPECT_NEAR(data[r][2], size * limit, 1e-6 * size * limit);
    EXPECT_NEAR(data[r][3], -size * limit, 1e-6 * size * limit);
  }
}

TEST_P(CollectiveTest, BroadcastAndBarrier) {
  for (int size = 1; size <= 7; ++size) {
    for (int root = 0; root < size; ++root) {
      std::vector<std::vector<float>> data(size, std::vector<float>(33, -1.0f));
      data[root] = Input(root, 33);
      auto st = RunRanks(
          size,
          [&](int r, Communicator& c) {
            COHORT_RETURN_IF_ERROR(c.Broadcast(data[r], root));
            return c.Barrier();
          },
          GetParam());
      for (int r = 0; r < size; ++r) {
        ASSERT_TRUE(st[r].ok()) << st[r];
        EXPECT_EQ(data[r], data[root]) << "size " << size << " root " << root << " rank " << r;
      }
    }
  }
}

TEST_P(CollectiveTest, BroadcastsBytesExactly) {
  // Bytes, 64-bit integers past float precision, and a length only the root
  // knows arrive bit for bit (a byte run longer than a segment, too).
  const int size = 3, root = 1;
  std::vector<std::vector<uint8_t>> bytes(size, std::vector<uint8_t>(300000, 0));
  for (size_t i = 0; i < bytes[root].size(); ++i) bytes[root][i] = uint8_t(i * 131 + 7);
  std::vector<std::vector<int64_t>> words(size, std::vector<int64_t>(3, 0));
  words[root] = {(int64_t{1} << 53) + 1, -1, INT64_MIN};
  std::vector<std::vector<uint8_t>> id(size);
  id[root] = {1, 2, 3, 250};
  auto st = RunRanks(
      size,
      [&](int r, Communicator& c) {
        COHORT_RETURN_IF_ERROR(c.Broadcast(std::span<uint8_t>(bytes[r]), root));
        COHORT_RETURN_IF_ERROR(c.BroadcastBytesOf(std::span<int64_t>(words[r]), root));
        return c.BroadcastSized(id[r], root, 128);
      },
      GetParam());
  for (int r = 0; r < size; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    EXPECT_EQ(bytes[r], bytes[root]) << "rank " << r;
    EXPECT_EQ(words[r], words[root]) << "rank " << r;
    EXPECT_EQ(id[r], id[root]) << "rank " << r;
  }
  // A length over the limit fails on every rank, none waits for the bytes.
  id[root].assign(200, 9);
  st = RunRanks(
      size, [&](int r, Communicator& c) { return c.BroadcastSized(id[r], root, 128); }, GetParam());
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(st[r].code(), r == root ? StatusCode::kInvalidArgument : StatusCode::kDataLoss)
        << st[r];
  }
}

TEST_P(CollectiveTest, AMissingRankIsNamedWithinTheDeadline) {
  // Rank 2 of 4 never joins: every other rank's all-reduce fails in time,
  // and the ring neighbour that waits for it names it.
  const int size = 4;
  std::vector<std::vector<float>> data(size, std::vector<float>(1 << 16, 1.0f));
  const TimeMs start = SteadyNowMs();
  auto st = RunRanks(
      size,
      [&](int r, Communicator& c) -> Status {
        if (r == 2) return OkStatus();
        return c.AllReduce(data[r], {.algorithm = Algorithm::kRing, .timeout_ms = 300});
      },
      GetParam());
  EXPECT_LT(SteadyNowMs() - start, 3000);
  // Each names rank 2: directly, or through the abort of a rank that did.
  for (int r : {0, 1, 3}) {
    EXPECT_NE(st[r].message().find("rank 2 did not arrive"), std::string::npos) << st[r];
  }
  EXPECT_EQ(st[3].code(), StatusCode::kDeadlineExceeded) << st[3];
}

TEST(InProcessTest, ADeadPeerFailsAtOnceNamingIt) {
  InProcessHub hub(3);
  hub.Kill(1);
  auto t2 = hub.Connect(2);
  Communicator c(t2.get());
  std::vector<float> v(8, 1.0f);
  // Rank 2's ring neighbour before it is rank 1.
  Status s = c.AllReduce(v, {.algorithm = Algorithm::kRing, .timeout_ms = 60000});
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("rank 1 is gone"), std::string::npos) << s;
}

// Forwards to a transport, holding each copy receive until `go` is set.
class HeldTransport final : public collective::Transport {
 public:
  HeldTransport(collective::Transport* t, std::atomic<bool>* go) : t_(t), go_(go) {}
  int rank() const override { return t_->rank(); }
  int size() const override { return t_->size(); }
  Status Send(int peer, std::span<const uint8_t> head, std::span<const uint8_t> body) override {
    return t_->Send(peer, head, body);
  }
  Status SendFinal(int peer, std::span<const uint8_t> head,
                   std::span<const uint8_t> body) override {
    return t_->SendFinal(peer, head, body);
  }
  size_t window_bytes() const override { return t_->window_bytes(); }
  Status Flush(TimeMs deadline) override { return t_->Flush(deadline); }
  void Revoke() override { t_->Revoke(); }
  StatusOr<collective::Message> Receive(int peer, TimeMs deadline) override {
    return t_->Receive(peer, deadline);
  }
  StatusOr<collective::Message> ReceiveInto(int peer, TimeMs deadline, size_t head_bytes,
                                            std::span<uint8_t> body, bool* landed) override {
    while (!go_->load()) std::this_thread::yield();
    return t_->ReceiveInto(peer, deadline, head_bytes, body, landed);
  }

 private:
  collective::Transport* t_;
  std::atomic<bool>* go_;
};

// Over shared memory a large all-gather's ranges are read in place. A rank
// whose collective fails while a peer has not read them yet (here: its
// deadline passes while the peer is held) withdraws them before its
// caller gets the vector back: the peer's late read fails, naming it,
// instead of reading memory that is no longer the collective's.
TEST(ShmCollectiveTest, AFailedRankWithdrawsWhatItsPeerHasNotRead) {
  Group group(Kind::kShm, 2);
  std::atomic<bool> go{false};
  HeldTransport held(group.transports[1].get(), &go);
  const size_t n = (size_t{4} << 20) / sizeof(float);  // In place from 2 MiB.
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  Status s1;
  std::thread late([&] {
    Communicator c1(&held);
    s1 = c1.AllReduce(b, {.algorithm = Algorithm::kRing, .timeout_ms = 20000});
  });
  Communicator c0(group.transports[0].get());
  const Status s0 = c0.AllReduce(a, {.algorithm = Algorithm::kRing, .timeout_ms = 300});
  EXPECT_FALSE(s0.ok());
  std::fill(a.begin(), a.end(), -7.0f);  // The caller's again.
  go = true;
  late.join();
  EXPECT_FALSE(s1.ok());
  EXPECT_NE(s1.message().find("rank 0 withdrew a message it had sent"), std::string::npos) << s1;
  for (float x : b) ASSERT_NE(x, -7.0f);
}

TEST_P(CollectiveTest, AWrongSizedOrStaleMessageIsAnErrorNotACrash) {
  Group group(GetParam(), 2);
  collective::Transport* t0 = group.transports[0].get();
  collective::Transport* t1 = group.transports[1].get();
  Communicator c0(t0);
  // Rank 1 sends garbage instead of its chunk.
  const std::vector<uint8_t> junk(20, 0xab);
  ASSERT_TRUE(t1->Send(0, junk).ok());
  std::vector<float> v(64, 1.0f);
  Status s = c0.AllReduce(v, {.algorithm = Algorithm::kRecursiveDoubling, .timeout_ms = 1000});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("rank 1 sent a message of 20 bytes"), std::string::npos) << s;
  // A well-formed message from another collective (rank 1 is one behind).
  Communicator c1(t1);
  std::vector<float> w(64, 2.0f);
  std::thread peer([&] {
    (void)c1.AllReduce(w, {.algorithm = Algorithm::kRecursiveDoubling, .timeout_ms = 300});
  });
  s = c0.AllReduce(v, {.algorithm = Algorithm::kRecursiveDoubling, .timeout_ms = 1000});
  peer.join();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("message 0 of collective 1 (expected message 0 of collective 2)"),
            std::string::npos)
      << s;
}

// A message that is right in every field but the reserved header word
// (bytes 44-47, 0 in this format) is refused, naming the word.
TEST_P(CollectiveTest, AMessageWithItsReservedWordSetIsRefused) {
  Group group(GetParam(), 2);
  Communicator c0(group.transports[0].get());
  // Collective 1's message 0 from rank 1: all 64 floats, summed.
  struct {
    uint32_t magic = 0x33764c43, dtype = 1;
    uint64_t sequence = 1, index = 0, begin = 0, count = 64;
    uint32_t op = 0, reserved = 7;
  } header;
  static_assert(sizeof(header) == 48);
  std::vector<uint8_t> message(sizeof(header) + 64 * sizeof(float), 0);
  std::memcpy(message.data(), &header, sizeof(header));
  ASSERT_TRUE(group.transports[1]->Send(0, message).ok());
  std::vector<float> v(64, 1.0f);
  Status s = c0.AllReduce(v, {.algorithm = Algorithm::kRecursiveDoubling, .timeout_ms = 1000});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("rank 1 sent a message whose reserved header word is 7, not 0 "
                             "(another build's format?)"),
            std::string::npos)
      << s;
}

TEST(ZmqTransportTest, MalformedFramesAreDroppedAndCounted) {
  Group group(Kind::kZmqTcp, 2);
  auto* receiver = static_cast<ZmqTransport*>(group.transports[1].get());
  // A stranger connects to rank 1's inbox and sends frames that are not a
  // rank and a body; then rank 0 sends a real message.
  zmq::socket_t stranger(group.context, zmq::socket_type::push);
  stranger.connect(receiver->endpoint());
  stranger.send(zmq::str_buffer("no rank here"), zmq::send_flags::none);
  const uint32_t bogus = 99;
  stranger.send(zmq::buffer(&bogus, 4), zmq::send_flags::sndmore);
  stranger.send(zmq::str_buffer("x"), zmq::send_flags::none);
  const std::vector<uint8_t> hello = {1, 2, 3};
  // After the stranger's: one sender's messages keep their order, not two
  // senders', so wait for rank 0's message however they interleave.
  ASSERT_TRUE(group.transports[0]->Send(1, hello).ok());
  auto got = receiver->Receive(0, SteadyNowMs() + 5000);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(std::vector<uint8_t>(got->bytes().begin(), got->bytes().end()), hello);
  // Both bad messages are dropped once read (they may still be in flight).
  for (int i = 0; i < 100 && receiver->dropped() < 2; ++i) {
    if (receiver->Receive(0, SteadyNowMs() + 50).ok()) break;
  }
  EXPECT_EQ(receiver->dropped(), 2u);
}

TEST(RendezvousTest, StrayReportsAreIgnoredAndTheRealRanksMeet) {
  zmq::context_t context(1);
  const std::string master = "ipc:///tmp/cohort-rv-test-" + std::to_string(getpid());
  StatusOr<std::vector<std::string>> host = UnavailableError("not run");
  std::thread rank0([&] { host = Rendezvous(context, 0, 3, master, "e0", SteadyNowMs() + 10000); });
  // A stranger first: a wrong world size, a rank out of range, rank 0, junk.
  zmq::socket_t stranger(context, zmq::socket_type::dealer);
  stranger.set(zmq::sockopt::linger, 0);
  stranger.connect(master);
  for (const std::vector<std::string>& report : std::vector<std::vector<std::string>>{
           {"1", "4", "evil"}, {"7", "3", "evil"}, {"0", "3", "evil"}, {"x"}}) {
    for (size_t i = 0; i < report.size(); ++i) {
      stranger.send(zmq::buffer(report[i]),
                    i + 1 < report.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
  StatusOr<std::vector<std::string>> one = UnavailableError("not run"), two = one;
  std::thread rank1([&] { one = Rendezvous(context, 1, 3, master, "e1", SteadyNowMs() + 10000); });
  std::thread rank2([&] { two = Rendezvous(context, 2, 3, master, "e2", SteadyNowMs() + 10000); });
  rank0.join();
  rank1.join();
  rank2.join();
  const std::vector<std::string> want = {"e0", "e1", "e2"};
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(*host, want);
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(*one, want);
  EXPECT_EQ(*two, want);
  // A rank that never reports is named.
  auto alone = Rendezvous(context, 0, 2, master + "-b", "e0", SteadyNowMs() + 200);
  EXPECT_EQ(alone.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(alone.status().message().find("rank(s) 1 did not report"), std::string::npos)
      << alone.status();
}

INSTANTIATE_TEST_SUITE_P(Transports, CollectiveTest,
                         ::testing::Values(Kind::kInProcess, Kind::kZmqTcp, Kind::kZmqIpc,
                                           Kind::kShm, Kind::kTcp),
                         [](const auto& info) {
                           std::string n = Name(info.param);
                           for (char& ch : n) ch = std::isalnum(ch) ? ch : '_';
                           return n;
                         });

}  // namespace
}  // namespace cohort::net
