// The shared-memory path: a PacketIo decorator that hands datagrams for another urdma process of
// this host to it through a ring in shared memory (shm_ring.h) instead of the kernel's UDP
// stack, and everything else to the I/O it wraps (the slot's UdpSocketIo).
//
//   Udp <- ShmPacketIo <- CaptureTap <- FaultyPacketIo <- engine    (packet_io_env.h)
//
// A datagram takes a ring when its destination address is one of this host's (IsLocal) and its
// BTH DestQP lies in the QPN range of a peer slot this process has a region with (add_peer).
// The datagram is the same but for its ICRC, which the engine leaves zero for one a ring will
// take (icrc_needed: memory is no link); the receiver's engine is handed it as a socket's,
// with the endpoints a socket reports, marked via_ring (a zero ICRC is then no bad one).
// The capture tap and the fault profile sit above, so they see and act on both paths alike.
//
// REGIONS come from urdmad (daemon/protocol.h, kShmConnect / kShmOn): the first datagram for a
// local destination whose range has no region goes by UDP and asks for one (Want, on the I/O's
// thread; the runtime asks urdmad on another thread and calls add_peer when the answer comes).
// A range urdmad refused is asked again only after kAskAgainNs.
//
// RECEIVE copies each record out of the ring into the caller's buffer before anything looks at it
// (shm_ring.h: nothing in the region is trusted). The UDP socket is read too, but while regions
// exist at most every kUdpPollNs on a busy path (each read is a syscall, and on these VMs a
// syscall costs more than a ring's whole round trip), and on the first receive after a sleep that
// the doorbell did not end (disarm): a datagram that woke the process is read at once. After a
// sleep the doorbell ended, the first receive leaves the socket alone unless it was last read
// kUdpWatchedPollNs ago: a datagram there keeps readable_fd() readable, so the next sleep ends at
// once without the doorbell and reads it, and a conversation over a ring, whose every hop is such
// a wake-up, makes no read of an empty socket on each. While another thread sleeps on
// readable_fd() for it (watch_socket: the runtime's engine thread napping beside a busy poller),
// the socket is read when that thread says it became readable (woke_readable), and otherwise at
// most every kUdpWatchedPollNs.
//
// SLEEPING: readable_fd() is an epoll set of the wrapped I/O's fd and this process's doorbell;
// a thread about to sleep on it calls arm_wakeup() first (false: records wait, do not sleep)
// and disarm_wakeup() after, which reads the doorbell (the set is readable no longer).
// Producers write the doorbell only for an armed consumer.
//
// BACK-PRESSURE AND DEATH: a full ring is kWouldBlock (the engine keeps the datagram and retries;
// next_deadline_ns() asks for the retry soon). A ring that has been full for kStuckNs (a peer that
// died or stopped with its region still held) drops what is sent to it while it stays full, and
// one found broken (scribbled) drops everything until remove_peer; both counted in tx_rejected.
// The peer's RC connections then end by their retry counts, as with a vanished wire peer.
//
// THREADS: send, send_batch, recv_batch and counters() are the I/O thread's (the engine's turn
// holder); add_peer and remove_peer may run on any thread (handed over through a mutex, taken
// at the next call); arm_wakeup and disarm_wakeup on any thread (under the same mutex).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "net/clock.h"
#include "net/packet_io.h"
#include "net/shm_ring.h"

namespace urdma::net {

// The shared-memory path's own counters (beside the IoCounters it adds its datagrams to).
struct ShmCounters {
  uint64_t tx_datagrams = 0;  // written to a ring
  uint64_t rx_datagrams = 0;  // read from a ring
  uint64_t tx_full = 0;       // sends a full ring turned away (kWouldBlock)
  uint64_t tx_dropped = 0;    // sent to a stuck or broken ring: dropped
  uint64_t broken = 0;        // rings found scribbled on (either direction)
  uint64_t doorbells = 0;     // doorbell writes for a sleeping peer
  uint64_t asked = 0;         // Want calls
  uint64_t peers = 0;         // regions taken (add_peer)
  uint64_t udp_polls_skipped = 0;  // receives that left the socket for later
};

class ShmPacketIo final : public PacketIo {
 public:
  // A datagram for `dst`, local, whose DestQP `qpn` is in a range with no region: ask urdmad.
  // Called on the I/O's thread; must not block.
  using Want = std::function<void(const Address& dst, uint32_t qpn)>;
  // Whether `a` is an address of this host (the device's GID table).
  using IsLocal = std::function<bool(const Address& a)>;

  static constexpr uint64_t kAskAgainNs = 1'000'000'000;
  static constexpr uint64_t kUdpPollNs = 20'000;
  static constexpr uint64_t kUdpWatchedPollNs = 1'000'000;
  static constexpr uint64_t kStuckNs = 100'000'000;
  static constexpr uint64_t kRetryNs = 20'000;
  static constexpr size_t kMaxPeers = 128;

  // `own_range`: this process's QPN range (its own datagrams go by UDP); `doorbell`: its
  // doorbell eventfd (adopted). `clock` must outlive this.
  ShmPacketIo(std::unique_ptr<PacketIo> inner, const Clock& clock, uint32_t own_range,
              int doorbell, Want want, IsLocal is_local);
  ~ShmPacketIo() override;
  ShmPacketIo(const ShmPacketIo&) = delete;
  ShmPacketIo& operator=(const ShmPacketIo&) = delete;

