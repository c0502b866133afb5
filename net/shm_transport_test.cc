// The shared-memory transport on its own: messages larger than a ring's
// free space queue instead of blocking, and a peer that scribbles on the
// ring it writes gets an error naming it, never a read outside the ring.
#include "net/shm_transport.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "common/clock.h"

namespace cohort::net {
namespace {

struct Pair {
  Pair() {
    for (int r = 0; r < 2; ++r) t[r] = std::move(ShmTransport::Create(r, 2)).value();
    const std::vector<std::string> endpoints = {t[0]->endpoint(), t[1]->endpoint()};
    for (auto& x : t) EXPECT_TRUE(x->Connect(endpoints).ok());
  }
  std::unique_ptr<ShmTransport> t[2];
};

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 131 + i * 7);
  return v;
}

TEST(ShmTransportTest, MoreThanARingInFlightArrivesWholeAndInOrder) {
  Pair p;
  // 40 messages of 200 KiB: 8 MB, four times the 2 MiB ring. Send never
  // waits for the reader; the overflow is queued and flushed.
  constexpr int kCount = 40;
  constexpr size_t kBytes = 200 << 10;
  for (int i = 0; i < kCount; ++i) {
    const auto body = Pattern(kBytes, static_cast<uint8_t>(i));
    const uint32_t head = i;
    ASSERT_TRUE(
        p.t[0]->Send(1, {reinterpret_cast<const uint8_t*>(&head), sizeof(head)}, body).ok());
  }
  std::thread flusher([&] { EXPECT_TRUE(p.t[0]->Flush(SteadyNowMs() + 10000).ok()); });
  for (int i = 0; i < kCount; ++i) {
    auto m = p.t[1]->Receive(0, SteadyNowMs() + 10000);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_EQ(m->bytes().size(), sizeof(uint32_t) + kBytes);
    uint32_t head;
    std::memcpy(&head, m->data(), sizeof(head));
    EXPECT_EQ(head, static_cast<uint32_t>(i));
    const auto want = Pattern(kBytes, static_cast<uint8_t>(i));
    EXPECT_EQ(std::memcmp(m->data() + sizeof(head), want.data(), kBytes), 0) << "message " << i;
  }
  flusher.join();
}

TEST(ShmTransportTest, AMessageTooLargeForTheRingIsRefused) {
  Pair p;
  const auto body = Pattern(size_t{2} << 20, 1);
  const Status s = p.t[0]->Send(1, {}, body);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not fit"), std::string::npos) << s.ToString();
}

