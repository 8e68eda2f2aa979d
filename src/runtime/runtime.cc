// The runtime; see runtime.h for the threading design.
#include "runtime/runtime.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "base/check.h"
#include "net/packet_io_env.h"

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

// The counters urdmad shows in `urdma status`, in daemon::kCounterNames order.
daemon::CounterReport counter_report(const engine::EngineCounters& c) {
  daemon::CounterReport r{};
  r.qp_count = daemon::kQpCountUnknown;
  const uint64_t values[] = {c.sent_pkts,
                             c.rcvd_pkts,
                             c.duplicate_request,
                             c.out_of_seq_request,
                             c.rcvd_rnr_err,
                             c.send_rnr_err,
                             c.rcvd_seq_err,
                             c.ack_deferred,
                             c.retry_exceeded_err,
                             c.retry_rnr_exceeded_err,
                             c.completer_retry_err,
                             c.send_err,
                             c.link_downed,
                             c.rdma_sends,
                             c.rdma_recvs,
                             c.drops()};
  static_assert(std::size(values) == daemon::kCounterCount);
  std::copy(std::begin(values), std::end(values), r.counters);
  return r;
}

// Reads an eventfd/timerfd counter to zero (EAGAIN when it was not readable: fine).
void drain_fd(int fd) {
  uint64_t value;
  while (read(fd, &value, sizeof value) < 0 && errno == EINTR) {
  }
}

}  // namespace

Runtime::Runtime(std::unique_ptr<net::PacketIo> io, RuntimeConfig config)
    : io_(std::move(io)),
      device_(with_doorbell(std::move(config.device), &relay_)),
      engine_(device_, *io_, clock_, config.engine),
      has_thread_(config.engine_thread),
      busy_poll_(config.busy_poll_ns, config.busy_poll_adaptive) {
  relay_.set_waker(this);
  if (!has_thread_) return;
  base::check(io_->readable_fd() >= 0, "the engine thread needs a PacketIo with a readable fd");
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  base::check(epoll_fd_ >= 0 && event_fd_ >= 0 && timer_fd_ >= 0, "epoll/eventfd/timerfd");
  add_to_epoll(epoll_fd_, io_->readable_fd());
  add_to_epoll(epoll_fd_, event_fd_);
  add_to_epoll(epoll_fd_, timer_fd_);
  thread_ = std::thread([this] { run(); });
}