  // Any thread: the region with the slot of QPN range `peer_range` (urdmad's memfd, checked for
  // its size and seals, and the peer's doorbell; both adopted). This process writes ring `side`
  // and reads the other. A second region for the same range replaces the first. 0 or an errno
  // (EINVAL: bad size, seals or side; mmap's).
  int add_peer(uint32_t peer_range, uint32_t side, int region_fd, int peer_doorbell);
  // Any thread: the peer's lease ended; its region goes once its ring is read.
  void remove_peer(uint32_t peer_range);
  // Any thread: another doorbell of this process's (adopted), which peers given regions from now
  // on write — a restarted urdmad made it (daemon/client.h, ShmPush). Peers of the regions held
  // keep writing the ones before, which stay in the set. At most kMaxDoorbells (more: closed).
  void add_doorbell(int doorbell);
  static constexpr size_t kMaxDoorbells = 8;

  uint16_t source_port(uint16_t wanted) const override { return inner_->source_port(wanted); }
  // False for a datagram a ring will take: memory is no link, and the receiver's copy is the
  // sender's bytes (RxDatagram::via_ring).
  bool icrc_needed(const Endpoint& dst, uint32_t dest_qp) override;
  TxStatus send(const TxDatagram& d) override;
  size_t send_batch(std::span<const TxDatagram> batch) override;
  size_t recv_batch(std::span<RxDatagram> batch) override;
  int readable_fd() const override { return epoll_fd_; }
  size_t rx_buffer_bytes() const override { return inner_->rx_buffer_bytes(); }
  IoCounters counters() const override;
  uint64_t next_deadline_ns() const override;
  bool arm_wakeup() override;
  void disarm_wakeup(bool readable) override;
  void rearm_wakeup() override;
  bool rx_pending() override;
  void watch_writable(bool on) override;
  // Any thread: `on` while it sleeps on readable_fd() with no ring armed (only the socket and
  // add_peer's doorbell make it readable); woke_readable() when that sleep ended readable.
  void watch_socket(bool on) { socket_watched_.store(on, std::memory_order_relaxed); }
  void woke_readable();
  // Any thread: whether the I/O has a region, and so reads the socket only when due (RECEIVE);
  // without one, every recv_batch reads it.
  bool has_peers() const { return peer_count_.load(std::memory_order_relaxed) != 0; }

  // The I/O thread's (tests, `urdma status`).
  ShmCounters shm_counters() const { return shm_; }
  size_t peers() const { return peers_.size(); }

 private:
  struct Peer {
    uint32_t range = 0;
    unsigned side = 0;
    void* base = nullptr;  // the region's mapping
    uint64_t region_id = 0;  // the memfd's inode: the same region handed over twice is one
    int doorbell = -1;     // the peer's
    // The peer's lease ended (remove_peer): nothing more is sent to it, and its ring is read
    // until it is empty — the last datagrams it sent (an ACK, say) before it exited.
    bool closing = false;
    std::unique_ptr<ShmProducer> tx;
    std::unique_ptr<ShmConsumer> rx;
    uint64_t full_since_ns = 0;  // 0: not full
    // Broken: sends are dropped and its ring is not read (set by the I/O thread, read by
    // threads about to sleep).
    std::atomic<bool> dropping{false};
    ~Peer();
  };
  struct Change {
    bool add = false;
    uint32_t range = 0;
    std::unique_ptr<Peer> peer;
  };
  // Where datagram `d` goes: a peer, or null for the wrapped I/O.
  Peer* route(const TxDatagram& d);
  Peer* region_for(const Address& dst, uint32_t qpn, bool* ask);
  Peer* find(uint32_t range) const;
  bool local(const Address& a);
  // One datagram into its ring.
  TxStatus put(Peer& p, const TxDatagram& d);
  void publish_all();
  void take_changes();
  void ring_own_doorbell();
  bool take_doorbell();
  void woke();
  void set_socket_blocked(bool blocked);
  void update_writable_watch();
  // Drops closing peers whose rings are read (or broken).
  void drop_closed();

  std::unique_ptr<PacketIo> inner_;
  const Clock& clock_;
  const uint32_t own_range_;
  std::vector<int> doorbells_;  // under mu_ after construction: this process's, oldest first
  int epoll_fd_ = -1;
  Want want_;
  IsLocal is_local_;

  // Peers and changes: the I/O thread reads peers_ without the lock (it alone changes it, and
  // only under the lock, so that arm_wakeup on another thread sees a whole list).
  std::mutex mu_;
  std::atomic<bool> changed_{false};
  std::vector<Change> changes_;  // under mu_
  std::vector<std::unique_ptr<Peer>> peers_;
  unsigned armed_ = 0;  // under mu_: threads between arm_wakeup and disarm_wakeup
  bool rung_maybe_ = false;  // under mu_: the doorbell may have been written since last read
  std::atomic<bool> udp_due_{true};
  std::atomic<bool> rang_awake_{false};  // the doorbell ended a sleep: skip the socket once
  std::atomic<bool> socket_watched_{false};
  std::atomic<size_t> peer_count_{0};  // peers_.size(), stored under mu_ when it changes

  // The I/O thread's.
  std::vector<std::pair<Address, bool>> local_seen_;   // IsLocal's answers
  std::vector<std::pair<uint32_t, uint64_t>> asked_;   // range -> when Want was called
  uint64_t last_udp_poll_ns_ = 0;
  size_t next_rx_ = 0;  // the peer a receive starts with (round robin)
  size_t closing_ = 0;  // peers closing
  bool blocked_ = false;  // the last send found a ring full
  bool socket_blocked_ = false;  // the socket refused the last datagram sent to it
  bool want_writable_ = false;   // watch_writable's
  bool watching_out_ = false;    // EPOLLOUT on the socket in epoll_fd_
  IoCounters io_;  // this path's datagrams
  ShmCounters shm_;
};

}  // namespace urdma::net
