// Real UDP over loopback. Waits use poll() with a generous bound only so a broken build cannot
// hang; no assertion depends on timing.
#include "net/udp_socket_io.h"

#include <netinet/ip.h>
#include <netinet/udp.h>
#include <poll.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "wire/icrc.h"

namespace urdma::net {
namespace {

constexpr int kWaitMs = 5'000;

std::unique_ptr<UdpSocketIo> open_io(const char* endpoint, size_t source_ports = 0) {
  std::string error;
  const int fd = UdpSocketIo::bind_udp(*Endpoint::parse(endpoint), &error);
  EXPECT_GE(fd, 0) << error;
  if (fd < 0) return nullptr;
  auto io = UdpSocketIo::adopt(fd, &error, UdpSocketIoOptions{source_ports});
  EXPECT_TRUE(io) << error;
  return io;
}

int socket_int(int fd, int name) {
  int v = 0;
  socklen_t len = sizeof v;
  EXPECT_EQ(getsockopt(fd, SOL_SOCKET, name, &v, &len), 0);
  return v;
}

long proc_long(const char* path) {
  FILE* f = std::fopen(path, "r");
  long v = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%ld", &v) != 1) v = 0;
    std::fclose(f);
  }
  return v;
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

// Receives until `count` datagrams have arrived (or the bounded wait gives up); a coalesced
// receive (UDP GRO) counts as its datagrams, split as the engine splits it. Buffers are
// `buffer_bytes` or what the I/O asks for, whichever is larger.
std::vector<Received> receive(UdpSocketIo& io, size_t count, size_t buffer_bytes = 2048) {
  std::vector<Received> out;
  buffer_bytes = std::max(buffer_bytes, io.rx_buffer_bytes());
  std::vector<std::vector<uint8_t>> bufs(kMaxBatch, std::vector<uint8_t>(buffer_bytes));
  std::vector<RxDatagram> slots(kMaxBatch);
  while (out.size() < count && wait_readable(io.readable_fd())) {
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = RxDatagram{bufs[i]};
    const size_t n = io.recv_batch(slots);
    for (size_t i = 0; i < n; ++i) {
      const RxDatagram& d = slots[i];
      const size_t step = d.segment_bytes != 0 ? d.segment_bytes : std::max<size_t>(d.length, 1);
      for (size_t at = 0; at < std::max<size_t>(d.length, 1); at += step) {
        const size_t len = std::min(step, d.length - at);
        out.push_back(Received{std::vector<uint8_t>(bufs[i].begin() + at,
                                                    bufs[i].begin() + at + len),
                               d.src, d.dst, d.truncated});
      }
    }
  }
  return out;
}

// A datagram from `self`'s bound port (the port its ICRC would cover) to `peer`.
TxDatagram to(const UdpSocketIo& self, const UdpSocketIo& peer, std::span<const iovec> iov) {
  TxDatagram d;
  d.iov = iov;
  d.src_port = self.local().port;
  d.dst = Endpoint{Address::from_v4(127, 0, 0, 1), peer.local().port};
  return d;
}

TEST(RouteSource, NamesTheAddressTheKernelSendsFrom) {
  const Address lo = Address::from_v4(127, 0, 0, 1);
  EXPECT_EQ(route_source(lo), lo);
  EXPECT_EQ(route_source(Address::from_v4(127, 0, 0, 9)), lo) << "127/8 is routed from 127.0.0.1";
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

  ASSERT_EQ(a->send(to(*a, *b, iov)), TxStatus::kSent);
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
    batch.push_back(to(*a, *b, std::span<const iovec>(&iov[i], 1)));
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

// (Without UDP_GRO — the default, said here — which would ask for buffers that hold any
// datagram.)
TEST(UdpSocketIoTest, ReportsTruncation) {
  auto a = open_io("127.0.0.1:0");
  std::string error;
  auto b = UdpSocketIo::adopt(UdpSocketIo::bind_udp(*Endpoint::parse("127.0.0.1:0"), &error),
                              &error, UdpSocketIoOptions{.gro = false});
  ASSERT_TRUE(a && b) << error;
  std::vector<uint8_t> big(300, 7);
  const iovec v{big.data(), big.size()};
  ASSERT_EQ(a->send(to(*a, *b, std::span<const iovec>(&v, 1))), TxStatus::kSent);
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
  TxDatagram d = to(*a, *b, std::span<const iovec>(&v, 1));
  d.dst.address = Address::from_v4(127, 0, 0, 2);
  ASSERT_EQ(a->send(d), TxStatus::kSent);
  auto c = open_io("0.0.0.0:0");
  ASSERT_TRUE(c);
  TxDatagram e = d;
  e.src = Address::from_v4(127, 0, 0, 3);
  e.src_port = c->local().port;
  ASSERT_EQ(c->send(e), TxStatus::kSent);
  const auto got = receive(*b, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].dst, (Endpoint{Address::from_v4(127, 0, 0, 2), b->local().port}));
  EXPECT_EQ(got[0].src, a->local());
  EXPECT_EQ(got[1].src, (Endpoint{Address::from_v4(127, 0, 0, 3), c->local().port}));
}

// After a read that found at most one datagram, the next reads one (recvmsg: a conversation's
// read); a one-datagram read that found one is followed by a batch read. Whichever call reads,
// the slot says the same: bytes, both addresses (IP_PKTINFO on a wildcard socket), truncation.
TEST(UdpSocketIoTest, AfterAReadOfOneTheNextReadsOneThenABatchAgain) {
  auto a = open_io("127.0.0.1:0");
  std::string error;
  auto b = UdpSocketIo::adopt(UdpSocketIo::bind_udp(*Endpoint::parse("0.0.0.0:0"), &error), &error,
                              UdpSocketIoOptions{.gro = false});
  ASSERT_TRUE(a && b) << error;
  const Endpoint b_at{Address::from_v4(127, 0, 0, 2), b->local().port};
  auto send = [&](uint8_t value, size_t bytes) {
    std::vector<uint8_t> p(bytes, value);
    const iovec v{p.data(), p.size()};
    TxDatagram d = to(*a, *b, std::span<const iovec>(&v, 1));
    d.dst = b_at;
    ASSERT_EQ(a->send(d), TxStatus::kSent);
  };
  std::vector<std::vector<uint8_t>> bufs(kMaxBatch, std::vector<uint8_t>(100));
  std::vector<RxDatagram> slots(kMaxBatch);
  auto read = [&] {
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = RxDatagram{bufs[i]};
    return b->recv_batch(slots);
  };
  auto check = [&](size_t i, uint8_t value, size_t length, bool truncated) {
    EXPECT_EQ(slots[i].length, length);
    EXPECT_EQ(slots[i].truncated, truncated);
    EXPECT_EQ(slots[i].src, a->local());
    EXPECT_EQ(slots[i].dst, b_at);
    EXPECT_EQ(bufs[i][0], value);
    EXPECT_EQ(bufs[i][length - 1], value);
  };

  send(1, 10);
  ASSERT_TRUE(wait_readable(b->readable_fd()));
  ASSERT_EQ(read(), 1u);  // a batch read that found one
  check(0, 1, 10, false);
  EXPECT_EQ(b->counters().rx_one_reads, 0u);

  send(2, 20);
  send(3, 300);  // truncated to the 100-byte buffer
  send(4, 40);
  ASSERT_TRUE(wait_readable(b->readable_fd()));
  ASSERT_EQ(read(), 1u);  // one read, though three wait
  check(0, 2, 20, false);
  EXPECT_EQ(b->counters().rx_one_reads, 1u);
  ASSERT_EQ(read(), 2u);   // it found one: a batch read takes the rest
  check(0, 3, 100, true);  // the bytes that fit
  check(1, 4, 40, false);
  EXPECT_EQ(b->counters().rx_one_reads, 1u);

  EXPECT_EQ(read(), 0u);  // a batch read found none: the next reads one
  EXPECT_EQ(read(), 0u);
  EXPECT_EQ(b->counters().rx_one_reads, 2u);
  send(5, 50);
  ASSERT_TRUE(wait_readable(b->readable_fd()));
  ASSERT_EQ(read(), 1u);
  check(0, 5, 50, false);
  EXPECT_EQ(b->counters().rx_one_reads, 3u);
  EXPECT_EQ(b->counters().rx_datagrams, 5u);
  EXPECT_EQ(b->counters().rx_truncated, 1u);
}

TEST(UdpSocketIoTest, RejectsWhatItCannotSend) {
  auto a = open_io("127.0.0.1:0");
  ASSERT_TRUE(a);
  uint8_t byte = 0;
  const iovec v{&byte, 1};
  TxDatagram d = to(*a, *a, std::span<const iovec>(&v, 1));
  d.dst.address = *Address::parse("::1");  // IPv6 on an AF_INET socket
  EXPECT_EQ(a->send(d), TxStatus::kRejected);
  std::vector<iovec> many(kMaxTxIov + 1, v);
  d = to(*a, *a, many);
  EXPECT_EQ(a->send(d), TxStatus::kRejected);
  // A rejected datagram in the middle of a batch is skipped; the rest go out.
  TxDatagram good = to(*a, *a, std::span<const iovec>(&v, 1));
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

// Two I/Os on [::1]; nulls, with the reason in *why, where this host has no IPv6 loopback.
std::pair<std::unique_ptr<UdpSocketIo>, std::unique_ptr<UdpSocketIo>> open_ipv6_pair(
    std::string* why) {
  const int fa = UdpSocketIo::bind_udp(*Endpoint::parse("[::1]:0"), why);
  if (fa < 0) return {};
  auto a = UdpSocketIo::adopt(fa, why);
  auto b = open_io("[::1]:0");
  EXPECT_TRUE(a && b) << *why;  // a host with IPv6 loopback must get both
  if (!a || !b) return {};
  return {std::move(a), std::move(b)};
}

TEST(UdpSocketIoTest, Ipv6Loopback) {
  std::string why;
  auto [a, b] = open_ipv6_pair(&why);
  if (!a) GTEST_SKIP() << "no IPv6 loopback here: " << why;
  uint8_t data[5] = {1, 2, 3, 4, 5};
  const iovec v{data, 5};
  TxDatagram d;
  d.iov = std::span<const iovec>(&v, 1);
  d.dst = b->local();
  d.src_port = a->local().port;
  ASSERT_EQ(a->send(d), TxStatus::kSent);
  const auto got = receive(*b, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].bytes.size(), 5u);
  EXPECT_EQ(got[0].src, a->local());
  EXPECT_EQ(got[0].dst, b->local());
}

// Without a pool every datagram leaves from the bound port, whatever it asks for; a datagram
// sealed for another port is refused, not sent with an ICRC the receiver cannot check.
TEST(UdpSocketIoTest, WithoutAPoolOnlyTheBoundPortIsHonoured) {
  auto a = open_io("127.0.0.1:0");
  auto b = open_io("127.0.0.1:0");
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(a->source_ports().empty());
  EXPECT_EQ(a->source_port(0xC123), a->local().port);
  EXPECT_EQ(a->source_port(a->local().port), a->local().port);
  uint8_t byte = 1;
  const iovec v{&byte, 1};
  TxDatagram d = to(*a, *b, std::span<const iovec>(&v, 1));
  d.src_port = 0xC123;
  EXPECT_EQ(a->send(d), TxStatus::kRejected);
  d.src_port = a->source_port(0xC123);
  EXPECT_EQ(a->send(d), TxStatus::kSent);
  const auto got = receive(*b, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].src.port, a->local().port);
  EXPECT_EQ(a->counters().tx_rejected, 1u);
}

// Per-flow source ports: consecutive QPNs spread over the pool, every datagram leaves from the
// port source_port() named (the port its ICRC covers), and only those ports are honoured.
TEST(UdpSocketIoTest, SourcePortPoolSendsFromPerFlowPorts) {
  constexpr size_t kPool = 16;
  auto a = open_io("127.0.0.1:0", kPool);
  auto b = open_io("127.0.0.1:0");
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->source_ports().size(), kPool);
  for (size_t slot = 0; slot < kPool; ++slot) {
    const uint16_t p = a->source_ports()[slot];
    if (p == a->local().port) continue;  // fell back: every candidate taken by someone else
    EXPECT_EQ(p & 0xC000, 0xC000);
    EXPECT_EQ((p & kFlowPortMask) % kPool, slot);
  }
  std::set<uint16_t> distinct;
  std::vector<uint32_t> qpns(2 * kPool);
  std::vector<iovec> iov(qpns.size());
  std::vector<TxDatagram> batch;
  for (uint32_t i = 0; i < qpns.size(); ++i) {
    qpns[i] = 0x123400 + i;
    const uint16_t wanted = static_cast<uint16_t>(kFlowPortBase | (qpns[i] & kFlowPortMask));
    const uint16_t p = a->source_port(wanted);
    EXPECT_EQ(a->source_port(p), p) << "idempotent";
    distinct.insert(p);
    iov[i] = iovec{&qpns[i], sizeof qpns[i]};
    TxDatagram d = to(*a, *b, std::span<const iovec>(&iov[i], 1));
    d.src_port = p;
    batch.push_back(d);
  }
  EXPECT_EQ(distinct.size(), kPool);
  ASSERT_EQ(a->send_batch(batch), batch.size());  // runs split per socket
  EXPECT_EQ(a->counters().tx_datagrams, batch.size());
  const auto got = receive(*b, batch.size());
  ASSERT_EQ(got.size(), batch.size());
  for (const Received& r : got) {
    uint32_t qpn;
    std::memcpy(&qpn, r.bytes.data(), 4);
    const uint16_t wanted = static_cast<uint16_t>(kFlowPortBase | (qpn & kFlowPortMask));
    EXPECT_EQ(r.src.port, a->source_port(wanted)) << "qpn " << qpn;
    EXPECT_EQ(r.src.address, Address::from_v4(127, 0, 0, 1));
  }
  // A port of a slot's residue that the slot does not hold, a port outside the range: refused.
  uint8_t byte = 0;
  const iovec v{&byte, 1};
  TxDatagram d = to(*a, *b, std::span<const iovec>(&v, 1));
  const uint16_t p0 = a->source_ports()[0];
  d.src_port = static_cast<uint16_t>(p0 == 0xFFF0 ? 0xC000 : p0 + kPool);
  if (p0 == a->local().port) d.src_port = 0xC000;
  EXPECT_EQ(a->send(d), TxStatus::kRejected);
  d.src_port = 1234;
  EXPECT_EQ(a->send(d), TxStatus::kRejected);
  EXPECT_EQ(a->counters().tx_rejected, 2u);
  // The bound port is still honoured.
  d.src_port = a->local().port;
  EXPECT_EQ(a->send(d), TxStatus::kSent);
  ASSERT_EQ(receive(*b, 1).size(), 1u);
}

