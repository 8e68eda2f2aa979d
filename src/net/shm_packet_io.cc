#include "net/shm_packet_io.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/check.h"

namespace urdma::net {
namespace {

// RoCEv2's multicast QPN (IBA 9.6.1.2): never a ring's, whatever range it falls in.
constexpr uint32_t kMulticastQpn = 0xFFFFFF;
constexpr unsigned kRangeShift = 12;  // daemon/steering.h's kSlotShift: 4096 QPNs per range

void epoll_add(int epfd, int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  base::check(epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) == 0, "epoll_ctl(ADD) on the shm set");
}

// The BTH's DestQP (bytes 5-7, wire/headers.h) of a datagram about to be sent; kMulticastQpn
// when the first piece does not hold it (a datagram the engine did not build: not for a ring).
uint32_t dest_qp(const TxDatagram& d) {
  if (d.iov.empty() || d.iov[0].iov_len < 8) return kMulticastQpn;
  const auto* b = static_cast<const uint8_t*>(d.iov[0].iov_base);
  return (uint32_t{b[5]} << 16) | (uint32_t{b[6]} << 8) | b[7];
}

}  // namespace

ShmPacketIo::Peer::~Peer() {
  if (base != nullptr) munmap(base, kShmRegionBytes);
  if (doorbell >= 0) close(doorbell);
}

ShmPacketIo::ShmPacketIo(std::unique_ptr<PacketIo> inner, const Clock& clock, uint32_t own_range,
                         int doorbell, Want want, IsLocal is_local)
    : inner_(std::move(inner)),
      clock_(clock),
      own_range_(own_range),
      want_(std::move(want)),
      is_local_(std::move(is_local)) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  base::check(epoll_fd_ >= 0, "epoll_create1 for the shm set");
  epoll_add(epoll_fd_, inner_->readable_fd(), EPOLLIN);
  if (doorbell >= 0) {
    epoll_add(epoll_fd_, doorbell, EPOLLIN);
    doorbells_.push_back(doorbell);
  }
}

ShmPacketIo::~ShmPacketIo() {
  close(epoll_fd_);
  for (int fd : doorbells_) close(fd);
}

void ShmPacketIo::add_doorbell(int doorbell) {
  std::lock_guard lock(mu_);
  if (doorbells_.size() >= kMaxDoorbells) {
    close(doorbell);
    return;
  }
  epoll_add(epoll_fd_, doorbell, EPOLLIN);
  doorbells_.push_back(doorbell);
  rung_maybe_ = true;  // it may have rung already: read it with the others
}

int ShmPacketIo::add_peer(uint32_t peer_range, uint32_t side, int region_fd, int peer_doorbell) {
  auto peer = std::make_unique<Peer>();
  peer->range = peer_range;
  peer->doorbell = peer_doorbell;
  struct stat st{};
  const int seals = fcntl(region_fd, F_GET_SEALS);
  constexpr int kNeeded = F_SEAL_SHRINK | F_SEAL_GROW;
  if (side > 1 || fstat(region_fd, &st) != 0 ||
      static_cast<size_t>(st.st_size) != kShmRegionBytes || seals < 0 ||
      (seals & kNeeded) != kNeeded) {
    close(region_fd);
    return EINVAL;
  }
  // Populated here, on the thread that hands the region over: otherwise the engine's turns take
  // the first lap's page faults, one per 4 KiB of ring (on these VMs ~20 us each: the 99th
  // percentile of a ping-pong's first 50,000 rounds). The region's 8 MiB are in use after one
  // lap anyway.
  void* base = mmap(nullptr, kShmRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                    region_fd, 0);
  const int err = errno;
  close(region_fd);
  if (base == MAP_FAILED) return err;
  peer->base = base;
  peer->side = side;
  peer->region_id = static_cast<uint64_t>(st.st_ino);
  std::lock_guard lock(mu_);
  changes_.push_back({true, peer_range, std::move(peer)});
  changed_.store(true, std::memory_order_release);
  ring_own_doorbell();
  return 0;
}

// mu_ held. A thread asleep on readable_fd() takes the change now: the peer may be writing to
// the new ring already, and nothing else would wake it.
void ShmPacketIo::ring_own_doorbell() {
  if (doorbells_.empty()) return;
  const uint64_t one = 1;
  ssize_t n = write(doorbells_.back(), &one, sizeof one);
  (void)n;
  rung_maybe_ = true;
}

