#include "daemon/client.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "base/check.h"
#include "daemon/daemon.h"
#include "daemon/paths.h"
#include "net/shm_ring.h"

#ifndef URDMA_LIB_TO_BIN
#define URDMA_LIB_TO_BIN "../../bin"
#endif

namespace urdma::daemon {

namespace {

constexpr int kStatusFd = 3;

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string real(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) ? std::string(resolved) : std::string();
}

// The file of the binary or library holding this code.
std::string own_module() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&own_module), &info) || !info.dli_fname) return "";
  return real(info.dli_fname);
}

// A urdmad to run: a regular executable file that the caller may trust (paths.h).
bool trusted_binary(const std::string& path, std::string* why) {
  const std::string file = real(path);
  struct stat st;
  if (file.empty() || stat(file.c_str(), &st) != 0) {
    *why = path + ": " + std::strerror(errno);
    return false;
  }
  if (!S_ISREG(st.st_mode) || access(file.c_str(), X_OK) != 0) {
    *why = path + " is not an executable file";
    return false;
  }
  if (!trusted_path(file, geteuid(), why)) {
    *why = "not running " + path + ": " + *why;
    return false;
  }
  return true;
}

// A kShmReady's or kShmOn's body and fds as a pair: false unless the fds are a region, sealed
// against shrinking and growing and net::kShmRegionBytes long (a peer maps it whole: anything
// else could end in SIGBUS), and a doorbell. The fds are taken either way.
bool shm_pair_of(const ShmPairBody& body, std::vector<UniqueFd>* fds, ShmPair* pair) {
  std::vector<UniqueFd> taken = std::move(*fds);
  fds->clear();
  if (taken.size() != kShmPairFds) return false;
  constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW;
  struct stat st {};
  const int seals = fcntl(taken[0].get(), F_GET_SEALS);
  if (fstat(taken[0].get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<size_t>(st.st_size) != net::kShmRegionBytes || seals < 0 ||
      (seals & kSeals) != kSeals)
    return false;
  pair->peer_range = body.peer_range;
  pair->side = body.side;
  pair->peer_pid = body.peer_pid;
  pair->peer_slot = body.peer_slot;
  pair->region = std::move(taken[0]);
  pair->peer_doorbell = std::move(taken[1]);
  return true;
}

// Connects to a daemon's socket, checks who listens and sets the reply timeouts. ENOENT or
// ECONNREFUSED: nobody serves there.
int try_connect(const std::string& path, int timeout_ms, UniqueFd* out, std::string* detail) {
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno;
  sockaddr_un sun;
  socklen_t len;
  if (!unix_address(path, &sun, &len)) {
    *detail = path + ": the path is too long for a unix socket";
    return ENAMETOOLONG;
  }
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&sun), len) != 0) {
    const int err = errno;
    *detail = errno_text(("connect to urdmad at " + path).c_str(), err);
    return err;
  }
  // By the kernel's word: whoever listens there must be root or ourselves.
  ucred cred{};
  socklen_t clen = sizeof cred;
  if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) return errno;
  if (cred.uid != 0 && cred.uid != geteuid()) {
    *detail = "the urdmad socket " + path + " is served by " + owner_text(cred.uid) +
              ", neither root nor this user: refusing it";
    return EACCES;
  }
  // Replies are bounded in time: a stuck daemon is an error, never a hang.
  const timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  *out = std::move(fd);
  return 0;
}