// Two I/Os of one user share the pool's ports (SO_REUSEPORT), and datagrams sent to a pool port
// are dropped by the kernel rather than queued on a socket nobody reads.
TEST(UdpSocketIoTest, PoolPortsAreSharedAndDropWhatArrives) {
  auto a = open_io("127.0.0.1:0", 4);
  auto c = open_io("127.0.0.1:0", 4);
  auto b = open_io("127.0.0.1:0");
  ASSERT_TRUE(a && b && c);
  EXPECT_TRUE(std::equal(a->source_ports().begin(), a->source_ports().end(),
                         c->source_ports().begin(), c->source_ports().end()));
  uint8_t byte = 0;
  const iovec v{&byte, 1};
  TxDatagram d;
  d.iov = std::span<const iovec>(&v, 1);
  d.dst = Endpoint{Address::from_v4(127, 0, 0, 1), a->source_ports()[1]};
  d.src_port = b->local().port;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(b->send(d), TxStatus::kSent);
  std::vector<uint8_t> buf(16);
  RxDatagram slot{buf};
  EXPECT_EQ(a->recv_batch(std::span<RxDatagram>(&slot, 1)), 0u);
  EXPECT_EQ(c->recv_batch(std::span<RxDatagram>(&slot, 1)), 0u);
}