void ShmPacketIo::remove_peer(uint32_t peer_range) {
  std::lock_guard lock(mu_);
  changes_.push_back({false, peer_range, nullptr});
  changed_.store(true, std::memory_order_release);
  ring_own_doorbell();
}

void ShmPacketIo::take_changes() {
  std::vector<std::unique_ptr<Peer>> gone;  // unmapped after the lock is let go
  std::lock_guard lock(mu_);
  changed_.store(false, std::memory_order_relaxed);
  for (Change& c : changes_) {
    auto it = std::find_if(peers_.begin(), peers_.end(),
                           [&](const auto& p) { return p->range == c.range; });
    Peer* existing = it != peers_.end() ? it->get() : nullptr;
    if (!c.add) {
      if (existing != nullptr && !existing->closing) {
        existing->closing = true;
        ++closing_;
      }
      continue;
    }
    // The region urdmad pushed and the one it answered are the same: the first one taken
    // stays (its indices are live).
    if (existing != nullptr && existing->region_id == c.peer->region_id && !existing->closing) {
      gone.push_back(std::move(c.peer));
      continue;
    }
    if (existing != nullptr) {
      if (existing->closing) --closing_;
      if (existing->rx->armed()) rung_maybe_ = true;  // it may have rung: read with the rest
      gone.push_back(std::move(*it));
      peers_.erase(it);
    }
    if (peers_.size() >= kMaxPeers) {
      gone.push_back(std::move(c.peer));
      continue;
    }
    // The indices are read here, on the I/O's thread, when the ring starts being used.
    Peer& p = *c.peer;
    p.tx = std::make_unique<ShmProducer>(shm_ring_header(p.base, p.side),
                                         shm_ring_data(p.base, p.side));
    p.rx = std::make_unique<ShmConsumer>(shm_ring_header(p.base, 1 - p.side),
                                         shm_ring_data(p.base, 1 - p.side));
    // A process that sleeps now must hear from the new ring too.
    if (armed_ > 0 && !p.rx->arm()) rung_maybe_ = true;
    peers_.push_back(std::move(c.peer));
    ++shm_.peers;
  }
  changes_.clear();
  next_rx_ = 0;
  peer_count_.store(peers_.size(), std::memory_order_relaxed);
}

