// The runtime; see runtime.h for the threading design.
#include "runtime/runtime.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <thread>
#include <utility>

#include "base/check.h"
#include "net/capture_tap.h"
#include "net/packet_io_env.h"
#include "net/shm_packet_io.h"
#include "runtime/lazy_timer.h"

namespace urdma::runtime {
namespace {

// SO_RCVBUF asked for the slot socket: room for a few QPs' windows of full-MTU packets.
constexpr int kSlotReceiveBufferBytes = 4 << 20;

// Inline turns within one busy-poll window that mark an application thread busy-polling its CQ
// (one that sleeps on a completion channel makes one or two per completion).
constexpr uint64_t kInlineTurnsOfAPoller = 8;

provider::DeviceConfig with_doorbell(provider::DeviceConfig c, provider::Doorbell* doorbell) {
  c.doorbell = doorbell;
  return c;
}

void add_to_epoll(int epoll_fd, int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  base::check(epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0, "epoll_ctl(ADD)");
}

// The counters urdmad shows in `urdma status`, in daemon::kCounterNames order, and the QPs the
// process has.
daemon::CounterReport counter_report(const engine::EngineCounters& c, uint32_t qp_count) {
  daemon::CounterReport r{};
  r.qp_count = qp_count;
  const uint64_t values[] = {c.sent_pkts,           c.rcvd_pkts,
                             c.duplicate_request,   c.out_of_seq_request,
                             c.rcvd_rnr_err,        c.send_rnr_err,
                             c.rcvd_seq_err,        c.ack_deferred,
                             c.retry_exceeded_err,  c.retry_rnr_exceeded_err,
                             c.completer_retry_err, c.send_err,
                             c.link_downed,         c.rdma_sends,
                             c.rdma_recvs,          c.drops(),
                             c.drop_uc_access};
  static_assert(std::size(values) == daemon::kCounterCount);
  std::copy(std::begin(values), std::end(values), r.counters);
  return r;
}

// Arms a timerfd at an absolute MonotonicClock deadline (CLOCK_MONOTONIC, the timerfd's clock);
// kNever disarms it.
void arm_timer(int fd, uint64_t deadline_ns) {
  itimerspec its{};
  if (deadline_ns != net::kNever) {
    constexpr uint64_t kNsPerSecond = 1'000'000'000;
    its.it_value.tv_sec = static_cast<time_t>(deadline_ns / kNsPerSecond);
    its.it_value.tv_nsec = static_cast<long>(deadline_ns % kNsPerSecond);
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
  }
  base::check(timerfd_settime(fd, TFD_TIMER_ABSTIME, &its, nullptr) == 0, "timerfd_settime");
}

// Reads an eventfd/timerfd counter to zero (EAGAIN when it was not readable: fine).
void drain_fd(int fd) {
  uint64_t value;
  while (read(fd, &value, sizeof value) < 0 && errno == EINTR) {
  }
}

}  // namespace

// Asks urdmad for shared-memory regions (daemon/protocol.h, kShmConnect) on a thread of its own:
// the I/O asks on the engine's turn, which must not wait for urdmad's reply. The thread starts
// with the first request; a request the queue has no room for is dropped (the I/O asks again).
class Runtime::ShmBroker {
 public:
  explicit ShmBroker(daemon::Client* client) : client_(client) {}
  ~ShmBroker() {
    {
      std::lock_guard lock(mu_);
      stopped_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  void set_io(net::ShmPacketIo* io) { io_ = io; }

  // The I/O's thread (ShmPacketIo::Want).
  void want(const net::Address& dst, uint32_t qpn) {
    std::lock_guard lock(mu_);
    if (stopped_ || queue_.size() >= kMaxQueued) return;
    queue_.emplace_back(dst, qpn);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    cv_.notify_one();
  }

 private:
  static constexpr size_t kMaxQueued = 64;

  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stopped_ || !queue_.empty(); });
      if (stopped_) return;
      const auto [dst, qpn] = queue_.front();
      queue_.pop_front();
      lock.unlock();
      // Refused (another user's slot, a remote address, a peer without the path): the datagrams
      // keep going by UDP, and the I/O asks again later.
      daemon::ShmPair pair;
      if (client_->shm_connect(dst, qpn, &pair) == 0)
        io_->add_peer(pair.peer_range, pair.side, pair.region.release(),
                      pair.peer_doorbell.release());
      lock.lock();
    }
  }

  daemon::Client* const client_;
  net::ShmPacketIo* io_ = nullptr;  // set before the engine runs
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<net::Address, uint32_t>> queue_;  // under mu_
  bool stopped_ = false;                                  // under mu_
  std::thread thread_;
};

