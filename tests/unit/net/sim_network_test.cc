#include "support/sim_network.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace urdma::net {
namespace {

constexpr uint16_t kSrcPort = 0xc123;

Address host_address(size_t i) {
  return Address::from_v4(10, 0, 0, static_cast<uint8_t>(i + 1));
}

// A network of `n` hosts 10.0.0.1 ... on its own virtual clock.
struct Net {
  explicit Net(SimOptions options, size_t n = 2) : net(clock, std::move(options)) {
    for (size_t i = 0; i < n; ++i) net.add_host(host_address(i));
    net.set_trace([this](const SimEvent& e) { trace.push_back(e); });
  }

  TxStatus send(HostId from, HostId to, const std::vector<uint8_t>& payload) {
    const iovec v{const_cast<uint8_t*>(payload.data()), payload.size()};
    TxDatagram d;
    d.iov = std::span<const iovec>(&v, 1);
    d.dst = Endpoint{host_address(to), kRoceV2UdpPort};
    d.src_port = kSrcPort;
    return net.io(from).send(d);
  }

  // Moves virtual time to `t_ns`, delivering every datagram on time along the way.
  void advance_to(uint64_t t_ns) {
    while (net.next_event_ns() <= t_ns) {
      clock.set(net.next_event_ns());
      net.deliver_due();
    }
    clock.set(t_ns);
  }

  // Moves virtual time event by event until nothing is in flight.
  void run() {
    while (net.next_event_ns() != kNever) {
      clock.set(net.next_event_ns());
      net.deliver_due();
    }
  }

  struct Got {
    std::vector<uint8_t> bytes;
    Endpoint src, dst;
  };
  std::vector<Got> drain(HostId h) {
    std::vector<Got> out;
    std::vector<std::vector<uint8_t>> bufs(8, std::vector<uint8_t>(2048));
    std::vector<RxDatagram> slots(8);
    for (;;) {
      for (size_t i = 0; i < slots.size(); ++i) slots[i] = RxDatagram{bufs[i]};
      const size_t n = net.io(h).recv_batch(slots);
      if (n == 0) return out;
      for (size_t i = 0; i < n; ++i) {
        EXPECT_FALSE(slots[i].truncated);
        out.push_back(Got{std::vector<uint8_t>(bufs[i].begin(), bufs[i].begin() + slots[i].length),
                          slots[i].src, slots[i].dst});
      }
    }
  }

  size_t count(SimEventKind k) const {
    return std::count_if(trace.begin(), trace.end(),
                         [k](const SimEvent& e) { return e.kind == k; });
  }

