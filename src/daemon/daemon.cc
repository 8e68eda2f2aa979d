#include "daemon/daemon.h"

#include <linux/nsfs.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <numeric>

#include "base/check.h"
#include "net/capture_tap.h"
#include "net/shm_ring.h"

namespace urdma::daemon {

namespace {

// epoll tags: the kind in the top byte, an index or client id below.
enum Kind : uint64_t {
  kListener = 1,
  kSignal,
  kTimer,
  kNetlink,
  kSlotSocket,
  kClient,
  kTakeoverTimer,
  kReleaseTimer,
  kHelloTimer,
  kListenWaitTimer
};
constexpr uint64_t tag(Kind k, uint64_t id = 0) {
  return uint64_t{k} << 56 | id;
}
constexpr Kind kind_of(uint64_t t) {
  return static_cast<Kind>(t >> 56);
}
constexpr uint64_t id_of(uint64_t t) {
  return t & ((uint64_t{1} << 56) - 1);
}

// The MAD a GMP carries (empty when it is not one: route_mad said so).
std::span<const uint8_t> mad_of(std::span<const uint8_t> datagram) {
  return gsi::parse_gmp(datagram).mad;
}

// Most datagrams read from one slot socket per wakeup, so a flood cannot starve the loop.
constexpr int kDrainBatch = 1024;

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

std::string comm_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/comm");
  std::string line;
  std::getline(f, line);
  return line;
}

// Same open socket (dup'd or passed fds of one socket share the inode).
bool same_socket(int a, int b) {
  struct stat sa, sb;
  return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_ino == sb.st_ino &&
         sa.st_dev == sb.st_dev;
}

// The errno of a failed eventfd, memfd_create, ftruncate or seal, as kShmAccept and kShmConnect
// say.
int shm_errno(int err) {
  return err == EMFILE || err == ENFILE ? EMFILE : ENOMEM;
}

}  // namespace

uint16_t udp_port_from_env() {
  const char* v = std::getenv("URDMA_UDP_PORT");
  if (!v || !*v) return wire::kRoceV2UdpPort;
  char* end = nullptr;
  const unsigned long port = std::strtoul(v, &end, 10);
  return (*end == 0 && port > 0 && port < 65536) ? static_cast<uint16_t>(port)
                                                 : wire::kRoceV2UdpPort;
}

Daemon::Daemon(const DaemonOptions& options, DaemonHandoff handoff)
    : options_(options),
      uid_(geteuid()),
      netns_(netns_inode()),
      listener_(std::move(handoff.listener)),
      keeper_(std::move(handoff.keeper)),
      keeper_pid_(handoff.keeper_pid),
      restarts_(handoff.restarts),
      group_(std::move(handoff.group)),
      slots_(static_cast<unsigned>(group_.sockets.size())),
      listen_waits_(options.listen_wait_ms),
      start_ms_(now_ms()) {}

Daemon::~Daemon() {
  // The keeper holds the group and the listener; these are the daemon's copies.
  gmp_sender_.reset();
  gsi_io_.reset();
  group_.sockets.clear();
  clients_.clear();
  listener_.reset();
}

std::unique_ptr<Daemon> Daemon::create(const DaemonOptions& options, DaemonHandoff handoff,
                                       int* err, std::string* error) {
  const size_t n = handoff.group.sockets.size();
  if (n < kMinSlots || n > kMaxSlots || !handoff.listener.valid()) {
    *err = EINVAL;
    *error = "the keeper handed over no listener or a group of " + std::to_string(n) + " sockets";
    return nullptr;
  }
  std::unique_ptr<Daemon> d(new Daemon(options, std::move(handoff)));
  if (!d->setup(err, error)) return nullptr;
  d->tell_keeper(kKeeperReady);
  return d;
}

void Daemon::tell_keeper(char what) {
  if (keeper_.valid()) (void)!send(keeper_.get(), &what, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

bool Daemon::setup(int* err, std::string* error) {
  auto fail = [&](const std::string& what) {
    *err = errno ? errno : EIO;
    *error = errno_text(what.c_str(), *err);
    return false;
  };
  // 0. Room for every client's connection: the soft fd limit up to the hard one, and never more
  // clients than fds (an accept failing with EMFILE would leave the listener readable forever).
  // Shared-memory regions (kShmConnect) take what the clients leave, up to one per pair of slots
  // that can be leased: a memfd failing with EMFILE then refuses one pair, never an accept.
  const size_t leasable = slots_.slot_count() - 1;
  shm_regions_max_ = leasable * (leasable - 1) / 2;
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    if (nofile.rlim_cur < nofile.rlim_max) {
      nofile.rlim_cur = nofile.rlim_max;
      setrlimit(RLIMIT_NOFILE, &nofile);
      getrlimit(RLIMIT_NOFILE, &nofile);
    }
    // Reserve the group, a doorbell per slot (kShmAccept), the loop's own fds, stdio and one
    // in-flight accept.
    const rlim_t reserved = 2 * rlim_t{slots_.slot_count()} + 16;
    const rlim_t room = nofile.rlim_cur > reserved ? nofile.rlim_cur - reserved : 1;
    if (room < options_.max_clients) options_.max_clients = static_cast<unsigned>(room);
    shm_regions_max_ = std::min<size_t>(shm_regions_max_, room - options_.max_clients);
  }

  // After a restart, survivors reattach their slots before anyone else is given one.
  if (restarts_ > 0) takeover_ = kTakeoverGrace;

  // 3. Addresses, signals, idle timer, epoll.
  errno = 0;
  if (!addresses_.open(error)) {
    *err = errno ? errno : EIO;
    return false;
  }
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  if (sigprocmask(SIG_BLOCK, &mask, nullptr) != 0) return fail("sigprocmask");
  signal_fd_.reset(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signal_fd_.valid()) return fail("signalfd");
  timer_fd_.reset(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!timer_fd_.valid()) return fail("timerfd");
  takeover_timer_fd_.reset(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!takeover_timer_fd_.valid()) return fail("timerfd");
  release_timer_fd_.reset(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!release_timer_fd_.valid()) return fail("timerfd");
  listen_wait_timer_fd_.reset(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!listen_wait_timer_fd_.valid()) return fail("timerfd");
  hello_timer_fd_.reset(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!hello_timer_fd_.valid()) return fail("timerfd");
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) return fail("epoll");
  if (!watch(listener_.get(), tag(kListener), EPOLLIN) ||
      !watch(signal_fd_.get(), tag(kSignal), EPOLLIN) ||
      !watch(timer_fd_.get(), tag(kTimer), EPOLLIN) ||
      !watch(takeover_timer_fd_.get(), tag(kTakeoverTimer), EPOLLIN) ||
      !watch(release_timer_fd_.get(), tag(kReleaseTimer), EPOLLIN) ||
      !watch(listen_wait_timer_fd_.get(), tag(kListenWaitTimer), EPOLLIN) ||
      !watch(hello_timer_fd_.get(), tag(kHelloTimer), EPOLLIN) ||
      !watch(addresses_.fd(), tag(kNetlink), EPOLLIN))
    return fail("epoll_ctl");
  if (!start_group(error)) {
    *err = errno ? errno : EIO;
    return false;
  }
  if (takeover_ == kTakeoverGrace) arm_takeover_timer(options_.takeover_grace_ms);
  update_idle_timer();
  // The view is a convenience for programs that read sysfs: a daemon that cannot write it
  // serves anyway (`urdma run` says the view is missing).
  // Written from the whole table: the first dump is read here (it is quick: one recv per 32 KiB
  // of addresses), so neither the view nor the first clients see a table half filled.
  for (int i = 0; i < 20 && !addresses_.dumped(); ++i) {
    pollfd p{addresses_.fd(), POLLIN, 0};
    if (poll(&p, 1, 50) < 0 && errno != EINTR) break;
    std::string why;
    if (!addresses_.handle_readable(&gids_, &why)) break;
  }
  if (!options_.view_dir.empty()) {
    std::string why;
    if (!view_.open(options_.view_dir, gids_.entries(), &why)) log("no device view: " + why);
  }
  log(std::string(options_.system ? "system daemon" : "daemon of " + owner_text(uid_)) +
      " serving " + options_.socket_path + ", UDP port " + std::to_string(group_.port) + " (" +
      (group_.family == AF_INET6 ? "IPv6 dual-stack" : "IPv4") + "), " +
      std::to_string(slots_.slot_count()) + " slots" +
      (restarts_ ? ", restart " + std::to_string(restarts_) + ": survivors may reattach" : ""));
  return true;
}

