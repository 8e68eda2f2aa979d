// PacketIo over a real, already-bound UDP socket: the path the engine uses outside simulation.
//
// One sendmmsg per send_batch and one recvmmsg per recv_batch, straight from and into the
// caller's iovecs and buffers (no staging copy). Two exceptions save what a conversation pays
// for the batch calls (their setup costs more than the single-message calls'): a send of one
// message is a sendmsg; and after a read that found at most one datagram, the next reads one
// by recvmsg — recvmmsg would go back to the socket for a second that is not there — until a
// one-datagram read finds one, when the next reads a batch again.
//
// The socket is set up so that what the kernel puts on the wire is what a RoCEv2 ICRC can cover:
//  * IP_MTU_DISCOVER = IP_PMTUDISC_DO (and IPV6_MTU_DISCOVER): the kernel never fragments and sets
//    DF; for a DF datagram on an unconnected socket Linux writes IP ID 0 (ip_select_ident_segs),
//    so the receiver, which never sees the IP ID, can assume 0 in the IPv4 header the ICRC covers
//    (except for segments of a segmented send: "Segmentation offload" below);
//  * IP_PKTINFO / IPV6_RECVPKTINFO: every received datagram reports its destination address (the
//    ICRC covers it; a socket bound to the wildcard address would not know it otherwise), and a
//    send may pick its source address (the path's source GID);
//  * O_NONBLOCK: no call ever blocks; readable_fd() is for the engine's poll/epoll when idle.
//
// UDP source ports. The ICRC covers the UDP source port, and a socket sends only from the port it
// is bound to (the slot socket: 4791). For per-QP ECMP entropy (RoCEv2 annex A17.4.1; rxe hashes
// the QPN into 0xC000..0xFFFF) the I/O may own a small pool of send-only sockets bound, with
// SO_REUSEPORT, to ports P in 0xC000..0xFFFF; pool slot i holds a port with (P & 0x3FFF) % K == i
// (K, the pool size, a power of two). source_port(wanted) names the port a datagram asking for
// `wanted` leaves from — the pool slot (wanted & 0x3FFF) % K, so consecutive QPNs spread over the
// pool — and send() picks the socket by TxDatagram::src_port, rejecting a port it does not have
// (never a datagram sealed for another port). The pool sockets are never connect()ed (IP ID 0 with
// DF, as the main socket), take the same IP_PMTUDISC_DO and IP_PKTINFO source choice, and drop
// whatever arrives at them in the kernel (a drop-all socket filter, a minimal receive buffer):
// RoCEv2 traffic always goes to 4791. A slot whose port cannot be bound (another user holds every
// candidate) falls back to the main socket's port. Cost: K extra fds (docs/ARCHITECTURE.md,
// "Decisions").
//
// Segmentation offload (UDP GSO). send_batch hands the kernel a run of consecutive datagrams of
// one flow (same socket, destination, source address, traffic class and hop limit) as ONE send
// with UDP_SEGMENT when all but the last have the same size and the last is no larger: one trip
// through the UDP/IP stack for up to kMaxGsoSegments packets (a 64 KiB message is 16 packets at
// MTU 4096), split by the device that has USO, else in software just before the device — or not
// at all on lo and veth, where the receiving socket splits it (or a UDP_GRO socket takes it
// whole). The gather list is still the caller's memory. The segments' IPv4 IDs are 0, 1, 2, ...
// (the super-packet has ID 0, as every datagram here, and Linux numbers the segments from it),
// and the ICRC covers the ID: so segment i >= 1 of an IPv4 run leaves with its ICRC replaced by
// one for ID i (wire::ipv4_id_icrc_delta, into a 4-byte buffer of this I/O; the caller's buffers
// are never written). A receiver that sees the IP header (rxe, tshark) checks exactly that; a
// UDP-socket receiver solves for the ID (wire/icrc.h). A send the kernel refuses for the
// offload goes out again as single datagrams; a kernel or path without it (EIO: no checksum
// offload; ENOPROTOOPT) turns it off for good. UdpSocketIoOptions::gso = false (URDMA_UDP_GSO=0)
// turns it off from the start.
//
// Receive offload (UDP GRO). With UdpSocketIoOptions::gro the socket takes UDP_GRO: a segmented
// send that reaches it whole (lo, veth) stays one receive instead of being split into a
// datagram each, and a device's GRO may coalesce a flow's datagrams too; recv_batch reports the
// segment size (RxDatagram::segment_bytes) and the caller splits. Every receive buffer must then
// hold kMaxUdpPayloadBytes (rx_buffer_bytes()), which is why it is asked for, never a default.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/check.h"
#include "net/packet_io.h"