void ShmPacketIo::drop_closed() {
  std::vector<std::unique_ptr<Peer>> gone;
  std::lock_guard lock(mu_);
  for (auto it = peers_.begin(); it != peers_.end();) {
    Peer& p = **it;
    if (p.closing && (p.dropping.load(std::memory_order_relaxed) || !p.rx->pending())) {
      --closing_;
      if (p.rx->armed()) rung_maybe_ = true;  // it may have rung: read with the rest
      gone.push_back(std::move(*it));
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
  next_rx_ = 0;
  peer_count_.store(peers_.size(), std::memory_order_relaxed);
}

ShmPacketIo::Peer* ShmPacketIo::find(uint32_t range) const {
  for (const auto& p : peers_)
    if (p->range == range) return p.get();
  return nullptr;
}

bool ShmPacketIo::local(const Address& a) {
  for (const auto& [addr, yes] : local_seen_)
    if (addr == a) return yes;
  const bool yes = is_local_ && is_local_(a);
  if (local_seen_.size() >= 64) local_seen_.erase(local_seen_.begin());
  local_seen_.emplace_back(a, yes);
  return yes;
}

// The peer whose ring takes a datagram for `dst` and `qpn`; null for the wrapped I/O, and with
// *ask set when the range has no region yet (a local destination: route() asks urdmad for one).
ShmPacketIo::Peer* ShmPacketIo::region_for(const Address& dst, uint32_t qpn, bool* ask) {
  *ask = false;
  const uint32_t range = qpn >> kRangeShift;
  if (qpn == kMulticastQpn || range == 0 || range == own_range_) return nullptr;
  Peer* p = find(range);
  if (p != nullptr) return !p->closing && local(dst) ? p : nullptr;
  *ask = want_ && local(dst);
  return nullptr;
}

bool ShmPacketIo::icrc_needed(const Endpoint& dst, uint32_t dest_qp) {
  if (changed_.load(std::memory_order_acquire)) [[unlikely]]
    take_changes();
  bool ask = false;
  const Peer* p = peers_.empty() ? nullptr : region_for(dst.address, dest_qp, &ask);
  // A broken ring drops what is sent to it: sealed or not, nobody reads it.
  if (p == nullptr) return inner_->icrc_needed(dst, dest_qp);
  return false;
}

ShmPacketIo::Peer* ShmPacketIo::route(const TxDatagram& d) {
  const uint32_t qpn = dest_qp(d);
  bool ask = false;
  Peer* p = region_for(d.dst.address, qpn, &ask);
  if (p != nullptr || !ask) return p;
  const uint32_t range = qpn >> kRangeShift;
  const uint64_t now = clock_.now_ns();
  auto it = std::find_if(asked_.begin(), asked_.end(), [&](const auto& a) { return a.first == range; });
  if (it != asked_.end() && now - it->second < kAskAgainNs) return nullptr;
  if (it != asked_.end()) {
    it->second = now;
  } else {
    if (asked_.size() >= 256) asked_.erase(asked_.begin());
    asked_.emplace_back(range, now);
  }
  ++shm_.asked;
  want_(d.dst.address, qpn);
  return nullptr;
}

TxStatus ShmPacketIo::put(Peer& p, const TxDatagram& d) {
  if (p.dropping.load(std::memory_order_relaxed)) {
    ++shm_.tx_dropped;
    ++io_.tx_rejected;
    return TxStatus::kRejected;
  }
  const size_t length = d.size_bytes();
  if (length > kShmMaxPayloadBytes || d.iov.size() > kMaxTxIov) {
    ++io_.tx_rejected;
    return TxStatus::kRejected;
  }
  ShmRecord r{};
  r.src_port = d.src_port;
  r.traffic_class = d.traffic_class;
  r.hop_limit = d.hop_limit;
  // A socket's kernel would pick the source for an unspecified one: for a local destination,
  // the destination itself.
  const Address& src = d.src.is_unspecified() ? d.dst.address : d.src;
  std::memcpy(r.src, src.bytes().data(), sizeof r.src);
  std::memcpy(r.dst, d.dst.address.bytes().data(), sizeof r.dst);
  switch (p.tx->put(r, d.iov, length)) {
    case ShmProducer::Put::kOk:
      p.full_since_ns = 0;
      ++shm_.tx_datagrams;
      ++io_.tx_datagrams;
      io_.tx_bytes += length;
      return TxStatus::kSent;
    case ShmProducer::Put::kFull: {
      // Full for a moment: the engine waits. Full for long (a peer stopped or gone with its
      // region still held): lost, as a full socket buffer loses datagrams; the ring is used
      // again when it has room.
      const uint64_t now = clock_.now_ns();
      if (p.full_since_ns == 0) p.full_since_ns = now;
      if (now - p.full_since_ns < kStuckNs) {
        ++shm_.tx_full;
        ++io_.tx_would_block;
        blocked_ = true;
        return TxStatus::kWouldBlock;
      }
      break;
    }
    case ShmProducer::Put::kBroken:
      ++shm_.broken;
      p.dropping.store(true, std::memory_order_relaxed);
      break;
  }
  ++shm_.tx_dropped;
  ++io_.tx_rejected;
  return TxStatus::kRejected;
}

void ShmPacketIo::set_socket_blocked(bool blocked) {
  if (blocked == socket_blocked_) return;
  socket_blocked_ = blocked;
  update_writable_watch();
}

void ShmPacketIo::publish_all() {
  for (const auto& p : peers_) {
    if (!p->tx->publish()) continue;
    const uint64_t one = 1;
    ssize_t n = write(p->doorbell, &one, sizeof one);
    (void)n;  // EAGAIN only near 2^64: readable anyway
    ++shm_.doorbells;
  }
}

TxStatus ShmPacketIo::send(const TxDatagram& d) {
  if (changed_.load(std::memory_order_acquire)) [[unlikely]]
    take_changes();
  blocked_ = false;
  Peer* p = peers_.empty() && !want_ ? nullptr : route(d);
  if (p == nullptr) {
    const TxStatus s = inner_->send(d);
    set_socket_blocked(s == TxStatus::kWouldBlock);
    return s;
  }
  const TxStatus s = put(*p, d);
  publish_all();
  return s;
}

size_t ShmPacketIo::send_batch(std::span<const TxDatagram> batch) {
  if (changed_.load(std::memory_order_acquire)) [[unlikely]]
    take_changes();
  blocked_ = false;
  size_t done = 0;
  while (done < batch.size()) {
    // The run of datagrams for the socket goes as one batch (sendmmsg, GSO).
    size_t run = done;
    Peer* p = nullptr;
    while (run < batch.size() && (p = route(batch[run])) == nullptr) ++run;
    if (run > done) {
      const size_t sent = inner_->send_batch(batch.subspan(done, run - done));
      done += sent;
      set_socket_blocked(done < run);
      if (done < run) break;
    }
    if (p == nullptr) break;
    if (put(*p, batch[done]) == TxStatus::kWouldBlock) break;
    ++done;
  }
  publish_all();
  return done;
}

size_t ShmPacketIo::recv_batch(std::span<RxDatagram> batch) {
  if (changed_.load(std::memory_order_acquire)) [[unlikely]]
    take_changes();
  size_t n = 0;
  const size_t count = peers_.size();
  for (size_t k = 0; k < count && n < batch.size(); ++k) {
    Peer& p = *peers_[(next_rx_ + k) % count];
    if (p.dropping.load(std::memory_order_relaxed)) continue;
    while (n < batch.size()) {
      RxDatagram& d = batch[n];
      ShmRecord r;
      size_t length = 0;
      const ShmConsumer::Get got = p.rx->get(&r, d.buffer, &length);
      if (got == ShmConsumer::Get::kEmpty) break;
      if (got == ShmConsumer::Get::kBroken) {
        ++shm_.broken;
        p.dropping.store(true, std::memory_order_relaxed);
        break;
      }
      d.length = std::min(length, d.buffer.size());
      d.truncated = length > d.buffer.size();
      d.segment_bytes = 0;
      d.via_ring = true;
      Address::Bytes a;
      std::memcpy(a.data(), r.src, a.size());
      d.src = Endpoint{Address(a), r.src_port};
      std::memcpy(a.data(), r.dst, a.size());
      d.dst = Endpoint{Address(a), kRoceV2UdpPort};
      ++n;
      ++shm_.rx_datagrams;
      ++io_.rx_datagrams;
      io_.rx_bytes += d.length;
      if (d.truncated) ++io_.rx_truncated;
    }
    p.rx->release();
  }
  if (count > 0) next_rx_ = (next_rx_ + 1) % count;
  if (closing_ > 0) [[unlikely]]
    drop_closed();
  if (n == batch.size()) return n;
  // The socket: always without regions; with them, when due (shm_packet_io.h).
  const uint64_t now = count > 0 ? clock_.now_ns() : 0;
  const uint64_t interval =
      socket_watched_.load(std::memory_order_relaxed) ? kUdpWatchedPollNs : kUdpPollNs;
  const bool rang = rang_awake_.load(std::memory_order_relaxed);
  if (rang) rang_awake_.store(false, std::memory_order_relaxed);
  if (count > 0 && !udp_due_.load(std::memory_order_relaxed) &&
      now - last_udp_poll_ns_ < (rang ? kUdpWatchedPollNs : interval)) {
    ++shm_.udp_polls_skipped;
    return n;
  }
  udp_due_.store(false, std::memory_order_relaxed);
  last_udp_poll_ns_ = now;
  const size_t from_socket = inner_->recv_batch(batch.subspan(n));
  for (size_t i = n; i < n + from_socket; ++i) batch[i].via_ring = false;
  return n + from_socket;
}

IoCounters ShmPacketIo::counters() const {
  IoCounters c = inner_->counters();
  c.tx_datagrams += io_.tx_datagrams;
  c.tx_bytes += io_.tx_bytes;
  c.tx_would_block += io_.tx_would_block;
  c.tx_rejected += io_.tx_rejected;
  c.rx_datagrams += io_.rx_datagrams;
  c.rx_bytes += io_.rx_bytes;
  c.rx_truncated += io_.rx_truncated;
  return c;
}

uint64_t ShmPacketIo::next_deadline_ns() const {
  const uint64_t inner = inner_->next_deadline_ns();
  if (!blocked_) return inner;
  return std::min(inner, clock_.now_ns() + kRetryNs);
}

// mu_ held. Reads the doorbell if it may have been written since it was last read: by this
// process (rung_maybe_), or by a producer that took a ring's request (ShmConsumer::settle_taken:
// a ring whose request still stands has rung nothing); whether it had rung. An arming that
// nobody answered costs no read.
bool ShmPacketIo::take_doorbell() {
  bool due = rung_maybe_;
  for (const auto& p : peers_) due = p->rx->settle_taken() || due;
  if (!due) return false;
  rung_maybe_ = false;
  bool rang = false;
  for (int fd : doorbells_) {
    uint64_t v;
    rang = read(fd, &v, sizeof v) == sizeof v || rang;
  }
  return rang;
}

bool ShmPacketIo::arm_wakeup() {
  std::lock_guard lock(mu_);
  ++armed_;
  // A doorbell written after the last one was read (a producer that saw this side armed just
  // before disarm_wakeup): read now, or it would end this sleep at once (and every later one:
  // epoll is level-triggered). Only a ring this I/O armed can have rung it.
  take_doorbell();
  bool idle = true;
  for (const auto& p : peers_) {
    if (p->dropping.load(std::memory_order_relaxed)) continue;
    if (p->rx->arm()) continue;
    idle = false;
    rung_maybe_ = true;  // withdrawn, but the producer may have taken it first
  }
  for (const Change& c : changes_)
    if (c.add) idle = false;  // a region came: take it first
  return idle;
}

bool ShmPacketIo::rx_pending() {
  std::lock_guard lock(mu_);
  for (const auto& p : peers_)
    if (!p->dropping.load(std::memory_order_relaxed) && p->rx->pending()) return true;
  return !changes_.empty();
}

void ShmPacketIo::disarm_wakeup(bool readable) {
  std::lock_guard lock(mu_);
  if (armed_ > 0) --armed_;
  // Not readable: neither the doorbell nor the socket has anything (a doorbell written since
  // is read by the next arm_wakeup).
  if (readable) {
    rung_maybe_ = true;  // the doorbell is in the set that was readable: read it
    woke();
  }
  // The other sleeper's requests stand; one a producer takes is seen by take_doorbell.
  if (armed_ > 0) return;
  for (const auto& p : peers_)
    if (p->rx->disarm()) rung_maybe_ = true;  // its doorbell write comes: the next arm reads it
}

// A producer writes the doorbell once per arming (it takes the ring's wake flag): when two
// threads sleep armed and one wakes, reads the doorbell and takes a turn, the other sleeps on
// with its flags taken and is woken by nothing that comes later. The waker may also have read
// the doorbell add_peer rang and left without a turn (its event came): the region waits in
// changes_, and its peer writes to a ring nobody here reads or arms until a turn takes it.
void ShmPacketIo::rearm_wakeup() {
  std::lock_guard lock(mu_);
  if (armed_ == 0) return;
  bool waiting = !changes_.empty();
  for (const auto& p : peers_) {
    if (p->rx->settle_taken()) rung_maybe_ = true;  // taken since the waker read the doorbell
    if (p->dropping.load(std::memory_order_relaxed)) continue;
    if (p->rx->arm()) continue;
    waiting = true;
    rung_maybe_ = true;  // withdrawn, but the producer may have taken it first
  }
  if (waiting) ring_own_doorbell();  // records the waker left: the sleeper takes them
}

void ShmPacketIo::woke_readable() {
  std::lock_guard lock(mu_);
  rung_maybe_ = true;  // the doorbell is in the set that was readable: read it
  woke();
}

// mu_ held: a thread woke. The doorbell is read at once: left counted, it keeps readable_fd()
// readable, and the epoll set of the runtime's engine thread — which gets the fd back when a
// waiting application thread is done (runtime.cc, Watch) — would wake that thread for records
// the waiter's own turn takes. A doorbell that had rung says a ring woke the thread, and the
// next receive leaves the socket alone (shm_packet_io.h, RECEIVE); otherwise the socket did (or
// a timer, a post), and it is read on the next receive.
void ShmPacketIo::woke() {
  if (take_doorbell())
    rang_awake_.store(true, std::memory_order_relaxed);
  else
    udp_due_.store(true, std::memory_order_relaxed);
}

void ShmPacketIo::watch_writable(bool on) {
  inner_->watch_writable(on);
  want_writable_ = on;
  update_writable_watch();
}

// EPOLLOUT on the socket only while the socket itself refused a datagram: a full ring is
// retried by the deadline (next_deadline_ns), and a socket that is writable, as it nearly
// always is, would keep the set readable and the caller from ever sleeping.
void ShmPacketIo::update_writable_watch() {
  const bool out = want_writable_ && socket_blocked_;
  if (out == watching_out_) return;
  watching_out_ = out;
  epoll_event ev{};
  ev.events = EPOLLIN | (out ? EPOLLOUT : 0u);
  ev.data.fd = inner_->readable_fd();
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, inner_->readable_fd(), &ev);
}

}  // namespace urdma::net