bool Daemon::start_group(std::string* error) {
  const int gsi_fd = fcntl(group_.sockets[0].get(), F_DUPFD_CLOEXEC, 0);
  if (gsi_fd < 0) {
    *error = errno_text("dup slot 0");
    return false;
  }
  // A burst of CM MADs (a process's 200 connections torn down at once) overflowed the default
  // receive buffer (~208 KiB: fewer than 200 MADs once skb overhead is counted) between two
  // epoll wakes. 4 MiB when the daemon may pass net.core.rmem_max, else as much as it allows.
  // Without UDP_GRO (the default): route_mads reads into MAD-sized buffers, one MAD each.
  std::unique_ptr<net::UdpSocketIo> udp = net::UdpSocketIo::adopt(
      gsi_fd, error, net::UdpSocketIoOptions{.socket_buffer_bytes = net::kLargeSocketBufferBytes});
  if (!udp) return false;
  gsi_io_ = std::make_unique<net::CaptureTap>(std::move(udp), static_cast<uint32_t>(getpid()));
  gmp_sender_.emplace(*gsi_io_, /*first_psn=*/0);
  // Slot 0 is routed; every free slot is drained until it is leased — after a restart only once
  // the grace period is over (a survivor's socket is not ours to drain).
  for (unsigned s = 0; s < group_.sockets.size(); ++s) {
    if (s > 0 && (slots_.leased(s) || takeover_ == kTakeoverGrace)) continue;
    if (!watch(group_.sockets[s].get(), tag(kSlotSocket, s), EPOLLIN)) {
      *error = errno_text("epoll_ctl");
      return false;
    }
  }
  return true;
}

void Daemon::arm_takeover_timer(uint32_t ms) {
  itimerspec its{};
  its.it_value.tv_sec = ms / 1000;
  its.it_value.tv_nsec = static_cast<long>(ms % 1000) * 1000000 + (ms == 0 ? 1 : 0);
  base::check(timerfd_settime(takeover_timer_fd_.get(), 0, &its, nullptr) == 0, "timerfd_settime");
}

void Daemon::takeover_timer_fired() {
  if (takeover_ == kTakeoverGrace) {
    // The grace period is over: slots nobody reattached are free. Drain them from now on (a
    // survivor coming later still gets its slot back while nobody leased it).
    takeover_ = kTakeoverDone;
    for (unsigned s = 1; s < group_.sockets.size(); ++s)
      if (!slots_.leased(s)) watch(group_.sockets[s].get(), tag(kSlotSocket, s), EPOLLIN);
    log("takeover done: " + std::to_string(survivors_) + " processes reattached their slots");
  }
  answer_pending();
}

bool Daemon::watch(int fd, uint64_t t, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = t;
  return epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) == 0;
}

void Daemon::unwatch(int fd) {
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

void Daemon::log(const std::string& line) const {
  if (options_.verbose) std::cerr << "urdmad: " << line << std::endl;
}

void Daemon::update_idle_timer() {
  itimerspec its{};
  if (clients_.empty() && options_.idle_timeout_ms > 0) {
    its.it_value.tv_sec = options_.idle_timeout_ms / 1000;
    its.it_value.tv_nsec = static_cast<long>(options_.idle_timeout_ms % 1000) * 1000000;
  }
  // Zero disarms.
  base::check(timerfd_settime(timer_fd_.get(), 0, &its, nullptr) == 0, "timerfd_settime");
}

int Daemon::run() {
  while (!stop_) {
    if (!step(-1)) return 1;
  }
  log_mad_drops();
  return exit_code_;
}

bool Daemon::step(int timeout_ms) {
  std::array<epoll_event, 64> events;
  const int n =
      epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), timeout_ms);
  if (n < 0) {
    if (errno == EINTR) return true;
    std::cerr << "urdmad: " << errno_text("epoll_wait") << '\n';
    return false;
  }
  for (int i = 0; i < n && !stop_; ++i) {
    const uint64_t t = events[i].data.u64;
    switch (kind_of(t)) {
      case kListener:
        accept_clients();
        break;
      case kSignal: {
        signalfd_siginfo si;
        while (read(signal_fd_.get(), &si, sizeof si) == sizeof si) {
          log("signal " + std::to_string(si.ssi_signo) + ", exiting");
          stop_ = true;
        }
        break;
      }
      case kTimer: {
        uint64_t expirations;
        // A client still in the listen backlog is a client: take it before deciding. (One
        // that connects after this and before exit sees its hello fail and starts a daemon.)
        if (read(timer_fd_.get(), &expirations, sizeof expirations) <= 0) break;  // re-armed
        accept_clients();
        if (clients_.empty()) {
          log("idle for " + std::to_string(options_.idle_timeout_ms) + " ms, exiting");
          tell_keeper(kKeeperIdle);
          stop_ = true;
        }
        break;
      }
      case kHelloTimer: {
        uint64_t expirations;
        if (read(hello_timer_fd_.get(), &expirations, sizeof expirations) > 0) hello_timer_fired();
        break;
      }
      case kTakeoverTimer: {
        uint64_t expirations;
        if (read(takeover_timer_fd_.get(), &expirations, sizeof expirations) > 0)
          takeover_timer_fired();
        break;
      }
      case kReleaseTimer: {
        uint64_t expirations;
        if (read(release_timer_fd_.get(), &expirations, sizeof expirations) > 0)
          release_timer_fired();
        break;
      }
      case kListenWaitTimer: {
        uint64_t expirations;
        if (read(listen_wait_timer_fd_.get(), &expirations, sizeof expirations) > 0)
          listen_wait_timer_fired();
        break;
      }
      case kNetlink: {
        std::string error;
        bool changed = false;
        if (!addresses_.handle_readable(&gids_, &error, &changed)) {
          std::cerr << "urdmad: " << error << '\n';
          exit_code_ = 1;
          stop_ = true;
        }
        if (changed) {
          publish_gids();
          view_.update(gids_.entries());
        }
        break;
      }
      case kSlotSocket:
        if (id_of(t) == 0) {
          route_mads();
        } else {
          drain(static_cast<unsigned>(id_of(t)));
        }
        break;
      case kClient:
        if (events[i].events & EPOLLOUT) flush_backlog(id_of(t));
        if (events[i].events & ~EPOLLOUT) serve(id_of(t));
        break;
    }
  }
  return true;
}

