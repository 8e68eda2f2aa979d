// Real UDP over loopback. Waits use poll() with a generous bound only so a broken build cannot
// hang; no assertion depends on timing.
#include "net/udp_socket_io.h"

#include <netinet/ip.h>
#include <netinet/udp.h>
#include <poll.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace urdma::net {
namespace {

constexpr int kWaitMs = 5'000;

std::unique_ptr<UdpSocketIo> open_io(const char* endpoint) {
  std::string error;
  const int fd = UdpSocketIo::bind_udp(*Endpoint::parse(endpoint), &error);
  EXPECT_GE(fd, 0) << error;
  if (fd < 0) return nullptr;
  auto io = UdpSocketIo::adopt(fd, &error);
  EXPECT_TRUE(io) << error;
  return io;
}

bool wait_readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, kWaitMs) == 1;
}

struct Received {
  std::vector<uint8_t> bytes;
  Endpoint src, dst;
  bool truncated;
};

// Receives until `count` datagrams have arrived (or the bounded wait gives up).
std::vector<Received> receive(UdpSocketIo& io, size_t count, size_t buffer_bytes = 2048) {
  std::vector<Received> out;
  std::vector<std::vector<uint8_t>> bufs(kMaxBatch, std::vector<uint8_t>(buffer_bytes));
  std::vector<RxDatagram> slots(kMaxBatch);
  while (out.size() < count && wait_readable(io.readable_fd())) {
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = RxDatagram{bufs[i]};
    const size_t n = io.recv_batch(slots);
    for (size_t i = 0; i < n; ++i)
      out.push_back(
          Received{std::vector<uint8_t>(bufs[i].begin(), bufs[i].begin() + slots[i].length),
                   slots[i].src, slots[i].dst, slots[i].truncated});
  }
  return out;
}

TxDatagram to(const UdpSocketIo& peer, std::span<const iovec> iov) {
  TxDatagram d;
  d.iov = iov;
  d.dst = Endpoint{Address::from_v4(127, 0, 0, 1), peer.local().port};
  return d;
}

TEST(UdpSocketIoTest, SendsGatheredDatagramAcrossLoopback) {
  auto a = open_io("127.0.0.1:0");
  auto b = open_io("127.0.0.1:0");
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->local().port, 0);
  EXPECT_GE(b->readable_fd(), 0);

  uint8_t hdr[12] = {0x64, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 1};
  std::vector<uint8_t> payload(1000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i);
  uint8_t icrc[4] = {1, 2, 3, 4};
  const iovec iov[3] = {{hdr, sizeof hdr}, {payload.data(), payload.size()}, {icrc, 4}};
  // Nothing is waiting yet, and reading does not block.
  std::vector<uint8_t> buf(64);
  RxDatagram slot{buf};
  EXPECT_EQ(b->recv_batch(std::span<RxDatagram>(&slot, 1)), 0u);

  ASSERT_EQ(a->send(to(*b, iov)), TxStatus::kSent);
  const auto got = receive(*b, 1);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].bytes.size(), 1016u);
  EXPECT_EQ(std::memcmp(got[0].bytes.data(), hdr, 12), 0);
  EXPECT_EQ(std::memcmp(got[0].bytes.data() + 12, payload.data(), 1000), 0);
  EXPECT_EQ(std::memcmp(got[0].bytes.data() + 1012, icrc, 4), 0);
  EXPECT_EQ(got[0].src, a->local());
  EXPECT_EQ(got[0].dst, b->local());
  EXPECT_EQ(a->counters().tx_datagrams, 1u);
  EXPECT_EQ(a->counters().tx_bytes, 1016u);
  EXPECT_EQ(b->counters().rx_bytes, 1016u);
}

TEST(UdpSocketIoTest, BatchesBothWays) {
  auto a = open_io("127.0.0.1:0");
  auto b = open_io("127.0.0.1:0");
  ASSERT_TRUE(a && b);
  constexpr size_t kCount = 40;
  std::vector<uint32_t> seq(kCount);
  std::vector<iovec> iov(kCount);
  std::vector<TxDatagram> batch;
  for (size_t i = 0; i < kCount; ++i) {
    seq[i] = static_cast<uint32_t>(i);
    iov[i] = iovec{&seq[i], sizeof seq[i]};
    batch.push_back(to(*b, std::span<const iovec>(&iov[i], 1)));
  }
  ASSERT_EQ(a->send_batch(batch), kCount);
  const auto got = receive(*b, kCount);
  ASSERT_EQ(got.size(), kCount);
  for (size_t i = 0; i < kCount; ++i) {
    uint32_t s;
    std::memcpy(&s, got[i].bytes.data(), 4);
    EXPECT_EQ(s, i);  // loopback keeps order
  }
}

TEST(UdpSocketIoTest, ReportsTruncation) {
  auto a = open_io("127.0.0.1:0");
  auto b = open_io("127.0.0.1:0");
  ASSERT_TRUE(a && b);
  std::vector<uint8_t> big(300, 7);
  const iovec v{big.data(), big.size()};
  ASSERT_EQ(a->send(to(*b, std::span<const iovec>(&v, 1))), TxStatus::kSent);
  const auto got = receive(*b, 1, 100);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].truncated);
  EXPECT_EQ(got[0].bytes.size(), 100u);
  EXPECT_EQ(b->counters().rx_truncated, 1u);
}