Runtime::Runtime(std::unique_ptr<net::PacketIo> io, RuntimeConfig config)
    : shm_io_(config.shm_io),
      io_(std::move(io)),
      device_(with_doorbell(std::move(config.device), &relay_)),
      engine_(device_, *io_, clock_, config.engine),
      has_thread_(config.engine_thread),
      waiting_thread_drives_(config.waiting_thread_drives),
      busy_poll_(config.busy_poll_ns, config.busy_poll_adaptive) {
  relay_.set_waker(this);
  if (!has_thread_) return;
  base::check(io_->readable_fd() >= 0, "the engine thread needs a PacketIo with a readable fd");
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  app_timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  base::check(epoll_fd_ >= 0 && event_fd_ >= 0 && timer_fd_ >= 0 && app_timer_fd_ >= 0,
              "epoll/eventfd/timerfd");
  add_to_epoll(epoll_fd_, io_->readable_fd());
  add_to_epoll(epoll_fd_, event_fd_);
  add_to_epoll(epoll_fd_, timer_fd_);
  add_to_epoll(epoll_fd_, app_timer_fd_);
  thread_ = std::thread([this] { run(); });
}

Runtime::~Runtime() {
  if (client_) client_->stop_keeping();  // its counter source reads the engine
  shm_broker_.reset();                   // it hands regions to the I/O
  if (thread_.joinable()) {
    stop_.store(true, std::memory_order_seq_cst);
    const uint64_t one = 1;
    ssize_t n = write(event_fd_, &one, sizeof one);
    (void)n;
    wake_token_waiter();
    thread_.join();
  }
  relay_.set_waker(nullptr);
  for (int fd : {app_timer_fd_, timer_fd_, event_fd_, epoll_fd_})
    if (fd >= 0) close(fd);
}

