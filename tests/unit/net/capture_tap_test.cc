// The capture tap over a scripted PacketIo, writing into a real SOCK_SEQPACKET socket pair: what
// reaches the capturer is every datagram sent and received, byte for byte, with its endpoints;
// nothing while nobody captures; a full socket drops and counts; a capturer that goes away ends
// the capture, and the I/O's own results never change.
#include "net/capture_tap.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

namespace urdma::net {
namespace {

// Sends succeed (or block, or reject); receives hand out what the test queued.
class ScriptedIo final : public PacketIo {
 public:
  TxStatus send(const TxDatagram&) override {
    if (reject) {
      ++counters_.tx_rejected;
      return TxStatus::kRejected;
    }
    return block ? TxStatus::kWouldBlock : TxStatus::kSent;
  }
  size_t send_batch(std::span<const TxDatagram> batch) override {
    size_t n = 0;
    for (; n < batch.size() && n < accept_at_most; ++n)
      if (send(batch[n]) == TxStatus::kWouldBlock) break;
    return n;
  }
  size_t recv_batch(std::span<RxDatagram> batch) override {
    size_t n = 0;
    for (; n < batch.size() && !inbound.empty(); ++n) {
      const Inbound& in = inbound.front();
      std::memcpy(batch[n].buffer.data(), in.bytes.data(), in.bytes.size());
      batch[n].length = in.bytes.size();
      batch[n].src = in.src;
      batch[n].dst = in.dst;
      batch[n].segment_bytes = in.segment_bytes;
      inbound.erase(inbound.begin());
    }
    return n;
  }
  int readable_fd() const override { return -1; }
  IoCounters counters() const override { return counters_; }

  struct Inbound {
    std::vector<uint8_t> bytes;
    Endpoint src, dst;
    size_t segment_bytes = 0;
  };
  std::vector<Inbound> inbound;
  bool block = false;
  bool reject = false;
  size_t accept_at_most = kMaxBatch;
  IoCounters counters_;
};

struct Captured {
  CaptureRecord header{};
  std::vector<uint8_t> payload;
};

class CaptureTapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto io = std::make_unique<ScriptedIo>();
    inner_ = io.get();
    tap_ = std::make_unique<CaptureTap>(std::move(io), 4242);
  }
  // A capturer: the tap gets one end, the test keeps the other (reader_, the latest).
  void capture(uint32_t slot, int sndbuf = 0) {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
    if (sndbuf > 0) setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    if (reader_ >= 0) close(reader_);
    reader_ = sv[0];
    tap_->add_sink(sv[1], slot);
  }
  void TearDown() override {
    if (reader_ >= 0) close(reader_);
  }
  std::vector<Captured> drain() {
    std::vector<Captured> out;
    std::vector<uint8_t> buf(sizeof(CaptureRecord) + 70000);
    for (;;) {
      const ssize_t n = recv(reader_, buf.data(), buf.size(), MSG_DONTWAIT);
      if (n <= 0) break;  // nothing queued, or the sink was closed (EOF)
      Captured c;
      EXPECT_GE(static_cast<size_t>(n), sizeof c.header);
      std::memcpy(&c.header, buf.data(), sizeof c.header);
      c.payload.assign(buf.begin() + sizeof c.header, buf.begin() + n);
      EXPECT_EQ(c.header.length, c.payload.size());
      out.push_back(std::move(c));
    }
    return out;
  }
  // Sends one datagram of `bytes`, split over two iovecs.
  size_t send_one(const std::vector<uint8_t>& bytes, uint16_t src_port = 0xC001) {
    const iovec iov[2] = {{const_cast<uint8_t*>(bytes.data()), 5},
                          {const_cast<uint8_t*>(bytes.data()) + 5, bytes.size() - 5}};
    TxDatagram d{.iov = iov,
                 .dst = {kPeer, kRoceV2UdpPort},
                 .src_port = src_port,
                 .src = kSelf,
                 .traffic_class = 0x28,
                 .hop_limit = 7};
    return tap_->send_batch({&d, 1});
  }

