// Two ShmPacketIos sharing a sealed memfd region as urdmad makes it, each over a scripted
// "socket": a datagram for a local address in the peer's QPN range crosses the ring byte for
// byte with the endpoints a socket would report, and the socket sees none of it; everything
// else (a remote address, the multicast QPN, its own range, a range with no region) goes to
// the socket, and the last asks for a region once per kAskAgainNs; a full ring blocks, then
// drops once it has been full for kStuckNs; a sleeping peer is woken through its doorbell, and
// a sleeping thread by a region handed over, also when another thread took that wake-up and
// left the region untaken; a region that is not sealed is refused; remove_peer sends the
// peer's datagrams to the socket.
#include "net/shm_packet_io.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

namespace urdma::net {
namespace {

// Records what it is asked to send; receives nothing. Its readable fd is an eventfd.
class ScriptedSocket final : public PacketIo {
 public:
  ScriptedSocket() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~ScriptedSocket() override { close(fd_); }
  TxStatus send(const TxDatagram& d) override {
    sent.push_back(d.dst);
    return TxStatus::kSent;
  }
  size_t send_batch(std::span<const TxDatagram> batch) override {
    for (const TxDatagram& d : batch) send(d);
    return batch.size();
  }
  size_t recv_batch(std::span<RxDatagram>) override {
    ++recvs;
    return 0;
  }
  int readable_fd() const override { return fd_; }
  IoCounters counters() const override { return {}; }

  std::vector<Endpoint> sent;
  int recvs = 0;

 private:
  int fd_;
};

constexpr uint32_t kRangeA = 65;  // slot 1 of 64, generation 1
constexpr uint32_t kRangeB = 66;
const Address kLocal = Address::from_v4(10, 0, 0, 1);
const Address kRemote = Address::from_v4(10, 0, 0, 2);

int sealed_region() {
  const int fd = memfd_create("urdma-shm-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, kShmRegionBytes), 0);
  EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  return fd;
}

// A BTH-like first piece: DestQP at bytes 5-7.
std::vector<uint8_t> packet_to(uint32_t qpn, size_t size) {
  std::vector<uint8_t> p(size);
  for (size_t i = 0; i < size; ++i) p[i] = static_cast<uint8_t>(i * 7 + 3);
  p[4] = 0;
  p[5] = static_cast<uint8_t>(qpn >> 16);
  p[6] = static_cast<uint8_t>(qpn >> 8);
  p[7] = static_cast<uint8_t>(qpn);
  return p;
}

class ShmPacketIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = std::make_unique<ScriptedSocket>();
    auto b = std::make_unique<ScriptedSocket>();
    sock_a_ = a.get();
    sock_b_ = b.get();
    bell_a_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    bell_b_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    auto is_local = [](const Address& x) { return x == kLocal; };
    io_a_ = std::make_unique<ShmPacketIo>(
        std::move(a), clock_, kRangeA, dup(bell_a_),
        [this](const Address& dst, uint32_t qpn) { wants_.emplace_back(dst, qpn); }, is_local);
    io_b_ = std::make_unique<ShmPacketIo>(std::move(b), clock_, kRangeB, dup(bell_b_), nullptr,
                                          is_local);
  }
  void TearDown() override {
    close(bell_a_);
    close(bell_b_);
  }
  void connect() {
    const int region = sealed_region();
    ASSERT_EQ(io_a_->add_peer(kRangeB, 0, dup(region), dup(bell_b_)), 0);
    ASSERT_EQ(io_b_->add_peer(kRangeA, 1, region, dup(bell_a_)), 0);
  }
  // connect(), B's turn taking the region, and two of B's threads asleep armed: the engine
  // thread and an application thread waiting for an event. What they sleep on.
  pollfd connect_with_two_sleepers() {
    connect();
    EXPECT_TRUE(receive_at_b().empty());  // takes the region
    EXPECT_TRUE(io_b_->arm_wakeup());     // the engine thread
    EXPECT_TRUE(io_b_->arm_wakeup());     // a waiting application thread
    return pollfd{io_b_->readable_fd(), POLLIN, 0};
  }
  TxStatus send_from_a(const std::vector<uint8_t>& bytes, const Address& dst,
                       size_t split = 20) {
    const iovec iov[2] = {{const_cast<uint8_t*>(bytes.data()), split},
                          {const_cast<uint8_t*>(bytes.data()) + split, bytes.size() - split}};
    TxDatagram d;
    d.iov = iov;
    d.dst = {dst, kRoceV2UdpPort};
    d.src = kLocal;
    d.src_port = 49152;
    d.traffic_class = 0x28;
    d.hop_limit = 64;
    return io_a_->send(d);
  }
  std::vector<std::vector<uint8_t>> receive_at_b(std::vector<RxDatagram>* got = nullptr) {
    std::vector<std::vector<uint8_t>> buffers(8, std::vector<uint8_t>(9000));
    std::vector<RxDatagram> rx(8);
    for (size_t i = 0; i < rx.size(); ++i) rx[i].buffer = buffers[i];
    const size_t n = io_b_->recv_batch(rx);
    std::vector<std::vector<uint8_t>> out;
    for (size_t i = 0; i < n; ++i)
      out.emplace_back(buffers[i].begin(), buffers[i].begin() + rx[i].length);
    if (got != nullptr) got->assign(rx.begin(), rx.begin() + n);
    return out;
  }