void Daemon::log_mad_drops() const {
  std::string line;
  for (size_t i = 0; i < kMadDropCount; ++i) {
    if (counters_.mads_dropped[i] == 0) continue;
    line += (line.empty() ? "" : ", ") + std::string(mad_drop_name(static_cast<MadDrop>(i))) + " " +
            std::to_string(counters_.mads_dropped[i]);
  }
  if (!line.empty()) log("MADs dropped: " + line);
}

void Daemon::drain(unsigned slot) {
  base::check(slot < group_.sockets.size(), "slot index");
  // Slot 0's datagrams (QP1: CM MADs) will be routed to processes; until then they are dropped
  // like those of free slots.
  alignas(8) static uint8_t sink[65536];
  for (int i = 0; i < kDrainBatch; ++i) {
    const ssize_t n = recv(group_.sockets[slot].get(), sink, sizeof sink, MSG_DONTWAIT);
    if (n < 0) break;  // EAGAIN: empty
    ++counters_.drained_datagrams;
  }
}

void Daemon::route_mads() {
  constexpr size_t kBatch = 16;
  static std::array<std::array<uint8_t, kMaxMadDatagramBytes>, kBatch> buffers;
  std::array<net::RxDatagram, kBatch> rx{};
  for (int round = 0; round < 64; ++round) {  // bounded: the loop comes back when epoll says so
    for (size_t i = 0; i < kBatch; ++i) rx[i] = net::RxDatagram{.buffer = buffers[i]};
    const size_t n = gsi_io_->recv_batch(rx);
    if (n == 0) return;
    for (size_t i = 0; i < n; ++i) {
      const std::span<const uint8_t> datagram(buffers[i].data(), rx[i].length);
      // Nothing a peer sends has an effect before its ICRC holds (IBA annex A17.4.3.1).
      const MadRoute route = rx[i].truncated ? MadRoute{.drop = MadDrop::kTruncated}
                             : !gsi::icrc_ok(datagram, rx[i].src, rx[i].dst)
                                 ? MadRoute{.drop = MadDrop::kBadIcrc}
                                 : route_mad(datagram);
      MadDrop drop = route.drop;
      unsigned slot = route.slot;
      if (route.by == MadRoute::By::kSlot && take_release_drep(datagram, rx[i])) continue;
      if (route.by == MadRoute::By::kServiceId) {
        const auto l = listeners_.find(route.service_id);
        if (l == listeners_.end()) {
          if (wait_for_listener(route, datagram, rx[i])) continue;
          drop = MadDrop::kNoListener;
        } else {
          slot = l->second;
        }
      } else if (route.by == MadRoute::By::kRequester) {
        const auto s = requesters_.take(rx[i].src.address, route.sender_comm_id);
        if (s) {
          slot = *s;
        } else {
          drop = MadDrop::kNoSlot;  // a REQ we never routed, or long ago
        }
      }
      if (drop == MadDrop::kNone && route.by != MadRoute::By::kServiceId &&
          (slot == 0 || slot >= slots_.slot_count() || !slots_.leased(slot))) {
        drop = MadDrop::kNoSlot;
      }
      if (drop == MadDrop::kNone) drop = forward(slot, datagram, rx[i].src, rx[i].dst);
      if (drop == MadDrop::kNone) {
        ++counters_.mads_forwarded;
        if (route.by == MadRoute::By::kServiceId && route.sender_comm_id != 0)
          requesters_.remember(rx[i].src.address, route.sender_comm_id, slot);
      } else {
        ++counters_.mads_dropped[static_cast<size_t>(drop)];
        answer_for_host(drop, datagram, rx[i].src, rx[i].dst);
      }
    }
  }
}

MadDrop Daemon::forward(unsigned slot, std::span<const uint8_t> datagram, const net::Endpoint& src,
                        const net::Endpoint& dst) {
  const auto ch = channels_.find(slot);
  if (ch == channels_.end()) return MadDrop::kNoChannel;
  MadDelivery d{};
  std::memcpy(d.src_address, src.address.bytes().data(), 16);
  std::memcpy(d.dst_address, dst.address.bytes().data(), 16);
  d.src_port = src.port;
  d.dst_port = dst.port;
  if (!deliver_mad(ch->second, clients_.at(ch->second), encode_mad(d, datagram)))
    return MadDrop::kChannelFull;
  capture_received(slot, datagram, src, dst);
  return MadDrop::kNone;
}

void Daemon::capture_received(unsigned slot, std::span<const uint8_t> datagram,
                              const net::Endpoint& src, const net::Endpoint& dst) {
  const Client* holder = nullptr;
  for (const auto& [id, c] : clients_)
    if (c.slot == slot) holder = &c;
  if (holder == nullptr) return;
  std::optional<net::CaptureRecord> r;  // made for the first capturer
  const iovec piece{const_cast<uint8_t*>(datagram.data()), datagram.size()};
  for (const auto& [id, capturer] : clients_) {
    if (!captures(capturer, *holder) || captures_host(capturer)) continue;
    if (!r) {
      r = net::make_capture_record(net::CaptureDirection::kReceived, src, dst, 0, 0,
                                   static_cast<uint32_t>(holder->pid), datagram.size(), false);
      r->slot = slot;
    }
    // Non-blocking: a capturer that does not read loses the record, never the daemon its time.
    (void)net::write_capture_record(capturer.capture_sink.get(), *r, {&piece, 1});
  }
}

bool Daemon::wait_for_listener(const MadRoute& route, std::span<const uint8_t> datagram,
                               const net::RxDatagram& rx) {
  if (options_.listen_wait_ms == 0) return false;
  std::optional<CmMad> mra;
  switch (listen_waits_.add(route.service_id, datagram, mad_of(datagram), rx.src, rx.dst, now_ms(),
                            &mra)) {
    case ListenWaits::Added::kWaiting:
      ++counters_.cm_requests_waited;
      arm_listen_wait_timer();
      return true;
    case ListenWaits::Added::kDuplicate:
      if (mra) {
        send_gmp(*mra, rx.dst.address, rx.src.address);
        ++counters_.cm_mras_sent;
      }
      return true;
    case ListenWaits::Added::kFull:
      ++counters_.cm_requests_unwaited;
      return false;
    case ListenWaits::Added::kNotRequest:
      return false;
  }
  return false;
}

void Daemon::serve_waiting(uint64_t service_id, unsigned slot) {
  for (const ListenWaits::Request& r : listen_waits_.take(service_id)) {
    const MadDrop drop = forward(slot, r.datagram, r.src, r.dst);
    if (drop != MadDrop::kNone) {
      ++counters_.mads_dropped[static_cast<size_t>(drop)];
      continue;  // as a request to a listener without a channel: the requester retries
    }
    ++counters_.mads_forwarded;
    ++counters_.cm_requests_served;
    if (const MadRoute route = route_mad(r.datagram); route.sender_comm_id != 0)
      requesters_.remember(r.src.address, route.sender_comm_id, slot);
  }
  arm_listen_wait_timer();
}

void Daemon::listen_wait_timer_fired() {
  for (const ListenWaits::Request& r : listen_waits_.expired(now_ms())) {
    ++counters_.mads_dropped[static_cast<size_t>(MadDrop::kNoListener)];
    answer_for_host(MadDrop::kNoListener, r.datagram, r.src, r.dst);
  }
  arm_listen_wait_timer();
}

void Daemon::arm_listen_wait_timer() {
  itimerspec its{};  // zero disarms
  if (const auto next = listen_waits_.next_deadline_ms()) {
    const int64_t ms = std::max<int64_t>(*next - now_ms(), 1);
    its.it_value.tv_sec = ms / 1000;
    its.it_value.tv_nsec = static_cast<long>(ms % 1000) * 1000000;
  }
  base::check(timerfd_settime(listen_wait_timer_fd_.get(), 0, &its, nullptr) == 0,
              "timerfd_settime");
}