// The daemon's log: a regular file of ours in a directory we can trust, reached through no link
// another user could point elsewhere (trusted_path checks every component), opened without
// following a link and without blocking (a FIFO planted there fails instead of hanging us). -1
// and *why when it is set but refused.
int open_log(std::string* why) {
  const char* env = secure_getenv("URDMA_DAEMON_LOG");
  if (!env || !*env) return -1;
  const std::string path = env;
  const std::string label = "URDMA_DAEMON_LOG=" + path;
  if (path[0] != '/') {
    *why = label + " is not an absolute path";
    return -1;
  }
  std::string dir_why;
  if (!trusted_path(dir_of(path), geteuid(), &dir_why, /*to_create_in=*/true)) {
    *why = label + ": " + dir_why;
    return -1;
  }
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = errno_text(label.c_str());
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    *why = label + " is not a regular file of this user";
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

// Starts `path` detached (double fork: the daemon is not our child and never our zombie) with
// its status pipe on fd 3. Only async-signal-safe calls between fork and exec: the caller may
// have threads. Returns the read end of the status pipe, or -errno.
int spawn_detached(const std::string& path, const std::string& runtime_dir, int log_fd) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return -errno;
  UniqueFd rd(pipe_fds[0]), wr(pipe_fds[1]);
  const std::string status_arg = std::to_string(kStatusFd);
  // With a log file, the daemon says what it does (clients, slots); otherwise only errors.
  const char* argv[] = {path.c_str(),    "--status-fd",       status_arg.c_str(),
                        "--runtime-dir", runtime_dir.c_str(), log_fd >= 0 ? "--verbose" : nullptr,
                        nullptr};
  const pid_t child = fork();
  if (child < 0) return -errno;
  if (child == 0) {
    setsid();
    if (fork() != 0) _exit(0);  // the intermediate exits; the daemon is reparented
    const int null_fd = open("/dev/null", O_RDWR);
    const int out = log_fd >= 0 ? log_fd : null_fd;
    if (null_fd >= 0) dup2(null_fd, 0);
    if (out >= 0) {
      dup2(out, 1);
      dup2(out, 2);
    }
    if (wr.get() == kStatusFd) {
      fcntl(kStatusFd, F_SETFD, 0);  // already there: only keep it open across exec
    } else {
      dup2(wr.get(), kStatusFd);  // dup2 clears close-on-exec on the copy
    }
    close_range(kStatusFd + 1, ~0U, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    (void)!chdir("/");
    execv(path.c_str(), const_cast<char* const*>(argv));
    const SpawnStatus st{kSpawnExecFailed, errno, {}};
    (void)!write(kStatusFd, &st, sizeof st);
    _exit(127);
  }
  int status;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return rd.release();
}

}  // namespace

bool running_from_build_tree() {
#ifdef URDMA_BINARY_DIR
  const std::string module = own_module();
  const std::string build = real(URDMA_BINARY_DIR);
  return !module.empty() && !build.empty() && module.rfind(build + "/", 0) == 0;
#else
  return false;
#endif
}

std::string find_daemon_binary(const ClientOptions& options, std::string* why) {
  std::string ignored;
  if (!why) why = &ignored;
  auto take = [&](const std::string& path) { return trusted_binary(path, why) ? path : ""; };
  if (!options.daemon_path.empty()) return take(options.daemon_path);
  if (const char* env = secure_getenv("URDMA_DAEMON"); env && *env) return take(env);
  const std::string module = own_module();
  if (!module.empty()) {
    // Installed: urdmad beside the tools in bin/, or bin/ seen from <libdir>/urdma.
    for (const std::string& candidate :
         {dir_of(module) + "/urdmad", dir_of(module) + "/" URDMA_LIB_TO_BIN "/urdmad"}) {
      struct stat st;
      if (stat(candidate.c_str(), &st) == 0) return take(candidate);
    }
  }
#ifdef URDMA_BUILT_DAEMON
  if (running_from_build_tree()) return take(URDMA_BUILT_DAEMON);
#endif
  *why = "no urdmad found (installed beside urdma's libraries, or named by URDMA_DAEMON)";
  return "";
}