  VirtualClock clock_{1'000'000'000};
  ScriptedSocket* sock_a_ = nullptr;
  ScriptedSocket* sock_b_ = nullptr;
  int bell_a_ = -1, bell_b_ = -1;
  std::unique_ptr<ShmPacketIo> io_a_, io_b_;
  std::vector<std::pair<Address, uint32_t>> wants_;
};

TEST_F(ShmPacketIoTest, ADatagramForALocalPeerCrossesTheRingByteForByte) {
  connect();
  const auto bytes = packet_to((kRangeB << 12) | 17, 1500);
  ASSERT_EQ(send_from_a(bytes, kLocal), TxStatus::kSent);
  EXPECT_TRUE(sock_a_->sent.empty());
  std::vector<RxDatagram> rx;
  const auto got = receive_at_b(&rx);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], bytes);
  EXPECT_EQ(rx[0].src, (Endpoint{kLocal, 49152}));
  EXPECT_EQ(rx[0].dst, (Endpoint{kLocal, kRoceV2UdpPort}));
  EXPECT_FALSE(rx[0].truncated);
  EXPECT_EQ(io_a_->counters().tx_datagrams, 1u);
  EXPECT_EQ(io_a_->counters().tx_bytes, 1500u);
  EXPECT_EQ(io_b_->counters().rx_datagrams, 1u);
  EXPECT_EQ(io_b_->shm_counters().rx_datagrams, 1u);
  EXPECT_TRUE(wants_.empty());
}

TEST_F(ShmPacketIoTest, EverythingElseGoesToTheSocketAndAMissingRegionIsAskedForOnce) {
  connect();
  // A remote address in the peer's range, the multicast QPN, A's own range.
  ASSERT_EQ(send_from_a(packet_to((kRangeB << 12) | 1, 100), kRemote), TxStatus::kSent);
  ASSERT_EQ(send_from_a(packet_to(0xFFFFFF, 100), kLocal), TxStatus::kSent);
  ASSERT_EQ(send_from_a(packet_to((kRangeA << 12) | 1, 100), kLocal), TxStatus::kSent);
  EXPECT_TRUE(wants_.empty());
  // A local range with no region: by the socket, and asked for once per kAskAgainNs.
  const uint32_t other = (70u << 12) | 5;
  ASSERT_EQ(send_from_a(packet_to(other, 100), kLocal), TxStatus::kSent);
  ASSERT_EQ(send_from_a(packet_to(other, 100), kLocal), TxStatus::kSent);
  ASSERT_EQ(wants_.size(), 1u);
  EXPECT_EQ(wants_[0].first, kLocal);
  EXPECT_EQ(wants_[0].second, other);
  clock_.advance(ShmPacketIo::kAskAgainNs);
  ASSERT_EQ(send_from_a(packet_to(other, 100), kLocal), TxStatus::kSent);
  EXPECT_EQ(wants_.size(), 2u);
  EXPECT_EQ(sock_a_->sent.size(), 6u);
  EXPECT_TRUE(receive_at_b().empty());
}