std::unique_ptr<Runtime> Runtime::open(const daemon::ClientOptions& options, RuntimeConfig config,
                                       int* err, std::string* detail) {
  auto client = std::make_unique<daemon::Client>();
  if (int e = daemon::Client::connect_or_spawn(options, client.get(), detail)) {
    *err = e;
    return nullptr;
  }
  auto slot = std::make_unique<daemon::Slot>();
  if (int e = client->acquire_slot(slot.get())) {
    *err = e;
    *detail = "urdmad leased no slot";
    return nullptr;
  }
  // The slot's QPNs steer to its socket; QP0/QP1 are the daemon's (range 0 is never leased).
  config.device.qpn_base = slot->info.qpn_base;
  // The slot keeps its own copy (the keeper thread hands it back after a daemon restart).
  const int fd = dup(slot->fd.get());
  if (fd < 0) {
    *err = errno;
    *detail = "dup of the slot socket failed";
    return nullptr;
  }
  // The receive buffer holds what arrives while the engine thread is not running. The default
  // (net.core.rmem_default, 208 KiB) is less than one QP's send window: 128 unacknowledged 4 KiB
  // packets take ~1 MiB of socket memory (truesize), so on a busy host the kernel dropped whole
  // bursts (UdpRcvbufErrors) and RC crawled through ACK timeouts — 16 MiB of WRITEs on loopback
  // took 3-5 s instead of 0.2 s. Best effort: the kernel caps it at net.core.rmem_max.
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &kSlotReceiveBufferBytes, sizeof kSlotReceiveBufferBytes);
  // The slot socket as UdpSocketIo with per-flow source ports, wrapped per URDMA_FAULTS. The
  // clock a fault wrapper keeps must outlive it: MonotonicClock is stateless, one static will do.
  static const net::MonotonicClock kFaultClock;
  net::CaptureTap* tap = nullptr;
  // The shared-memory path: a doorbell from urdmad says this process reads rings. A urdmad that
  // has none to give (an older protocol) leaves the process on UDP alone.
  bool shm = true;
  if (!net::shm_enabled_from_env(&shm, detail)) {
    close(fd);
    *err = EINVAL;
    return nullptr;
  }
  daemon::UniqueFd doorbell;
  if (shm && client->shm_accept(&doorbell) != 0) shm = false;
  auto broker = shm ? std::make_unique<ShmBroker>(client.get()) : nullptr;
  // Set once the runtime exists; the I/O asks only after a QP sent something.
  auto device_of = std::make_shared<provider::Device*>(nullptr);
  net::ShmSetup setup;
  if (shm) {
    setup.own_range = daemon::range_of_qpn(slot->info.qpn_base);
    setup.doorbell = doorbell.release();
    setup.want = [b = broker.get()](const net::Address& dst, uint32_t qpn) { b->want(dst, qpn); };
    setup.is_local = [device_of](const net::Address& a) {
      return *device_of != nullptr && (*device_of)->has_gid(a.bytes());
    };
  }
  std::unique_ptr<net::PacketIo> io =
      net::make_packet_io_from_env(fd, kFaultClock, detail, &tap, shm ? &setup : nullptr);
  if (!io) {
    *err = EIO;
    return nullptr;
  }
  config.shm_io = setup.io;
  auto rt = std::make_unique<Runtime>(std::move(io), std::move(config));
  *device_of = &rt->device_;
  if (broker) broker->set_io(setup.io);
  rt->shm_broker_ = std::move(broker);
  // The client keeps the slot through daemon restarts and reports the counters to urdmad
  // (daemon/client.h); ~Runtime stops it before the engine goes.
  Runtime* r = rt.get();
  auto report = [r] { return counter_report(r->counters(), r->device().qp_count()); };
  // A capturer's socket (`urdma capture`) goes to the taps: the engine's, and librdmacm's.
  rt->engine_tap_ = tap;
  auto capture = [r](daemon::UniqueFd socket, uint32_t at) {
    r->capture_pushed(std::move(socket), at);
  };
  // Regions urdmad made for a peer that asked (kShmOn), and the end of a peer's lease (kShmOff).
  auto shm_push = [r](daemon::ShmPush push) {
    if (r->shm_io_ == nullptr) return;
    if (push.own_doorbell.valid()) {
      r->shm_io_->add_doorbell(push.own_doorbell.release());
      return;
    }
    if (!push.on) {
      r->shm_io_->remove_peer(push.pair.peer_range);
      return;
    }
    r->shm_io_->add_peer(push.pair.peer_range, push.pair.side, push.pair.region.release(),
                         push.pair.peer_doorbell.release());
  };
  if (int e = client->keep(std::move(*slot), report, capture, shm_push)) {
    *err = e;
    *detail = "could not keep the slot";
    return nullptr;
  }
  rt->client_ = std::move(client);
  *err = 0;
  return rt;
}

namespace {

// A capture whose capturer closed its end: the socket hangs up.
bool capture_ended(int fd) {
  pollfd p{fd, 0, 0};
  return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

int dup_cloexec(int fd) {
  return fcntl(fd, F_DUPFD_CLOEXEC, 0);
}

}  // namespace

void Runtime::capture_pushed(daemon::UniqueFd socket, uint32_t slot) {
  std::lock_guard lock(capture_mu_);
  std::erase_if(capture_sockets_, [](const auto& c) { return capture_ended(c.first.get()); });
  for (net::CaptureTap* t : capture_taps_)
    if (const int copy = dup_cloexec(socket.get()); copy >= 0) t->add_sink(copy, slot);
  if (const int copy = dup_cloexec(socket.get()); copy >= 0)
    capture_sockets_.emplace_back(daemon::UniqueFd(copy), slot);
  if (engine_tap_ != nullptr) engine_tap_->add_sink(socket.release(), slot);
}

void Runtime::add_capture_tap(net::CaptureTap* tap) {
  std::lock_guard lock(capture_mu_);
  std::erase_if(capture_sockets_, [](const auto& c) { return capture_ended(c.first.get()); });
  capture_taps_.push_back(tap);
  for (const auto& [socket, slot] : capture_sockets_)
    if (const int copy = dup_cloexec(socket.get()); copy >= 0) tap->add_sink(copy, slot);
}

// Poster side of the need-wakeup handshake (runtime.h).
void Runtime::wake() {
  if (!has_thread_) return;
  doorbell_.store(true, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst)) {
    wakeups_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t one = 1;
    ssize_t n = write(event_fd_, &one, sizeof one);
    (void)n;  // EAGAIN only if the counter is near 2^64: it is readable anyway
  }
}