bool Daemon::deliver_mad(uint64_t id, Client& c, std::vector<uint8_t> record) {
  const MadBacklog::Sent sent = c.backlog.send(c.fd.get(), std::move(record));
  if (sent == MadBacklog::Sent::kQueued) watch_backlog(id, c);
  return sent != MadBacklog::Sent::kDropped;
}

void Daemon::flush_backlog(uint64_t id) {
  const auto it = clients_.find(id);
  if (it == clients_.end()) return;
  // A failed send is a closed channel: its hang-up drops the client.
  (void)it->second.backlog.flush(it->second.fd.get());
  watch_backlog(id, it->second);
}

void Daemon::watch_backlog(uint64_t id, Client& c) {
  const bool want_out = !c.backlog.empty();
  if (want_out == c.watching_out) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (want_out ? EPOLLOUT : 0u);
  ev.data.u64 = tag(kClient, id);
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev) == 0) c.watching_out = want_out;
}

bool Daemon::take_release_drep(std::span<const uint8_t> datagram, const net::RxDatagram& rx) {
  // A DREP answering the daemon's DREQ for a dead process is the daemon's, whoever holds the
  // slot now.
  if (releases_.size() == 0 || !releases_.take_drep(rx.src.address, mad_of(datagram))) return false;
  arm_release_timer();
  return true;
}

void Daemon::answer_for_host(MadDrop drop, std::span<const uint8_t> datagram,
                             const net::Endpoint& src, const net::Endpoint& dst) {
  // What no process will answer (cm_agent.h); the ICRC was checked first.
  const bool answerable =
      drop == MadDrop::kNoListener || drop == MadDrop::kNoSlot || drop == MadDrop::kNoChannel;
  if (!answerable) return;
  const auto mad = mad_of(datagram);
  if (drop == MadDrop::kNoListener) {
    if (const auto reply = no_listener_reply(mad)) {
      send_gmp(*reply, dst.address, src.address);
      ++counters_.cm_rejects_sent;
    }
  } else if (const auto reply = orphan_drep(mad)) {
    send_gmp(*reply, dst.address, src.address);
    ++counters_.cm_dreps_sent;
  }
}

void Daemon::send_gmp(const CmMad& mad, const net::Address& from, const net::Address& to) {
  if (!gmp_sender_) return;
  // A Linux CM sends to port 4791 whatever port the request came from; ours listen on the
  // group's port (4791 but in tests). Lost (a full socket buffer): the peer's CM retransmits
  // its request.
  (void)gmp_sender_->send(mad, from, net::Endpoint{to, group_.port});
}

void Daemon::release_connections(unsigned slot) {
  const int64_t now = now_ms();
  for (const PeerConn& c : conns_.reclaim(slot)) {
    if (!releases_.add(Releases::Dreq{.conn = c, .transaction_id = next_dreq_tid_++}, now))
      ++counters_.cm_dreqs_dropped;
  }
  release_timer_fired();
}

void Daemon::send_dreq(const Releases::Dreq& d) {
  send_gmp(build_dreq(d.conn, d.transaction_id), d.conn.local, d.conn.peer);
}

void Daemon::release_timer_fired() {
  for (const Releases::Dreq& d : releases_.due(now_ms())) {
    send_dreq(d);
    ++(d.sends == 1 ? counters_.cm_dreqs_sent : counters_.cm_dreq_retries);
  }
  arm_release_timer();
}

void Daemon::arm_release_timer() {
  itimerspec its{};  // zero disarms
  if (const auto next = releases_.next_deadline_ms()) {
    const int64_t ms = std::max<int64_t>(*next - now_ms(), 1);
    its.it_value.tv_sec = ms / 1000;
    its.it_value.tv_nsec = static_cast<long>(ms % 1000) * 1000000;
  }
  base::check(timerfd_settime(release_timer_fd_.get(), 0, &its, nullptr) == 0, "timerfd_settime");
}

int Daemon::listen_request(Client& c, MsgType type, std::span<const uint8_t> rec) {
  ServiceIdBody body;
  if (const int err = decode_request_body(rec, &body)) return err;
  if (!c.slot) return EINVAL;  // MADs are delivered per slot
  // On a system daemon users share the namespace's ports: below 1024 only root listens, as
  // Linux's rdma_cm binds them only with CAP_NET_BIND_SERVICE (cma_alloc_port's check).
  if (options_.system && c.uid != 0 && type == MsgType::kListen &&
      (body.service_id & 0xFFFF) < 1024)
    return EACCES;
  const auto it = listeners_.find(body.service_id);
  if (type == MsgType::kListen) {
    if (it != listeners_.end()) return it->second == *c.slot ? 0 : EADDRINUSE;
    listeners_[body.service_id] = *c.slot;
    serve_waiting(body.service_id, *c.slot);
    return 0;
  }
  if (it == listeners_.end() || it->second != *c.slot) return ENOENT;
  listeners_.erase(it);
  return 0;
}

int Daemon::conn_request(Client& c, MsgType type, std::span<const uint8_t> rec) {
  if (!c.slot) return EINVAL;
  if (type == MsgType::kConnDown) {
    CommIdBody body;
    if (const int err = decode_request_body(rec, &body)) return err;
    return conns_.remove(*c.slot, body.local_comm_id);
  }
  ConnRecord r;
  if (const int err = decode_request_body(rec, &r)) return err;
  net::Address::Bytes local, peer;
  std::memcpy(local.data(), r.local_address, local.size());
  std::memcpy(peer.data(), r.peer_address, peer.size());
  return conns_.add(*c.slot, PeerConn{.local_comm_id = r.local_comm_id,
                                      .remote_comm_id = r.remote_comm_id,
                                      .remote_qpn = r.remote_qpn & wire::kQpnMask,
                                      .local = net::Address(local),
                                      .peer = net::Address(peer)});
}

std::vector<uint32_t> Daemon::mcast_interfaces(bool v4) const {
  std::vector<uint32_t> all, loopback;
  for (const GidEntry& e : gids_.entries()) {
    if (e.gid.is_v4() != v4) continue;
    std::vector<uint32_t>& to = e.gid.is_loopback() ? loopback : all;
    if (std::ranges::find(to, e.ifindex) == to.end()) to.push_back(e.ifindex);
  }
  return all.empty() ? loopback : all;
}

int Daemon::mcast_request(Client& c, MsgType type, std::span<const uint8_t> rec) {
  McastBody body;
  if (const int err = decode_request_body(rec, &body)) return err;
  if (!c.slot) return EINVAL;
  const unsigned slot = *c.slot;
  const net::Address group(std::to_array(body.group));
  const uint32_t qpn = body.qpn & wire::kQpnMask;
  const int fd = group_.sockets[slot].get();
  if (type == MsgType::kMcastDetach) {
    const std::vector<uint32_t> joined = mcast_.interfaces(slot, group);
    const McastMembers::Change change = mcast_.detach(slot, qpn, group);
    if (change.err) return change.err;
    if (change.last)
      for (const uint32_t ifindex : joined)
        (void)set_group_membership(fd, group_.family, group, ifindex, false);
    return 0;
  }
  const McastMembers::Change change = mcast_.attach(slot, c.qpn_base, c.qpn_count, qpn, group);
  if (change.err || !change.first) return change.err;
  // The slot's first QP in the group: join it on the slot's socket, on every interface that
  // has an address of the group's family (the device spans them all).
  std::vector<uint32_t> joined;
  int err = ENODEV;
  for (const uint32_t ifindex : mcast_interfaces(group.is_v4())) {
    const int r = set_group_membership(fd, group_.family, group, ifindex, true);
    if (r == 0)
      joined.push_back(ifindex);
    else
      err = r;
  }
  if (joined.empty()) {
    (void)mcast_.detach(slot, qpn, group);
    // ENOBUFS: the socket holds net.ipv4.igmp_max_memberships groups already.
    return err == ENOBUFS ? ENOMEM : err;
  }
  mcast_.set_interfaces(slot, group, std::move(joined));
  return 0;
}

