#include "daemon/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "daemon/paths.h"
#include "daemon/view_sweep.h"

namespace urdma::daemon {

namespace {

constexpr int kListenFdsStart = 3;  // sd_listen_fds(3): SD_LISTEN_FDS_START

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

void report_status(int* fd, int err, const std::string& reason) {
  if (*fd < 0) return;
  SpawnStatus st{kSpawnStarted, err, {}};
  std::strncpy(st.reason, reason.c_str(), sizeof st.reason - 1);
  (void)!write(*fd, &st, sizeof st);
  close(*fd);
  *fd = -1;
}

// The listening socket systemd passed (sd_listen_fds(3)): a listening SOCK_SEQPACKET unix socket
// at fd 3 meant for this process. -1 when there is none.
int systemd_listener() {
  const char* pid = std::getenv("LISTEN_PID");
  const char* fds = std::getenv("LISTEN_FDS");
  if (!pid || !fds || std::strtol(pid, nullptr, 10) != getpid() ||
      std::strtol(fds, nullptr, 10) < 1)
    return -1;
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  int type = 0, domain = 0, listening = 0;
  socklen_t len = sizeof type;
  if (getsockopt(kListenFdsStart, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET)
    return -1;
  len = sizeof domain;
  if (getsockopt(kListenFdsStart, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_UNIX)
    return -1;
  len = sizeof listening;
  if (getsockopt(kListenFdsStart, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening)
    return -1;
  fcntl(kListenFdsStart, F_SETFD, FD_CLOEXEC);
  fcntl(kListenFdsStart, F_SETFL, fcntl(kListenFdsStart, F_GETFL) | O_NONBLOCK);
  return kListenFdsStart;
}

// Binds and listens on the endpoint's socket file: readable and writable by everyone for a
// system daemon (its directory is root's, and the daemon checks each peer), by the owner only
// otherwise (its directory is the user's, mode 0700, too).
int listen_on(const Endpoint& ep, UniqueFd* out, std::string* error) {
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) {
    *error = errno_text("unix socket");
    return errno;
  }
  sockaddr_un sun;
  socklen_t len;
  if (!unix_address(ep.socket, &sun, &len)) {
    *error = ep.socket + ": the path is too long for a unix socket";
    return ENAMETOOLONG;
  }
  // We hold the lock: a socket file there is a dead daemon's.
  unlink(ep.socket.c_str());
  const mode_t old = umask(ep.system ? 0111 : 0177);
  const int r = bind(fd.get(), reinterpret_cast<const sockaddr*>(&sun), len);
  const int bind_err = errno;
  umask(old);
  if (r != 0) {
    *error = errno_text(("bind " + ep.socket).c_str(), bind_err);
    return bind_err;
  }
  if (listen(fd.get(), 256) != 0) {
    *error = errno_text("listen");
    return errno;
  }
  *out = std::move(fd);
  return 0;
}

// Why the group could not be had: who holds the port, and what to do about it.
std::string port_held_text(uint16_t port, const std::string& detail) {
  const auto owner = udp_port_owner(port);
  if (!owner) return detail;
  std::string text = "UDP port " + std::to_string(port) + " of this network namespace is held by " +
                     owner_text(*owner);
  if (*owner != geteuid()) {
    text +=
        ": one user's urdmad serves a namespace; for every user to use urdma here, run the "
        "system daemon (`systemctl enable --now urdmad.socket`, or `urdmad --system` as "
        "root; docs/SECURITY.md)";
  } else {
    text +=
        " (this user's processes of a daemon that died with its keeper, or another program): "
        "urdma can serve again once they exit";
  }
  return text;
}

pid_t start_daemon(const DaemonOptions& options, DaemonHandoff& handoff, int status_fd,
                   UniqueFd& keeper_end, UniqueFd& signals) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // The daemon: the keeper's control end, signals and signal mask are not its own.
  keeper_end.reset();
  signals.reset();
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  prctl(PR_SET_NAME, "urdmad");
  int err = 0;
  std::string error;
  auto daemon = Daemon::create(options, std::move(handoff), &err, &error);
  int fd = status_fd;
  if (!daemon) {
    std::cerr << "urdmad: " << error << '\n';
    report_status(&fd, err, error);
    _exit(1);
  }
  report_status(&fd, 0, "");
  _exit(daemon->run());
}

}  // namespace

int run_supervisor(SupervisorOptions o) {
  auto log = [&](const std::string& line) {
    if (o.daemon.verbose) std::cerr << "urdma-keeper: " << line << std::endl;
  };
  auto fail = [&](int err, const std::string& error) {
    std::cerr << "urdmad: " << error << '\n';
    report_status(&o.status_fd, err, error);
    return err == EADDRINUSE ? 3 : 1;
  };

  DaemonHandoff handoff;
  int lock_fd = -1;
  std::string error;
  if (const int fd = systemd_listener(); fd >= 0) {
    handoff.listener.reset(fd);
    o.daemon.socket_path = systemd_endpoint().socket;
    o.daemon.view_dir = gid_view_dir(systemd_endpoint().dir, netns_inode());
  } else {
    if (const int err = take_lock(o.endpoint.lock, &lock_fd)) {
      if (err == EADDRINUSE)
        return fail(err, "another urdmad already serves this network namespace (" +
                             o.endpoint.socket + ")");
      return fail(err, errno_text(("lock " + o.endpoint.lock).c_str(), err));
    }
    if (const int err = listen_on(o.endpoint, &handoff.listener, &error)) {
      release_lock(o.endpoint.lock, lock_fd);
      return fail(err, error);
    }
    o.daemon.socket_path = o.endpoint.socket;
    o.daemon.view_dir = gid_view_dir(o.endpoint.dir, netns_inode());
  }
  const std::string runtime_dir = lock_fd >= 0 ? o.endpoint.dir : systemd_endpoint().dir;
  const bool shared_dir = lock_fd < 0 || o.endpoint.system;
  auto sweep_log = [&](const char* what, const SweepResult& r) {
    if (!r.skipped.empty()) log(std::string(what) + ": nothing removed (" + r.skipped + ")");
    for (uint64_t ns : r.removed)
      log(std::string(what) + ": removed the entries of network namespace " + std::to_string(ns));
  };
  bool served = false;  // a daemon served: the namespace's view is ours to judge at the end
  auto cleanup = [&] {
    handoff.group.sockets.clear();  // the UDP group first: a successor finds the port free
    handoff.listener.reset();
    // Our own view, while we still hold the lock: when nothing in the namespace is left to use
    // it. (systemd's socket outlives us: a daemon it starts later writes the same view.)
    if (lock_fd >= 0 && served)
      sweep_log("at exit",
                remove_own_namespace_if_unused(runtime_dir, netns_inode(), shared_dir));
    if (lock_fd >= 0) {
      unlink(o.endpoint.socket.c_str());
      release_lock(o.endpoint.lock, lock_fd);
    }
  };

  // The group, proved before anything is handed out.
  const SlotGroupOptions g{.slot_count = o.daemon.slot_count,
                           .port = o.daemon.udp_port,
                           .allow_ipv6 = o.daemon.allow_ipv6};
  if (const int err = open_slot_group(g, &handoff.group, &error)) {
    cleanup();
    return fail(err, err == EADDRNOTAVAIL ? port_held_text(o.daemon.udp_port, error) : error);
  }
  bool skipped = false;
  if (!verify_steering(handoff.group, &error, &skipped)) {
    cleanup();
    return fail(EADDRNOTAVAIL, error);
  }
  if (skipped) log("loopback unusable: steering not verified");

  sigset_t mask;
  sigemptyset(&mask);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGCHLD}) sigaddset(&mask, s);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  UniqueFd signals(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signals.valid()) {
    cleanup();
    return fail(errno, errno_text("signalfd"));
  }
  handoff.keeper_pid = getpid();
  prctl(PR_SET_NAME, "urdma-keeper");