// A datagram a ring will take needs no ICRC (memory is no link); one for the socket does, and
// so does everything while no region exists. What comes out of a ring is marked via_ring.
TEST_F(ShmPacketIoTest, OnlyADatagramForARingGoesUnsealed) {
  const Endpoint local{kLocal, kRoceV2UdpPort};
  const uint32_t in_b = (kRangeB << 12) | 17;
  EXPECT_TRUE(io_a_->icrc_needed(local, in_b));  // no region yet
  connect();
  EXPECT_FALSE(io_a_->icrc_needed(local, in_b));
  EXPECT_TRUE(io_a_->icrc_needed({kRemote, kRoceV2UdpPort}, in_b));
  EXPECT_TRUE(io_a_->icrc_needed(local, 0xFFFFFF));
  EXPECT_TRUE(io_a_->icrc_needed(local, (kRangeA << 12) | 1));
  EXPECT_TRUE(io_a_->icrc_needed(local, (70u << 12) | 5));
  EXPECT_TRUE(wants_.empty()) << "a question is no send: urdmad is not asked";
  ASSERT_EQ(send_from_a(packet_to(in_b, 100), kLocal), TxStatus::kSent);
  std::vector<RxDatagram> rx;
  ASSERT_EQ(receive_at_b(&rx).size(), 1u);
  EXPECT_TRUE(rx[0].via_ring);
  io_a_->remove_peer(kRangeB);
  EXPECT_TRUE(io_a_->icrc_needed(local, in_b));  // closing: the socket takes it
}

TEST_F(ShmPacketIoTest, ABatchKeepsItsOrderAcrossBothPaths) {
  connect();
  std::vector<std::vector<uint8_t>> packets;
  std::vector<iovec> iovs;
  for (int i = 0; i < 6; ++i)
    packets.push_back(packet_to(i % 2 == 0 ? (kRangeB << 12) | i : 0xFFFFFF, 64 + i));
  for (auto& p : packets) iovs.push_back({p.data(), p.size()});
  std::vector<TxDatagram> batch(6);
  for (int i = 0; i < 6; ++i) {
    batch[i].iov = {&iovs[i], 1};
    batch[i].dst = {kLocal, kRoceV2UdpPort};
    batch[i].src = kLocal;
  }
  EXPECT_EQ(io_a_->send_batch(batch), 6u);
  EXPECT_EQ(sock_a_->sent.size(), 3u);
  const auto got = receive_at_b();
  ASSERT_EQ(got.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], packets[2 * i]);
}

TEST_F(ShmPacketIoTest, AFullRingBlocksThenDropsOnceStuck) {
  connect();
  const auto bytes = packet_to((kRangeB << 12) | 1, 4096);
  size_t sent = 0;
  while (send_from_a(bytes, kLocal) == TxStatus::kSent) ++sent;
  EXPECT_GT(sent, 1000u);
  EXPECT_EQ(send_from_a(bytes, kLocal), TxStatus::kWouldBlock);
  EXPECT_NE(io_a_->next_deadline_ns(), kNever);  // asks for a retry soon
  clock_.advance(ShmPacketIo::kStuckNs);
  EXPECT_EQ(send_from_a(bytes, kLocal), TxStatus::kRejected);
  EXPECT_EQ(io_a_->shm_counters().tx_dropped, 1u);
  EXPECT_EQ(io_a_->counters().tx_rejected, 1u);
  // The peer reads: room again, and the ring is used again.
  ASSERT_EQ(receive_at_b().size(), 8u);
  EXPECT_EQ(send_from_a(bytes, kLocal), TxStatus::kSent);
}