namespace {
// The runtime of the completion event this thread took last, until the thread posts a send
// (Runtime::send_posted).
thread_local const Runtime* t_event_from = nullptr;
}  // namespace

void Runtime::event_taken() {
  t_event_from = this;
}

// A thread that took a completion event usually answers it, and the engine thread often sleeps
// by then (the waiting thread took the datagram's turn itself). Waking it for the answer costs
// a second wake-up per hop, and on a loaded host the woken thread waits for a core. The first
// send after the event takes the turn here instead; later ones ring as usual, so a burst still
// leaves in the engine thread's batches (a turn per post would cost a sendmmsg per message).
void Runtime::send_posted() {
  if (!has_thread_) return;
  if (t_event_from == this) {
    t_event_from = nullptr;
    if ((sleeping_.load(std::memory_order_seq_cst) || napping_.load(std::memory_order_seq_cst)) &&
        take_turn(kReply))
      return;
  }
  wake();
}

void Runtime::release_token() {
  token_.store(kFree, std::memory_order_seq_cst);
  // Pairs with the engine thread's store of engine_waits_token_ before its re-check. Taken, not
  // read: one wake per wait. An application thread that polls in a loop releases the token
  // many times before the woken engine thread gets a core (2 cores, both spinning), and each
  // release that saw the flag still set paid a futex syscall.
  if (engine_waits_token_.load(std::memory_order_seq_cst) &&
      engine_waits_token_.exchange(false, std::memory_order_seq_cst))
    wake_token_waiter();
  else if (app_waits_token_.load(std::memory_order_seq_cst) &&
           app_waits_token_.exchange(false, std::memory_order_seq_cst))
    wake_token_waiter();
}

void Runtime::wake_token_waiter() {
  token_wakes_.fetch_add(1, std::memory_order_seq_cst);
  token_wakes_.notify_all();
}

bool Runtime::try_progress() {
  return take_turn(kPoll);
}