void Daemon::leave_groups(unsigned slot) {
  const int fd = group_.sockets[slot].get();
  for (const auto& [group, ifindexes] : mcast_.reclaim(slot))
    for (const uint32_t ifindex : ifindexes)
      (void)set_group_membership(fd, group_.family, group, ifindex, false);
  // Whatever the process set on its socket itself: back to its own groups only.
  (void)accept_only_joined_groups(fd, group_.family);
}

int Daemon::channel_request(uint64_t id, Client& c, std::span<const uint8_t> rec) {
  SlotBody body;
  if (const int err = decode_request_body(rec, &body)) return err;
  if (c.slot || c.channel_slot) return EINVAL;  // a channel is a connection of its own
  // The slot must belong to this very process (another connection of the same pid).
  bool owner = false;
  for (const auto& [other_id, other] : clients_)
    owner |= other_id != id && other.slot == body.slot && other.pid == c.pid;
  if (!owner) return EPERM;
  if (channels_.contains(body.slot)) return EBUSY;
  channels_[body.slot] = id;
  c.channel_slot = body.slot;
  return 0;
}

void Daemon::reset_socket(int fd) const {
  // Undo what the previous owner may have done to the shared socket: a filter of its own.
  // Never connect(AF_UNSPEC) it: on a socket bound to the wildcard address, UDP's disconnect
  // rehashes the socket, which takes it out of the reuseport group; the kernel then compacts the
  // group (the last socket moves into the hole) and the steering program's indices no longer
  // name the slots — every datagram for the slot landed on slot 0. The engine never connects its
  // socket; one a process connected anyway stays connected (it would hear only that peer), and
  // we say so in the log rather than break the group.
  int zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_DETACH_FILTER, &zero, sizeof zero);  // ENOENT when none
  sockaddr_storage peer{};
  socklen_t len = sizeof peer;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0) {
    log("a reclaimed slot socket is connected to a peer (its previous owner called connect); "
        "it only hears that peer");
  }
}

int Daemon::refusal(uid_t uid, pid_t pid) const {
  if (!options_.system && uid != uid_) return EACCES;
  if (clients_.size() >= options_.max_clients) return EMFILE;
  unsigned of_user = 0, of_process = 0;
  for (const auto& [id, c] : clients_) {
    of_user += c.uid == uid;
    of_process += c.pid == pid;
  }
  if (of_user >= options_.max_clients_per_user || of_process >= options_.max_clients_per_process)
    return EMFILE;
  return 0;
}

void Daemon::accept_clients() {
  for (;;) {
    UniqueFd fd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) break;  // EAGAIN, or a connection that went away
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) continue;
    if (const int refuse = refusal(cred.uid, cred.pid)) {
      ++counters_.clients_refused;
      log("refusing pid " + std::to_string(cred.pid) + " of " + owner_text(cred.uid) + ": " +
          (refuse == EACCES ? "not the daemon's user" : "too many connections"));
      send_record(fd.get(), encode_error(refuse));
      continue;  // hang up: the client reads the error, then EOF
    }
    const uint64_t id = next_client_id_++;
    if (!watch(fd.get(), tag(kClient, id), EPOLLIN | EPOLLRDHUP)) continue;
    ++counters_.clients_accepted;
    Client c{std::move(fd), cred.uid, cred.pid};
    c.hello_deadline_ms = now_ms() + options_.hello_timeout_ms;
    c.comm = comm_of(cred.pid);
    c.connected_ms = now_ms();
    clients_[id] = std::move(c);
    update_idle_timer();
  }
  arm_hello_timer();
}

void Daemon::arm_hello_timer() {
  std::optional<int64_t> next;
  for (const auto& [id, c] : clients_)
    if (!c.greeted && (!next || c.hello_deadline_ms < *next)) next = c.hello_deadline_ms;
  itimerspec its{};  // zero disarms
  if (next) {
    const int64_t ms = std::max<int64_t>(*next - now_ms(), 1);
    its.it_value.tv_sec = ms / 1000;
    its.it_value.tv_nsec = static_cast<long>(ms % 1000) * 1000000;
  }
  base::check(timerfd_settime(hello_timer_fd_.get(), 0, &its, nullptr) == 0, "timerfd_settime");
}

void Daemon::hello_timer_fired() {
  const int64_t now = now_ms();
  std::vector<uint64_t> late;
  for (const auto& [id, c] : clients_)
    if (!c.greeted && c.hello_deadline_ms <= now) late.push_back(id);
  for (const uint64_t id : late) {
    log("pid " + std::to_string(clients_.at(id).pid) + " did not greet within " +
        std::to_string(options_.hello_timeout_ms) + " ms: closed");
    ++counters_.clients_refused;
    drop_client(id);
  }
  arm_hello_timer();
}

int Daemon::hello_request(Client& c, std::vector<UniqueFd>& fds) {
  // The client's network namespace, as an fd it holds: a daemon serves its own namespace only
  // (a system daemon's socket file is reachable from every namespace that shares /run).
  if (fds.size() != 1) return EPROTO;
  struct stat st {};
  if (fstat(fds[0].get(), &st) != 0 || ioctl(fds[0].get(), NS_GET_NSTYPE) != CLONE_NEWNET)
    return EPROTO;
  if (st.st_ino != netns_) return EXDEV;
  c.greeted = true;
  return 0;
}

void Daemon::serve(uint64_t id) {
  const auto it = clients_.find(id);
  if (it == clients_.end()) return;
  std::vector<uint8_t> buffer(kMaxMessageBytes);
  for (int i = 0; i < 16; ++i) {
    // Only kReattach passes fds; any others are closed with the vector.
    std::vector<UniqueFd> fds;
    const ssize_t n = recv_record(it->second.fd.get(), buffer, &fds, MSG_DONTWAIT);
    if (n == -EAGAIN) return;
    if (n <= 0) {  // EOF (the process closed it or died) or an error
      drop_client(id);
      return;
    }
    handle_request(id, it->second, {buffer.data(), static_cast<size_t>(n)}, fds);
    if (!clients_.contains(id)) return;
  }
}

