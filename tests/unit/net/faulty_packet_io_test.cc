// The fault decorator over a recording PacketIo under a VirtualClock: exact, seeded outcomes.
#include "net/faulty_packet_io.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "net/packet_io_env.h"
#include "wire/icrc.h"

namespace urdma::net {
namespace {

// Records every datagram handed to it (bytes, the first iovec's address, the source port).
class RecordingIo final : public PacketIo {
 public:
  struct Sent {
    std::vector<uint8_t> bytes;
    const void* first_iov = nullptr;
    uint16_t src_port = 0;
  };
  TxStatus send(const TxDatagram& d) override {
    if (block) return TxStatus::kWouldBlock;
    Sent s;
    s.first_iov = d.iov.empty() ? nullptr : d.iov[0].iov_base;
    s.src_port = d.src_port;
    for (const iovec& v : d.iov) {
      const auto* p = static_cast<const uint8_t*>(v.iov_base);
      s.bytes.insert(s.bytes.end(), p, p + v.iov_len);
    }
    if (log != nullptr) log->push_back(s);
    sent.push_back(std::move(s));
    return TxStatus::kSent;
  }
  size_t send_batch(std::span<const TxDatagram> batch) override {
    for (size_t i = 0; i < batch.size(); ++i)
      if (send(batch[i]) == TxStatus::kWouldBlock) return i;
    return batch.size();
  }
  size_t recv_batch(std::span<RxDatagram>) override { return 0; }
  int readable_fd() const override { return -1; }
  IoCounters counters() const override { return {}; }
  uint16_t source_port(uint16_t wanted) const override { return wanted | 1; }
  // As a shared-memory ring would answer (shm_packet_io.h), when `ring` is set.
  bool icrc_needed(const Endpoint&, uint32_t) override { return !ring; }