TEST_F(ShmPacketIoTest, ASleepingPeerIsWokenThroughItsDoorbell) {
  connect();
  // A region handed over and not yet taken: no sleep, take it first.
  EXPECT_FALSE(io_b_->arm_wakeup());
  io_b_->disarm_wakeup(true);
  EXPECT_TRUE(receive_at_b().empty());
  // B about to sleep: nothing waits, its epoll set is quiet.
  ASSERT_TRUE(io_b_->arm_wakeup());
  pollfd p{io_b_->readable_fd(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);
  ASSERT_EQ(send_from_a(packet_to((kRangeB << 12) | 1, 64), kLocal), TxStatus::kSent);
  EXPECT_EQ(poll(&p, 1, 1000), 1);
  EXPECT_EQ(io_a_->shm_counters().doorbells, 1u);
  io_b_->disarm_wakeup(true);
  EXPECT_TRUE(io_b_->rx_pending());
  // Awake (disarmed): A's next datagram rings nothing.
  ASSERT_EQ(send_from_a(packet_to((kRangeB << 12) | 1, 64), kLocal), TxStatus::kSent);
  EXPECT_EQ(io_a_->shm_counters().doorbells, 1u);
  EXPECT_EQ(receive_at_b().size(), 2u);
  // The next sleep reads the old doorbell first: the set is quiet again.
  ASSERT_TRUE(io_b_->arm_wakeup());
  EXPECT_EQ(poll(&p, 1, 0), 0);
  io_b_->disarm_wakeup(true);
}

// The peer may write to a new region before this process's engine next runs: a thread asleep
// on the I/O's fd is woken to take it.
TEST_F(ShmPacketIoTest, ARegionHandedOverWakesASleepingThread) {
  EXPECT_TRUE(receive_at_b().empty());
  ASSERT_TRUE(io_b_->arm_wakeup());
  pollfd p{io_b_->readable_fd(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);
  ASSERT_EQ(io_b_->add_peer(kRangeA, 1, sealed_region(), dup(bell_a_)), 0);
  EXPECT_EQ(poll(&p, 1, 1000), 1);
  io_b_->disarm_wakeup(true);
  EXPECT_TRUE(receive_at_b().empty());
  EXPECT_EQ(io_b_->peers(), 1u);
  // Taken, and the doorbell read by the next sleep: quiet again.
  ASSERT_TRUE(io_b_->arm_wakeup());
  EXPECT_EQ(poll(&p, 1, 0), 0);
  io_b_->disarm_wakeup(true);
}

TEST_F(ShmPacketIoTest, AnUnsealedOrMissizedRegionIsRefused) {
  const int fd = memfd_create("urdma-shm-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(fd, kShmRegionBytes), 0);
  EXPECT_EQ(io_a_->add_peer(kRangeB, 0, dup(fd), dup(bell_b_)), EINVAL);
  ASSERT_EQ(ftruncate(fd, kShmRegionBytes / 2), 0);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  EXPECT_EQ(io_a_->add_peer(kRangeB, 0, dup(fd), dup(bell_b_)), EINVAL);
  EXPECT_EQ(io_a_->add_peer(kRangeB, 2, sealed_region(), dup(bell_b_)), EINVAL);
  close(fd);
  ASSERT_EQ(send_from_a(packet_to((kRangeB << 12) | 1, 64), kLocal), TxStatus::kSent);
  EXPECT_EQ(sock_a_->sent.size(), 1u);
  EXPECT_EQ(io_a_->peers(), 0u);
}

// The peer's lease ended: what it sent before it went is still read (its last ACK, say), then
// the region goes and its range is the socket's again.
TEST_F(ShmPacketIoTest, ARemovedPeersLastDatagramsAreReadThenItsRangeGoesToTheSocket) {
  connect();
  ASSERT_EQ(send_from_a(packet_to((kRangeB << 12) | 1, 64), kLocal), TxStatus::kSent);
  EXPECT_TRUE(sock_a_->sent.empty());
  io_b_->remove_peer(kRangeA);
  const auto got = receive_at_b();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], packet_to((kRangeB << 12) | 1, 64));
  EXPECT_TRUE(receive_at_b().empty());
  EXPECT_EQ(io_b_->peers(), 0u);
  io_a_->remove_peer(kRangeB);
  ASSERT_EQ(send_from_a(packet_to((kRangeB << 12) | 1, 64), kLocal), TxStatus::kSent);
  EXPECT_EQ(sock_a_->sent.size(), 1u);
}

// urdmad pushes a region to the peer and answers the same region when that peer asks too: the
// second copy changes nothing (the ring's indices are live), nothing is read twice or lost.
TEST_F(ShmPacketIoTest, TheSameRegionHandedOverTwiceIsOneRing) {
  const int region = sealed_region();
  ASSERT_EQ(io_a_->add_peer(kRangeB, 0, dup(region), dup(bell_b_)), 0);
  ASSERT_EQ(io_b_->add_peer(kRangeA, 1, dup(region), dup(bell_a_)), 0);
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(send_from_a(packet_to((kRangeB << 12) | i, 64), kLocal), TxStatus::kSent);
  ASSERT_EQ(receive_at_b().size(), 3u);
  ASSERT_EQ(send_from_a(packet_to((kRangeB << 12) | 3, 64), kLocal), TxStatus::kSent);
  ASSERT_EQ(io_a_->add_peer(kRangeB, 0, dup(region), dup(bell_b_)), 0);
  ASSERT_EQ(io_b_->add_peer(kRangeA, 1, region, dup(bell_a_)), 0);
  ASSERT_EQ(send_from_a(packet_to((kRangeB << 12) | 4, 64), kLocal), TxStatus::kSent);
  const auto got = receive_at_b();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], packet_to((kRangeB << 12) | 3, 64));
  EXPECT_EQ(got[1], packet_to((kRangeB << 12) | 4, 64));
  EXPECT_EQ(io_a_->peers(), 1u);
  EXPECT_EQ(io_a_->shm_counters().broken + io_b_->shm_counters().broken, 0u);
}