int Daemon::lease(Client& c, std::vector<uint8_t>* reply, std::vector<int>* pass_fds) {
  if (c.slot) return EALREADY;
  if (takeover_ == kTakeoverGrace) return EAGAIN;
  if (options_.system && options_.max_slots_per_user > 0) {
    unsigned held = 0;
    for (const auto& [id, other] : clients_) held += other.slot && other.uid == c.uid;
    if (held >= options_.max_slots_per_user) return EBUSY;
  }
  const auto l = slots_.acquire();
  if (!l) return EBUSY;
  // A leased socket is the client's to read: stop draining it, and hand it over empty
  // (datagrams still queued name QPNs of the previous lease or of nobody).
  unwatch(group_.sockets[l->slot].get());
  drain(l->slot);
  c.slot = l->slot;
  c.qpn_base = l->qpn_base;
  c.qpn_count = l->qpn_count;
  ++counters_.slots_leased;
  // The slot's socket and nothing else: the group stays with the keeper and the daemon.
  pass_fds->push_back(group_.sockets[l->slot].get());
  *reply = encode_slot(SlotInfo{.slot = l->slot,
                                .slot_count = slots_.slot_count(),
                                .qpn_base = l->qpn_base,
                                .qpn_count = l->qpn_count,
                                .generation = l->generation,
                                .udp_port = group_.port,
                                .family = static_cast<uint16_t>(group_.family)});
  log("pid " + std::to_string(c.pid) + " leased slot " + std::to_string(l->slot) + " (QPNs " +
      std::to_string(l->qpn_base) + "+" + std::to_string(l->qpn_count) + ")");
  return 0;
}

void Daemon::answer_pending() {
  std::vector<uint64_t> waiting;
  waiting.swap(pending_);
  for (const uint64_t id : waiting) {
    const auto it = clients_.find(id);
    if (it == clients_.end()) continue;
    std::vector<uint8_t> reply;
    std::vector<int> pass_fds;
    const int err = lease(it->second, &reply, &pass_fds);
    if (err == EAGAIN) {
      pending_.push_back(id);
      continue;
    }
    if (err) {
      reply = encode_error(err);
      pass_fds.clear();
    }
    if (err == 0) push_captures_to(it->second);  // ahead of the reply, as in handle_request
    if (send_record(it->second.fd.get(), reply, pass_fds) != 0) drop_client(id);
  }
}

int Daemon::reattach_request(Client& c, std::span<const uint8_t> rec, std::vector<UniqueFd>& fds) {
  SlotInfo info;
  if (const int err = decode_request_body(rec, &info)) return err;
  if (c.slot || c.channel_slot || c.watches_gids) return EALREADY;
  const unsigned n = slots_.slot_count();
  if (info.slot_count != n || info.slot == 0 || info.slot >= n || fds.size() != 1 ||
      info.qpn_count != kQpnsPerRange || info.qpn_base % kQpnsPerRange != 0 ||
      slot_of_qpn(info.qpn_base, n) != info.slot || range_of_qpn(info.qpn_base) == 0 ||
      info.udp_port != group_.port)
    return EINVAL;
  // Proof of ownership: the socket itself, the group's at that index.
  if (!same_socket(fds[0].get(), group_.sockets[info.slot].get())) return EINVAL;
  if (!slots_.adopt(info.slot, range_of_qpn(info.qpn_base))) return EBUSY;
  // A free slot was being drained (a survivor after the grace period): it is the process's now.
  unwatch(group_.sockets[info.slot].get());
  c.slot = info.slot;
  c.qpn_base = info.qpn_base;
  c.qpn_count = info.qpn_count;
  c.reattached = true;
  ++survivors_;
  log("pid " + std::to_string(c.pid) + " reattached slot " + std::to_string(info.slot) + " (QPNs " +
      std::to_string(info.qpn_base) + "+" + std::to_string(info.qpn_count) + ")");
  return 0;
}

std::vector<uint8_t> Daemon::clients_page(const Client& viewer, std::span<const uint8_t> rec,
                                          int* err) const {
  ClientsQuery q;
  if ((*err = decode_request_body(rec, &q)) != 0) return {};
  // A user sees their own processes; root sees everyone's.
  const bool all = viewer.uid == 0;
  auto visible = [&](uid_t uid) { return all || uid == viewer.uid; };
  uint32_t total = 0;
  for (const auto& [id, c] : clients_) total += visible(c.uid);
  for (const Departed& d : departed_) total += visible(d.uid);
  const int64_t now = now_ms();
  const ClientsPage page{.uptime_ms = static_cast<uint64_t>(now - start_ms_),
                         .netns_inode = netns_,
                         .total = total,
                         .first = q.first,
                         .count = 0,
                         .takeover = takeover_,
                         .survivors = survivors_,
                         .keeper_pid = static_cast<uint32_t>(keeper_pid_),
                         .restarts = restarts_,
                         .mode = options_.system ? kModeSystem : kModeUser,
                         .reserved16 = 0,
                         .daemon_uid = static_cast<uint32_t>(uid_),
                         .viewer_uid = all ? kAllUsers : static_cast<uint32_t>(viewer.uid),
                         .reserved = 0};
  std::vector<ClientEntry> entries;
  uint32_t index = 0;
  for (const auto& [id, c] : clients_) {
    if (!visible(c.uid)) continue;
    if (index++ < q.first) continue;
    if (entries.size() == kClientsPerPage) break;
    ClientEntry e{};
    e.pid = static_cast<uint32_t>(c.pid);
    e.uid = static_cast<uint32_t>(c.uid);
    e.slot = c.slot ? *c.slot : c.channel_slot ? *c.channel_slot : kNotASlot;
    e.qpn_base = c.qpn_base;
    e.qpn_count = c.qpn_count;
    e.role = static_cast<uint16_t>(c.slot           ? ClientRole::kSlotHolder
                                   : c.channel_slot ? ClientRole::kMadChannel
                                   : c.watches_gids ? ClientRole::kGidWatcher
                                                    : ClientRole::kConnection);
    e.flags = static_cast<uint16_t>((c.reattached ? kClientReattached : 0) |
                                    (c.report ? kClientReported : 0));
    std::strncpy(e.comm, c.comm.c_str(), sizeof e.comm - 1);
    e.connected_ms = static_cast<uint64_t>(now - c.connected_ms);
    if (c.report) {
      e.report = *c.report;
      e.report_age_ms = static_cast<uint64_t>(now - c.report_ms);
    }
    entries.push_back(e);
  }
  for (const Departed& d : departed_) {
    if (!visible(d.uid)) continue;
    if (index++ < q.first) continue;
    if (entries.size() == kClientsPerPage) break;
    ClientEntry e{};
    e.pid = static_cast<uint32_t>(d.pid);
    e.uid = static_cast<uint32_t>(d.uid);
    e.slot = d.slot;
    e.role = static_cast<uint16_t>(ClientRole::kDeparted);
    e.flags = kClientReported;
    std::strncpy(e.comm, d.comm.c_str(), sizeof e.comm - 1);
    e.connected_ms = static_cast<uint64_t>(now - d.left_ms);
    e.report = d.report;
    e.report_age_ms = static_cast<uint64_t>(now - d.report_ms);
    entries.push_back(e);
  }
  return encode_clients(page, entries);
}

