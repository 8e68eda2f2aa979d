// The packet-I/O seam: the only way the engine reaches the network.
//
// The engine knows nothing of sockets. It hands datagrams to a PacketIo and takes datagrams from
// it; behind it sit either a real UDP slot socket (sendmmsg/recvmmsg on UDP 4791) or one host of
// the simulated network (tests/support/sim_network.h). The shapes are chosen so the real path needs no copies:
//  * transmit is a gather list (iovec): BTH and friends from an engine header buffer, the payload
//    straight out of registered memory, the ICRC from the header buffer again. These map 1:1 onto
//    msghdr.msg_iov;
//  * receive fills buffers the caller owns, in batches that map 1:1 onto recvmmsg's mmsghdr array.
//
// All calls are non-blocking and made from the engine thread only; an implementation is not
// thread-safe unless it says so.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "net/address.h"
#include "net/clock.h"
#include "wire/icrc.h"

namespace urdma::net {

// RoCEv2's UDP destination port, defined once with the wire format (wire/icrc.h).
using wire::kRoceV2UdpPort;

// Largest UDP payload over IPv4: 65535 - 20 (IPv4 header) - 8 (UDP header). RoCEv2 packets are
// far smaller (path MTU <= 4096 plus headers); this is only the hard limit of the transport.
inline constexpr size_t kMaxUdpPayloadBytes = 65'507;

// Most iovecs one datagram may have: headers, payload SGEs, ICRC. Bounded so implementations can
// keep fixed arrays (Linux's UIO_MAXIOV is 1024; we need far fewer).
inline constexpr size_t kMaxTxIov = 16;

// Largest batch a single send_batch / recv_batch call takes; larger batches are the caller's bug.
inline constexpr size_t kMaxBatch = 64;

// One datagram to transmit. Only borrowed memory: everything it points at need only live until
// send / send_batch returns — the implementation copies or consumes it before returning.
struct TxDatagram {
  std::span<const iovec> iov;  // the UDP payload, gathered in order; at most kMaxTxIov entries
  Endpoint dst;                // destination address; port is kRoceV2UdpPort for RoCEv2
  // UDP source port. RoCEv2 uses it as flow entropy (e.g. per QP) so ECMP spreads flows
  // (IBA Annex A17). The ICRC covers it, so it must be the port the datagram really leaves from:
  // a sender asks PacketIo::source_port() first and seals with the answer. An I/O that cannot
  // send from this port rejects the datagram (kRejected) rather than send a wrong ICRC.
  uint16_t src_port = kRoceV2UdpPort;
  // Local source address; unspecified = let the I/O choose (the host's address in the simulation,
  // the kernel's route choice on a socket). Set from the AH / path's source GID.
  Address src;
  // IP traffic class (DSCP << 2 | ECN) and hop limit from the GRH; 0 = the I/O's default.
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;

  size_t size_bytes() const {
    size_t n = 0;
    for (const iovec& v : iov) n += v.iov_len;
    return n;
  }
};

enum class TxStatus : uint8_t {
  kSent,        // accepted: it left (or, in the simulation, entered the network)
  kWouldBlock,  // the transmit queue is full; nothing was sent, try again later
  kRejected,    // never will be sent (too big, too many iovecs, no route); counted, dropped
};

// One receive slot: the caller provides `buffer`; recv_batch fills in the rest.
struct RxDatagram {
  std::span<uint8_t> buffer;  // in: where the UDP payload goes
  size_t length = 0;          // out: bytes stored in buffer
  bool truncated = false;     // out: the datagram was longer than buffer; the excess is lost
  Endpoint src;               // out: sender address and UDP source port
  // out: the local address and port it was sent to (IP_PKTINFO / IPV6_PKTINFO on a socket). The
  // ICRC covers both. The IP ID is not reported: a UDP socket never sees it.
  Endpoint dst;
  // out: 0 for one datagram. Otherwise the kernel coalesced several datagrams of this flow (UDP
  // GRO): `buffer` holds them back to back, each segment_bytes long except the last, which may
  // be shorter. Only an I/O that says so in rx_buffer_bytes() coalesces.
  size_t segment_bytes = 0;
  // out: it crossed no link (a shared-memory ring, shm_packet_io.h), and a zero ICRC means its
  // sender left it unsealed (PacketIo::icrc_needed); a socket's datagram is always sealed.
  bool via_ring = false;
};

// Per-I/O counters, the same for every implementation.
struct IoCounters {
  uint64_t tx_datagrams = 0;
  uint64_t tx_bytes = 0;
  uint64_t tx_would_block = 0;
  uint64_t tx_rejected = 0;
  // Datagrams that left as segments of one send with UDP segmentation offload (UDP_SEGMENT),
  // and how many such sends there were (udp_socket_io.h, "Segmentation offload").
  uint64_t tx_gso_datagrams = 0;
  uint64_t tx_gso_sends = 0;
  uint64_t rx_datagrams = 0;
  uint64_t rx_bytes = 0;
  uint64_t rx_truncated = 0;
  // Receives that held several datagrams (UDP GRO), and how many datagrams they held; those
  // datagrams are also in rx_datagrams.
  uint64_t rx_gro_receives = 0;
  uint64_t rx_gro_datagrams = 0;
  // Reads that asked for one datagram (recvmsg) where the caller offered a batch, the last
  // read having found at most one (udp_socket_io.h); found or not.
  uint64_t rx_one_reads = 0;
};

class PacketIo {
 public:
  virtual ~PacketIo() = default;