TEST_F(ShmPacketIoTest, TheSocketIsReadAfterASleepAndNotOnEveryBusyTurn) {
  connect();
  std::vector<RxDatagram> rx;
  receive_at_b(&rx);  // first receive: the socket is due
  EXPECT_EQ(sock_b_->recvs, 1);
  receive_at_b(&rx);  // a busy turn with a region: left for later
  EXPECT_EQ(sock_b_->recvs, 1);
  clock_.advance(ShmPacketIo::kUdpPollNs);
  receive_at_b(&rx);
  EXPECT_EQ(sock_b_->recvs, 2);
  ASSERT_TRUE(io_b_->arm_wakeup());
  io_b_->disarm_wakeup(true);  // woke: maybe by the socket
  receive_at_b(&rx);
  EXPECT_EQ(sock_b_->recvs, 3);
  ASSERT_TRUE(io_b_->arm_wakeup());
  io_b_->disarm_wakeup(false);  // woke by something else (a timer): the set was not readable
  receive_at_b(&rx);
  EXPECT_EQ(sock_b_->recvs, 3);
  // Woken by A's doorbell, after the busy path's interval: the ring's record is taken and the
  // socket left alone — a datagram there would end the next sleep at once.
  clock_.advance(10 * ShmPacketIo::kUdpPollNs);
  ASSERT_TRUE(io_b_->arm_wakeup());
  ASSERT_EQ(send_from_a(packet_to(kRangeB << 12, 64), kLocal), TxStatus::kSent);
  io_b_->disarm_wakeup(true);
  EXPECT_EQ(receive_at_b(&rx).size(), 1u);
  EXPECT_EQ(sock_b_->recvs, 3);
  receive_at_b(&rx);  // the next turn goes by the interval again: the socket is due
  EXPECT_EQ(sock_b_->recvs, 4);
  // Such wake-ups leave it for kUdpWatchedPollNs at most.
  clock_.advance(ShmPacketIo::kUdpWatchedPollNs);
  ASSERT_TRUE(io_b_->arm_wakeup());
  ASSERT_EQ(send_from_a(packet_to(kRangeB << 12, 64), kLocal), TxStatus::kSent);
  io_b_->disarm_wakeup(true);
  EXPECT_EQ(receive_at_b(&rx).size(), 1u);
  EXPECT_EQ(sock_b_->recvs, 5);
}