// A dual-stack slot socket ([::], as urdmad's) gets a dual-stack pool: IPv4 and IPv6 datagrams
// both leave from the pool's ports.
TEST(UdpSocketIoTest, DualStackPoolSendsBothFamilies) {
  std::string error;
  const int fd = UdpSocketIo::bind_udp(*Endpoint::parse("[::]:0"), &error);
  if (fd < 0) GTEST_SKIP() << "no IPv6 here: " << error;
  auto a = UdpSocketIo::adopt(fd, &error, UdpSocketIoOptions{4});
  ASSERT_TRUE(a) << error;
  const int f6 = UdpSocketIo::bind_udp(*Endpoint::parse("[::1]:0"), &error);
  if (f6 < 0) GTEST_SKIP() << "no IPv6 loopback here: " << error;
  auto b6 = UdpSocketIo::adopt(f6, &error);
  auto b4 = open_io("127.0.0.1:0");
  ASSERT_TRUE(b6 && b4);
  uint8_t byte = 1;
  const iovec v{&byte, 1};
  for (UdpSocketIo* peer : {b4.get(), b6.get()}) {
    TxDatagram d;
    d.iov = std::span<const iovec>(&v, 1);
    d.dst = peer->local();
    d.src_port = a->source_port(0xC003);
    ASSERT_NE(d.src_port, a->local().port);
    ASSERT_EQ(a->send(d), TxStatus::kSent) << d.dst.to_string();
    const auto got = receive(*peer, 1);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].src.port, d.src_port);
  }
}