namespace {

// Starts urdmad and waits for its verdict: 0 (serving), EADDRINUSE (another daemon won the
// race to serve the namespace) or why it could not start.
int spawn_and_wait(const std::string& path, const std::string& runtime_dir, int64_t deadline,
                   int timeout_ms, std::string* detail) {
  std::string log_why;
  UniqueFd log(open_log(&log_why));
  if (!log_why.empty()) {
    *detail = log_why;
    return EACCES;
  }
  const int status_fd = spawn_detached(path, runtime_dir, log.get());
  if (status_fd < 0) {
    *detail = errno_text(("start " + path).c_str(), -status_fd);
    return -status_fd;
  }
  UniqueFd status(status_fd);
  SpawnStatus st{};
  for (;;) {
    const int64_t left = deadline - now_ms();
    pollfd p{status.get(), POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 0)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      *detail = path + " did not report within " + std::to_string(timeout_ms) + " ms";
      return ETIMEDOUT;
    }
    const ssize_t n = read(status.get(), &st, sizeof st);
    if (n < 0 && errno == EINTR) continue;
    if (n < static_cast<ssize_t>(offsetof(SpawnStatus, reason)))
      st = {kSpawnStarted, EIO, "exited without reporting"};
    st.reason[sizeof st.reason - 1] = 0;
    break;
  }
  if (st.stage == kSpawnExecFailed) {
    *detail = errno_text(("exec " + path).c_str(), st.err);
    return st.err;
  }
  if (st.err != 0 && st.err != EADDRINUSE)
    *detail = path + " failed to start: " + (st.reason[0] ? st.reason : std::strerror(st.err));
  return st.err;
}

}  // namespace

int Client::greet() {
  // Our network namespace travels as an fd: the daemon serves only its own.
  UniqueFd ns(open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!ns.valid()) return errno;
  const int fds[] = {ns.get()};
  std::vector<uint8_t> reply;
  int err = call_record_locked(encode_request(MsgType::kHello), &reply, nullptr, fds);
  if (err == 0) err = decode_hello(reply, &hello_);
  return err;
}

int Client::connect_or_spawn(const ClientOptions& options, Client* out, std::string* detail) {
  const uint64_t netns = netns_inode();
  const int64_t deadline = now_ms() + options.timeout_ms;
  // Greets the daemon at `path`: 0, or why not (ECONNREFUSED: nobody, or it was going away).
  auto reach = [&](const std::string& path) {
    UniqueFd fd;
    int err = try_connect(path, options.timeout_ms, &fd, detail);
    if (err != 0) return err == ENOENT ? ECONNREFUSED : err;
    out->fd_ = std::move(fd);
    out->push_only_ = false;
    out->options_ = options;
    out->socket_path_ = path;
    err = out->greet();
    if (err == 0) return 0;
    out->fd_.reset();
    if (err == ECONNRESET || err == EPIPE) return ECONNREFUSED;  // it was exiting (idle)
    *detail = errno_text(("urdmad at " + path).c_str(), err);
    if (err == EACCES) *detail += " (it serves another user)";
    if (err == EMFILE) *detail += " (too many connections of this process or user)";
    return err;
  };

  // A system daemon of this namespace first: its directory must be root's.
  if (options.system && options.runtime_dir.empty()) {
    for (const Endpoint& ep : {system_endpoint(netns), systemd_endpoint()}) {
      std::string why;
      struct stat st;
      if (stat(ep.socket.c_str(), &st) != 0 || !trusted_path(ep.dir, 0, &why)) continue;
      const int err = reach(ep.socket);
      if (err == 0) return 0;
      if (err != ECONNREFUSED && err != EXDEV) return err;  // it is there and refused us
    }
  }

  Endpoint ep;
  if (!options.runtime_dir.empty()) {
    ep = endpoint_in(options.runtime_dir, netns, false);
    if (!trusted_path(ep.dir, geteuid(), detail)) return EACCES;
  } else if (const int err = user_endpoint(geteuid(), netns, &ep, detail)) {
    return err;
  }
  std::string path;
  // Each round: connect and greet; else start a daemon. A round repeats when the daemon we
  // reached was exiting (idle) as we connected, or when another daemon won the start-up race
  // and is not listening yet, until the deadline.
  for (;;) {
    int err = reach(ep.socket);
    if (err == 0) return 0;
    if (err != ECONNREFUSED) return err;
    if (!options.spawn) {
      *detail = "urdmad is not running in this network namespace (" + ep.socket + ")";
      return ECONNREFUSED;
    }
    if (now_ms() >= deadline) {
      *detail = "urdmad at " + ep.socket + " did not come up within " +
                std::to_string(options.timeout_ms) + " ms";
      return ETIMEDOUT;
    }
    if (path.empty()) {
      std::string why;
      path = find_daemon_binary(options, &why);
      if (path.empty()) {
        *detail = "urdmad is not running and cannot be started: " + why;
        return ENOENT;
      }
    }
    err = spawn_and_wait(path, ep.dir, deadline, options.timeout_ms, detail);
    if (err == EADDRINUSE) {
      usleep(5000);  // the winner holds the lock; let it listen
    } else if (err != 0) {
      return err;
    }
  }
}