  std::vector<Sent> sent;
  bool ring = false;
  std::vector<Sent>* log = nullptr;  // a copy of `sent` that outlives this object
  bool block = false;
};

struct Rig {
  explicit Rig(const FaultProfile& p) {
    auto rec = std::make_unique<RecordingIo>();
    inner = rec.get();
    io = std::make_unique<FaultyPacketIo>(std::move(rec), clock, p);
  }
  // Sends datagram number `n`: n and its complement, so a corrupted one is recognised.
  TxStatus send_number(uint32_t n) {
    uint32_t words[2] = {n, ~n};
    const iovec v{words, sizeof words};
    TxDatagram d;
    d.iov = std::span<const iovec>(&v, 1);
    d.dst = Endpoint{Address::from_v4(10, 0, 0, 2), kRoceV2UdpPort};
    return io->send(d);
  }
  // The numbers sent so far, in order, leaving out corrupted datagrams.
  std::vector<uint32_t> numbers() const {
    std::vector<uint32_t> out;
    for (const auto& s : inner->sent) {
      uint32_t words[2];
      std::memcpy(words, s.bytes.data(), sizeof words);
      if (words[0] == ~words[1]) out.push_back(words[0]);
    }
    return out;
  }
  VirtualClock clock;
  RecordingIo* inner = nullptr;
  std::unique_ptr<FaultyPacketIo> io;
};

TEST(FaultProfileTest, ParsesTheDocumentedSyntax) {
  std::string error;
  const auto p = parse_fault_profile(
      "seed=1,loss=10000,dup=1000,reorder=10000,delay_us=0-200,corrupt=100", &error);
  ASSERT_TRUE(p) << error;
  EXPECT_EQ(p->seed, 1u);
  EXPECT_EQ(p->loss_ppm, 10000u);
  EXPECT_EQ(p->duplicate_ppm, 1000u);
  EXPECT_EQ(p->reorder_ppm, 10000u);
  EXPECT_EQ(p->corrupt_ppm, 100u);
  EXPECT_EQ(p->delay_min_ns, 0u);
  EXPECT_EQ(p->delay_max_ns, 200'000u);
  const auto q = parse_fault_profile(
      " loss = 5 , delay_us=7, reorder_depth=9,reorder_max_us=50,"
      "held_max=10,",
      &error);
  ASSERT_TRUE(q) << error;
  EXPECT_EQ(q->loss_ppm, 5u);
  EXPECT_EQ(q->delay_min_ns, 7'000u);
  EXPECT_EQ(q->delay_max_ns, 7'000u);
  EXPECT_EQ(q->reorder_depth, 9u);
  EXPECT_EQ(q->reorder_max_ns, 50'000u);
  EXPECT_EQ(q->held_max, 10u);
  EXPECT_EQ(parse_fault_profile("", &error), FaultProfile{});
  EXPECT_EQ(parse_fault_profile(to_string(*p), &error), p) << to_string(*p);
}

TEST(FaultProfileTest, MalformedProfilesAreErrorsNamingTheItem) {
  const std::pair<const char*, const char*> bad[] = {
      {"los=1", "unknown key 'los'"},
      {"loss", "'loss' is not key=value"},
      {"loss=1000001", "'loss=1000001'"},
      {"loss=1%", "'loss=1%'"},
      {"loss=-1", "'loss=-1'"},
      {"dup=", "'dup='"},
      {"seed=1,seed=2", "'seed' given twice"},
      {"delay_us=200-100", "'delay_us=200-100'"},
      {"delay_us=1-", "'delay_us=1-'"},
      {"reorder_depth=0", "'reorder_depth=0'"},
      {"held_max=70000", "'held_max=70000'"},
  };
  for (const auto& [text, message] : bad) {
    std::string error;
    EXPECT_FALSE(parse_fault_profile(text, &error)) << text;
    EXPECT_NE(error.find("URDMA_FAULTS: "), std::string::npos) << error;
    EXPECT_NE(error.find(message), std::string::npos) << text << " -> " << error;
  }
}

// 100,000 datagrams under the documented profile (no delay, so time does not move): the counts
// are exact for the seed, and each lies within 5 standard deviations of its binomial mean.
// A profile that corrupts needs every ICRC (the receiver finds the flipped bit by it), even for
// a datagram a ring below would take unsealed; any other profile answers as the I/O below.
TEST(FaultyPacketIoTest, AProfileThatCorruptsNeedsEveryIcrc) {
  const Endpoint dst{Address::from_v4(10, 0, 0, 2), kRoceV2UdpPort};
  FaultProfile lossy;
  lossy.loss_ppm = 10'000;
  Rig plain(lossy);
  EXPECT_TRUE(plain.io->icrc_needed(dst, 0x1001));
  plain.inner->ring = true;
  EXPECT_FALSE(plain.io->icrc_needed(dst, 0x1001));
  FaultProfile corrupting = lossy;
  corrupting.corrupt_ppm = 1;
  Rig corrupt(corrupting);
  corrupt.inner->ring = true;
  EXPECT_TRUE(corrupt.io->icrc_needed(dst, 0x1001));
}

TEST(FaultyPacketIoTest, CountsForAFixedSeedAreExactAndPlausible) {
  FaultProfile p;
  p.seed = 1;
  p.loss_ppm = 10'000;
  p.duplicate_ppm = 1'000;
  p.reorder_ppm = 10'000;
  p.corrupt_ppm = 100;
  Rig rig(p);
  constexpr uint32_t kN = 100'000;
  for (uint32_t i = 0; i < kN; ++i) ASSERT_EQ(rig.send_number(i), TxStatus::kSent);
  const FaultCounters& c = rig.io->fault_counters();
  auto plausible = [](uint64_t count, uint64_t trials, uint32_t ppm) {
    const double q = ppm / 1e6;
    const double mean = trials * q;
    return std::fabs(static_cast<double>(count) - mean) <= 5 * std::sqrt(mean * (1 - q));
  };
  const uint64_t copies = kN - c.dropped_loss + c.duplicated;
  EXPECT_EQ(c.offered, kN);
  EXPECT_TRUE(plausible(c.dropped_loss, kN, p.loss_ppm)) << c.dropped_loss;
  EXPECT_TRUE(plausible(c.duplicated, kN - c.dropped_loss, p.duplicate_ppm)) << c.duplicated;
  EXPECT_TRUE(plausible(c.reordered, copies, p.reorder_ppm)) << c.reordered;
  EXPECT_TRUE(plausible(c.corrupted, copies, p.corrupt_ppm)) << c.corrupted;
  // Exact for seed 1: a change here means the draws changed and old seeds no longer replay.
  EXPECT_EQ(c.dropped_loss, 1014u);
  EXPECT_EQ(c.duplicated, 111u);
  EXPECT_EQ(c.reordered, 1006u);
  EXPECT_EQ(c.corrupted, 7u);
  EXPECT_EQ(c.delayed, 0u);
  EXPECT_EQ(c.held_overflow, 0u);
  // Everything held is out once its time has come; nothing else is lost.
  rig.clock.advance(p.reorder_max_ns);
  rig.io->release_due();
  EXPECT_EQ(rig.io->held(), 0u);
  EXPECT_EQ(rig.inner->sent.size(), copies);
  // Reordered copies really were overtaken: count the datagrams that arrive after a later one.
  const std::vector<uint32_t> got = rig.numbers();
  uint64_t late = 0;
  uint32_t highest = 0;
  for (uint32_t n : got) {
    if (n < highest) ++late;
    highest = std::max(highest, n);
  }
  EXPECT_GT(late, c.reordered / 2);
  EXPECT_LE(late, c.reordered + c.duplicated);
}

TEST(FaultyPacketIoTest, ASeedReplaysExactly) {
  FaultProfile p;
  p.loss_ppm = 50'000;
  p.duplicate_ppm = 50'000;
  p.reorder_ppm = 50'000;
  p.corrupt_ppm = 50'000;
  auto run = [&](uint64_t seed) {
    p.seed = seed;
    Rig rig(p);
    for (uint32_t i = 0; i < 2000; ++i) rig.send_number(i);
    rig.clock.advance(p.reorder_max_ns);
    rig.io->release_due();
    std::vector<std::vector<uint8_t>> out;
    for (const auto& s : rig.inner->sent) out.push_back(s.bytes);
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

// A reordered copy waits for 1..reorder_depth later datagrams, or its time.
TEST(FaultyPacketIoTest, ReorderedCopyIsOvertakenByAtMostDepthDatagrams) {
  FaultProfile p;
  p.reorder_ppm = 1'000'000;  // every copy ... so only the first is checked below
  p.reorder_depth = 1;
  Rig rig(p);
  rig.send_number(0);
  EXPECT_EQ(rig.inner->sent.size(), 0u);
  EXPECT_EQ(rig.io->held(), 1u);
  EXPECT_EQ(rig.io->next_deadline_ns(), p.reorder_max_ns);
  rig.send_number(1);  // held too; its arrival releases #0 (one datagram overtook it)
  EXPECT_EQ(rig.numbers(), std::vector<uint32_t>{0});
  rig.clock.advance(p.reorder_max_ns);  // nothing more is sent: #1 goes by time
  rig.io->release_due();
  EXPECT_EQ(rig.numbers(), (std::vector<uint32_t>{0, 1}));
}

TEST(FaultyPacketIoTest, DelayHoldsUntilItsTime) {
  std::string error;
  const auto p = parse_fault_profile("delay_us=100", &error);
  ASSERT_TRUE(p) << error;
  Rig rig(*p);
  rig.send_number(5);
  EXPECT_EQ(rig.inner->sent.size(), 0u);
  EXPECT_EQ(rig.io->next_deadline_ns(), 100'000u);
  rig.clock.advance(99'999);
  std::vector<uint8_t> buf(8);
  RxDatagram slot{buf};
  EXPECT_EQ(rig.io->recv_batch(std::span<RxDatagram>(&slot, 1)), 0u);  // also releases
  EXPECT_EQ(rig.inner->sent.size(), 0u);
  rig.clock.advance(1);
  EXPECT_EQ(rig.io->recv_batch(std::span<RxDatagram>(&slot, 1)), 0u);
  EXPECT_EQ(rig.numbers(), std::vector<uint32_t>{5});
  EXPECT_EQ(rig.io->fault_counters().delayed, 1u);
  EXPECT_EQ(rig.io->next_deadline_ns(), kNever);
}

TEST(FaultyPacketIoTest, HeldCopiesLeaveWhenTheDecoratorIsDestroyedInTheOrderTheyWereDue) {
  std::vector<RecordingIo::Sent> log;
  FaultProfile p;
  p.delay_min_ns = 1'000;
  p.delay_max_ns = 1'000'000;
  p.seed = 7;
  Rig rig(p);
  rig.inner->log = &log;
  for (uint32_t i = 0; i < 20; ++i) rig.send_number(i);
  ASSERT_EQ(rig.io->held(), 20u) << "every copy delayed, none due yet";
  rig.io.reset();  // the device closed before any delay ran out
  ASSERT_EQ(log.size(), 20u) << "held copies were lost at destruction";
  std::vector<uint32_t> got;
  for (const auto& s : log) {
    uint32_t words[2];
    std::memcpy(words, s.bytes.data(), sizeof words);
    got.push_back(words[0]);
  }
  std::vector<uint32_t> sorted = got;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t i = 0; i < 20; ++i) EXPECT_EQ(sorted[i], i);
  EXPECT_NE(got, sorted) << "a delay spread reorders: released by due time, not send order";
  // The same seed, left to run out its delays: the same order.
  Rig waited(p);
  for (uint32_t i = 0; i < 20; ++i) waited.send_number(i);
  waited.clock.advance(p.delay_max_ns);
  waited.io->release_due();
  EXPECT_EQ(waited.numbers(), got);
}

TEST(FaultyPacketIoTest, HeldQueueIsBoundedAndWouldBlockIsRetried) {
  FaultProfile p;
  p.delay_min_ns = p.delay_max_ns = 1'000'000;
  p.held_max = 4;
  Rig rig(p);
  for (uint32_t i = 0; i < 10; ++i) rig.send_number(i);
  EXPECT_EQ(rig.io->held(), 4u);
  EXPECT_EQ(rig.io->fault_counters().held_overflow, 6u);
  EXPECT_EQ(rig.numbers(), (std::vector<uint32_t>{0, 1, 2, 3, 4, 5}));
  rig.inner->block = true;
  rig.clock.advance(p.delay_max_ns);
  rig.io->release_due();
  EXPECT_EQ(rig.io->held(), 4u) << "would block: still held";
  // The queue is full and the earliest cannot go: it is lost (counted) to keep the bound.
  EXPECT_EQ(rig.send_number(99), TxStatus::kSent) << "held, not sent yet";
  EXPECT_EQ(rig.io->held(), 4u);
  EXPECT_EQ(rig.io->fault_counters().release_failed, 1u);
  rig.inner->block = false;
  rig.clock.advance(p.delay_max_ns);
  rig.io->release_due();
  EXPECT_EQ(rig.numbers(), (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 7, 8, 9, 99}));
}

// Without a fault for it a datagram goes through as it came (the caller's iovecs, no copy), and
// would-block reaches the caller (nothing accepted).
TEST(FaultyPacketIoTest, UnfaultedDatagramsPassThroughUncopied) {
  Rig rig(FaultProfile{});
  uint32_t n = 3;
  const iovec v{&n, sizeof n};
  TxDatagram d;
  d.iov = std::span<const iovec>(&v, 1);
  d.src_port = 0xC010;
  EXPECT_EQ(rig.io->send(d), TxStatus::kSent);
  ASSERT_EQ(rig.inner->sent.size(), 1u);
  EXPECT_EQ(rig.inner->sent[0].first_iov, &n);
  EXPECT_EQ(rig.inner->sent[0].src_port, 0xC010);
  EXPECT_EQ(rig.io->source_port(0xC010), 0xC011) << "asks the inner I/O";
  rig.inner->block = true;
  const TxDatagram batch[2] = {d, d};
  EXPECT_EQ(rig.io->send_batch(batch), 0u);
  EXPECT_EQ(rig.io->fault_counters().offered, 1u);
}

// Corruption flips one bit after the sender sealed the ICRC: the receiver's check fails, and
// the sender's buffer is untouched.
TEST(FaultyPacketIoTest, CorruptFlipsOneBitSoTheIcrcFails) {
  FaultProfile p;
  p.corrupt_ppm = 1'000'000;
  Rig rig(p);
  wire::IcrcIpv4 h;
  h.flow.src_addr = {10, 0, 0, 1};
  h.flow.dst_addr = {10, 0, 0, 2};
  h.flow.udp_src_port = 0xC001;
  for (int round = 0; round < 50; ++round) {
    std::vector<uint8_t> pkt(12 + 64 + 4, static_cast<uint8_t>(round));
    pkt[0] = 0x04;  // RC SEND Only
    pkt[1] = 0;
    pkt[2] = 0xFF;
    pkt[3] = 0xFF;
    wire::seal_icrc(h, pkt);
    ASSERT_TRUE(wire::verify_icrc_ipv4(h.flow, pkt, wire::Ipv4DfSearch::kSetOnly).ok);
    const std::vector<uint8_t> original = pkt;
    const iovec v{pkt.data(), pkt.size()};
    TxDatagram d;
    d.iov = std::span<const iovec>(&v, 1);
    d.src_port = 0xC001;
    ASSERT_EQ(rig.io->send(d), TxStatus::kSent);
    EXPECT_EQ(pkt, original);
    ASSERT_EQ(rig.inner->sent.size(), static_cast<size_t>(round + 1));
    const std::vector<uint8_t>& out = rig.inner->sent.back().bytes;
    int flipped = 0;
    size_t at = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const int bits = std::popcount(static_cast<uint8_t>(out[i] ^ pkt[i]));
      if (bits) at = i;
      flipped += bits;
    }
    EXPECT_EQ(flipped, 1);
    // BTH byte 4 (FECN, BECN, resv6) is masked out of the ICRC (annex A17.4.3.1): a flip there
    // passes, as on a real link; anywhere else the check fails.
    EXPECT_EQ(wire::verify_icrc_ipv4(h.flow, out, wire::Ipv4DfSearch::kSetOnly).ok, at == 4)
        << "byte " << at;
  }
  EXPECT_EQ(rig.io->fault_counters().corrupted, 50u);
}

TEST(PacketIoEnvTest, WrapsOnlyForAProfileAndRefusesAMalformedOne) {
  VirtualClock clock;
  std::string error;
  auto plain = std::make_unique<RecordingIo>();
  PacketIo* raw = plain.get();
  auto same = wrap_with_faults(std::move(plain), clock, "", &error);
  EXPECT_EQ(same.get(), raw);
  same = wrap_with_faults(std::move(same), clock, nullptr, &error);
  EXPECT_EQ(same.get(), raw);
  auto faulty = wrap_with_faults(std::move(same), clock, "seed=3,loss=1", &error);
  ASSERT_TRUE(faulty) << error;
  auto* f = dynamic_cast<FaultyPacketIo*>(faulty.get());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->profile().loss_ppm, 1u);
  EXPECT_EQ(&f->inner(), raw);
  EXPECT_FALSE(wrap_with_faults(std::make_unique<RecordingIo>(), clock, "loss=2%", &error));
  EXPECT_NE(error.find("URDMA_FAULTS"), std::string::npos);
}

}  // namespace
}  // namespace urdma::net