bool Runtime::progress_now() {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::nanoseconds(kProgressWaitNs);
  while (!take_turn(kPoll)) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

bool Runtime::take_turn(TurnKind kind) {
  uint32_t expected = kFree;
  if (!token_.compare_exchange_strong(expected, kApplication, std::memory_order_acquire,
                                      std::memory_order_relaxed))
    return false;
  // A turn's recvmmsg and sendmmsg are cancellation points, and a thread cancelled in one
  // (rping cancels its CQ thread, blocked in ibv_get_cq_event, which now takes turns) would
  // leave a batch half done and the token taken for good: no cancellation inside a turn. Where
  // rdma-core can be cancelled — the wait in ibv_get_cq_event — ours can too (poll, outside).
  int cancel_state;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
  // Every turn sees everything rung before this exchange, as the engine thread's turn does
  // (run()); the engine thread need not take a turn for it when it wakes — nor, napping beside
  // a busy poller, queue for the token because a post rang while the poller polled.
  if (doorbell_.load(std::memory_order_seq_cst)) doorbell_.exchange(false, std::memory_order_seq_cst);
  // A reply turn does not read the socket: it runs after this thread's wait gave the socket
  // back to the engine thread's epoll set (or another thread still waits and watches it), so
  // a datagram that came meanwhile wakes one of them; in a conversation the read found
  // nothing — a syscall per answer for nothing.
  uint64_t turn_ns;
  bool blocked;
  {
    const net::TurnTime turn_time;  // the clock is read once for the turn (net/clock.h)
    turn_ns = turn_time.ns();
    const uint64_t deadline = std::min(engine_.poll(/*hold_acks=*/kind != kWait,
                                                    /*receive=*/kind != kReply),
                                       io_->next_deadline_ns());
    blocked = engine_.tx_blocked();
    if (has_thread_ && !blocked) set_app_timer(deadline);
  }
  // Reply turns are not polls: inline_turns_ is how the engine thread tells a busy-polling
  // thread. Counted under the token, which orders the writers: no locked instruction.
  std::atomic<uint64_t>& turns = kind == kReply ? reply_turns_ : inline_turns_;
  turns.store(turns.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (kind == kPoll) last_poll_ns_.store(turn_ns, std::memory_order_relaxed);
  release_token();
  pthread_setcancelstate(cancel_state, nullptr);
  // Blocked on transmit: the engine thread must wait for EPOLLOUT, which only it can ask for.
  if (has_thread_ && blocked) wake();
  return true;
}

// Token holder only. The engine thread may sleep on a later deadline than this turn left (a
// retransmission timer this turn started, an ACK held for a reply): the application timer
// wakes it then, instead of waking it now to re-arm its own. Set to what this turn left, later
// too when the armed time is near: an ACK held for a reply that then carried it must not wake
// the engine thread for nothing; a far one is left to fire early once (lazy_timer.h).
void Runtime::set_app_timer(uint64_t deadline) {
  const uint64_t armed = armed_deadline_ns_.load(std::memory_order_seq_cst);
  // 0: the engine thread is awake and reads the deadline itself before it sleeps.
  const uint64_t want = (armed != 0 && deadline < armed) ? deadline : net::kNever;
  set_timer(app_timer_fd_, &app_timer_ns_, want);
}

// A timerfd of this runtime, set lazily (lazy_timer.h): `*armed` is what it is set for.
void Runtime::set_timer(int fd, uint64_t* armed, uint64_t want) {
  if (*armed == want) return;
  if (!LazyTimer::must_set(*armed, want, clock_.now_ns())) return;
  *armed = want;
  arm_timer(fd, want);
}

void Runtime::run() {
  engine_tid_.store(gettid(), std::memory_order_release);
  while (!stop_.load(std::memory_order_acquire)) {
    uint32_t expected = kFree;
    if (!token_.compare_exchange_strong(expected, kEngineThread, std::memory_order_acquire,
                                        std::memory_order_relaxed)) {
      // A thread that busy-polls holds the token: nap beside it (NAPPING). Queued for the
      // token, this thread would take a turn between two of the poller's, each costing the
      // poller a futex wake and a core it spins on. Not when a post or a blocked transmit
      // rang for this thread (doorbell_): that turn is its to take; nor right after a nap that
      // a datagram ended: the socket stays readable until the poller reads it, and napping
      // again at once would spin.
      const bool nap_woke = nap_woke_;
      nap_woke_ = false;
      if (!nap_woke && !doorbell_.load(std::memory_order_seq_cst) &&
          clock_.now_ns() - last_poll_ns_.load(std::memory_order_relaxed) < kPollerNs) {
        nap_woke_ = sleep_until(net::kNever);
        continue;
      }
      // An application thread drives the engine: sleep until it lets go of the token. On the
      // wake generation, not on the token: an application thread that polls in a loop has
      // taken the token again by the time this thread runs, and a wait on the token would
      // sleep on without asking for another wake.
      const uint32_t generation = token_wakes_.load(std::memory_order_seq_cst);
      engine_waits_token_.store(true, std::memory_order_seq_cst);
      if (token_.load(std::memory_order_seq_cst) == kApplication &&
          !stop_.load(std::memory_order_seq_cst))
        token_wakes_.wait(generation, std::memory_order_seq_cst);
      engine_waits_token_.store(false, std::memory_order_relaxed);  // set again before a wait
      continue;
    }
    // Everything rung before this point is seen by this turn (poll() reads the engine's own
    // doorbell flags after this store).
    doorbell_.store(false, std::memory_order_seq_cst);
    // Awake, this thread reads every deadline before it sleeps again.
    uint64_t deadline;
    uint64_t ring_records = 0;  // read from shared-memory rings this turn
    {
      const net::TurnTime turn_time;  // the clock is read once for the turn (net/clock.h)
      set_timer(app_timer_fd_, &app_timer_ns_, net::kNever);
      const uint64_t rx_before = shm_io_ != nullptr ? shm_io_->shm_counters().rx_datagrams : 0;
      // The I/O's own timers too (a fault wrapper's held datagrams: net/packet_io.h).
      deadline = std::min(engine_.poll(), io_->next_deadline_ns());
      if (shm_io_ != nullptr) ring_records = shm_io_->shm_counters().rx_datagrams - rx_before;
    }
    want_writable(engine_.tx_blocked());
    release_token();
    turns_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t turn_end = clock_.now_ns();
    if (deadline <= turn_end) continue;
    // A peer streams through a ring (STREAMS, runtime.h): look at the rings a little longer
    // before sleeping.
    if (ring_records >= kStreamRecords && spin_on_rings(turn_end + kStreamSpinNs)) continue;
    // A turn after a nap that nothing woke is the nap's look around: no spin (the application
    // thread drove the engine, or stopped and the thread now sleeps).
    const bool after_nap = napped_idle_;
    napped_idle_ = false;
    if (busy_poll_.ns() != 0 && !after_nap) {
      // Busy-poll window: keep taking turns while work may come soon.
      const uint64_t until = turn_end + busy_poll_.ns();
      // Ends at once on a post (the doorbell), a due timer, or a datagram (epoll with no
      // timeout: the socket, doorbell and timers are its fds; a datagram stays pending for the
      // turn, a timer or eventfd that fired is read here — left readable, it would end every
      // later window at once and the thread would never sleep); and when an application thread
      // is seen busy-polling its CQ — it drives the engine itself, and a spinning engine thread
      // would only take its core (2 cores).
      nap_socket(false);  // the socket is one of them
      const uint64_t inline_before = inline_turns_.load(std::memory_order_relaxed);
      bool more = false;
      bool app_polls = false;
      epoll_event ready[4];
      while (!more && !app_polls && clock_.now_ns() < until &&
             !stop_.load(std::memory_order_relaxed)) {
        more = doorbell_.load(std::memory_order_seq_cst) || clock_.now_ns() >= deadline ||
               io_->rx_pending();
        if (!more) {
          const int n = epoll_wait(epoll_fd_, ready, 4, 0);
          for (int i = 0; i < n; ++i)
            if (ready[i].data.fd != io_->readable_fd()) drain_fd(ready[i].data.fd);
          more = n > 0;
        }
        app_polls =
            inline_turns_.load(std::memory_order_relaxed) - inline_before >= kInlineTurnsOfAPoller;
      }
      const uint64_t spin_end = clock_.now_ns();
      busy_poll_.spun(spin_end - turn_end, spin_end);
      if (more) {
        busy_poll_hits_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
    }
    // Work that wakes the thread (not its timer) tells the window how soon it came.
    if (sleep_until(deadline)) {
      const uint64_t woke = clock_.now_ns();
      busy_poll_.work_came_after(woke - turn_end, woke);
    }
  }
}

// Spins until `until` or until a ring has records, a post rings or an application thread takes
// poll turns (it drives the engine itself); whether there is work. No syscall: a datagram on the
// socket waits for the sleep that follows.
bool Runtime::spin_on_rings(uint64_t until) {
  const uint64_t inline_before = inline_turns_.load(std::memory_order_relaxed);
  // The clock every 32 looks: a reading costs as much as a look (kvm-clock, net/clock.h).
  for (uint32_t i = 0; (i % 32 != 0 || clock_.now_ns() < until); ++i) {
    if (stop_.load(std::memory_order_relaxed)) return false;
    if (doorbell_.load(std::memory_order_seq_cst) || io_->rx_pending()) return true;
    if (inline_turns_.load(std::memory_order_relaxed) != inline_before) return false;
  }
  return false;
}

// The application thread that waits for a completion event watches the socket itself (and
// takes the turn a datagram asks for) while the engine thread keeps sleeping on its timers and
// doorbell: the datagram wakes one thread, the one that wants the event, instead of the engine
// thread, which would then wake it through the channel. Waking a sleeping thread is the cost
// that matters on a VM whose idle vCPUs halt. The first watcher takes the socket out of the
// engine thread's epoll set and the last one puts it back (level-triggered: what arrived
// meanwhile is reported at once).
//
// Not EPOLLEXCLUSIVE sets: they would save the two epoll_ctl per wait, but a woken waiter leaves
// the socket's wait queue until it waits again, so the next datagram — the reply behind an ACK
// — would wake the engine thread, which would then take turns beside the application thread.
int Runtime::wait_readable(int fd, const bool& delivered) {
  const int sock = io_->readable_fd();
  if (!has_thread_ || sock < 0) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, -1) < 0 ? errno : 0;
  }
  // An object, so that a thread cancelled in poll() (a cancellation point, as read() is in
  // rdma-core's ibv_get_cq_event) gives the socket back as it unwinds.
  struct Watch {
    Runtime* rt;
    explicit Watch(Runtime* r) : rt(r) {
      std::lock_guard lock(rt->watch_mutex_);
      // Blocked on transmit, the engine thread waits for EPOLLOUT on it: left in.
      if (rt->watchers_++ == 0 && !rt->epollout_ && !rt->socket_out_)
        rt->socket_out_ =
            epoll_ctl(rt->epoll_fd_, EPOLL_CTL_DEL, rt->io_->readable_fd(), nullptr) == 0;
    }
    ~Watch() {
      {
        std::lock_guard lock(rt->watch_mutex_);
        if (--rt->watchers_ == 0 && rt->socket_out_ &&
            !rt->nap_out_.load(std::memory_order_relaxed))
          rt->socket_back();
      }
      // The engine thread, or another waiting thread, may sleep armed with its wake-up taken by
      // this thread's: the doorbell that woke this thread is read (net/shm_packet_io.cc,
      // rearm_wakeup).
      rt->io_->rearm_wakeup();
    }
  } watch(this);
  for (;;) {
    // A send posted while the engine thread naps rang no eventfd: this thread, about to block,
    // sends it (runtime.h, NAPPING).
    if (doorbell_.load(std::memory_order_seq_cst) && !sleeping_.load(std::memory_order_seq_cst) &&
        take_turn(kReply) && delivered)
      return 0;  // the turn handed this thread its event (CompletionChannel::notify)
    pollfd p[2] = {{fd, POLLIN, 0}, {sock, POLLIN, 0}};
    // A peer's shared-memory ring rings the I/O's doorbell (in `sock`'s set) once asked to.
    const bool idle = io_->arm_wakeup();
    const int polled = idle ? poll(p, 2, -1) : poll(p, 2, 0);
    const int poll_err = errno;
    io_->disarm_wakeup(polled < 0 || p[1].revents != 0);
    if (polled < 0) return poll_err;  // EINTR: a signal ends the wait, as it ends read()
    if (p[0].revents != 0) return 0;
    // A datagram: take the turn. If somebody holds the token, its turn may have read the
    // socket before the datagram came: wait until it lets go, then look again. (Not
    // sched_yield: on a loaded host that gives the core away for a whole time slice.)
    if (take_turn(kWait)) {
      // The turn handed this thread its event (CompletionChannel::notify): no fd to look at.
      if (delivered) return 0;
      continue;
    }
    const uint32_t generation = token_wakes_.load(std::memory_order_seq_cst);
    app_waits_token_.store(true, std::memory_order_seq_cst);
    if (token_.load(std::memory_order_seq_cst) != kFree)
      token_wakes_.wait(generation, std::memory_order_seq_cst);
  }
}

void Runtime::nap_socket(bool out) {
  if (!out && !nap_out_.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(watch_mutex_);
  // An armed CQ: a thread may sleep on its channel's fd, where no turn of ours sees it. Read
  // under the lock: an arming counted after this read puts the socket back (req_notify).
  if (device_.armed_cqs() != 0) out = false;
  nap_out_.store(out, std::memory_order_relaxed);
  if (out && !socket_out_)
    socket_out_ = epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, io_->readable_fd(), nullptr) == 0;
  else if (!out && socket_out_ && watchers_ == 0)
    socket_back();  // level-triggered: a datagram that came meanwhile is reported at once
}

void Runtime::req_notify(provider::Cq& cq, bool solicited_only) {
  cq.req_notify(solicited_only);
  std::lock_guard lock(watch_mutex_);
  if (!nap_out_.load(std::memory_order_relaxed)) return;
  nap_out_.store(false, std::memory_order_relaxed);
  if (socket_out_ && watchers_ == 0) socket_back();
}

// watch_mutex_ held.
void Runtime::socket_back() {
  epoll_event ev{};
  ev.events = EPOLLIN | (epollout_ ? EPOLLOUT : 0u);
  ev.data.fd = io_->readable_fd();
  base::check(epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, io_->readable_fd(), &ev) == 0, "epoll_ctl(ADD)");
  socket_out_ = false;
}