struct Client::Keeper {
  std::mutex mu;  // held across every exchange on fd_ (calls from other threads, the keeper's)
  Slot slot;
  CounterSource counters;
  CaptureSink capture;
  ShmSink shm;
  UniqueFd stop;  // an eventfd: written to stop the thread
  std::atomic<uint64_t> reattachments{0};
  std::thread thread;
};

int Client::call(MsgType request, std::vector<uint8_t>* reply, std::vector<UniqueFd>* passed) {
  return call_record(encode_request(request), reply, passed);
}

int Client::call_record(std::span<const uint8_t> rec, std::vector<uint8_t>* reply,
                        std::vector<UniqueFd>* passed) {
  if (!keeper_) return call_record_locked(rec, reply, passed);
  std::lock_guard lock(keeper_->mu);
  return call_record_locked(rec, reply, passed);
}

int Client::call_record_locked(std::span<const uint8_t> rec, std::vector<uint8_t>* reply,
                               std::vector<UniqueFd>* passed, std::span<const int> fds) {
  if (!fd_.valid()) return ENOTCONN;
  if (push_only_) return EBUSY;
  const int send_err = send_record(fd_.get(), rec, fds);
  // A refused client may find the connection closed already; the reason is still queued.
  if (send_err != 0 && send_err != EPIPE && send_err != ECONNRESET) return send_err;
  reply->resize(kMaxMessageBytes);
  // urdmad may have pushed a capturer's socket or a region before the reply (kCaptureOn,
  // kShmOn): their fds are kept even when the caller expects none.
  std::vector<UniqueFd> pushed;
  std::vector<UniqueFd>* into = passed != nullptr ? passed : &pushed;
  ssize_t n = recv_record(fd_.get(), *reply, into, 0, kShmPairFds);
  for (int pushes = 0; n > 0 && pushes < 64; ++pushes) {
    if (!take_push({reply->data(), static_cast<size_t>(n)}, into)) break;
    reply->resize(kMaxMessageBytes);
    n = recv_record(fd_.get(), *reply, into, 0, kShmPairFds);
  }
  // A daemon that refused us closed the connection with our request unread: the kernel reports
  // ECONNRESET first (once), and the refusal record is still queued behind it.
  if (n == -ECONNRESET) n = recv_record(fd_.get(), *reply, passed, MSG_DONTWAIT, kShmPairFds);
  if (n == -EAGAIN && send_err) return send_err;
  if (n < 0) return -n == EAGAIN ? ETIMEDOUT : static_cast<int>(-n);
  if (n == 0) return send_err ? send_err : ECONNRESET;
  reply->resize(static_cast<size_t>(n));
  return 0;
}