  VirtualClock clock;
  SimNetwork net;
  std::vector<SimEvent> trace;
};

// A payload that carries its sequence number in its first 4 bytes (as many as fit).
std::vector<uint8_t> numbered(uint32_t seq, size_t len = 64) {
  std::vector<uint8_t> p(len);
  for (size_t i = 0; i < len; ++i) p[i] = static_cast<uint8_t>(seq * 31 + i * 7);
  std::memcpy(p.data(), &seq, std::min(sizeof seq, len));
  return p;
}
uint32_t seq_of(const std::vector<uint8_t>& p) {
  uint32_t s;
  std::memcpy(&s, p.data(), sizeof s);
  return s;
}

SimOptions fixed_delay(uint64_t delay_ns = 1'000) {
  SimOptions o;
  o.delay_min_ns = o.delay_max_ns = delay_ns;
  return o;
}

TEST(SimNetworkTest, DeliversGatheredCopyExactlyAfterTheDelay) {
  Net n(fixed_delay(5'000));
  uint8_t hdr[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<uint8_t> payload(100, 0xab);
  uint8_t icrc[4] = {0xde, 0xad, 0xbe, 0xef};
  const iovec iov[3] = {{hdr, sizeof hdr}, {payload.data(), payload.size()}, {icrc, sizeof icrc}};
  TxDatagram d;
  d.iov = iov;
  d.dst = Endpoint{host_address(1), kRoceV2UdpPort};
  d.src_port = kSrcPort;
  n.clock.set(1'000);
  ASSERT_EQ(n.net.io(0).send(d), TxStatus::kSent);
  hdr[0] = 0xff;  // the engine reuses its header buffer at once: the network holds its own copy
  payload.assign(payload.size(), 0);

  EXPECT_EQ(n.net.next_event_ns(), 6'000u);
  n.clock.set(5'999);
  EXPECT_EQ(n.net.deliver_due(), 0u);
  EXPECT_EQ(n.net.rx_pending(1), 0u);
  n.clock.set(6'000);
  EXPECT_EQ(n.net.deliver_due(), 1u);
  EXPECT_EQ(n.net.next_event_ns(), kNever);

  auto got = n.drain(1);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].bytes.size(), 116u);
  EXPECT_EQ(got[0].bytes[0], 1);
  EXPECT_EQ(got[0].bytes[12], 0xab);
  EXPECT_EQ(got[0].bytes[115], 0xef);
  EXPECT_EQ(got[0].src, (Endpoint{host_address(0), kSrcPort}));
  EXPECT_EQ(got[0].dst, (Endpoint{host_address(1), kRoceV2UdpPort}));
  EXPECT_TRUE(n.drain(0).empty());

  const IoCounters tx = n.net.io(0).counters();
  const IoCounters rx = n.net.io(1).counters();
  EXPECT_EQ(tx.tx_datagrams, 1u);
  EXPECT_EQ(tx.tx_bytes, 116u);
  EXPECT_EQ(rx.rx_datagrams, 1u);
  EXPECT_EQ(rx.rx_bytes, 116u);
  EXPECT_EQ(n.net.io(0).readable_fd(), -1);
}

TEST(SimNetworkTest, EqualDeliveryTimesKeepSendOrder) {
  Net n(fixed_delay());
  for (uint32_t i = 0; i < 100; ++i) n.send(0, 1, numbered(i));
  n.run();
  auto got = n.drain(1);
  ASSERT_EQ(got.size(), 100u);
  for (uint32_t i = 0; i < 100; ++i) EXPECT_EQ(seq_of(got[i].bytes), i);
}

// Sends a mixed workload among three hosts with every fault on; returns the trace as text and
// what each host received.
std::vector<std::string> faulty_run(uint64_t seed) {
  SimOptions o;
  o.seed = seed;
  o.loss_ppm = o.duplicate_ppm = o.reorder_ppm = o.corrupt_ppm = 100'000;
  o.delay_min_ns = 1'000;
  o.delay_max_ns = 9'000;
  Net n(o, 3);
  for (uint32_t i = 0; i < 300; ++i) {
    n.advance_to(i * 500);
    n.send(i % 3, (i + 1 + i / 3) % 3 == i % 3 ? (i + 2) % 3 : (i + 1 + i / 3) % 3, numbered(i));
  }
  n.run();
  std::vector<std::string> lines;
  for (const SimEvent& e : n.trace) lines.push_back(to_string(e));
  for (HostId h = 0; h < 3; ++h)
    for (const auto& g : n.drain(h))
      lines.push_back("h" + std::to_string(h) + " got " + std::to_string(seq_of(g.bytes)) +
                      " from " + g.src.to_string());
  return lines;
}

TEST(SimNetworkTest, SameSeedReplaysIdenticallyDifferentSeedDiffers) {
  const auto a = faulty_run(1234);
  const auto b = faulty_run(1234);
  const auto c = faulty_run(1235);
  EXPECT_GT(a.size(), 600u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

enum class Fault { kLoss, kDuplicate, kReorder, kCorrupt };

SimOptions with_fault(Fault f, uint32_t ppm, uint64_t seed = 99) {
  SimOptions o = fixed_delay();
  o.seed = seed;
  (f == Fault::kLoss        ? o.loss_ppm
   : f == Fault::kDuplicate ? o.duplicate_ppm
   : f == Fault::kReorder   ? o.reorder_ppm
                            : o.corrupt_ppm) = ppm;
  return o;
}

uint64_t fault_count(const SimCounters& c, Fault f) {
  switch (f) {
    case Fault::kLoss:
      return c.dropped_loss;
    case Fault::kDuplicate:
      return c.duplicated;
    case Fault::kReorder:
      return c.reordered;
    case Fault::kCorrupt:
      return c.corrupted;
  }
  return 0;
}

std::string fault_name(const ::testing::TestParamInfo<Fault>& p) {
  const char* const kNames[] = {"Loss", "Duplicate", "Reorder", "Corrupt"};
  return kNames[static_cast<int>(p.param)];
}

class FaultTest : public ::testing::TestWithParam<Fault> {};

TEST_P(FaultTest, NeverAtZeroPpm) {
  Net n(with_fault(GetParam(), 0));
  constexpr uint32_t kCount = 2'000;
  for (uint32_t i = 0; i < kCount; ++i) n.send(0, 1, numbered(i));
  n.run();
  const auto got = n.drain(1);
  // Everything arrives once, intact, in order.
  ASSERT_EQ(got.size(), kCount);
  for (uint32_t i = 0; i < kCount; ++i) EXPECT_EQ(got[i].bytes, numbered(i));
  const SimCounters& c = n.net.counters();
  EXPECT_EQ(c.sent, kCount);
  EXPECT_EQ(c.delivered, kCount);
  EXPECT_EQ(c.dropped_loss + c.duplicated + c.reordered + c.corrupted, 0u);
}

TEST_P(FaultTest, AlwaysAtOneMillionPpm) {
  const Fault f = GetParam();
  Net n(with_fault(f, 1'000'000));
  constexpr uint32_t kCount = 2'000;
  for (uint32_t i = 0; i < kCount; ++i) n.send(0, 1, numbered(i));
  n.run();
  const auto got = n.drain(1);
  const SimCounters& c = n.net.counters();
  EXPECT_EQ(c.sent, kCount);
  switch (f) {
    case Fault::kLoss:
      EXPECT_EQ(c.dropped_loss, kCount);
      EXPECT_TRUE(got.empty());
      break;
    case Fault::kDuplicate: {
      EXPECT_EQ(c.duplicated, kCount);
      ASSERT_EQ(got.size(), 2 * kCount);
      std::map<uint32_t, int> copies;
      for (const auto& g : got) {
        EXPECT_EQ(g.bytes, numbered(seq_of(g.bytes)));
        copies[seq_of(g.bytes)]++;
      }
      ASSERT_EQ(copies.size(), kCount);
      for (const auto& [seq, k] : copies) EXPECT_EQ(k, 2) << seq;
      break;
    }
    case Fault::kReorder:
      // Every datagram got an extra delay: none arrives at the plain one-way delay.
      EXPECT_EQ(c.reordered, kCount);
      ASSERT_EQ(got.size(), kCount);
      for (const SimEvent& e : n.trace) {
        if (e.kind == SimEventKind::kSchedule) {
          EXPECT_GT(e.detail, 1'000u);
        }
      }
      break;
    case Fault::kCorrupt:
      EXPECT_EQ(c.corrupted, kCount);
      ASSERT_EQ(got.size(), kCount);
      for (uint32_t i = 0; i < kCount; ++i) EXPECT_NE(got[i].bytes, numbered(i));
      break;
  }
}

// 10,000 datagrams at 100,000 ppm: the expected count is 1,000 with a standard deviation of 30;
// [800, 1200] is more than six deviations each way. No timing is involved.
TEST_P(FaultTest, IntermediateRateFallsInStatisticalBound) {
  const Fault f = GetParam();
  for (uint64_t seed : {1, 2, 3}) {
    Net n(with_fault(f, 100'000, seed));
    for (uint32_t i = 0; i < 10'000; ++i) n.send(0, 1, numbered(i, 16));
    n.run();
    const uint64_t k = fault_count(n.net.counters(), f);
    EXPECT_GE(k, 800u) << "seed " << seed;
    EXPECT_LE(k, 1'200u) << "seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(AllFaults, FaultTest,
                         ::testing::Values(Fault::kLoss, Fault::kDuplicate, Fault::kReorder,
                                           Fault::kCorrupt),
                         fault_name);

TEST(SimNetworkTest, DelayStaysWithinBoundsAndSpreads) {
  SimOptions o;
  o.seed = 5;
  o.delay_min_ns = 1'000;
  o.delay_max_ns = 5'000;
  Net n(o);
  std::map<uint64_t, uint64_t> sent_at;  // packet id → send time
  uint64_t lo = kNever, hi = 0;
  size_t deliveries = 0;
  n.net.set_trace([&](const SimEvent& e) {
    if (e.kind == SimEventKind::kSend) sent_at[e.packet_id] = e.time_ns;
    if (e.kind == SimEventKind::kDeliver) {
      const uint64_t d = e.time_ns - sent_at.at(e.packet_id);
      lo = std::min(lo, d);
      hi = std::max(hi, d);
      ++deliveries;
    }
  });
  for (uint32_t i = 0; i < 2'000; ++i) {
    n.advance_to(i * 700);
    n.send(i % 2, 1 - i % 2, numbered(i));
  }
  n.run();
  EXPECT_EQ(deliveries, 2'000u);
  EXPECT_GE(lo, 1'000u);
  EXPECT_LE(hi, 5'000u);
  EXPECT_LT(lo, 1'100u);  // the whole range is used, not one value
  EXPECT_GT(hi, 4'900u);
}

TEST(SimNetworkTest, ReorderingReorders) {
  SimOptions o = with_fault(Fault::kReorder, 300'000);
  Net n(o);
  constexpr uint32_t kCount = 500;
  for (uint32_t i = 0; i < kCount; ++i) n.send(0, 1, numbered(i));
  n.run();
  const auto got = n.drain(1);
  ASSERT_EQ(got.size(), kCount);
  std::vector<uint32_t> order;
  for (const auto& g : got) order.push_back(seq_of(g.bytes));
  EXPECT_FALSE(std::is_sorted(order.begin(), order.end()));
  std::vector<uint32_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t i = 0; i < kCount; ++i) ASSERT_EQ(sorted[i], i);  // a permutation: none lost
  // The datagrams that were not picked keep their relative order: only the picked ones move.
  std::vector<bool> picked(kCount + 1);
  for (const SimEvent& e : n.trace)
    if (e.kind == SimEventKind::kReorder) picked[e.packet_id] = true;
  uint32_t last = 0;
  bool first = true;
  for (uint32_t s : order) {
    if (picked[s + 1]) continue;  // packet ids count from 1 in send order
    if (!first) {
      EXPECT_GT(s, last);
    }
    last = s;
    first = false;
  }
}

TEST(SimNetworkTest, CorruptionFlipsExactlyOneBit) {
  Net n(with_fault(Fault::kCorrupt, 1'000'000, 77));
  constexpr uint32_t kCount = 1'000;
  for (uint32_t i = 0; i < kCount; ++i) n.send(0, 1, numbered(i, 1 + i % 300));
  n.run();
  const auto got = n.drain(1);
  ASSERT_EQ(got.size(), kCount);
  std::map<uint64_t, uint64_t> bit_of;  // packet id → flipped bit, from the trace
  for (const SimEvent& e : n.trace)
    if (e.kind == SimEventKind::kCorrupt) bit_of[e.packet_id] = e.detail;
  std::vector<bool> byte_hit(300);
  for (uint32_t i = 0; i < kCount; ++i) {
    // The sequence number may itself be corrupted, so compare by position (order is kept).
    const auto want = numbered(i, 1 + i % 300);
    ASSERT_EQ(got[i].bytes.size(), want.size());
    int flipped = 0;
    size_t where = 0;
    for (size_t b = 0; b < want.size(); ++b) {
      const int diff = std::popcount(static_cast<unsigned>(got[i].bytes[b] ^ want[b]));
      if (diff)
        where = b * 8 + static_cast<size_t>(
                            std::countl_zero(static_cast<uint8_t>(got[i].bytes[b] ^ want[b])));
      flipped += diff;
    }
    ASSERT_EQ(flipped, 1) << "datagram " << i;
    EXPECT_EQ(where, bit_of.at(i + 1));
    byte_hit[where / 8] = true;
  }
  // Flips land all over the payload, not only at its start.
  EXPECT_GT(std::count(byte_hit.begin(), byte_hit.end(), true), 150);
}

TEST(SimNetworkTest, ZeroLengthDatagramsPassAndAreNeverCorrupted) {
  Net n(with_fault(Fault::kCorrupt, 1'000'000));
  TxDatagram d;
  d.dst = Endpoint{host_address(1), kRoceV2UdpPort};
  ASSERT_EQ(n.net.io(0).send(d), TxStatus::kSent);
  n.run();
  const auto got = n.drain(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].bytes.empty());
  EXPECT_EQ(n.net.counters().corrupted, 0u);
}

TEST(SimNetworkTest, ScheduledPartitionDropsOnlyInItsWindowAndOnlyBetweenItsSets) {
  SimOptions o = fixed_delay(1'000);
  o.partitions.push_back(SimPartition{10'000, 20'000, HostSet{0}, HostSet{1, 2}});
  Net n(o, 4);
  // (time, from, to, expect delivered)
  struct Case {
    uint64_t t;
    HostId from, to;
    bool delivered;
  };
  const Case cases[] = {
      {0, 0, 1, true},       {8'000, 1, 0, true},    // before the window
      {8'999, 0, 2, true},                           // arrives at 9,999: still before
      {9'000, 0, 1, false},                          // sent before, arrives at 10,000: cut
      {10'000, 0, 1, false}, {10'000, 1, 0, false},  // both directions
      {12'000, 2, 0, false}, {12'000, 0, 3, true},   // host 3 is in neither set
      {12'000, 1, 2, true},  {12'000, 3, 1, true},   // inside one set / outside
      {19'999, 0, 2, false},                         // sent in the window
      {20'000, 0, 1, true},  {25'000, 2, 0, true},   // after
  };
  uint32_t seq = 0;
  for (const Case& c : cases) {
    n.advance_to(c.t);
    n.send(c.from, c.to, numbered(seq++));
  }
  n.run();
  std::map<uint32_t, bool> arrived;
  for (HostId h = 0; h < 4; ++h)
    for (const auto& g : n.drain(h)) arrived[seq_of(g.bytes)] = true;
  for (uint32_t i = 0; i < seq; ++i) EXPECT_EQ(arrived[i], cases[i].delivered) << "case " << i;
  EXPECT_EQ(n.net.counters().dropped_partition, 5u);
  EXPECT_TRUE(n.net.is_partitioned(0, 1, 10'000));
  EXPECT_TRUE(n.net.is_partitioned(2, 0, 19'999));
  EXPECT_FALSE(n.net.is_partitioned(0, 1, 20'000));
  EXPECT_FALSE(n.net.is_partitioned(1, 2, 15'000));
}

TEST(SimNetworkTest, PartitionAndHealAtRunTime) {
  Net n(fixed_delay(1'000), 3);
  n.clock.set(5'000);
  const size_t p = n.net.partition(HostSet{0}, HostSet{1});
  n.send(0, 1, numbered(0));  // cut
  n.send(0, 2, numbered(1));  // not cut
  n.run();
  EXPECT_TRUE(n.drain(1).empty());
  EXPECT_EQ(n.drain(2).size(), 1u);
  n.clock.set(50'000);
  n.net.heal(p);
  n.send(0, 1, numbered(2));
  n.run();
  ASSERT_EQ(n.drain(1).size(), 1u);
  EXPECT_TRUE(n.net.is_partitioned(0, 1, 5'000));  // history is kept
  EXPECT_FALSE(n.net.is_partitioned(0, 1, 50'000));

  // A partition made while a datagram is in flight cuts it at delivery (counted at the receiver).
  n.send(0, 1, numbered(3));
  n.net.partition(HostSet{0}, HostSet{1});
  n.run();
  EXPECT_TRUE(n.drain(1).empty());
  EXPECT_EQ(n.net.host_counters(1).dropped_partition, 1u);

  n.net.partition(HostSet{2}, HostSet{0, 1});
  n.send(1, 2, numbered(4));
  n.send(2, 0, numbered(5));
  n.run();
  EXPECT_TRUE(n.drain(0).empty());
  EXPECT_TRUE(n.drain(2).empty());
  n.advance_to(100'000);
  n.net.heal_all();
  n.send(1, 2, numbered(6));
  n.send(2, 0, numbered(7));
  n.send(0, 1, numbered(8));
  n.run();
  EXPECT_EQ(n.drain(2).size(), 1u);
  EXPECT_EQ(n.drain(0).size(), 1u);
  EXPECT_EQ(n.drain(1).size(), 1u);
  EXPECT_EQ(n.net.counters().dropped_partition, 4u);
  EXPECT_EQ(n.net.host_counters(0).dropped_partition, 1u);  // the first, at send
}

TEST(SimNetworkTest, InFlightQueueIsBounded) {
  SimOptions o = fixed_delay();
  o.in_flight_max = 10;
  o.duplicate_ppm = 1'000'000;  // copies count against the bound too
  Net n(o);
  for (uint32_t i = 0; i < 8; ++i) n.send(0, 1, numbered(i));
  EXPECT_EQ(n.net.in_flight(), 10u);
  EXPECT_EQ(n.net.counters().dropped_queue_full, 6u);
  EXPECT_EQ(n.net.host_counters(0).dropped_queue_full, 6u);
  n.run();
  EXPECT_EQ(n.drain(1).size(), 10u);
  n.send(0, 1, numbered(9));  // room again once delivered
  EXPECT_EQ(n.net.in_flight(), 2u);
}

TEST(SimNetworkTest, ReceiveQueueIsBounded) {
  SimOptions o = fixed_delay();
  o.rx_queue_max = 4;
  Net n(o);
  for (uint32_t i = 0; i < 10; ++i) n.send(0, 1, numbered(i));
  n.run();
  EXPECT_EQ(n.net.rx_pending(1), 4u);
  EXPECT_EQ(n.net.counters().dropped_rx_full, 6u);
  EXPECT_EQ(n.net.host_counters(1).dropped_rx_full, 6u);  // counted at the receiver
  EXPECT_EQ(n.net.host_counters(1).delivered, 4u);
  const auto got = n.drain(1);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(seq_of(got[3].bytes), 3u);  // the first four, like a full socket buffer
}

TEST(SimNetworkTest, TruncatesIntoSmallBuffers) {
  Net n(fixed_delay());
  n.send(0, 1, numbered(7, 100));
  n.run();
  std::vector<uint8_t> small(40);
  RxDatagram slot{small};
  ASSERT_EQ(n.net.io(1).recv_batch(std::span<RxDatagram>(&slot, 1)), 1u);
  EXPECT_TRUE(slot.truncated);
  EXPECT_EQ(slot.length, 40u);
  EXPECT_TRUE(std::equal(small.begin(), small.end(), numbered(7, 100).begin()));
  EXPECT_EQ(n.net.io(1).counters().rx_truncated, 1u);
}

TEST(SimNetworkTest, UnroutableDroppedAndInvalidRejected) {
  Net n(fixed_delay());
  std::vector<uint8_t> p = numbered(0);
  iovec v{p.data(), p.size()};
  TxDatagram d;
  d.iov = std::span<const iovec>(&v, 1);
  d.dst = Endpoint{Address::from_v4(192, 0, 2, 1), kRoceV2UdpPort};
  EXPECT_EQ(n.net.io(0).send(d), TxStatus::kSent);  // it left; the network has no such host
  EXPECT_EQ(n.net.counters().dropped_no_route, 1u);
  EXPECT_EQ(n.net.in_flight(), 0u);

  d.dst = Endpoint{host_address(1), kRoceV2UdpPort};
  d.src = host_address(1);  // host 0 does not own this address
  EXPECT_EQ(n.net.io(0).send(d), TxStatus::kRejected);
  d.src = host_address(0);
  EXPECT_EQ(n.net.io(0).send(d), TxStatus::kSent);

  std::vector<iovec> many(kMaxTxIov + 1, v);
  d.iov = many;
  EXPECT_EQ(n.net.io(0).send(d), TxStatus::kRejected);
  std::vector<uint8_t> huge(kMaxUdpPayloadBytes + 1);
  iovec hv{huge.data(), huge.size()};
  d.iov = std::span<const iovec>(&hv, 1);
  EXPECT_EQ(n.net.io(0).send(d), TxStatus::kRejected);
  EXPECT_EQ(n.net.io(0).counters().tx_rejected, 3u);
  EXPECT_EQ(n.net.counters().sent, 2u);
}

TEST(SimNetworkTest, SendBatchSendsAllInOrder) {
  Net n(fixed_delay(), 3);
  std::vector<std::vector<uint8_t>> payloads;
  for (uint32_t i = 0; i < 6; ++i) payloads.push_back(numbered(i));
  std::vector<iovec> iov(6);
  std::vector<TxDatagram> batch(6);
  for (size_t i = 0; i < 6; ++i) {
    iov[i] = iovec{payloads[i].data(), payloads[i].size()};
    batch[i].iov = std::span<const iovec>(&iov[i], 1);
    batch[i].dst = Endpoint{host_address(1 + i % 2), kRoceV2UdpPort};
  }
  EXPECT_EQ(n.net.io(0).send_batch(batch), 6u);
  n.run();
  const auto to1 = n.drain(1);
  const auto to2 = n.drain(2);
  ASSERT_EQ(to1.size(), 3u);
  ASSERT_EQ(to2.size(), 3u);
  EXPECT_EQ(seq_of(to1[2].bytes), 4u);
  EXPECT_EQ(seq_of(to2[2].bytes), 5u);
  EXPECT_EQ(n.net.host_counters(0).sent, 6u);
  EXPECT_EQ(n.net.host_counters(1).delivered, 3u);
}

TEST(SimNetworkTest, TraceLinesAreReadable) {
  const SimEvent e{2'000, SimEventKind::kCorrupt, 7, 1, 0, 1, 64, 13};
  EXPECT_EQ(to_string(e), "t=2000 corrupt #7.1 h0->h1 len=64 bit=13");
  EXPECT_STREQ(to_string(SimEventKind::kDropQueueFull), "drop-queue-full");
}

TEST(SimNetworkDeathTest, RejectsImpossibleOptions) {
  VirtualClock clock;
  SimOptions o;
  o.loss_ppm = 1'000'001;
  EXPECT_DEATH(SimNetwork(clock, o), "ppm");
  o = SimOptions{};
  o.delay_min_ns = 2;
  o.delay_max_ns = 1;
  EXPECT_DEATH(SimNetwork(clock, o), "delay_min_ns");
  SimNetwork net(clock, SimOptions{});
  net.add_host(host_address(0));
  EXPECT_DEATH(net.add_host(host_address(0)), "duplicate");
}

}  // namespace
}  // namespace urdma::net
