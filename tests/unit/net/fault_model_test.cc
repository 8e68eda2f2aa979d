// The one fault model: its draws in their documented order, and both injectors — the simulated
// network and FaultyPacketIo — meeting the same faults for the same seed and rates.
#include "net/fault_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "net/faulty_packet_io.h"
#include "support/sim_network.h"

namespace urdma::net {
namespace {

FaultRates every_fault() {
  FaultRates r;
  r.loss_ppm = 100'000;
  r.duplicate_ppm = 200'000;
  r.reorder_ppm = 300'000;
  r.corrupt_ppm = 250'000;
  r.delay_min_ns = 10;
  r.delay_max_ns = 5'000;
  return r;
}

// The decisions drawn by hand from a Xoshiro256 in the order fault_model.h gives.
DatagramFaults by_hand(Xoshiro256& g, const FaultRates& r, uint64_t span, size_t bytes) {
  DatagramFaults f;
  if (g.chance_ppm(r.loss_ppm)) {
    f.lost = true;
    return f;
  }
  f.duplicated = g.chance_ppm(r.duplicate_ppm);
  for (size_t i = 0; i < f.copies(); ++i) {
    f.copy[i].delay_ns = g.between(r.delay_min_ns, r.delay_max_ns);
    if (g.chance_ppm(r.reorder_ppm)) f.copy[i].reorder = g.between(1, span);
    f.copy[i].corrupt = g.chance_ppm(r.corrupt_ppm) && bytes > 0;
    if (f.copy[i].corrupt) f.copy[i].corrupt_bit = g.below(bytes * 8);
  }
  return f;
}

TEST(FaultModel, DrawsInTheDocumentedOrder) {
  const FaultRates r = every_fault();
  constexpr uint64_t kSpan = 7;
  FaultModel model(42, r, kSpan);
  Xoshiro256 g(42);
  size_t lost = 0, duplicated = 0, reordered = 0, corrupted = 0;
  for (size_t n = 0; n < 5'000; ++n) {
    const size_t bytes = n % 50;  // empty payloads among them: never corrupted
    const DatagramFaults want = by_hand(g, r, kSpan, bytes);
    const DatagramFaults got = model.next(bytes);
    ASSERT_EQ(got.lost, want.lost) << n;
    ASSERT_EQ(got.duplicated, want.duplicated) << n;
    ASSERT_EQ(got.copies(), want.copies()) << n;
    for (size_t i = 0; i < got.copies(); ++i) {
      EXPECT_EQ(got.copy[i].delay_ns, want.copy[i].delay_ns) << n;
      EXPECT_EQ(got.copy[i].reorder, want.copy[i].reorder) << n;
      EXPECT_EQ(got.copy[i].corrupt, want.copy[i].corrupt) << n;
      EXPECT_EQ(got.copy[i].corrupt_bit, want.copy[i].corrupt_bit) << n;
      EXPECT_GE(got.copy[i].delay_ns, r.delay_min_ns);
      EXPECT_LE(got.copy[i].delay_ns, r.delay_max_ns);
      EXPECT_LE(got.copy[i].reorder, kSpan);
      EXPECT_TRUE(!got.copy[i].corrupt || got.copy[i].corrupt_bit < bytes * 8) << n;
      reordered += got.copy[i].reorder > 0;
      corrupted += got.copy[i].corrupt;
    }
    lost += got.lost;
    duplicated += got.duplicated;
  }
  // Every fault happened (the rates are high enough that none can miss 5000 tries).
  EXPECT_GT(lost, 0u);
  EXPECT_GT(duplicated, 0u);
  EXPECT_GT(reordered, 0u);
  EXPECT_GT(corrupted, 0u);
}

TEST(FaultModel, NoRatesNoFaults) {
  FaultModel model(1, FaultRates{}, 1);
  for (size_t n = 0; n < 1'000; ++n) {
    const DatagramFaults f = model.next(100);
    ASSERT_FALSE(f.lost);
    ASSERT_EQ(f.copies(), 1u);
    EXPECT_EQ(f.copy[0].delay_ns, 0u);
    EXPECT_EQ(f.copy[0].reorder, 0u);
    EXPECT_FALSE(f.copy[0].corrupt);
  }
}

TEST(FaultModel, FlipBitCountsFromTheTopOfByteZero) {
  std::vector<uint8_t> b(3, 0);
  FaultModel::flip_bit(b, 0);
  FaultModel::flip_bit(b, 15);
  FaultModel::flip_bit(b, 17);
  EXPECT_EQ(b, (std::vector<uint8_t>{0x80, 0x01, 0x40}));
}

TEST(FaultModelDeathTest, RatesAreChecked) {
  FaultRates r;
  r.loss_ppm = 1'000'001;
  EXPECT_DEATH(FaultModel(1, r, 1), "ppm");
  r = FaultRates{};
  r.delay_min_ns = 2;
  r.delay_max_ns = 1;
  EXPECT_DEATH(FaultModel(1, r, 1), "delay_min_ns");
}

// Records what reaches it.
class Recorder final : public PacketIo {
 public:
  TxStatus send(const TxDatagram& d) override {
    std::vector<uint8_t> bytes;
    for (const iovec& v : d.iov) {
      const auto* p = static_cast<const uint8_t*>(v.iov_base);
      bytes.insert(bytes.end(), p, p + v.iov_len);
    }
    sent->push_back(std::move(bytes));
    return TxStatus::kSent;
  }
  size_t send_batch(std::span<const TxDatagram> batch) override {
    for (const TxDatagram& d : batch) send(d);
    return batch.size();
  }
  size_t recv_batch(std::span<RxDatagram>) override { return 0; }
  int readable_fd() const override { return -1; }
  IoCounters counters() const override { return {}; }