Runtime::~Runtime() {
  if (client_) client_->stop_keeping();  // its counter source reads the engine
  if (thread_.joinable()) {
    stop_.store(true, std::memory_order_seq_cst);
    const uint64_t one = 1;
    ssize_t n = write(event_fd_, &one, sizeof one);
    (void)n;
    wake_token_waiter();
    thread_.join();
  }
  relay_.set_waker(nullptr);
  for (int fd : {timer_fd_, event_fd_, epoll_fd_})
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
  // The socket stays the daemon's too (its copy keeps the group's order); ours is a dup.
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
  std::unique_ptr<net::PacketIo> io = net::make_packet_io_from_env(fd, kFaultClock, detail);
  if (!io) {
    *err = EIO;
    return nullptr;
  }
  auto rt = std::make_unique<Runtime>(std::move(io), std::move(config));
  // The client keeps the slot through daemon restarts and reports the counters to urdmad
  // (daemon/client.h); ~Runtime stops it before the engine goes.
  Runtime* r = rt.get();
  if (int e = client->keep(std::move(*slot), [r] { return counter_report(r->counters()); })) {
    *err = e;
    *detail = "could not keep the slot";
    return nullptr;
  }
  rt->client_ = std::move(client);
  *err = 0;
  return rt;
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

void Runtime::release_token() {
  token_.store(kFree, std::memory_order_seq_cst);
  // Pairs with the engine thread's store of engine_waits_token_ before its re-check. Taken, not
  // read: one wake per wait. An application thread that polls in a loop releases the token
  // many times before the woken engine thread gets a core (2 cores, both spinning), and each
  // release that saw the flag still set paid a futex syscall.
  if (engine_waits_token_.load(std::memory_order_seq_cst) &&
      engine_waits_token_.exchange(false, std::memory_order_seq_cst))
    wake_token_waiter();
}

void Runtime::wake_token_waiter() {
  token_wakes_.fetch_add(1, std::memory_order_seq_cst);
  token_wakes_.notify_all();
}

bool Runtime::try_progress() {
  uint32_t expected = kFree;
  if (!token_.compare_exchange_strong(expected, kApplication, std::memory_order_acquire,
                                      std::memory_order_relaxed))
    return false;
  engine_.poll();
  const uint64_t deadline = std::min(engine_.next_deadline_ns(), io_->next_deadline_ns());
  const bool blocked = engine_.tx_blocked();
  release_token();
  inline_turns_.fetch_add(1, std::memory_order_relaxed);
  // The engine thread may sleep on a later deadline than this turn left (a timer it armed),
  // or without EPOLLOUT while the engine is blocked on transmit: wake it so that it re-arms.
  if (blocked || deadline < armed_deadline_ns_.load(std::memory_order_seq_cst)) wake();
  return true;
}

void Runtime::run() {
  engine_tid_.store(gettid(), std::memory_order_release);
  while (!stop_.load(std::memory_order_acquire)) {
    uint32_t expected = kFree;
    if (!token_.compare_exchange_strong(expected, kEngineThread, std::memory_order_acquire,
                                        std::memory_order_relaxed)) {
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
    engine_.poll();
    // The I/O's own timers too (a fault wrapper's held datagrams: net/packet_io.h).
    uint64_t deadline = std::min(engine_.next_deadline_ns(), io_->next_deadline_ns());
    want_writable(engine_.tx_blocked());
    release_token();
    turns_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t turn_end = clock_.now_ns();
    if (deadline <= turn_end) continue;
    if (busy_poll_.ns() != 0) {
      // Busy-poll window: keep taking turns while work may come soon.
      const uint64_t until = turn_end + busy_poll_.ns();
      // Ends at once on a post (the doorbell), a due timer, or a datagram (epoll with no
      // timeout: the socket, doorbell and timer are its fds; what it reports stays pending);
      // and when an application thread is seen busy-polling its CQ — it drives
      // the engine itself, and a spinning engine thread would only take its core (2 cores).
      const uint64_t inline_before = inline_turns_.load(std::memory_order_relaxed);
      bool more = false;
      bool app_polls = false;
      epoll_event ready[3];
      while (!more && !app_polls && clock_.now_ns() < until &&
             !stop_.load(std::memory_order_relaxed)) {
        more = doorbell_.load(std::memory_order_seq_cst) || clock_.now_ns() >= deadline ||
               epoll_wait(epoll_fd_, ready, 3, 0) > 0;
        app_polls = inline_turns_.load(std::memory_order_relaxed) - inline_before >=
                    kInlineTurnsOfAPoller;
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

void Runtime::want_writable(bool on) {
  if (on == epollout_) return;
  epoll_event ev{};
  ev.events = EPOLLIN | (on ? EPOLLOUT : 0u);
  ev.data.fd = io_->readable_fd();
  base::check(epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, io_->readable_fd(), &ev) == 0, "epoll_ctl(MOD)");
  epollout_ = on;
}

// Engine-thread side of the need-wakeup handshake (runtime.h).
bool Runtime::sleep_until(uint64_t deadline_ns) {
  armed_deadline_ns_.store(deadline_ns, std::memory_order_seq_cst);
  sleeping_.store(true, std::memory_order_seq_cst);
  if (doorbell_.load(std::memory_order_seq_cst) || stop_.load(std::memory_order_seq_cst)) {
    sleeping_.store(false, std::memory_order_seq_cst);
    armed_deadline_ns_.store(0, std::memory_order_seq_cst);
    return true;
  }
  // A turn an application thread took after this thread's last one, and before the store
  // above, left its deadline (an ACK held for a reply, a retransmission timer) without waking
  // this thread: it read armed_deadline_ns_ as 0, "awake". Read the engine's deadline again
  // (under its turn lock: such a turn has ended or starts after the store and compares). The
  // I/O's own deadline is not read here: it belongs to the token's holder.
  const uint64_t now_due = engine_.next_deadline_ns();
  if (now_due < deadline_ns) {
    deadline_ns = now_due;
    armed_deadline_ns_.store(deadline_ns, std::memory_order_seq_cst);
  }
  itimerspec its{};
  if (deadline_ns != net::kNever) {
    constexpr uint64_t kNsPerSecond = 1'000'000'000;
    its.it_value.tv_sec = static_cast<time_t>(deadline_ns / kNsPerSecond);
    its.it_value.tv_nsec = static_cast<long>(deadline_ns % kNsPerSecond);
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
  }
  // MonotonicClock is CLOCK_MONOTONIC, the timerfd's clock: the deadline is absolute.
  base::check(timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &its, nullptr) == 0, "timerfd_settime");
  epoll_event events[3];
  int n;
  do {
    n = epoll_wait(epoll_fd_, events, 3, -1);
  } while (n < 0 && errno == EINTR);
  sleeping_.store(false, std::memory_order_seq_cst);
  armed_deadline_ns_.store(0, std::memory_order_seq_cst);
  bool work = false;
  for (int i = 0; i < n; ++i) {
    if (events[i].data.fd == event_fd_ || events[i].data.fd == timer_fd_)
      drain_fd(events[i].data.fd);
    if (events[i].data.fd != timer_fd_) work = true;
  }
  return work;
}

}  // namespace urdma::runtime