void Daemon::handle_request(uint64_t id, Client& c, std::span<const uint8_t> rec,
                            std::vector<UniqueFd>& fds) {
  MsgHeader h;
  int err = decode_header(rec, &h);
  std::vector<uint8_t> reply;
  std::vector<int> pass_fds;
  const auto type = static_cast<MsgType>(h.type);
  if (err == 0 && !c.greeted) {
    // The first request must be the hello; anything else, or a hello that fails, ends the
    // connection after its answer.
    err = type == MsgType::kHello ? hello_request(c, fds) : EPROTO;
    if (err == 0) {
      arm_hello_timer();
      reply = encode_hello(HelloInfo{.pid = static_cast<uint32_t>(getpid()),
                                     .keeper_pid = static_cast<uint32_t>(keeper_pid_),
                                     .uid = static_cast<uint32_t>(uid_),
                                     .mode = options_.system ? kModeSystem : kModeUser,
                                     .reserved = 0,
                                     .netns_inode = netns_});
      if (send_record(c.fd.get(), reply) != 0) drop_client(id);
    } else {
      ++counters_.clients_refused;
      send_record(c.fd.get(), encode_error(err));
      drop_client(id);
    }
    return;
  }
  // Only a reattach (its slot's socket) and a capture (the capturer's socket) pass an fd.
  if (err == 0 && !fds.empty() && type != MsgType::kReattach && type != MsgType::kCapture)
    err = EPROTO;
  if (err) {
    // (the error reply below)
  } else if (type == MsgType::kAcquireSlot) {
    err = lease(c, &reply, &pass_fds);
    if (err == EAGAIN) {  // answered when the takeover settles
      pending_.push_back(id);
      return;
    }
  } else if (type == MsgType::kReportCounters) {
    CounterReport report;
    err = decode_request_body(rec, &report);
    if (err == 0) {
      c.report = report;
      c.report_ms = now_ms();
      return;  // one-way
    }
  } else if (type == MsgType::kReattach) {
    err = reattach_request(c, rec, fds);
    if (err == 0) reply = encode_request(MsgType::kOk);
  } else if (type == MsgType::kQueryClients) {
    reply = clients_page(c, rec, &err);
  } else if (type == MsgType::kQueryGids || type == MsgType::kWatchGids) {
    reply = encode_gids(gids_.entries());
    if (type == MsgType::kWatchGids) c.watches_gids = true;
  } else if (type == MsgType::kListen || type == MsgType::kUnlisten) {
    err = listen_request(c, type, rec);
    if (err == 0) reply = encode_request(MsgType::kOk);
  } else if (type == MsgType::kMadChannel) {
    err = channel_request(id, c, rec);
    if (err == 0) reply = encode_request(MsgType::kOk);
  } else if (type == MsgType::kConnUp || type == MsgType::kConnDown) {
    err = conn_request(c, type, rec);
    if (err == 0) reply = encode_request(MsgType::kOk);
  } else if (type == MsgType::kMcastAttach || type == MsgType::kMcastDetach) {
    err = mcast_request(c, type, rec);
    if (err == 0) reply = encode_request(MsgType::kOk);
  } else if (type == MsgType::kCapture) {
    uint32_t processes = 0;
    err = capture_request(c, rec, fds, &processes);
    if (err == 0) reply = encode_capturing(processes);
  } else if (type == MsgType::kShmAccept) {
    int doorbell = -1;
    err = rec.size() == sizeof(MsgHeader) ? shm_accept_request(c, &doorbell) : EPROTO;
    if (err == 0) {
      reply = encode_request(MsgType::kShmAccepted);
      pass_fds.push_back(doorbell);
    }
  } else if (type == MsgType::kShmConnect) {
    err = shm_connect_request(c, rec, &reply, &pass_fds);
  } else if (type == MsgType::kHello) {
    err = EALREADY;
  } else if (type == MsgType::kQueryStatus) {
    reply = encode_status(
        StatusInfo{.pid = static_cast<uint32_t>(getpid()),
                   .slot_count = slots_.slot_count(),
                   .slots_leased = slots_.slot_count() - 1 - slots_.free_count(),
                   .clients = static_cast<uint32_t>(clients_.size()),
                   .max_clients = options_.max_clients,
                   .gid_count = static_cast<uint32_t>(gids_.size()),
                   .clients_accepted = counters_.clients_accepted,
                   .clients_refused = counters_.clients_refused,
                   .leases = counters_.slots_leased,
                   .reclaims = counters_.slots_reclaimed,
                   .drained_datagrams = counters_.drained_datagrams,
                   .udp_port = group_.port,
                   .family = static_cast<uint16_t>(group_.family),
                   .idle_timeout_ms = options_.idle_timeout_ms,
                   .mads_forwarded = counters_.mads_forwarded,
                   .mads_dropped = std::accumulate(counters_.mads_dropped.begin(),
                                                   counters_.mads_dropped.end(), uint64_t{0}),
                   .cm_rejects_sent = counters_.cm_rejects_sent,
                   .cm_dreqs_sent = counters_.cm_dreqs_sent,
                   .cm_dreps_sent = counters_.cm_dreps_sent,
                   .cm_dreq_retries = counters_.cm_dreq_retries,
                   .cm_requests_waited = counters_.cm_requests_waited,
                   .cm_requests_served = counters_.cm_requests_served,
                   .cm_requests_unwaited = counters_.cm_requests_unwaited,
                   .cm_mras_sent = counters_.cm_mras_sent});
  } else {
    err = EPROTO;
  }
  if (err) {
    reply = encode_error(err);
    pass_fds.clear();
  }
  // A holder that gains its slot now is captured from its first datagram: the captures go
  // ahead of the reply, so the client holds them before it has the slot (Client::keep).
  if (err == 0 && (type == MsgType::kAcquireSlot || type == MsgType::kReattach)) push_captures_to(c);
  if (send_record(c.fd.get(), reply, pass_fds) != 0) drop_client(id);
}

bool Daemon::captures(const Client& capturer, const Client& holder) {
  if (!capturer.capture_sink.valid() || !holder.slot) return false;
  // Another user's traffic only for root (a system daemon's users; a per-user daemon serves one).
  if (capturer.uid != 0 && capturer.uid != holder.uid) return false;
  const uint32_t f = capturer.capture_filter;
  return f == kCaptureAll || f == *holder.slot || f == static_cast<uint32_t>(holder.pid);
}

bool Daemon::captures_host(const Client& capturer) {
  if (!capturer.capture_sink.valid()) return false;
  if (capturer.uid != 0 && capturer.uid != geteuid()) return false;
  const uint32_t f = capturer.capture_filter;
  return f == kCaptureAll || f == 0 || f == static_cast<uint32_t>(getpid());
}

void Daemon::push_captures_to(Client& holder) {
  for (const auto& [id, capturer] : clients_) {
    if (!captures(capturer, holder)) continue;
    // Non-blocking, like every push: a holder that does not read is not captured.
    const int fd = capturer.capture_sink.get();
    (void)send_record(holder.fd.get(), encode_capture_on(*holder.slot), {&fd, 1});
  }
}

