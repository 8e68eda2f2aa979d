// A PacketIo for two runtimes in one test process: each side is a real UDP socket on
// 127.0.0.1 (an ephemeral port, so tests never collide with urdmad's 4791 or each other) that
// carries RoCEv2 datagrams between two *logical* hosts (10.x addresses, the rule for tests).
// Every datagram is prefixed with the sender's logical address and UDP source port, so the
// receiver reports exactly the flow the sender's engine sealed its ICRC with, and the engines
// run with ICRC checks on. readable_fd() is the socket: the engine thread sleeps on it.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <utility>

#include "base/check.h"
#include "net/packet_io.h"

namespace urdma::runtime::testing {

class LinkIo final : public net::PacketIo {
 public:
  // Two joined ends: what `a` sends arrives at `b` as sent from a_addr, and back.
  static std::pair<std::unique_ptr<LinkIo>, std::unique_ptr<LinkIo>> pair(net::Address a_addr,
                                                                          net::Address b_addr) {
    auto a = std::unique_ptr<LinkIo>(new LinkIo(a_addr));
    auto b = std::unique_ptr<LinkIo>(new LinkIo(b_addr));
    a->peer_port_ = b->port_;
    b->peer_port_ = a->port_;
    return {std::move(a), std::move(b)};
  }
  ~LinkIo() override { close(fd_); }

  // Back-pressure for tests: of every 16 send attempts, the first `n` say kWouldBlock (as a
  // full socket buffer's EAGAIN would). Set before traffic starts.
  void set_would_block(uint32_t n) { would_block_.store(n, std::memory_order_relaxed); }

  // Every send says kWouldBlock for the next `d` (a socket buffer that stays full that long).
  void block_for(std::chrono::nanoseconds d) {
    blocked_until_ns_.store(now_ns() + static_cast<uint64_t>(d.count()), std::memory_order_relaxed);
  }

  net::TxStatus send(const net::TxDatagram& d) override {
    if (attempts_++ % 16 < would_block_.load(std::memory_order_relaxed) ||
        now_ns() < blocked_until_ns_.load(std::memory_order_relaxed)) {
      ++counters_.tx_would_block;
      return net::TxStatus::kWouldBlock;
    }
    base::check(d.iov.size() + 1 <= 32, "too many iovecs");
    Header h{};
    const net::Address src = d.src.is_unspecified() ? logical_ : d.src;
    std::memcpy(h.src, src.bytes().data(), 16);
    h.src_port = d.src_port;
    std::array<iovec, 32> iov;
    iov[0] = {&h, sizeof h};
    for (size_t i = 0; i < d.iov.size(); ++i) iov[i + 1] = d.iov[i];
    sockaddr_in to = loopback(peer_port_);
    msghdr m{};
    m.msg_name = &to;
    m.msg_namelen = sizeof to;
    m.msg_iov = iov.data();
    m.msg_iovlen = d.iov.size() + 1;
    if (sendmsg(fd_, &m, MSG_DONTWAIT) < 0) {
      if (errno == EAGAIN || errno == ENOBUFS) {
        ++counters_.tx_would_block;
        return net::TxStatus::kWouldBlock;
      }
      ++counters_.tx_rejected;
      return net::TxStatus::kRejected;
    }
    ++counters_.tx_datagrams;
    return net::TxStatus::kSent;
  }

  size_t send_batch(std::span<const net::TxDatagram> batch) override {
    size_t n = 0;
    for (const net::TxDatagram& d : batch) {
      if (send(d) == net::TxStatus::kWouldBlock) break;
      ++n;
    }
    return n;
  }

  size_t recv_batch(std::span<net::RxDatagram> batch) override {
    size_t n = 0;
    for (net::RxDatagram& slot : batch) {
      Header h{};
      iovec iov[2] = {{&h, sizeof h}, {slot.buffer.data(), slot.buffer.size()}};
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = 2;
      const ssize_t got = recvmsg(fd_, &m, MSG_DONTWAIT);
      if (got < static_cast<ssize_t>(sizeof h)) break;  // EAGAIN (or a runt: not ours)
      slot.length = static_cast<size_t>(got) - sizeof h;
      slot.truncated = (m.msg_flags & MSG_TRUNC) != 0;
      net::Address::Bytes b;
      std::memcpy(b.data(), h.src, 16);
      slot.src = net::Endpoint{net::Address(b), h.src_port};
      slot.dst = net::Endpoint{logical_, net::kRoceV2UdpPort};
      ++counters_.rx_datagrams;
      ++n;
    }
    return n;
  }

  int readable_fd() const override { return fd_; }
  net::IoCounters counters() const override { return counters_; }

 private:
  static uint64_t now_ns() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }

  struct Header {
    uint8_t src[16];
    uint16_t src_port;
    uint16_t pad;
  };

  static sockaddr_in loopback(uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    return a;
  }

  explicit LinkIo(net::Address logical) : logical_(logical) {
    fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    base::check(fd_ >= 0, "socket");
    // Room for a window of full-MTU packets (net.core.rmem_max caps it).
    const int bytes = 4 << 20;
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
    setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    sockaddr_in a = loopback(0);
    base::check(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0, "bind");
    socklen_t len = sizeof a;
    base::check(getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0, "getsockname");
    port_ = ntohs(a.sin_port);
  }

  net::Address logical_;
  int fd_ = -1;
  uint16_t port_ = 0;
  uint16_t peer_port_ = 0;
  net::IoCounters counters_;
  uint64_t attempts_ = 0;
  std::atomic<uint32_t> would_block_{0};
  std::atomic<uint64_t> blocked_until_ns_{0};
};

}  // namespace urdma::runtime::testing
