#include "daemon/daemon.h"

#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <fcntl.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <numeric>

#include "base/check.h"

namespace urdma::daemon {

namespace {

// epoll tags: the kind in the top byte, an index or client id below.
enum Kind : uint64_t { kListener = 1, kSignal, kTimer, kNetlink, kSlotSocket, kClient };
constexpr uint64_t tag(Kind k, uint64_t id = 0) {
  return uint64_t{k} << 56 | id;
}
constexpr Kind kind_of(uint64_t t) {
  return static_cast<Kind>(t >> 56);
}
constexpr uint64_t id_of(uint64_t t) {
  return t & ((uint64_t{1} << 56) - 1);
}

// Most datagrams read from one slot socket per wakeup, so a flood cannot starve the loop.
constexpr int kDrainBatch = 1024;

}  // namespace

std::string socket_name_from_env() {
  const char* v = std::getenv("URDMA_SOCKET");
  return v && *v ? v : kDefaultSocketName;
}

uint16_t udp_port_from_env() {
  const char* v = std::getenv("URDMA_UDP_PORT");
  if (!v || !*v) return wire::kRoceV2UdpPort;
  char* end = nullptr;
  const unsigned long port = std::strtoul(v, &end, 10);
  return (*end == 0 && port > 0 && port < 65536) ? static_cast<uint16_t>(port)
                                                 : wire::kRoceV2UdpPort;
}

Daemon::Daemon(const DaemonOptions& options)
    : options_(options), uid_(geteuid()), slots_(options.slot_count) {}

Daemon::~Daemon() {
  // UDP sockets first, every copy of them (the group dissolves), then the listener (the
  // namespace is free): a daemon started meanwhile must find no socket of ours on the port.
  gsi_io_.reset();
  group_.sockets.clear();
  clients_.clear();
  listener_.reset();
}

std::unique_ptr<Daemon> Daemon::create(const DaemonOptions& options, int* err, std::string* error) {
  if (options.slot_count < kMinSlots || options.slot_count > kMaxSlots) {
    *err = EINVAL;
    *error =
        "--slots must be in [" + std::to_string(kMinSlots) + ", " + std::to_string(kMaxSlots) + "]";
    return nullptr;
  }
  std::unique_ptr<Daemon> d(new Daemon(options));
  if (!d->setup(err, error)) return nullptr;
  return d;
}

bool Daemon::setup(int* err, std::string* error) {
  auto fail = [&](const std::string& what) {
    *err = errno ? errno : EIO;
    *error = errno_text(what.c_str(), *err);
    return false;
  };
  // 0. Room for every client's connection: the soft fd limit up to the hard one, and never more
  // clients than fds (an accept failing with EMFILE would leave the listener readable forever).
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    if (nofile.rlim_cur < nofile.rlim_max) {
      nofile.rlim_cur = nofile.rlim_max;
      setrlimit(RLIMIT_NOFILE, &nofile);
      getrlimit(RLIMIT_NOFILE, &nofile);
    }
    // Reserve the group, the loop's own fds, stdio and one in-flight accept.
    const rlim_t reserved = options_.slot_count + 16;
    const rlim_t room = nofile.rlim_cur > reserved ? nofile.rlim_cur - reserved : 1;
    if (room < options_.max_clients) options_.max_clients = static_cast<unsigned>(room);
  }