TEST(ShmTransportTest, NothingSentIsADeadlineNamingThePeer) {
  Pair p;
  auto m = p.t[1]->Receive(0, SteadyNowMs() + 20);
  EXPECT_EQ(m.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(m.status().message().find("rank 0"), std::string::npos);
}

TEST(ShmTransportTest, AnEndpointThatIsNotAnInboxIsRefused) {
  auto t = std::move(ShmTransport::Create(0, 2)).value();
  for (const std::string bad : {"tcp://127.0.0.1:1", "shm://no-such-segment-here", "shm://a/b"}) {
    const Status s = t->Connect({t->endpoint(), bad});
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.ToString();
  }
  // Rank 0's own inbox offered as rank 1's: the header says otherwise.
  const Status s = t->Connect({t->endpoint(), t->endpoint()});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

// Rank 1's inbox as rank 0 sees it: what a hostile rank 0 can write.
struct Inbox {
  explicit Inbox(const std::string& endpoint) {
    const int fd = shm_open(("/" + endpoint.substr(6)).c_str(), O_RDWR, 0);
    EXPECT_GE(fd, 0);
    length = static_cast<size_t>(lseek(fd, 0, SEEK_END));
    base = static_cast<uint8_t*>(mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~Inbox() { munmap(base, length); }
  // Layout (shm_transport.cc): a 64-byte header, then per sender a 256-byte
  // control block (head at offset 0) and its ring.
  std::atomic<uint64_t>* head_from_rank0() {
    return reinterpret_cast<std::atomic<uint64_t>*>(base + 64);
  }
  uint8_t* ring_from_rank0() { return base + 64 + 256; }
  uint8_t* base;
  size_t length;
};

TEST(ShmTransportTest, AHeadBeyondTheRingIsDataLossNamingTheWriter) {
  Pair p;
  Inbox inbox(p.t[1]->endpoint());
  inbox.head_from_rank0()->store(uint64_t{1} << 40);
  auto m = p.t[1]->Receive(0, SteadyNowMs() + 1000);
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(m.status().message().find("rank 0 corrupted its ring"), std::string::npos)
      << m.status().ToString();
}

TEST(ShmTransportTest, ARecordLongerThanWhatWasPublishedIsDataLoss) {
  Pair p;
  const uint32_t word = 7;
  ASSERT_TRUE(p.t[0]->Send(1, {reinterpret_cast<const uint8_t*>(&word), sizeof(word)}, {}).ok());
  Inbox inbox(p.t[1]->endpoint());
  // The record's length field now claims 1 MiB; only 64 bytes were
  // published.
  const uint64_t lie = 1 << 20;
  std::memcpy(inbox.ring_from_rank0(), &lie, sizeof(lie));
  auto m = p.t[1]->Receive(0, SteadyNowMs() + 1000);
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(m.status().message().find("overruns its ring"), std::string::npos)
      << m.status().ToString();
}

// Final bodies of 64 KiB and more go by reference: the peer reads them out
// of the sender's memory (one copy), so the sender's Flush waits until it
// has; what the sender changes after Flush is not what the peer got.
TEST(ShmTransportTest, FinalBodiesAreReadInPlaceAndFlushWaitsForThePeer) {
  Pair p;
  const uint32_t head = 42;
  const std::span<const uint8_t> h(reinterpret_cast<const uint8_t*>(&head), sizeof(head));
  std::vector<uint8_t> a = Pattern(1 << 20, 1);
  ASSERT_TRUE(p.t[0]->SendFinal(1, h, a).ok());
  // Not read yet: a copy would have let Flush return at once.
  Status early = p.t[0]->Flush(SteadyNowMs() + 50);
  EXPECT_EQ(early.code(), StatusCode::kDeadlineExceeded) << early;
  EXPECT_NE(early.message().find("rank 1 did not read what rank 0 sent"), std::string::npos)
      << early;
  std::vector<uint8_t> got(a.size());
  bool landed = false;
  auto m = p.t[1]->ReceiveInto(0, SteadyNowMs() + 1000, sizeof(head), got, &landed);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(landed);
  ASSERT_EQ(m->size(), sizeof(head));
  EXPECT_EQ(std::memcmp(m->data(), &head, sizeof(head)), 0);
  EXPECT_EQ(got, a);

  std::vector<uint8_t> b = Pattern(1 << 20, 2);
  const std::vector<uint8_t> want = b;
  ASSERT_TRUE(p.t[0]->SendFinal(1, h, b).ok());
  std::thread reader([&] {
    bool into = false;
    auto r = p.t[1]->ReceiveInto(0, SteadyNowMs() + 10000, sizeof(head), got, &into);
    EXPECT_TRUE(r.ok() && into);
  });
  ASSERT_TRUE(p.t[0]->Flush(SteadyNowMs() + 10000).ok());
  std::fill(b.begin(), b.end(), 0);  // The peer has read it already.
  reader.join();
  EXPECT_EQ(got, want);

  // Received as a whole message: the head and the body read in place.
  ASSERT_TRUE(p.t[0]->SendFinal(1, h, a).ok());
  auto whole = p.t[1]->Receive(0, SteadyNowMs() + 1000);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(whole->size(), sizeof(head) + a.size());
  EXPECT_EQ(std::memcmp(whole->data() + sizeof(head), a.data(), a.size()), 0);
  EXPECT_TRUE(p.t[0]->Flush(SteadyNowMs() + 1000).ok());
}

// A sender that gives up (a failed collective) withdraws what its peer has
// not read yet, since the memory is its caller's again: the peer's read
// fails, naming it, and what is sent afterwards is read as before.
TEST(ShmTransportTest, AWithdrawnReferenceIsNotRead) {
  Pair p;
  const uint32_t head = 9;
  const std::span<const uint8_t> h(reinterpret_cast<const uint8_t*>(&head), sizeof(head));
  std::vector<uint8_t> body = Pattern(1 << 20, 4);
  ASSERT_TRUE(p.t[0]->SendFinal(1, h, body).ok());
  p.t[0]->Revoke();
  std::fill(body.begin(), body.end(), 0xee);  // Reused by its owner.
  std::vector<uint8_t> got(body.size(), 0);
  bool landed = false;
  auto m = p.t[1]->ReceiveInto(0, SteadyNowMs() + 1000, sizeof(head), got, &landed);
  EXPECT_EQ(m.status().code(), StatusCode::kUnavailable) << m.status();
  EXPECT_NE(m.status().message().find("rank 0 withdrew a message it had sent"), std::string::npos)
      << m.status();
  EXPECT_TRUE(p.t[0]->Flush(SteadyNowMs() + 1000).ok());  // Consumed, so counted.
  const std::vector<uint8_t> next = Pattern(1 << 20, 5);
  ASSERT_TRUE(p.t[0]->SendFinal(1, h, next).ok());
  m = p.t[1]->ReceiveInto(0, SteadyNowMs() + 1000, sizeof(head), got, &landed);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(landed);
  EXPECT_EQ(got, next);
  EXPECT_TRUE(p.t[0]->Flush(SteadyNowMs() + 1000).ok());
}

// A reference is checked like any record: a length beyond a message's, or
// an address the sender does not map, is an error naming the sender.
TEST(ShmTransportTest, ABadReferenceIsAnErrorNamingTheSender) {
  Pair p;
  const uint32_t head = 7;
  const std::span<const uint8_t> h(reinterpret_cast<const uint8_t*>(&head), sizeof(head));
  const std::vector<uint8_t> body = Pattern(1 << 20, 3);
  Inbox inbox(p.t[1]->endpoint());
  // The record: its tagged length, the head, then the address and length.
  uint8_t* ref = inbox.ring_from_rank0() + sizeof(uint64_t) + sizeof(head);
  ASSERT_TRUE(p.t[0]->SendFinal(1, h, body).ok());
  const uint64_t huge = uint64_t{1} << 30;
  std::memcpy(ref + 8, &huge, sizeof(huge));
  auto m = p.t[1]->Receive(0, SteadyNowMs() + 1000);
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status();
  EXPECT_NE(m.status().message().find("rank 0 referred to 1073741824 bytes"), std::string::npos)
      << m.status();

  Pair q;
  Inbox other(q.t[1]->endpoint());
  ref = other.ring_from_rank0() + sizeof(uint64_t) + sizeof(head);
  ASSERT_TRUE(q.t[0]->SendFinal(1, h, body).ok());
  const uint64_t nowhere = 8;  // The first page is never mapped.
  std::memcpy(ref, &nowhere, sizeof(nowhere));
  std::vector<uint8_t> got(body.size());
  bool landed = false;
  m = q.t[1]->ReceiveInto(0, SteadyNowMs() + 1000, sizeof(head), got, &landed);
  EXPECT_EQ(m.status().code(), StatusCode::kUnavailable) << m.status();
  EXPECT_NE(m.status().message().find("cannot read rank 0's message in place"), std::string::npos)
      << m.status();
}

}  // namespace
}  // namespace cohort::net