  std::vector<std::vector<uint8_t>>* sent = nullptr;
};

// Both injectors draw from FaultModel: with one seed and one set of rates, the simulated
// network and FaultyPacketIo lose, duplicate, reorder and corrupt the same datagrams, bits and
// all.
TEST(FaultModel, TheSimulatedNetworkAndFaultyPacketIoMeetTheSameFaults) {
  constexpr uint64_t kSeed = 99;
  constexpr uint32_t kDatagrams = 2'000;
  FaultRates rates = every_fault();
  rates.delay_min_ns = rates.delay_max_ns = 1'000;

  // The simulated network: what each datagram met, from its trace.
  SimOptions o;
  static_cast<FaultRates&>(o) = rates;
  o.seed = kSeed;
  VirtualClock sim_clock;
  SimNetwork net(sim_clock, o);
  const Address a = Address::from_v4(10, 0, 0, 1), b = Address::from_v4(10, 0, 0, 2);
  net.add_host(a);
  net.add_host(b);
  struct Met {
    bool lost = false;
    int copies = 0;
    int reordered = 0;
    std::vector<uint64_t> bits;
  };
  std::vector<Met> sim(kDatagrams + 1);
  net.set_trace([&](const SimEvent& e) {
    Met& m = sim[e.packet_id];
    if (e.kind == SimEventKind::kDropLoss) m.lost = true;
    if (e.kind == SimEventKind::kSchedule) ++m.copies;
    if (e.kind == SimEventKind::kReorder) ++m.reordered;
    if (e.kind == SimEventKind::kCorrupt) m.bits.push_back(e.detail);
  });

  // FaultyPacketIo with the same seed and rates (a reordered copy waits for one later datagram).
  FaultProfile p;
  static_cast<FaultRates&>(p) = rates;
  p.seed = kSeed;
  p.reorder_depth = 1;
  p.held_max = kMaxFaultHeld;
  VirtualClock io_clock;
  std::vector<std::vector<uint8_t>> out;
  auto rec = std::make_unique<Recorder>();
  rec->sent = &out;
  auto io = std::make_unique<FaultyPacketIo>(std::move(rec), io_clock, p);

  for (uint32_t n = 1; n <= kDatagrams; ++n) {
    uint32_t words[4] = {n, ~n, n, ~n};
    const iovec v{words, sizeof words};
    TxDatagram d;
    d.iov = std::span<const iovec>(&v, 1);
    d.dst = Endpoint{b, kRoceV2UdpPort};
    ASSERT_EQ(net.io(0).send(d), TxStatus::kSent);
    ASSERT_EQ(io->send(d), TxStatus::kSent);
  }

  const FaultCounters fc = io->fault_counters();
  const SimCounters& sc = net.counters();
  EXPECT_EQ(fc.dropped_loss, sc.dropped_loss);
  EXPECT_EQ(fc.duplicated, sc.duplicated);
  EXPECT_EQ(fc.reordered, sc.reordered);
  EXPECT_EQ(fc.corrupted, sc.corrupted);
  EXPECT_GT(sc.dropped_loss, 0u);
  EXPECT_GT(sc.duplicated, 0u);
  EXPECT_GT(sc.reordered, 0u);
  EXPECT_GT(sc.corrupted, 0u);

  // Per datagram: FaultyPacketIo sent every copy the network scheduled (no queue bound was hit),
  // and each corrupted copy with the bit the network flipped.
  io.reset();  // sends what it still holds
  std::vector<int> copies(kDatagrams + 1, 0);
  std::vector<std::vector<uint64_t>> bits(kDatagrams + 1);
  for (const std::vector<uint8_t>& bytes : out) {
    ASSERT_EQ(bytes.size(), 16u);
    uint32_t w[4];
    std::memcpy(w, bytes.data(), sizeof w);
    // At most one bit of the four words is flipped: the two intact pairs name the datagram.
    const uint32_t n = w[0] == ~w[1] ? w[0] : w[2];
    ASSERT_GE(n, 1u);
    ASSERT_LE(n, kDatagrams);
    ++copies[n];
    uint32_t clean[4] = {n, ~n, n, ~n};
    for (uint64_t bit = 0; bit < 128; ++bit) {
      const uint8_t mask = static_cast<uint8_t>(0x80u >> (bit % 8));
      if ((bytes[bit / 8] ^ reinterpret_cast<const uint8_t*>(clean)[bit / 8]) & mask)
        bits[n].push_back(bit);
    }
  }
  for (uint32_t n = 1; n <= kDatagrams; ++n) {
    EXPECT_EQ(copies[n], sim[n].lost ? 0 : sim[n].copies) << n;
    std::vector<uint64_t> want = sim[n].bits;
    std::sort(want.begin(), want.end());
    std::sort(bits[n].begin(), bits[n].end());
    // Two corrupted copies of one datagram may flip the same bit; each copy is checked apart
    // above through the counters, here the set of bits.
    want.erase(std::unique(want.begin(), want.end()), want.end());
    bits[n].erase(std::unique(bits[n].begin(), bits[n].end()), bits[n].end());
    EXPECT_EQ(bits[n], want) << n;
  }
}

}  // namespace
}  // namespace urdma::net