// A restarted urdmad gives the process another doorbell (ShmPacketIo::add_doorbell): peers given
// regions from then on write it, and it wakes a sleeper and is read on waking as the first is.
TEST_F(ShmPacketIoTest, ADoorbellAddedAfterARestartWakesASleeperLikeTheFirst) {
  connect();
  EXPECT_TRUE(receive_at_b().empty());  // takes the region
  const int second = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(second, 0);
  io_b_->add_doorbell(dup(second));
  pollfd p{io_b_->readable_fd(), POLLIN, 0};
  ASSERT_TRUE(io_b_->arm_wakeup());  // reads what add_peer rang
  EXPECT_EQ(poll(&p, 1, 0), 0);
  const uint64_t one = 1;
  ASSERT_EQ(write(second, &one, sizeof one), static_cast<ssize_t>(sizeof one));
  EXPECT_EQ(poll(&p, 1, 0), 1);  // the sleeper wakes
  io_b_->disarm_wakeup(true);
  EXPECT_EQ(poll(&p, 1, 0), 0);  // and reads it: the set is quiet again
  close(second);
}

// Two threads sleep armed (the engine thread, and an application thread waiting for an event).
// A producer writes the doorbell once per arming; the thread that wakes reads it and takes the
// turn. rearm_wakeup then asks again for the one still asleep: the next record rings again.
TEST_F(ShmPacketIoTest, ASleeperWhoseWakeAnotherTookIsWokenByTheNextRecord) {
  pollfd p = connect_with_two_sleepers();
  ASSERT_EQ(send_from_a(packet_to(kRangeB << 12, 64), kLocal), TxStatus::kSent);
  EXPECT_EQ(poll(&p, 1, 0), 1);
  io_b_->disarm_wakeup(true);  // the application thread wakes, reads the doorbell
  EXPECT_EQ(receive_at_b().size(), 1u);  // and takes the record
  EXPECT_EQ(poll(&p, 1, 0), 0);
  io_b_->rearm_wakeup();  // it is done: the engine thread still sleeps armed
  ASSERT_EQ(send_from_a(packet_to(kRangeB << 12, 64), kLocal), TxStatus::kSent);
  EXPECT_EQ(poll(&p, 1, 0), 1) << "the record after it woke nobody";
  io_b_->disarm_wakeup(true);
  EXPECT_EQ(receive_at_b().size(), 1u);
}

// The same two sleepers, and a region handed over while both sleep: the application thread
// wakes on add_peer's doorbell, reads it, and returns without a turn (its own event came). The
// region is not taken yet, so the engine thread's flags do not cover its ring: rearm_wakeup
// wakes the engine thread to take it, or the peer's records would wait for the next verb.
TEST_F(ShmPacketIoTest, ARegionAWakerLeftUntakenWakesTheOtherSleeper) {
  pollfd p{io_b_->readable_fd(), POLLIN, 0};
  ASSERT_TRUE(io_b_->arm_wakeup());  // the engine thread
  ASSERT_TRUE(io_b_->arm_wakeup());  // a waiting application thread
  ASSERT_EQ(io_b_->add_peer(kRangeA, 1, sealed_region(), dup(bell_a_)), 0);
  EXPECT_EQ(poll(&p, 1, 0), 1);
  io_b_->disarm_wakeup(true);  // the application thread wakes and reads the doorbell
  EXPECT_EQ(poll(&p, 1, 0), 0);
  io_b_->rearm_wakeup();  // and leaves with its event, taking no turn
  EXPECT_EQ(poll(&p, 1, 0), 1) << "the region waits for a turn and nobody is woken for it";
  io_b_->disarm_wakeup(true);  // the engine thread wakes
  EXPECT_TRUE(receive_at_b().empty());
  EXPECT_EQ(io_b_->peers(), 1u);
}