  // 1. The namespace's unix socket: the one place where two daemons meet.
  listener_.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listener_.valid()) return fail("unix socket");
  sockaddr_un sun;
  const socklen_t sun_len = abstract_address(options_.socket_name, &sun);
  if (bind(listener_.get(), reinterpret_cast<const sockaddr*>(&sun), sun_len) != 0) {
    if (errno == EADDRINUSE) {
      *err = EADDRINUSE;
      *error = "another urdmad already serves this network namespace (@" + options_.socket_name +
               " is in use)";
      return false;
    }
    return fail("bind @" + options_.socket_name);
  }
  if (listen(listener_.get(), 128) != 0) return fail("listen");

  // 2. The UDP slot group.
  SlotGroupOptions g{.slot_count = options_.slot_count,
                     .port = options_.udp_port,
                     .allow_ipv6 = options_.allow_ipv6};
  if (const int e = open_slot_group(g, &group_, error)) {
    *err = e;
    return false;
  }

  // Prove the steering before handing anything out.
  bool skipped = false;
  if (!verify_steering(group_, error, &skipped)) {
    *err = EADDRNOTAVAIL;
    return false;
  }
  if (skipped) log("loopback unusable: steering not verified");
  const int gsi_fd = fcntl(group_.sockets[0].get(), F_DUPFD_CLOEXEC, 0);
  if (gsi_fd < 0) return fail("dup slot 0");
  gsi_io_ = net::UdpSocketIo::adopt(gsi_fd, error);
  if (!gsi_io_) {
    *err = EIO;
    return false;
  }

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
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) return fail("epoll");
  if (!watch(listener_.get(), tag(kListener), EPOLLIN) ||
      !watch(signal_fd_.get(), tag(kSignal), EPOLLIN) ||
      !watch(timer_fd_.get(), tag(kTimer), EPOLLIN) ||
      !watch(addresses_.fd(), tag(kNetlink), EPOLLIN))
    return fail("epoll_ctl");
  // Every slot starts free: the daemon drains them all until they are leased.
  for (unsigned s = 0; s < group_.sockets.size(); ++s)
    if (!watch(group_.sockets[s].get(), tag(kSlotSocket, s), EPOLLIN)) return fail("epoll_ctl");
  update_idle_timer();
  log("serving @" + options_.socket_name + ", UDP port " + std::to_string(group_.port) + " (" +
      (group_.family == AF_INET6 ? "IPv6 dual-stack" : "IPv4") + "), " +
      std::to_string(options_.slot_count) + " slots");
  return true;
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
  std::vector<epoll_event> events(64);
  while (!stop_) {
    const int n = epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::cerr << "urdmad: " << errno_text("epoll_wait") << '\n';
      return 1;
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
            stop_ = true;
          }
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
          if (changed) publish_gids();
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
          serve(id_of(t));
          break;
      }
    }
  }
  return exit_code_;
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
      const MadRoute route =
          rx[i].truncated ? MadRoute{.drop = MadDrop::kTruncated} : route_mad(datagram);
      MadDrop drop = route.drop;
      unsigned slot = route.slot;
      if (route.by == MadRoute::By::kServiceId) {
        const auto l = listeners_.find(route.service_id);
        if (l == listeners_.end()) {
          drop = MadDrop::kNoListener;
        } else {
          slot = l->second;
        }
      } else if (route.by == MadRoute::By::kSlot &&
                 (slot == 0 || slot >= slots_.slot_count() || !slots_.leased(slot))) {
        drop = MadDrop::kNoSlot;
      }
      if (drop == MadDrop::kNone) {
        const auto ch = channels_.find(slot);
        if (ch == channels_.end()) {
          drop = MadDrop::kNoChannel;
        } else {
          MadDelivery d{};
          std::memcpy(d.src_address, rx[i].src.address.bytes().data(), 16);
          std::memcpy(d.dst_address, rx[i].dst.address.bytes().data(), 16);
          d.src_port = rx[i].src.port;
          d.dst_port = rx[i].dst.port;
          // Non-blocking: a process that does not read its channel loses MADs (the CM retries).
          if (send_record(clients_.at(ch->second).fd.get(), encode_mad(d, datagram)) != 0)
            drop = MadDrop::kChannelFull;
        }
      }
      if (drop == MadDrop::kNone) {
        ++counters_.mads_forwarded;
      } else {
        ++counters_.mads_dropped[static_cast<size_t>(drop)];
      }
    }
  }
}

int Daemon::listen_request(Client& c, MsgType type, std::span<const uint8_t> rec) {
  ServiceIdBody body;
  if (const int err = decode_request_body(rec, &body)) return err;
  if (!c.slot) return EINVAL;  // MADs are delivered per slot
  const auto it = listeners_.find(body.service_id);
  if (type == MsgType::kListen) {
    if (it != listeners_.end()) return it->second == *c.slot ? 0 : EADDRINUSE;
    listeners_[body.service_id] = *c.slot;
    return 0;
  }
  if (it == listeners_.end() || it->second != *c.slot) return ENOENT;
  listeners_.erase(it);
  return 0;
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

void Daemon::reset_socket(int fd) {
  // Undo what the previous owner may have done to the shared socket: a filter of its own, or a
  // connect() (which the engine never does: a connected socket would only hear one peer, and a
  // connected socket in a reuseport group makes the kernel fall back to scoring lookups).
  int zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_DETACH_FILTER, &zero, sizeof zero);  // ENOENT when none
  sockaddr unspec{};
  unspec.sa_family = AF_UNSPEC;
  connect(fd, &unspec, sizeof unspec);  // dissolves an association; a no-op otherwise
}

void Daemon::accept_clients() {
  for (;;) {
    UniqueFd fd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) return;  // EAGAIN, or a connection that went away
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) continue;
    int refuse = 0;
    if (cred.uid != uid_) {
      refuse = EACCES;
      log("refusing pid " + std::to_string(cred.pid) + ": uid " + std::to_string(cred.uid) +
          " is not the daemon's uid " + std::to_string(uid_));
    } else if (clients_.size() >= options_.max_clients) {
      refuse = EMFILE;
    }
    if (refuse) {
      ++counters_.clients_refused;
      send_record(fd.get(), encode_error(refuse));
      continue;  // hang up: the client reads the error, then EOF
    }
    const uint64_t id = next_client_id_++;
    if (!watch(fd.get(), tag(kClient, id), EPOLLIN | EPOLLRDHUP)) continue;
    ++counters_.clients_accepted;
    clients_[id] = Client{std::move(fd), cred.uid, cred.pid, std::nullopt};
    update_idle_timer();
  }
}

