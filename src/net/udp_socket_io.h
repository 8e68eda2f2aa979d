// PacketIo over a real, already-bound UDP socket: the path the engine uses outside simulation.
//
// One sendmmsg per send_batch and one recvmmsg per recv_batch, straight from and into the
// caller's iovecs and buffers (no staging copy). The socket is set up so that what the kernel
// puts on the wire is what a RoCEv2 ICRC can cover:
//  * IP_MTU_DISCOVER = IP_PMTUDISC_DO (and IPV6_MTU_DISCOVER): the kernel never fragments and sets
//    DF; for a DF datagram on an unconnected socket Linux writes IP ID 0 (ip_select_ident_segs),
//    so the receiver, which never sees the IP ID, can assume 0 in the IPv4 header the ICRC covers;
//  * IP_PKTINFO / IPV6_RECVPKTINFO: every received datagram reports its destination address (the
//    ICRC covers it; a socket bound to the wildcard address would not know it otherwise), and a
//    send may pick its source address (the path's source GID);
//  * O_NONBLOCK: no call ever blocks; readable_fd() is for the engine's poll/epoll when idle.
// UDP source ports: a socket sends from its bound port, so TxDatagram::src_port is ignored.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <memory>
#include <string>

#include "base/check.h"
#include "net/packet_io.h"

namespace urdma::net {

class UdpSocketIo final : public PacketIo {
 public:
  // Takes ownership of `fd`, a bound AF_INET or AF_INET6 SOCK_DGRAM socket, and configures it as
  // above. On failure returns null with the reason in *error, and the fd is closed.
  static std::unique_ptr<UdpSocketIo> adopt(int fd, std::string* error);
  // Creates and binds a UDP socket (port 0 = an ephemeral port), for tests and the daemon.
  // Returns the fd, or -1 with the reason in *error.
  static int bind_udp(const Endpoint& local, std::string* error);

  ~UdpSocketIo() override;
  UdpSocketIo(const UdpSocketIo&) = delete;
  UdpSocketIo& operator=(const UdpSocketIo&) = delete;

  TxStatus send(const TxDatagram& d) override;
  size_t send_batch(std::span<const TxDatagram> batch) override;
  size_t recv_batch(std::span<RxDatagram> batch) override;
  int readable_fd() const override { return fd_; }
  IoCounters counters() const override { return io_; }

  // The address and port the socket is bound to (the address may be the wildcard).
  const Endpoint& local() const { return local_; }

 private:
  // Room for one IP_PKTINFO/IPV6_PKTINFO plus one traffic-class and one hop-limit cmsg.
  static constexpr size_t kCmsgBytes =
      CMSG_SPACE(sizeof(in6_pktinfo)) + 2 * CMSG_SPACE(sizeof(int));
  struct alignas(cmsghdr) CmsgBuffer {
    uint8_t bytes[kCmsgBytes];
  };

  UdpSocketIo(int fd, int family, const Endpoint& local);
  // Fills tx_msgs_[i] for `d`; false if the datagram cannot be sent on this socket.
  bool prepare_tx(size_t i, const TxDatagram& d);

  int fd_;
  int family_;
  Endpoint local_;
  IoCounters io_;
  std::array<mmsghdr, kMaxBatch> msgs_{};
  std::array<sockaddr_storage, kMaxBatch> names_{};
  std::array<iovec, kMaxBatch> rx_iov_{};
  std::array<CmsgBuffer, kMaxBatch> cmsg_{};
};

}  // namespace urdma::net