int Client::acquire_slot(Slot* slot) {
  std::vector<uint8_t> reply;
  std::vector<UniqueFd> fds;
  if (const int err = call(MsgType::kAcquireSlot, &reply, &fds)) return err;
  SlotInfo info;
  if (const int err = decode_slot(reply, &info)) return err;
  int type = 0;
  socklen_t len = sizeof type;
  if (fds.size() != 1 || getsockopt(fds.front().get(), SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
      type != SOCK_DGRAM)
    return EPROTO;
  slot->fd = std::move(fds.front());
  slot->info = info;
  return 0;
}

int Client::query_status(StatusInfo* status) {
  std::vector<uint8_t> reply;
  if (const int err = call(MsgType::kQueryStatus, &reply, nullptr)) return err;
  return decode_status(reply, status);
}

int Client::watch_gids(std::vector<GidEntry>* gids) {
  std::vector<uint8_t> reply;
  if (const int err = call(MsgType::kWatchGids, &reply, nullptr)) return err;
  if (const int err = decode_gids(reply, gids)) return err;
  push_only_ = true;
  return 0;
}

int Client::next_push(std::vector<uint8_t>* record) {
  if (!push_only_) return EINVAL;
  record->resize(kMaxMessageBytes);
  const ssize_t n = recv_record(fd_.get(), *record, nullptr, MSG_DONTWAIT);
  if (n < 0) return static_cast<int>(-n);
  if (n == 0) return ECONNRESET;  // the daemon went away
  record->resize(static_cast<size_t>(n));
  return 0;
}

int Client::next_gid_update(std::vector<GidEntry>* gids) {
  std::vector<uint8_t> record;
  if (const int err = next_push(&record)) return err;
  return decode_gids(record, gids);
}

int Client::listen(uint64_t service_id) {
  return service_request(MsgType::kListen, service_id);
}

int Client::unlisten(uint64_t service_id) {
  return service_request(MsgType::kUnlisten, service_id);
}

// kListen / kUnlisten. The service IDs are remembered (under the keeper's lock, when keeping) so
// that the keeper registers them again with a restarted daemon.
int Client::service_request(MsgType type, uint64_t service_id) {
  std::unique_lock<std::mutex> lock;
  if (keeper_) lock = std::unique_lock(keeper_->mu);
  std::vector<uint8_t> reply;
  int err = call_record_locked(encode_service_request(type, service_id), &reply, nullptr);
  if (err == 0) err = decode_ok(reply);
  if (err == 0 && type == MsgType::kListen) listening_.insert(service_id);
  if (err == 0 && type == MsgType::kUnlisten) listening_.erase(service_id);
  return err;
}

int Client::open_mad_channel(unsigned slot) {
  std::vector<uint8_t> reply;
  if (const int err = call_record(encode_mad_channel(slot), &reply, nullptr)) return err;
  if (const int err = decode_ok(reply)) return err;
  push_only_ = true;
  return 0;
}

int Client::next_mad(MadDelivery* info, std::vector<uint8_t>* datagram) {
  std::vector<uint8_t> record;
  if (const int err = next_push(&record)) return err;
  return decode_mad(record, info, datagram);
}

int Client::query_clients(ClientsPage* page, std::vector<ClientEntry>* entries) {
  entries->clear();
  // Pages until every connection was listed; connections come and go meanwhile, so stop at an
  // empty page, and after as many entries as a daemon can have (a daemon that claims more is
  // not believed).
  constexpr size_t kMaxEntries = 65536;
  for (uint32_t first = 0;;) {
    std::vector<uint8_t> reply;
    if (const int err = call_record(encode_clients_query(first), &reply, nullptr)) return err;
    std::vector<ClientEntry> got;
    ClientsPage p;
    if (const int err = decode_clients(reply, &p, &got)) return err;
    if (first == 0) *page = p;
    entries->insert(entries->end(), got.begin(), got.end());
    first += p.count;
    if (p.count == 0 || first >= p.total) break;
    if (entries->size() >= kMaxEntries) return EPROTO;
  }
  page->total = static_cast<uint32_t>(entries->size());
  page->first = 0;
  page->count = page->total;
  return 0;
}

int Client::report_counters(const CounterReport& report) {
  std::unique_lock<std::mutex> lock;
  if (keeper_) lock = std::unique_lock(keeper_->mu);
  if (!fd_.valid()) return ENOTCONN;
  if (push_only_) return EBUSY;
  return send_record(fd_.get(), encode_counter_report(report));
}

int Client::reattach(const Slot& slot) {
  const int fds[] = {slot.fd.get()};
  std::vector<uint8_t> reply;
  const auto request = encode_reattach(slot.info);
  int err;
  if (keeper_) {
    std::lock_guard lock(keeper_->mu);
    err = call_record_locked(request, &reply, nullptr, fds);
  } else {
    err = call_record_locked(request, &reply, nullptr, fds);
  }
  return err ? err : decode_ok(reply);
}

int Client::conn_up(const ConnRecord& conn) {
  std::unique_lock<std::mutex> lock;
  if (keeper_) lock = std::unique_lock(keeper_->mu);
  std::vector<uint8_t> reply;
  int err = call_record_locked(encode_conn_up(conn), &reply, nullptr);
  if (err == 0) err = decode_ok(reply);
  if (err == 0) conns_[conn.local_comm_id] = conn;
  return err;
}

int Client::conn_down(uint32_t local_comm_id) {
  std::unique_lock<std::mutex> lock;
  if (keeper_) lock = std::unique_lock(keeper_->mu);
  conns_.erase(local_comm_id);
  std::vector<uint8_t> reply;
  const int err = call_record_locked(encode_conn_down(local_comm_id), &reply, nullptr);
  return err ? err : decode_ok(reply);
}

int Client::mcast_attach(uint32_t qpn, const net::Address& group) {
  std::unique_lock<std::mutex> lock;
  if (keeper_) lock = std::unique_lock(keeper_->mu);
  std::vector<uint8_t> reply;
  int err = call_record_locked(encode_mcast(MsgType::kMcastAttach, qpn, group), &reply, nullptr);
  if (err == 0) err = decode_ok(reply);
  if (err == 0) mcast_.emplace(qpn, group);
  return err;
}

int Client::mcast_detach(uint32_t qpn, const net::Address& group) {
  std::unique_lock<std::mutex> lock;
  if (keeper_) lock = std::unique_lock(keeper_->mu);
  mcast_.erase({qpn, group});
  std::vector<uint8_t> reply;
  const int err =
      call_record_locked(encode_mcast(MsgType::kMcastDetach, qpn, group), &reply, nullptr);
  return err ? err : decode_ok(reply);
}

int Client::shm_accept(UniqueFd* doorbell) {
  std::vector<uint8_t> reply;
  std::vector<UniqueFd> fds;
  if (const int err = call(MsgType::kShmAccept, &reply, &fds)) return err;
  if (const int err = decode_shm_accepted(reply)) return err;
  if (fds.size() != 1) return EPROTO;
  *doorbell = std::move(fds.front());
  shm_accepted_ = true;
  return 0;
}

int Client::shm_connect(const net::Address& address, uint32_t qpn, ShmPair* pair) {
  std::vector<uint8_t> reply;
  std::vector<UniqueFd> fds;
  if (const int err = call_record(encode_shm_connect(address, qpn), &reply, &fds)) return err;
  ShmPairBody body;
  if (const int err = decode_shm_ready(reply, &body)) return err;
  return shm_pair_of(body, &fds, pair) ? 0 : EPROTO;
}

// ---- the keeper ----

Client::Client() = default;
Client::Client(Client&& other) noexcept
    : fd_(std::move(other.fd_)),
      push_only_(other.push_only_),
      options_(std::move(other.options_)),
      listening_(std::move(other.listening_)),
      conns_(std::move(other.conns_)),
      mcast_(std::move(other.mcast_)),
      captures_(std::move(other.captures_)),
      shm_accepted_(other.shm_accepted_),
      shm_pushes_(std::move(other.shm_pushes_)),
      hello_(other.hello_),
      socket_path_(std::move(other.socket_path_)) {
  // Moved only before keep(): the keeper thread holds `this`.
  base::check(other.keeper_ == nullptr, "a kept Client is not moved");
}
Client& Client::operator=(Client&& other) noexcept {
  base::check(keeper_ == nullptr && other.keeper_ == nullptr, "a kept Client is not moved");
  fd_ = std::move(other.fd_);
  push_only_ = other.push_only_;
  options_ = std::move(other.options_);
  listening_ = std::move(other.listening_);
  conns_ = std::move(other.conns_);
  mcast_ = std::move(other.mcast_);
  captures_ = std::move(other.captures_);
  shm_accepted_ = other.shm_accepted_;
  shm_pushes_ = std::move(other.shm_pushes_);
  hello_ = other.hello_;
  socket_path_ = std::move(other.socket_path_);
  return *this;
}
Client::~Client() {
  stop_keeping();
}

bool Client::take_push(std::span<const uint8_t> record, std::vector<UniqueFd>* fds) {
  uint32_t slot = 0;
  ShmPairBody body;
  uint32_t peer_range = 0;
  if (decode_capture_on(record, &slot) == 0) {
    if (fds->size() == 1) {
      UniqueFd socket = std::move(fds->front());
      if (keeper_ && keeper_->capture)
        keeper_->capture(std::move(socket), slot);
      else
        captures_.emplace_back(std::move(socket), slot);
    }
  } else if (decode_shm_on(record, &body) == 0) {
    ShmPush push{.on = true, .pair = {}};
    if (shm_pair_of(body, fds, &push.pair)) take_shm_push(std::move(push));
  } else if (decode_shm_off(record, &peer_range) == 0) {
    ShmPush push{.on = false, .pair = {}};
    push.pair.peer_range = peer_range;
    take_shm_push(std::move(push));
  } else {
    return false;
  }
  fds->clear();
  return true;
}

void Client::take_shm_push(ShmPush push) {
  if (keeper_ && keeper_->shm) {
    keeper_->shm(std::move(push));
    return;
  }
  // Kept for keep(). The end of a peer's lease replaces what was kept about it (a region made
  // and gone before anyone looked), so at most one push per range waits here.
  if (!push.on)
    std::erase_if(shm_pushes_,
                  [&](const ShmPush& p) { return p.pair.peer_range == push.pair.peer_range; });
  shm_pushes_.push_back(std::move(push));
}

int Client::capture(uint32_t filter, int socket, uint32_t* processes) {
  // A kept connection's keeper thread reads it too: without the lock it may take the reply.
  std::unique_lock<std::mutex> lock;
  if (keeper_) lock = std::unique_lock(keeper_->mu);
  std::vector<uint8_t> reply;
  const int fds[] = {socket};
  if (const int err = call_record_locked(encode_capture(filter), &reply, nullptr, fds)) return err;
  return decode_capturing(reply, processes);
}

int Client::keep(Slot slot, CounterSource counters, CaptureSink capture, ShmSink shm) {
  if (keeper_) return EALREADY;
  if (!fd_.valid()) return ENOTCONN;
  if (push_only_) return EBUSY;
  auto k = std::make_unique<Keeper>();
  k->stop.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!k->stop.valid()) return errno;
  k->slot = std::move(slot);
  k->counters = std::move(counters);
  k->capture = std::move(capture);
  k->shm = std::move(shm);
  if (k->capture)
    for (auto& [socket, at] : captures_) k->capture(std::move(socket), at);
  captures_.clear();
  if (k->shm)
    for (ShmPush& push : shm_pushes_) k->shm(std::move(push));
  shm_pushes_.clear();
  keeper_ = std::move(k);
  keeper_->thread = std::thread([this] { keep_loop(); });
  return 0;
}