TEST(UdpSocketIoTest, PoolSizeMustBeAPowerOfTwo) {
  std::string error;
  const int fd = UdpSocketIo::bind_udp(*Endpoint::parse("127.0.0.1:0"), &error);
  ASSERT_GE(fd, 0) << error;
  EXPECT_FALSE(UdpSocketIo::adopt(fd, &error, UdpSocketIoOptions{3}));
  EXPECT_NE(error.find("power of two"), std::string::npos) << error;
  const int fd2 = UdpSocketIo::bind_udp(*Endpoint::parse("127.0.0.1:0"), &error);
  ASSERT_GE(fd2, 0) << error;
  EXPECT_FALSE(UdpSocketIo::adopt(fd2, &error, UdpSocketIoOptions{kMaxSourcePorts * 2}));
}

// What the kernel puts on the wire: DF set and IP ID 0, the IPv4 header the receiver assumes
// when it checks the ICRC. Seen through a raw socket, which needs CAP_NET_RAW.
TEST(UdpSocketIoTest, KernelSendsDontFragmentAndIpIdZero) {
  const int raw = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_UDP);
  if (raw < 0) GTEST_SKIP() << "raw socket not permitted: " << std::strerror(errno);
  auto a = open_io("127.0.0.1:0", 2);  // from the bound port and from the pool's sockets
  auto b = open_io("127.0.0.1:0");
  ASSERT_TRUE(a && b);
  uint8_t data[32] = {};
  const iovec v{data, sizeof data};
  std::set<uint16_t> ports;
  for (const uint16_t p : {a->local().port, a->source_ports()[0], a->source_ports()[1]}) {
    TxDatagram d = to(*a, *b, std::span<const iovec>(&v, 1));
    d.src_port = p;
    ASSERT_EQ(a->send(d), TxStatus::kSent);
    ports.insert(p);
  }
  int seen = 0;
  uint8_t pkt[2048];
  while (seen < 3 && wait_readable(raw)) {
    const ssize_t n = recv(raw, pkt, sizeof pkt, 0);
    ASSERT_GT(n, 0);
    iphdr ip;
    std::memcpy(&ip, pkt, sizeof ip);
    udphdr udp;
    std::memcpy(&udp, pkt + ip.ihl * 4, sizeof udp);
    if (ntohs(udp.dest) != b->local().port || !ports.contains(ntohs(udp.source))) continue;
    EXPECT_EQ(ntohs(ip.frag_off), IP_DF);  // DF, offset 0
    EXPECT_EQ(ip.id, 0);
    ++seen;
  }
  EXPECT_EQ(seen, 3);
  close(raw);
}