// A socket bound to the wildcard learns each datagram's destination address from IP_PKTINFO, and
// a sender picks its source address per datagram.
TEST(UdpSocketIoTest, PktinfoGivesDestinationAndChoosesSource) {
  auto a = open_io("127.0.0.1:0");
  auto b = open_io("0.0.0.0:0");
  ASSERT_TRUE(a && b);
  uint8_t byte = 1;
  const iovec v{&byte, 1};
  TxDatagram d = to(*b, std::span<const iovec>(&v, 1));
  d.dst.address = Address::from_v4(127, 0, 0, 2);
  ASSERT_EQ(a->send(d), TxStatus::kSent);
  auto c = open_io("0.0.0.0:0");
  ASSERT_TRUE(c);
  TxDatagram e = d;
  e.src = Address::from_v4(127, 0, 0, 3);
  ASSERT_EQ(c->send(e), TxStatus::kSent);
  const auto got = receive(*b, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].dst, (Endpoint{Address::from_v4(127, 0, 0, 2), b->local().port}));
  EXPECT_EQ(got[0].src, a->local());
  EXPECT_EQ(got[1].src, (Endpoint{Address::from_v4(127, 0, 0, 3), c->local().port}));
}

TEST(UdpSocketIoTest, RejectsWhatItCannotSend) {
  auto a = open_io("127.0.0.1:0");
  ASSERT_TRUE(a);
  uint8_t byte = 0;
  const iovec v{&byte, 1};
  TxDatagram d = to(*a, std::span<const iovec>(&v, 1));
  d.dst.address = *Address::parse("::1");  // IPv6 on an AF_INET socket
  EXPECT_EQ(a->send(d), TxStatus::kRejected);
  std::vector<iovec> many(kMaxTxIov + 1, v);
  d = to(*a, many);
  EXPECT_EQ(a->send(d), TxStatus::kRejected);
  // A rejected datagram in the middle of a batch is skipped; the rest go out.
  TxDatagram good = to(*a, std::span<const iovec>(&v, 1));
  const TxDatagram batch[3] = {good, d, good};
  EXPECT_EQ(a->send_batch(batch), 3u);
  EXPECT_EQ(a->counters().tx_rejected, 3u);
  EXPECT_EQ(a->counters().tx_datagrams, 2u);
  EXPECT_EQ(receive(*a, 2).size(), 2u);
}

TEST(UdpSocketIoTest, AdoptRefusesWhatIsNotABoundUdpSocket) {
  std::string error;
  EXPECT_FALSE(UdpSocketIo::adopt(socket(AF_INET, SOCK_DGRAM, 0), &error));  // not bound
  EXPECT_NE(error, "");
  EXPECT_FALSE(UdpSocketIo::adopt(socket(AF_UNIX, SOCK_DGRAM, 0), &error));
  auto a = open_io("127.0.0.1:0");
  ASSERT_TRUE(a);
  EXPECT_LT(UdpSocketIo::bind_udp(a->local(), &error), 0);  // the port is taken
  EXPECT_NE(error.find("bind"), std::string::npos);
}

TEST(UdpSocketIoTest, Ipv6Loopback) {
  std::string error;
  const int fa = UdpSocketIo::bind_udp(*Endpoint::parse("[::1]:0"), &error);
  if (fa < 0) GTEST_SKIP() << "no IPv6 loopback here: " << error;
  auto a = UdpSocketIo::adopt(fa, &error);
  auto b = open_io("[::1]:0");
  ASSERT_TRUE(a && b);
  uint8_t data[5] = {1, 2, 3, 4, 5};
  const iovec v{data, 5};
  TxDatagram d;
  d.iov = std::span<const iovec>(&v, 1);
  d.dst = b->local();
  ASSERT_EQ(a->send(d), TxStatus::kSent);
  const auto got = receive(*b, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].bytes.size(), 5u);
  EXPECT_EQ(got[0].src, a->local());
  EXPECT_EQ(got[0].dst, b->local());
}

// What the kernel puts on the wire: DF set and IP ID 0, the IPv4 header the receiver assumes
// when it checks the ICRC. Seen through a raw socket, which needs CAP_NET_RAW.
TEST(UdpSocketIoTest, KernelSendsDontFragmentAndIpIdZero) {
  const int raw = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_UDP);
  if (raw < 0) GTEST_SKIP() << "raw socket not permitted: " << std::strerror(errno);
  auto a = open_io("127.0.0.1:0");
  auto b = open_io("127.0.0.1:0");
  ASSERT_TRUE(a && b);
  uint8_t data[32] = {};
  const iovec v{data, sizeof data};
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(a->send(to(*b, std::span<const iovec>(&v, 1))), TxStatus::kSent);
  int seen = 0;
  uint8_t pkt[2048];
  while (seen < 3 && wait_readable(raw)) {
    const ssize_t n = recv(raw, pkt, sizeof pkt, 0);
    ASSERT_GT(n, 0);
    iphdr ip;
    std::memcpy(&ip, pkt, sizeof ip);
    udphdr udp;
    std::memcpy(&udp, pkt + ip.ihl * 4, sizeof udp);
    if (ntohs(udp.dest) != b->local().port || ntohs(udp.source) != a->local().port) continue;
    EXPECT_EQ(ntohs(ip.frag_off), IP_DF);  // DF, offset 0
    EXPECT_EQ(ip.id, 0);
    ++seen;
  }
  EXPECT_EQ(seen, 3);
  close(raw);
}

}  // namespace
}  // namespace urdma::net