void Runtime::want_writable(bool on) {
  if (on == epollout_) return;  // written only by this thread
  std::lock_guard lock(watch_mutex_);
  epollout_ = on;
  io_->watch_writable(on);
  if (socket_out_) {
    // A watcher has the socket; EPOLLOUT is this thread's to wait for: back in now.
    if (on) socket_back();
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLIN | (on ? EPOLLOUT : 0u);
  ev.data.fd = io_->readable_fd();
  base::check(epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, io_->readable_fd(), &ev) == 0, "epoll_ctl(MOD)");
}

// Engine-thread side of the need-wakeup handshake (runtime.h).
bool Runtime::sleep_until(uint64_t deadline_ns) {
  // An application thread that took a poll turn within kPollerNs drives the engine itself (it
  // busy-polls its CQ): this thread naps instead (runtime.h, NAPPING).
  const uint64_t now = clock_.now_ns();
  const bool nap = now - last_poll_ns_.load(std::memory_order_relaxed) < kPollerNs;
  if (nap) {
    deadline_ns = std::min(deadline_ns, now + kNapNs);
    napping_.store(true, std::memory_order_seq_cst);
    naps_.fetch_add(1, std::memory_order_relaxed);
  } else {
    armed_deadline_ns_.store(deadline_ns, std::memory_order_seq_cst);
    sleeping_.store(true, std::memory_order_seq_cst);
  }
  if (doorbell_.load(std::memory_order_seq_cst) || stop_.load(std::memory_order_seq_cst)) {
    sleeping_.store(false, std::memory_order_seq_cst);
    napping_.store(false, std::memory_order_seq_cst);
    armed_deadline_ns_.store(0, std::memory_order_seq_cst);
    return true;
  }
  // A turn an application thread took after this thread's last one, and before the store
  // above, left its deadline (an ACK held for a reply, a retransmission timer) without waking
  // this thread: it read armed_deadline_ns_ as 0, "awake". Read the engine's deadline again
  // (under its turn lock: such a turn has ended or starts after the store and compares). The
  // I/O's own deadline is not read here: it belongs to the token's holder. A nap does not: the
  // poller's turns fire what is due, and the nap ends within kPollerNs + kNapNs of its last
  // one (waiting for the turn lock, it would wait for the poller's turn).
  if (!nap) {
    const uint64_t now_due = engine_.next_deadline_ns();
    if (now_due < deadline_ns) {
      deadline_ns = now_due;
      armed_deadline_ns_.store(deadline_ns, std::memory_order_seq_cst);
    }
  }
  set_timer(timer_fd_, &timer_ns_, deadline_ns);
  // A poller that reads the socket on every turn needs no watch on it (NAPPING).
  nap_socket(nap && !epollout_ && (shm_io_ == nullptr || !shm_io_->has_peers()));
  epoll_event events[4];
  int n = 0;
  // Datagrams that do not make the socket readable (a peer's shared-memory ring) ring the I/O's
  // doorbell instead, once asked to; some may wait already: no sleep then.
  // A nap asks for neither: the polling thread reads the rings.
  const bool idle = nap || io_->arm_wakeup();
  // A nap with the socket in watches it for the polling thread, which then leaves it alone
  // until this thread sees it readable (net/shm_packet_io.h).
  const bool watch = nap && !nap_out_.load(std::memory_order_relaxed) && shm_io_ != nullptr;
  if (watch) shm_io_->watch_socket(true);
  if (idle) {
    do {
      n = epoll_wait(epoll_fd_, events, 4, -1);
    } while (n < 0 && errno == EINTR);
  }
  if (watch) {
    shm_io_->watch_socket(false);
    for (int i = 0; i < n; ++i)
      if (events[i].data.fd == io_->readable_fd()) shm_io_->woke_readable();
  }
  if (!nap) {
    bool readable = !idle;  // no sleep: not looked at
    for (int i = 0; i < n; ++i) readable = readable || events[i].data.fd == io_->readable_fd();
    io_->disarm_wakeup(readable);
  }
  sleeping_.store(false, std::memory_order_seq_cst);
  napping_.store(false, std::memory_order_seq_cst);
  if (!idle) {
    armed_deadline_ns_.store(0, std::memory_order_seq_cst);
    return true;
  }
  armed_deadline_ns_.store(0, std::memory_order_seq_cst);
  bool work = false;
  for (int i = 0; i < n; ++i) {
    const int fd = events[i].data.fd;
    if (fd != io_->readable_fd()) drain_fd(fd);
    if (fd == io_->readable_fd() || fd == event_fd_) work = true;
  }
  napped_idle_ = nap && !work;
  return work;
}

}  // namespace urdma::runtime