// RoCEv2-shaped datagrams for the segmentation tests: a BTH-sized header, a payload of `size`
// bytes in all, and an ICRC sealed for {ID 0, DF} on the flow from `from`'s bound port to `to_io`.
struct Packets {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::array<iovec, 2>> iov;
  std::vector<TxDatagram> batch;
};

Packets roce_packets(const UdpSocketIo& from, const UdpSocketIo& to_io,
                     const std::vector<size_t>& sizes) {
  Packets p;
  p.bytes.reserve(sizes.size());
  p.iov.resize(sizes.size());
  wire::IcrcIpv4 h;
  h.flow.src_addr = {127, 0, 0, 1};
  h.flow.dst_addr = {127, 0, 0, 1};
  h.flow.udp_src_port = from.local().port;
  h.flow.udp_dst_port = to_io.local().port;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint8_t>& b = p.bytes.emplace_back(sizes[i]);
    for (size_t j = 0; j < b.size(); ++j) b[j] = static_cast<uint8_t>(i * 31 + j);
    wire::seal_icrc(h, b);
    // Odd datagrams gather the ICRC from its own iovec (as the engine does), even ones have it
    // at the end of their single one.
    const size_t split = i % 2 ? b.size() - wire::kIcrcBytes : b.size();
    p.iov[i] = {iovec{b.data(), split}, iovec{b.data() + split, b.size() - split}};
    p.batch.push_back(to(from, to_io, std::span<const iovec>(p.iov[i].data(), i % 2 ? 2 : 1)));
  }
  return p;
}