  // The UDP source port a datagram that asks for `wanted` will leave from: `wanted` itself when
  // the I/O can send from any port (the simulation), else one of the ports it has (a socket's
  // bound port, a pool of per-flow ports: udp_socket_io.h). Stable for a given `wanted`, and
  // source_port(source_port(p)) == source_port(p). A TxDatagram whose src_port is a port this
  // returns is never rejected for its port.
  virtual uint16_t source_port(uint16_t wanted) const { return wanted; }

  // Whether a datagram to `dst` whose BTH DestQP is `dest_qp` must carry its ICRC: false only
  // where it will cross no link (a shared-memory ring) and no layer on its way changes its bytes
  // (a fault profile that corrupts). The sender then leaves the ICRC zero (unsealed), and the
  // receiver's I/O marks it RxDatagram::via_ring. Asked on the I/O's thread just before the
  // datagram is sent; a route that changes in between (a region that goes) sends it unsealed
  // by UDP, where the receiver drops it as a bad packet.
  virtual bool icrc_needed(const Endpoint& dst, uint32_t dest_qp) {
    (void)dst;
    (void)dest_qp;
    return true;
  }

  // Transmits one datagram. kRejected datagrams are dropped and counted, like a lost packet.
  virtual TxStatus send(const TxDatagram& d) = 0;

  // Transmits datagrams in order (sendmmsg on a socket) and returns how many were consumed from
  // the front — sent or rejected. Fewer than batch.size() means the rest would block; they remain
  // the caller's to retry. batch.size() <= kMaxBatch.
  virtual size_t send_batch(std::span<const TxDatagram> batch) = 0;

  // Receives up to batch.size() (<= kMaxBatch) waiting datagrams into the caller's buffers and
  // returns how many slots were filled, from the front; 0 when nothing is waiting. Never blocks.
  virtual size_t recv_batch(std::span<RxDatagram> batch) = 0;

  // A file descriptor that polls readable (epoll/poll, level-triggered) while datagrams wait, for
  // an engine thread that sleeps when idle. -1 if the I/O has none: the simulated network's
  // driver (SimWorld) instead polls a host's participants when it delivers to that host.
  virtual int readable_fd() const = 0;

  // The receive buffer each RxDatagram must offer: 0 = any size (a datagram longer than its
  // buffer is truncated, as always); otherwise the I/O may coalesce datagrams into one receive
  // (RxDatagram::segment_bytes) up to this many bytes, and a smaller buffer would lose them.
  virtual size_t rx_buffer_bytes() const { return 0; }

  virtual IoCounters counters() const = 0;

  // When this I/O next needs a call (send, send_batch or recv_batch) even if no datagram comes:
  // a held-back datagram's time (FaultyPacketIo). kNever for I/Os that need none. An engine
  // thread that sleeps bounds its sleep by it, as by its own timers.
  virtual uint64_t next_deadline_ns() const { return kNever; }

  // Any thread, around a sleep on readable_fd(): arm_wakeup asks for datagrams that do not make
  // the fd readable by themselves (shm_packet_io.h: a peer's ring) to do so, and is false when
  // some wait already (do not sleep: disarm and take a turn); disarm_wakeup withdraws it,
  // `readable` false when the sleep saw readable_fd() not readable. Each arm_wakeup has its
  // disarm_wakeup, true or false. A socket's I/O needs neither.
  virtual bool arm_wakeup() { return true; }
  virtual void disarm_wakeup(bool readable) { (void)readable; }
  // Any thread: a thread that still sleeps armed may have lost its wake-up to another that woke
  // and read what woke both (the runtime's engine thread, while an application thread waited
  // with the fd out of its set): ask for it again, and make the fd readable if some wait.
  virtual void rearm_wakeup() {}
  // Any thread: whether such datagrams wait now (a thread that spins before it sleeps looks).
  virtual bool rx_pending() { return false; }

  // The caller also waits for room to send, on readable_fd() — where that fd is not the socket
  // itself (an epoll set of the decorator's: shm_packet_io.h), it becomes readable when the
  // socket is writable. A socket's I/O needs nothing: the caller polls its fd for POLLOUT.
  virtual void watch_writable(bool on) { (void)on; }
};

}  // namespace urdma::net