namespace urdma::net {

// RoCEv2's UDP source-port range for flow entropy (annex A17.4.1; rxe's RXE_ROCE_V2_SPORT).
inline constexpr uint16_t kFlowPortBase = 0xC000;
inline constexpr uint16_t kFlowPortMask = 0x3FFF;  // 14 bits: 0xC000..0xFFFF
// Largest source-port pool; the default the runtime uses (make_packet_io_from_env).
inline constexpr size_t kMaxSourcePorts = 64;
inline constexpr size_t kDefaultSourcePorts = 16;

// A socket buffer size for UdpSocketIoOptions::socket_buffer_bytes. Linux's default receive
// buffer (net.core.rmem_default, ~208 KiB) holds ~25 datagrams of 4 KiB once skb overhead is
// counted, while one RC QP may have EngineConfig::max_unacked_pkts (128) request packets in
// flight: a burst from a fast sender then overflows it and turns into go-back-N
// retransmissions. 4 MiB holds several QPs' windows. (Runtime::open sizes urdmad's slot
// sockets itself; the loopback benchmark passes this.)
inline constexpr size_t kLargeSocketBufferBytes = size_t{4} << 20;

// Most datagrams in one UDP_SEGMENT send (the kernel's UDP_MAX_SEGMENTS on Linux 6.1).
inline constexpr size_t kMaxGsoSegments = 64;

// The local address the kernel sends from toward `dst` (a UDP socket connected to it is asked its
// name; nothing is sent); nullopt when no route leads there.
std::optional<Address> route_source(const Address& dst);

struct UdpSocketIoOptions {
  // Send-only sockets on ports in 0xC000..0xFFFF (above): 0 = send only from the bound port, or a
  // power of two <= kMaxSourcePorts.
  size_t source_ports = 0;
  // SO_RCVBUF / SO_SNDBUF for the socket, best effort: SO_RCVBUFFORCE / SO_SNDBUFFORCE when the
  // process may (CAP_NET_ADMIN), else the plain options, which the kernel caps at
  // net.core.rmem_max / wmem_max. 0 = leave the socket's sizes alone.
  size_t socket_buffer_bytes = 0;
  // UDP segmentation offload for runs of datagrams (above); off when the kernel lacks it.
  bool gso = true;
  // UDP receive offload (above); off when the kernel lacks it. Off by default: a caller must
  // offer receive buffers of rx_buffer_bytes() (the engine does; urdmad's MAD router, with its
  // MAD-sized buffers, does not ask for it). The runtime's I/O turns it on
  // (make_packet_io_from_env).
  bool gro = false;
};

class UdpSocketIo final : public PacketIo {
 public:
  // Takes ownership of `fd`, a bound AF_INET or AF_INET6 SOCK_DGRAM socket, configures it as
  // above and opens the source-port pool. On failure returns null with the reason in *error, and
  // the fd is closed.
  static std::unique_ptr<UdpSocketIo> adopt(int fd, std::string* error,
                                            const UdpSocketIoOptions& options = {});
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
  uint16_t source_port(uint16_t wanted) const override;
  // Whether sends may use UDP segmentation offload now (the option, and the kernel took it).
  bool gso() const { return gso_; }
  bool gro() const { return gro_; }
  size_t rx_buffer_bytes() const override { return gro_ ? kMaxUdpPayloadBytes : 0; }

  // The address and port the socket is bound to (the address may be the wildcard).
  const Endpoint& local() const { return local_; }
  // The pool's ports by slot (empty without a pool); a slot that fell back holds local().port.
  std::span<const uint16_t> source_ports() const { return pool_ports_; }

 private:
  // Room for one IP_PKTINFO/IPV6_PKTINFO, one traffic-class and one hop-limit cmsg, and the
  // UDP_SEGMENT size.
  static constexpr size_t kCmsgBytes = CMSG_SPACE(sizeof(in6_pktinfo)) +
                                       2 * CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(uint16_t));
  struct alignas(cmsghdr) CmsgBuffer {
    uint8_t bytes[kCmsgBytes];
  };
  // Most iovecs of one segmented send (the kernel's UIO_MAXIOV).
  static constexpr size_t kMaxMsgIov = 1024;

  UdpSocketIo(int fd, int family, const Endpoint& local);
  // Opens the pool's sockets; false with the reason in *error on a failure other than a port
  // taken by someone else.
  // Their send buffers get sndbuf_bytes (socket_buffer_bytes).
  bool open_pool(size_t count, size_t sndbuf_bytes, std::string* error);
  // The socket that sends from `port`, or -1 if there is none.
  int fd_for_port(uint16_t port) const;
  // Fills msgs_[i] for `d` (its addresses and cmsgs, and its own iovecs); false if the datagram
  // cannot be sent at all.
  bool prepare_tx(size_t i, const TxDatagram& d);
  // How many datagrams from batch[0] may leave as one segmented send (1 without offload).
  size_t gso_run(std::span<const TxDatagram> batch) const;
  // Turns msgs_[i], prepared for run[0], into one send of the whole run: gathers the run's
  // iovecs from tx_iov_[*iov_used], re-sealing IPv4 segments for their IDs, and adds the
  // UDP_SEGMENT cmsg. `first` is the run's index in the batch (its ICRC buffers).
  void gather_run(size_t i, std::span<const TxDatagram> run, size_t first, size_t* iov_used);

  int fd_;
  int family_;
  Endpoint local_;
  std::vector<uint16_t> pool_ports_;  // by slot
  std::vector<int> pool_fds_;         // by slot; fd_ for a slot that fell back (not owned)
  IoCounters io_;
  std::array<mmsghdr, kMaxBatch> msgs_{};
  std::array<sockaddr_storage, kMaxBatch> names_{};
  std::array<iovec, kMaxBatch> rx_iov_{};
  std::array<CmsgBuffer, kMaxBatch> cmsg_{};
  bool gso_ = false;
  bool gro_ = false;
  bool rx_one_ = false;  // the next recv_batch reads one datagram (recvmsg)
  // Segmented sends: datagrams per message of the sendmmsg being built, their gathered iovecs,
  // and the replaced ICRCs (by datagram index in the batch).
  std::array<uint8_t, kMaxBatch> run_length_{};
  std::array<iovec, kMaxBatch*(kMaxTxIov + 1)> tx_iov_{};
  std::array<std::array<uint8_t, 4>, kMaxBatch> icrc_{};
};

}  // namespace urdma::net