  static constexpr Address kSelf = Address::from_v4(10, 0, 0, 1);
  static constexpr Address kPeer = Address::from_v4(10, 0, 0, 2);
  ScriptedIo* inner_ = nullptr;
  std::unique_ptr<CaptureTap> tap_;
  int reader_ = -1;
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST_F(CaptureTapTest, NobodyCapturingWritesNothing) {
  EXPECT_EQ(send_one(pattern(64, 1)), 1u);
  EXPECT_FALSE(tap_->capturing());
  EXPECT_EQ(tap_->tap_counters().records, 0u);
}

TEST_F(CaptureTapTest, EverySentDatagramArrivesWholeWithItsFlow) {
  capture(3);
  const auto a = pattern(64, 1), b = pattern(4096 + 28, 9);
  EXPECT_EQ(send_one(a), 1u);
  EXPECT_EQ(send_one(b, 0xC0FF), 1u);
  const std::vector<Captured> got = drain();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].payload, a);
  EXPECT_EQ(got[1].payload, b);
  const CaptureRecord& h = got[1].header;
  EXPECT_EQ(h.magic, kCaptureRecordMagic);
  EXPECT_EQ(h.version, kCaptureRecordVersion);
  EXPECT_EQ(h.direction, static_cast<uint8_t>(CaptureDirection::kSent));
  EXPECT_EQ(Address(std::to_array(h.src_address)), kSelf);
  EXPECT_EQ(Address(std::to_array(h.dst_address)), kPeer);
  EXPECT_EQ(h.src_port, 0xC0FF);
  EXPECT_EQ(h.dst_port, kRoceV2UdpPort);
  EXPECT_EQ(h.traffic_class, 0x28);
  EXPECT_EQ(h.hop_limit, 7);
  EXPECT_EQ(h.pid, 4242u);
  EXPECT_EQ(h.slot, 3u);
  EXPECT_GT(h.timestamp_ns, 1'600'000'000ull * 1'000'000'000ull);
  EXPECT_EQ(tap_->tap_counters().records, 2u);
}

TEST_F(CaptureTapTest, OnlyWhatTheInnerIoConsumedIsRecorded) {
  capture(1);
  inner_->block = true;
  EXPECT_EQ(send_one(pattern(64, 1)), 0u);
  inner_->block = false;
  inner_->reject = true;
  EXPECT_EQ(send_one(pattern(64, 2)), 1u);  // consumed, never sent
  EXPECT_TRUE(drain().empty());
  EXPECT_EQ(tap_->tap_counters().dropped, 1u);
}

TEST_F(CaptureTapTest, ReceivedDatagramsAndCoalescedSegmentsAreOneRecordEach) {
  capture(2);
  const auto one = pattern(100, 3);
  auto coalesced = pattern(3 * 1000 + 400, 5);  // GRO: three 1000-byte segments and a short one
  inner_->inbound.push_back({one, {kPeer, 0xC123}, {kSelf, kRoceV2UdpPort}, 0});
  inner_->inbound.push_back({coalesced, {kPeer, 0xC124}, {kSelf, kRoceV2UdpPort}, 1000});
  std::vector<std::vector<uint8_t>> buffers(4, std::vector<uint8_t>(8192));
  std::vector<RxDatagram> batch(4);
  for (size_t i = 0; i < batch.size(); ++i) batch[i].buffer = buffers[i];
  ASSERT_EQ(tap_->recv_batch(batch), 2u);
  const std::vector<Captured> got = drain();
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0].payload, one);
  EXPECT_EQ(got[0].header.direction, static_cast<uint8_t>(CaptureDirection::kReceived));
  EXPECT_EQ(got[0].header.src_port, 0xC123);
  EXPECT_EQ(Address(std::to_array(got[0].header.dst_address)), kSelf);
  std::vector<uint8_t> joined;
  for (size_t i = 1; i < 5; ++i) {
    EXPECT_EQ(got[i].payload.size(), i < 4 ? 1000u : 400u);
    joined.insert(joined.end(), got[i].payload.begin(), got[i].payload.end());
  }
  EXPECT_EQ(joined, coalesced);
}