// One run of equal-size datagrams (the last shorter) of one flow leaves as ONE send with
// UDP_SEGMENT; a plain socket gets every datagram whole and in order, each byte as sent except
// segment i's ICRC, which is the one for IPv4 ID i (the ID Linux gives segment i of a
// super-packet with ID 0) — and the caller's buffers are untouched.
TEST(UdpSocketIoTest, ARunOfOneFlowLeavesAsOneSegmentedSendWithIcrcsForTheSegmentIds) {
  auto a = open_io("127.0.0.1:0");
  auto b = open_io("127.0.0.1:0");
  ASSERT_TRUE(a && b);
  if (!a->gso()) GTEST_SKIP() << "the kernel has no UDP_SEGMENT";
  std::vector<size_t> sizes(15, 1000);
  sizes.push_back(300);
  Packets p = roce_packets(*a, *b, sizes);
  const std::vector<std::vector<uint8_t>> before = p.bytes;
  ASSERT_EQ(a->send_batch(p.batch), sizes.size());
  EXPECT_EQ(p.bytes, before) << "the caller's buffers were written";
  EXPECT_EQ(a->counters().tx_gso_sends, 1u);
  EXPECT_EQ(a->counters().tx_gso_datagrams, sizes.size());
  EXPECT_EQ(a->counters().tx_datagrams, sizes.size());
  EXPECT_EQ(a->counters().tx_bytes, 15u * 1000 + 300);
  const auto got = receive(*b, sizes.size());
  ASSERT_EQ(got.size(), sizes.size());
  const wire::IcrcIpv4Flow flow{.src_addr = {127, 0, 0, 1}, .dst_addr = {127, 0, 0, 1},
                                .udp_src_port = a->local().port,
                                .udp_dst_port = b->local().port};
  for (size_t i = 0; i < got.size(); ++i) {
    const std::vector<uint8_t>& g = got[i].bytes;
    ASSERT_EQ(g.size(), sizes[i]) << i;
    EXPECT_TRUE(std::equal(g.begin(), g.end() - 4, before[i].begin())) << i;
    const wire::IcrcIpv4 id_i{.flow = flow, .ip_id = static_cast<uint16_t>(i)};
    EXPECT_EQ(wire::icrc_of(g), wire::compute_icrc(id_i, g)) << "segment " << i;
  }
}