void Client::stop_keeping() {
  if (!keeper_ || !keeper_->thread.joinable()) return;
  const uint64_t one = 1;
  (void)!write(keeper_->stop.get(), &one, sizeof one);
  keeper_->thread.join();
}

uint64_t Client::reattachments() const {
  return keeper_ ? keeper_->reattachments.load(std::memory_order_relaxed) : 0;
}

const Slot* Client::kept_slot() const {
  return keeper_ ? &keeper_->slot : nullptr;
}

// Sleeps up to timeout_ms on the stop eventfd; true when asked to stop.
bool Client::wait_stop(int timeout_ms) {
  pollfd p{keeper_->stop.get(), POLLIN, 0};
  return poll(&p, 1, timeout_ms) > 0;
}

void Client::keep_loop() {
  constexpr int kReportIntervalMs = 1000;
  Keeper& k = *keeper_;
  CounterReport last{};
  bool reported = false;
  // The next report's time: wake-ups for other reasons (pushes, other threads' replies) must
  // not put it off.
  int64_t report_at = now_ms() + kReportIntervalMs;
  for (;;) {
    // Hang-ups and pushes wake us on the connection. A reply to another thread's call wakes us
    // too, but that thread holds the lock until it has read it: we then find nothing.
    pollfd p[2] = {{k.stop.get(), POLLIN, 0}, {fd_.get(), POLLIN | POLLRDHUP, 0}};
    const int r = poll(
        p, 2, k.counters ? static_cast<int>(std::max<int64_t>(report_at - now_ms(), 0)) : -1);
    if (r < 0 && errno != EINTR) return;
    if (p[0].revents) {
      // The process closes its device: one last report, so a run shorter than the interval
      // is counted too (urdmad keeps it after the connection closes: ClientRole::kDeparted).
      if (k.counters) {
        const CounterReport now = k.counters();
        if (!reported || now != last) (void)report_counters(now);
      }
      return;
    }
    bool gone = (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
    if (!gone && (p[1].revents & POLLIN)) {
      std::lock_guard lock(k.mu);
      std::vector<uint8_t> record(kMaxMessageBytes);
      std::vector<UniqueFd> fds;
      const ssize_t n = recv_record(fd_.get(), record, &fds, MSG_DONTWAIT, kShmPairFds);
      // A push is taken; anything else unsolicited (a kError for a malformed report) is dropped.
      if (n > 0) (void)take_push({record.data(), static_cast<size_t>(n)}, &fds);
      gone = n == 0;
    }
    if (gone) {
      // The daemon is gone. Reconnect (starting one when nobody serves) and hand the slot over,
      // backing off while that fails; the slot's socket keeps working meanwhile.
      {
        std::lock_guard lock(k.mu);
        fd_.reset();
      }
      for (int backoff_ms = 20;; backoff_ms = std::min(backoff_ms * 2, 1000)) {
        Client fresh;
        std::string detail;
        int err = Client::connect_or_spawn(options_, &fresh, &detail);
        if (err == 0) err = fresh.reattach(k.slot);
        if (err == 0) {
          // The new daemon knows no doorbell of this slot: accept again, so that peers can be
          // given regions with it (those made before keep working with the old doorbell).
          UniqueFd bell;
          if (shm_accepted_ && fresh.shm_accept(&bell) != 0) bell.reset();
          std::lock_guard lock(k.mu);
          // The CM services this process listened on (best effort: another process may have
          // taken one meanwhile), and its established connections.
          for (const uint64_t id : listening_) (void)fresh.listen(id);
          for (const auto& [id, conn] : conns_) (void)fresh.conn_up(conn);
          for (const auto& [qpn, group] : mcast_) (void)fresh.mcast_attach(qpn, group);
          fd_ = std::move(fresh.fd_);
          hello_ = fresh.hello_;
          socket_path_ = fresh.socket_path_;
          k.reattachments.fetch_add(1, std::memory_order_relaxed);
          reported = false;  // the new daemon has none yet
          if (bell.valid() && k.shm) {
            ShmPush push;
            push.own_doorbell = std::move(bell);
            k.shm(std::move(push));
          }
          break;
        }
        // The daemon refused the slot for good (another group or port: EINVAL; the slot leased
        // to someone else: EBUSY; a daemon or socket we cannot trust: EACCES), or the group died
        // with its keeper and no daemon can start while our own socket holds the port
        // (EADDRNOTAVAIL). The slot's socket stays open for this process; only the daemon does
        // not know it.
        if (err == EINVAL || err == EBUSY || err == EACCES || err == EADDRNOTAVAIL) {
          (void)wait_stop(-1);
          return;
        }
        if (wait_stop(backoff_ms)) return;
      }
      continue;
    }
    if (k.counters && now_ms() >= report_at) {
      report_at = now_ms() + kReportIntervalMs;
      const CounterReport now = k.counters();
      if (reported && now == last) continue;
      if (report_counters(now) == 0) {
        last = now;
        reported = true;
      }
    }
  }
}

int Client::query_gids(std::vector<GidEntry>* gids) {
  std::vector<uint8_t> reply;
  if (const int err = call(MsgType::kQueryGids, &reply, nullptr)) return err;
  return decode_gids(reply, gids);
}

}  // namespace urdma::daemon