TEST_F(CaptureTapTest, AFullSocketDropsAndTheNextRecordSaysHowMany) {
  capture(1, 4096);  // the kernel's minimum: a few records fit
  const auto big = pattern(2000, 1);
  size_t sent = 0;
  while (tap_->tap_counters().dropped < 3 && sent < 1000) sent += send_one(big);
  ASSERT_GE(tap_->tap_counters().dropped, 3u);
  const uint64_t dropped = tap_->tap_counters().dropped;
  const size_t records = drain().size();
  EXPECT_EQ(records + dropped, sent);
  EXPECT_EQ(send_one(big), 1u);
  const std::vector<Captured> got = drain();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].header.dropped_before, dropped);
}

TEST_F(CaptureTapTest, ACapturerThatLeftEndsTheCaptureAndSendsGoOn) {
  capture(1);
  close(reader_);
  reader_ = -1;
  EXPECT_EQ(send_one(pattern(64, 1)), 1u);  // no SIGPIPE: the test would die
  EXPECT_FALSE(tap_->capturing());
  EXPECT_EQ(tap_->tap_counters().ended, 1u);
  EXPECT_EQ(send_one(pattern(64, 2)), 1u);
}

TEST_F(CaptureTapTest, TwoCapturesEachGetEveryRecordAndEndOnTheirOwn) {
  capture(1);
  const int first_reader = dup(reader_);
  capture(2);  // a second capture of the same process
  EXPECT_EQ(send_one(pattern(64, 1)), 1u);
  EXPECT_EQ(tap_->sinks(), 2u);
  const std::vector<Captured> second = drain();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].header.slot, 2u);
  std::vector<uint8_t> buf(4096);
  EXPECT_EQ(recv(first_reader, buf.data(), buf.size(), MSG_DONTWAIT),
            static_cast<ssize_t>(sizeof(CaptureRecord) + 64));
  close(first_reader);  // the first capturer goes: its sink ends, the second's goes on
  EXPECT_EQ(send_one(pattern(64, 2)), 1u);
  EXPECT_EQ(tap_->sinks(), 1u);
  EXPECT_EQ(tap_->tap_counters().ended, 1u);
  const std::vector<Captured> after = drain();
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].payload, pattern(64, 2));
}

TEST_F(CaptureTapTest, CapturesBeyondTheLimitAreRefused) {
  std::vector<int> readers;
  for (size_t i = 0; i < kMaxCaptureSinks + 2; ++i) {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
    readers.push_back(sv[0]);
    tap_->add_sink(sv[1], 0);
  }
  EXPECT_EQ(send_one(pattern(64, 1)), 1u);
  EXPECT_EQ(tap_->sinks(), kMaxCaptureSinks);
  EXPECT_EQ(tap_->tap_counters().refused, 2u);
  char c;
  EXPECT_EQ(recv(readers.back(), &c, 1, MSG_DONTWAIT), 0) << "a refused capture is closed";
  for (int r : readers) close(r);
}

// A capturer that left while no datagram passed keeps no place: when captures are added, the
// sinks whose other end is closed are dropped first, so a full set of gone captures refuses
// nobody.
TEST_F(CaptureTapTest, CapturesThatLeftWithoutTrafficMakeRoomForNewOnes) {
  std::vector<int> readers;
  for (size_t i = 0; i < kMaxCaptureSinks; ++i) {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
    readers.push_back(sv[0]);
    tap_->add_sink(sv[1], 0);
  }
  EXPECT_EQ(send_one(pattern(64, 1)), 1u);  // all taken
  EXPECT_EQ(tap_->sinks(), kMaxCaptureSinks);
  for (int r : readers) close(r);  // every capturer goes before the next datagram
  capture(9);
  EXPECT_EQ(send_one(pattern(64, 2)), 1u);
  EXPECT_EQ(tap_->sinks(), 1u);
  EXPECT_EQ(tap_->tap_counters().refused, 0u);
  const std::vector<Captured> got = drain();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].header.slot, 9u);
  EXPECT_EQ(got[0].payload, pattern(64, 2));
}

}  // namespace
}  // namespace urdma::net