// IPv6 has no identification field: a segmented IPv6 run leaves with every ICRC as sealed.
TEST(UdpSocketIoTest, Ipv6SegmentsKeepTheirIcrcs) {
  std::string why;
  auto [a, b] = open_ipv6_pair(&why);
  if (!a) GTEST_SKIP() << "no IPv6 loopback here: " << why;
  if (!a->gso()) GTEST_SKIP() << "the kernel has no UDP_SEGMENT";
  wire::IcrcIpv6 h;
  h.src_addr[15] = 1;
  h.dst_addr[15] = 1;
  h.udp_src_port = a->local().port;
  h.udp_dst_port = b->local().port;
  std::vector<std::vector<uint8_t>> bytes(6, std::vector<uint8_t>(700));
  bytes.back().resize(200);
  std::vector<iovec> iov;
  std::vector<TxDatagram> batch;
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (size_t j = 0; j < bytes[i].size(); ++j) bytes[i][j] = static_cast<uint8_t>(i + j * 7);
    wire::seal_icrc(h, bytes[i]);
    iov.push_back(iovec{bytes[i].data(), bytes[i].size()});
  }
  for (const iovec& v : iov) {
    TxDatagram d;
    d.iov = std::span<const iovec>(&v, 1);
    d.dst = b->local();
    d.src_port = a->local().port;
    batch.push_back(d);
  }
  ASSERT_EQ(a->send_batch(batch), batch.size());
  EXPECT_EQ(a->counters().tx_gso_sends, 1u);
  const auto got = receive(*b, batch.size());
  ASSERT_EQ(got.size(), batch.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].bytes, bytes[i]) << i;
    EXPECT_TRUE(wire::verify_icrc_ipv6(h, got[i].bytes)) << i;
  }
}

// Where runs end: another flow (here a source port), a datagram larger than the run's first,
// and after a short one; with the offload off, every datagram is a send of its own.
TEST(UdpSocketIoTest, RunsEndAtAnotherFlowALargerDatagramAndAfterAShortOne) {
  for (const bool gso : {true, false}) {
    std::string error;
    const int fd = UdpSocketIo::bind_udp(*Endpoint::parse("127.0.0.1:0"), &error);
    ASSERT_GE(fd, 0) << error;
    auto a = UdpSocketIo::adopt(fd, &error, UdpSocketIoOptions{.source_ports = 2, .gso = gso});
    auto b = open_io("127.0.0.1:0");
    ASSERT_TRUE(a && b) << error;
    if (gso && !a->gso()) GTEST_SKIP() << "the kernel has no UDP_SEGMENT";
    EXPECT_EQ(a->gso(), gso);
    // [1000 1000 500] [1000] | other port: [1000 1000] | [800] [900 900]
    Packets p = roce_packets(*a, *b, {1000, 1000, 500, 1000, 1000, 1000, 800, 900, 900});
    p.batch[4].src_port = p.batch[5].src_port = a->source_ports()[1];
    ASSERT_EQ(a->send_batch(p.batch), p.batch.size());
    EXPECT_EQ(a->counters().tx_gso_sends, gso ? 3u : 0u);
    EXPECT_EQ(a->counters().tx_gso_datagrams, gso ? 7u : 0u);
    const auto got = receive(*b, p.batch.size());
    ASSERT_EQ(got.size(), p.batch.size());
    // Pool ports reach b from other sockets, so only the order within each port is loopback's.
    std::vector<size_t> seen;
    for (const Received& r : got) seen.push_back(r.bytes.size());
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, (std::vector<size_t>{500, 800, 900, 900, 1000, 1000, 1000, 1000, 1000}));
  }
}