// A sleep reads the doorbell first only if it may have been written: a ring's request that a
// producer took, or this process's own write. Requests that still stand rang nothing, and the
// read would be a syscall for nothing on every wait. (A count nobody asked for is left to end
// the sleep at once, and is read then.)
TEST_F(ShmPacketIoTest, ASleepReadsTheDoorbellOnlyWhenARequestWasTaken) {
  pollfd p = connect_with_two_sleepers();
  ASSERT_EQ(send_from_a(packet_to(kRangeB << 12, 64), kLocal), TxStatus::kSent);
  io_b_->disarm_wakeup(true);  // the application thread wakes and reads the doorbell
  EXPECT_EQ(receive_at_b().size(), 1u);
  io_b_->rearm_wakeup();  // done: the engine thread's requests stand again
  const uint64_t one = 1;
  ASSERT_EQ(write(bell_b_, &one, sizeof one), 8);  // a count no request asked for
  ASSERT_TRUE(io_b_->arm_wakeup());  // the application thread's next wait
  EXPECT_EQ(poll(&p, 1, 0), 1) << "the sleep read a doorbell no ring had rung";
  io_b_->disarm_wakeup(true);  // the sleep ends at once and reads it
  EXPECT_EQ(poll(&p, 1, 0), 0);
  // A request A takes is seen in the ring's header: the next sleep reads its doorbell first.
  ASSERT_EQ(send_from_a(packet_to(kRangeB << 12, 64), kLocal), TxStatus::kSent);
  EXPECT_EQ(io_a_->shm_counters().doorbells, 2u);  // the engine thread's request, taken
  EXPECT_EQ(receive_at_b().size(), 1u);  // a turn takes the record; nobody reads the doorbell
  ASSERT_TRUE(io_b_->arm_wakeup());      // the application thread's next wait
  EXPECT_EQ(poll(&p, 1, 0), 0) << "the taken request's doorbell was left unread";
  io_b_->disarm_wakeup(false);
  io_b_->disarm_wakeup(false);
}

TEST_F(ShmPacketIoTest, AWatchedSocketIsReadWhenItsWatcherSaysSo) {
  connect();
  std::vector<RxDatagram> rx;
  receive_at_b(&rx);  // first receive: the socket is due
  EXPECT_EQ(sock_b_->recvs, 1);
  io_b_->watch_socket(true);  // a napping thread sleeps on readable_fd() for the poller
  clock_.advance(ShmPacketIo::kUdpPollNs);
  receive_at_b(&rx);  // the unwatched interval has passed: still left to the watcher
  EXPECT_EQ(sock_b_->recvs, 1);
  io_b_->woke_readable();  // the watcher's sleep ended readable: by the doorbell add_peer rang
  receive_at_b(&rx);
  EXPECT_EQ(sock_b_->recvs, 1);
  io_b_->woke_readable();  // again, the doorbell quiet now: by the socket
  receive_at_b(&rx);
  EXPECT_EQ(sock_b_->recvs, 2);
  receive_at_b(&rx);
  EXPECT_EQ(sock_b_->recvs, 2);
  clock_.advance(ShmPacketIo::kUdpWatchedPollNs);  // the watched interval: read anyway
  receive_at_b(&rx);
  EXPECT_EQ(sock_b_->recvs, 3);
  io_b_->watch_socket(false);  // the watcher woke: the busy interval again
  clock_.advance(ShmPacketIo::kUdpPollNs);
  receive_at_b(&rx);
  EXPECT_EQ(sock_b_->recvs, 4);
}

}  // namespace
}  // namespace urdma::net