void Daemon::serve(uint64_t id) {
  const auto it = clients_.find(id);
  if (it == clients_.end()) return;
  std::vector<uint8_t> buffer(kMaxMessageBytes);
  for (int i = 0; i < 16; ++i) {
    // Clients pass no fds; any they do is closed.
    const ssize_t n = recv_record(it->second.fd.get(), buffer, nullptr, MSG_DONTWAIT);
    if (n == -EAGAIN) return;
    if (n <= 0) {  // EOF (the process closed it or died) or an error
      drop_client(id);
      return;
    }
    handle_request(id, it->second, {buffer.data(), static_cast<size_t>(n)});
    if (!clients_.contains(id)) return;
  }
}

void Daemon::handle_request(uint64_t id, Client& c, std::span<const uint8_t> rec) {
  MsgHeader h;
  int err = decode_header(rec, &h);
  std::vector<uint8_t> reply;
  std::vector<int> pass_fds;
  if (err == 0 && h.type == static_cast<uint16_t>(MsgType::kAcquireSlot)) {
    if (c.slot) {
      err = EALREADY;
    } else if (const auto lease = slots_.acquire()) {
      // A leased socket is the client's to read: stop draining it, and hand it over empty
      // (datagrams still queued name QPNs of the previous lease or of nobody).
      unwatch(group_.sockets[lease->slot].get());
      drain(lease->slot);
      c.slot = lease->slot;
      ++counters_.slots_leased;
      // The slot's socket, then the whole group (see protocol.h: why every client holds it).
      pass_fds.push_back(group_.sockets[lease->slot].get());
      for (const auto& s : group_.sockets) pass_fds.push_back(s.get());
      reply = encode_slot(SlotInfo{.slot = lease->slot,
                                   .slot_count = slots_.slot_count(),
                                   .qpn_base = lease->qpn_base,
                                   .qpn_count = lease->qpn_count,
                                   .generation = lease->generation,
                                   .udp_port = group_.port,
                                   .family = static_cast<uint16_t>(group_.family)});
      log("pid " + std::to_string(c.pid) + " leased slot " + std::to_string(lease->slot) +
          " (QPNs " + std::to_string(lease->qpn_base) + "+" + std::to_string(lease->qpn_count) +
          ")");
    } else {
      err = EBUSY;
    }
  } else if (err == 0 && (h.type == static_cast<uint16_t>(MsgType::kQueryGids) ||
                          h.type == static_cast<uint16_t>(MsgType::kWatchGids))) {
    reply = encode_gids(gids_.entries());
    if (h.type == static_cast<uint16_t>(MsgType::kWatchGids)) c.watches_gids = true;
  } else if (err == 0 && (h.type == static_cast<uint16_t>(MsgType::kListen) ||
                          h.type == static_cast<uint16_t>(MsgType::kUnlisten))) {
    err = listen_request(c, static_cast<MsgType>(h.type), rec);
    if (err == 0) reply = encode_request(MsgType::kOk);
  } else if (err == 0 && h.type == static_cast<uint16_t>(MsgType::kMadChannel)) {
    err = channel_request(id, c, rec);
    if (err == 0) reply = encode_request(MsgType::kOk);
  } else if (err == 0 && h.type == static_cast<uint16_t>(MsgType::kHello)) {
    reply = encode_request(MsgType::kHello);
  } else if (err == 0 && h.type == static_cast<uint16_t>(MsgType::kQueryStatus)) {
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
                                                   counters_.mads_dropped.end(), uint64_t{0})});
  } else if (err == 0) {
    err = EPROTO;
  }
  if (err) {
    reply = encode_error(err);
    pass_fds.clear();
  }
  if (send_record(c.fd.get(), reply, pass_fds) != 0) drop_client(id);
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
  if (c.channel_slot) {
    const auto ch = channels_.find(*c.channel_slot);
    if (ch != channels_.end() && ch->second == id) channels_.erase(ch);
  }
  if (c.slot) {
    // The slot's service IDs and MAD channel go with it.
    std::erase_if(listeners_, [&](const auto& l) { return l.second == *c.slot; });
    channels_.erase(*c.slot);
    // Reclaim: whatever the dead process left queued is read and dropped, then the slot waits
    // at the back of the free list and will hand out its next QPN range.
    const unsigned s = *c.slot;
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