int Daemon::capture_request(Client& c, std::span<const uint8_t> rec, std::vector<UniqueFd>& fds,
                            uint32_t* processes) {
  CaptureBody body;
  if (const int err = decode_request_body(rec, &body)) return err;
  if (c.capture_sink.valid()) return EALREADY;
  if (c.slot || c.channel_slot || c.watches_gids || fds.size() != 1) return EINVAL;
  // What the holders will write to: a unix SEQPACKET socket, nothing else.
  int domain = 0, type = 0;
  socklen_t len = sizeof domain;
  if (getsockopt(fds[0].get(), SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_UNIX)
    return EINVAL;
  len = sizeof type;
  if (getsockopt(fds[0].get(), SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET)
    return EINVAL;
  // ...whose other end is the capturer's own: this daemon writes MADs into it, and a socket
  // connected to some other service would carry them there with the daemon's credentials
  // (SO_PASSCRED). One end of a pair the capturer made names the capturer as its peer.
  ucred peer{};
  len = sizeof peer;
  if (getsockopt(fds[0].get(), SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.pid != c.pid ||
      peer.uid != c.uid)
    return EINVAL;
  c.capture_sink = std::move(fds[0]);
  c.capture_filter = body.filter;
  const int fd = c.capture_sink.get();
  // The tap adopts a copy; it ends that copy when the capturer closes its end.
  bool host = false;
  if (captures_host(c) && gsi_io_) {
    const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy >= 0) {
      gsi_io_->add_sink(copy, 0);
      host = true;
    }
  }
  *processes = 0;
  for (auto& [id, holder] : clients_) {
    if (captures(c, holder) &&
        send_record(holder.fd.get(), encode_capture_on(*holder.slot), {&fd, 1}) == 0)
      ++*processes;
  }
  log("pid " + std::to_string(c.pid) + " captures " +
      (body.filter == kCaptureAll ? std::string("every slot")
                                  : "slot or pid " + std::to_string(body.filter)) +
      ": " + std::to_string(*processes) + " processes now" + (host ? ", and the host's QP1" : ""));
  return 0;
}

Daemon::Client* Daemon::holder_of(unsigned slot) {
  for (auto& [id, c] : clients_)
    if (c.slot == slot) return &c;
  return nullptr;
}

int Daemon::shm_accept_request(Client& c, int* doorbell) {
  if (!c.slot) return EINVAL;
  if (c.doorbell.valid()) return EALREADY;
  // Reserved in setup: one per slot.
  c.doorbell.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!c.doorbell.valid()) return shm_errno(errno);
  *doorbell = c.doorbell.get();
  log("pid " + std::to_string(c.pid) + " of slot " + std::to_string(*c.slot) +
      " accepts shared-memory rings");
  return 0;
}

int Daemon::shm_connect_request(Client& c, std::span<const uint8_t> rec,
                                std::vector<uint8_t>* reply, std::vector<int>* pass_fds) {
  ShmConnectBody body;
  if (const int err = decode_request_body(rec, &body)) return err;
  if (!c.slot || !c.doorbell.valid()) return EINVAL;
  const uint32_t range = range_of_qpn(body.qpn);
  // A QPN of 24 bits, not the multicast one, not range 0 (QP0, QP1), not the caller's own.
  if ((body.qpn & ~wire::kQpnMask) != 0 || body.qpn == wire::kQpnMask || range == 0 ||
      range == range_of_qpn(c.qpn_base))
    return EINVAL;
  // The rings stand for the wire between two addresses of this namespace: a peer reached at any
  // other address is on another host, or behind a route this device does not own.
  const net::Address address(std::to_array(body.address));
  const auto gids = gids_.entries();
  if (std::ranges::none_of(gids, [&](const GidEntry& e) { return e.gid == address; }))
    return EADDRNOTAVAIL;
  // The lease holding exactly that range now: its slot's holder, if its current range is it.
  const unsigned slot = slot_of_range(range, slots_.slot_count());
  Client* peer = slot == 0 ? nullptr : holder_of(slot);
  if (peer == nullptr || range_of_qpn(peer->qpn_base) != range) return ENOENT;
  // Each maps the other's pages and writes the other's doorbell: one user's processes only.
  if (peer->uid != c.uid) return EPERM;
  if (!peer->doorbell.valid()) return EOPNOTSUPP;
  const std::pair<unsigned, unsigned> key = std::minmax(*c.slot, slot);
  auto it = shm_regions_.find(key);
  if (it == shm_regions_.end()) {
    if (shm_regions_.size() >= shm_regions_max_) return EMFILE;
    // Sealed before anyone maps it: neither side can shrink it under the other (SIGBUS) or grow
    // it, and no one can add or remove a seal later. The daemon never maps it.
    UniqueFd memfd(memfd_create("urdma-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!memfd.valid()) return shm_errno(errno);
    if (ftruncate(memfd.get(), static_cast<off_t>(net::kShmRegionBytes)) != 0 ||
        fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
      return shm_errno(errno);
    // The peer holds the region before the caller can write to it. Non-blocking, like every
    // push: a holder whose connection is full gets none, and the caller none either.
    const int on_fds[] = {memfd.get(), c.doorbell.get()};
    const ShmPairBody on{.peer_range = range_of_qpn(c.qpn_base),
                         .side = 1,
                         .peer_pid = static_cast<uint32_t>(c.pid),
                         .peer_slot = *c.slot};
    if (send_record(peer->fd.get(), encode_shm_pair(MsgType::kShmOn, on), on_fds) != 0)
      return EAGAIN;
    it = shm_regions_.emplace(key, ShmRegion{std::move(memfd), *c.slot}).first;
    log("slots " + std::to_string(*c.slot) + " and " + std::to_string(slot) + " (pid " +
        std::to_string(c.pid) + ", " + std::to_string(peer->pid) + ") share a region");
  }
  *reply = encode_shm_pair(MsgType::kShmReady,
                           ShmPairBody{.peer_range = range,
                                       .side = it->second.first_slot == *c.slot ? 0u : 1u,
                                       .peer_pid = static_cast<uint32_t>(peer->pid),
                                       .peer_slot = slot});
  pass_fds->push_back(it->second.memfd.get());
  pass_fds->push_back(peer->doorbell.get());
  return 0;
}

void Daemon::end_shm_regions(const Client& c) {
  const uint32_t range = range_of_qpn(c.qpn_base);
  std::erase_if(shm_regions_, [&](const auto& entry) {
    const auto& [slots, region] = entry;
    if (slots.first != *c.slot && slots.second != *c.slot) return false;
    const unsigned other = slots.first == *c.slot ? slots.second : slots.first;
    // Non-blocking: a holder that does not read misses it, as its engine would a vanished peer.
    if (const Client* holder = holder_of(other))
      (void)send_record(holder->fd.get(), encode_shm_off(range));
    return true;
  });
}

void Daemon::publish_gids() {
  const auto record = encode_gids(gids_.entries());
  std::vector<uint64_t> lagging;
  for (auto& [id, c] : clients_) {
    if (!c.watches_gids) continue;
    // Non-blocking: a watcher whose buffer is full is not waited for.
    if (send_record(c.fd.get(), record) != 0) lagging.push_back(id);
  }
  for (const uint64_t id : lagging) {
    log("GID watcher " + std::to_string(id) + " is not reading: disconnected");
    drop_client(id);
  }
}

void Daemon::drop_client(uint64_t id) {
  const auto it = clients_.find(id);
  if (it == clients_.end()) return;
  Client& c = it->second;
  unwatch(c.fd.get());
  std::erase(pending_, id);
  if (c.channel_slot) {
    const auto ch = channels_.find(*c.channel_slot);
    if (ch != channels_.end() && ch->second == id) channels_.erase(ch);
  }
  if (c.slot && c.report) {
    departed_.push_back({c.pid, c.uid, c.comm, *c.slot, *c.report, c.report_ms, now_ms()});
    if (departed_.size() > kDepartedKept) departed_.pop_front();
  }
  if (c.slot) {
    // The slot's service IDs, MAD channel and pending requests go with it.
    std::erase_if(listeners_, [&](const auto& l) { return l.second == *c.slot; });
    channels_.erase(*c.slot);
    requesters_.forget_slot(*c.slot);
    // Reclaim: whatever the dead process left queued is read and dropped, then the slot waits
    // at the back of the free list and will hand out its next QPN range.
    const unsigned s = *c.slot;
    end_shm_regions(c);
    release_connections(s);
    leave_groups(s);
    reset_socket(group_.sockets[s].get());
    drain(s);
    slots_.release(s);
    ++counters_.slots_reclaimed;
    watch(group_.sockets[s].get(), tag(kSlotSocket, s), EPOLLIN);
    log("pid " + std::to_string(c.pid) + " gone, slot " + std::to_string(s) + " reclaimed");
  }
  clients_.erase(it);
  update_idle_timer();
}

}  // namespace urdma::daemon