  int exit_code = 0;
  int64_t backoff_ms = 0;
  for (handoff.restarts = 0;; ++handoff.restarts) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
      cleanup();
      return fail(errno, errno_text("socketpair"));
    }
    UniqueFd keeper_end(pair[0]);
    handoff.keeper.reset(pair[1]);
    const int64_t started = now_ms();
    const pid_t child = start_daemon(o.daemon, handoff, o.status_fd, keeper_end, signals);
    handoff.keeper.reset();
    if (child < 0) {
      cleanup();
      return fail(errno, errno_text("fork"));
    }
    if (o.status_fd >= 0) {  // the daemon reports to the spawner; our copy goes
      close(o.status_fd);
      o.status_fd = -1;
    }
    // What namespaces that no longer exist left here, while the daemon starts serving.
    if (handoff.restarts == 0)
      sweep_log("at start", remove_unused_namespaces(runtime_dir, netns_inode(), shared_dir));
    // Wait for the daemon's end: what it said (ready, idle) tells why it ended.
    bool ready = false, idle = false, stopping = false;
    int status = 0;
    for (bool running = true; running;) {
      pollfd p[2] = {{signals.get(), POLLIN, 0}, {keeper_end.get(), POLLIN, 0}};
      if (poll(p, 2, -1) < 0) continue;  // EINTR
      if (p[1].revents) {
        char what = 0;
        const ssize_t n = recv(keeper_end.get(), &what, 1, MSG_DONTWAIT);
        if (n == 1 && what == kKeeperReady) ready = served = true;
        if (n == 1 && what == kKeeperIdle) idle = true;
        if (n == 0) keeper_end.reset();  // the daemon is gone; its SIGCHLD follows
      }
      if (p[0].revents) {
        signalfd_siginfo si;
        while (read(signals.get(), &si, sizeof si) == sizeof si) {
          if (si.ssi_signo == SIGCHLD) {
            if (waitpid(child, &status, WNOHANG) == child) running = false;
          } else if (!stopping) {
            log("signal " + std::to_string(si.ssi_signo) + ": stopping the daemon");
            stopping = true;
            kill(child, SIGTERM);
          }
        }
      }
    }
    // Only a daemon that served and then ended by itself without idling out is started again:
    // it died under its clients (a crash, or a signal of its own).
    if (!ready || idle || stopping) {
      exit_code = idle || stopping ? 0 : WIFEXITED(status) ? WEXITSTATUS(status) : 1;
      if (!ready) log("the daemon did not start");
      break;
    }
    const bool quick = now_ms() - started < 1000;
    backoff_ms = quick ? std::min<int64_t>(std::max<int64_t>(backoff_ms * 2, 100), 5000) : 0;
    log("the daemon (pid " + std::to_string(child) + ") ended " +
        (WIFSIGNALED(status) ? "by signal " + std::to_string(WTERMSIG(status))
                             : "with status " + std::to_string(WEXITSTATUS(status))) +
        "; starting another" + (backoff_ms ? " in " + std::to_string(backoff_ms) + " ms" : ""));
    if (backoff_ms) {
      pollfd p{signals.get(), POLLIN, 0};
      // A stop request during the back-off ends the keeper.
      if (poll(&p, 1, static_cast<int>(backoff_ms)) > 0) {
        signalfd_siginfo si;
        bool stop = false;
        while (read(signals.get(), &si, sizeof si) == sizeof si) stop |= si.ssi_signo != SIGCHLD;
        if (stop) break;
      }
    }
  }
  cleanup();
  return exit_code;
}

}  // namespace urdma::daemon