// The receive side: a socket with UDP_GRO (asked for; the runtime's I/O does) takes a segmented send that reaches it
// whole (loopback) as ONE receive, reports the segment size and asks for 64 KiB buffers; one
// without it gets a datagram per segment. Both see the same bytes.
TEST(UdpSocketIoTest, ASegmentedSendArrivesAsOneReceiveWithGroAndAsDatagramsWithout) {
  auto a = open_io("127.0.0.1:0");
  ASSERT_TRUE(a);
  if (!a->gso()) GTEST_SKIP() << "the kernel has no UDP_SEGMENT";
  for (const bool gro : {true, false}) {
    std::string error;
    const int fd = UdpSocketIo::bind_udp(*Endpoint::parse("127.0.0.1:0"), &error);
    ASSERT_GE(fd, 0) << error;
    auto b = UdpSocketIo::adopt(fd, &error, UdpSocketIoOptions{.gro = gro});
    ASSERT_TRUE(b) << error;
    if (gro && !b->gro()) GTEST_SKIP() << "the kernel has no UDP_GRO";
    EXPECT_EQ(b->rx_buffer_bytes(), gro ? kMaxUdpPayloadBytes : 0u);
    std::vector<size_t> sizes(9, 1000);
    sizes.push_back(100);
    Packets p = roce_packets(*a, *b, sizes);
    ASSERT_EQ(a->send_batch(p.batch), sizes.size());
    std::vector<uint8_t> buf(kMaxUdpPayloadBytes);
    std::vector<uint8_t> joined;
    std::vector<RxDatagram> slots(kMaxBatch, RxDatagram{});
    size_t receives = 0, segment = 0;
    while (joined.size() < 9 * 1000 + 100 && wait_readable(b->readable_fd())) {
      RxDatagram d{buf};
      ASSERT_EQ(b->recv_batch(std::span<RxDatagram>(&d, 1)), 1u);
      ASSERT_FALSE(d.truncated);
      joined.insert(joined.end(), buf.begin(), buf.begin() + d.length);
      segment = d.segment_bytes;
      ++receives;
    }
    EXPECT_EQ(receives, gro ? 1u : sizes.size());
    EXPECT_EQ(segment, gro ? 1000u : 0u);
    EXPECT_EQ(b->counters().rx_datagrams, sizes.size());
    EXPECT_EQ(b->counters().rx_gro_receives, gro ? 1u : 0u);
    EXPECT_EQ(b->counters().rx_gro_datagrams, gro ? sizes.size() : 0u);
    ASSERT_EQ(joined.size(), 9u * 1000 + 100);
    for (size_t i = 0, at = 0; i < sizes.size(); at += sizes[i], ++i)
      EXPECT_TRUE(std::equal(p.bytes[i].begin(), p.bytes[i].end() - 4, joined.begin() + at)) << i;
  }
}

// socket_buffer_bytes: adopt() asks for that much receive and send buffer (a full window of 4 KiB
// packets must not overflow the default ~208 KiB); without CAP_NET_ADMIN the kernel caps it at
// net.core.[rw]mem_max. Linux reports twice the size set (its bookkeeping overhead). The
// default, 0, leaves the socket alone.
TEST(UdpSocketIoTest, AdoptSetsTheSocketBuffersOnlyWhenAsked) {
  std::string error;
  const int fd = UdpSocketIo::bind_udp(*Endpoint::parse("127.0.0.1:0"), &error);
  ASSERT_GE(fd, 0) << error;
  const int rcv_before = socket_int(fd, SO_RCVBUF);
  const int snd_before = socket_int(fd, SO_SNDBUF);
  UdpSocketIoOptions large;
  large.socket_buffer_bytes = kLargeSocketBufferBytes;
  auto io = UdpSocketIo::adopt(fd, &error, large);
  ASSERT_TRUE(io) << error;
  const long want = static_cast<long>(kLargeSocketBufferBytes);
  EXPECT_GE(socket_int(io->readable_fd(), SO_RCVBUF),
            std::min(want, proc_long("/proc/sys/net/core/rmem_max")));
  EXPECT_GE(socket_int(io->readable_fd(), SO_SNDBUF),
            std::min(want, proc_long("/proc/sys/net/core/wmem_max")));

  const int fd2 = UdpSocketIo::bind_udp(*Endpoint::parse("127.0.0.1:0"), &error);
  ASSERT_GE(fd2, 0) << error;
  auto io2 = UdpSocketIo::adopt(fd2, &error);
  ASSERT_TRUE(io2) << error;
  EXPECT_EQ(socket_int(io2->readable_fd(), SO_RCVBUF), rcv_before);
  EXPECT_EQ(socket_int(io2->readable_fd(), SO_SNDBUF), snd_before);
}

}  // namespace
}  // namespace urdma::net
