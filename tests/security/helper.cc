// The local attacker of the security tests (security_test.cc), run as an unprivileged user
// (setpriv). It uses nothing of urdma: only what any local user may do with unix sockets, so it
// can be aimed at any urdma build, an older one included.
//
//   urdma_security_helper lurk [--mkdir DIR]... [--listen PATH|@NAME]... [--connect PATH]...
//       Makes each DIR (mode 0777) it can, and until SIGTERM: keeps trying to listen on each
//       name (SOCK_SEQPACKET; @NAME is abstract) it does not hold yet — a name in use now may be
//       free later, when a daemon dies —, accepts every connection and answers every record as a
//       daemon would (a kHello for a kHello, a kOk for anything else), so a client that believes
//       it goes on to hand over what it holds; tries to connect to each PATH every 2 ms. Counts
//       the connections it got and the fds that came with them. Prints "ready pid=P" once it
//       made its first round, and at SIGTERM a line "lurk: accepted=A connected=C records=R
//       fds=F" (and what each --mkdir and --listen came to).
//   urdma_security_helper flood PATH PROCESSES PER_PROCESS DURATION_MS
//       PROCESSES processes, each holding up to PER_PROCESS connections to PATH that never send
//       a byte, for DURATION_MS: a connection the daemon closes is opened again (at once when it
//       was closed silently, after a second when refused). Prints "flooding" when every process
//       has opened its first connections, then one line of totals: "flood: connects=N
//       refused_emfile=E refused_other=O silent_closed=S min_close_ms=A max_close_ms=B
//       connect_errors=X open_at_end=H".
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

// The first 16 bytes of every urdmad record (daemon/protocol.h, MsgHeader), the same in every
// version so far; written out here so that this program depends on no urdma code.
struct Header {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t size;
  int32_t status;
};
constexpr uint16_t kTypeError = 5;
constexpr uint16_t kTypeHello = 9;
constexpr uint16_t kTypeOk = 10;

volatile sig_atomic_t g_stop = 0;

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

// A unix address: a path, or an abstract name written "@name".
socklen_t unix_address(const std::string& name, sockaddr_un* sun) {
  *sun = {};
  sun->sun_family = AF_UNIX;
  if (name.size() >= sizeof sun->sun_path) return 0;
  if (name[0] == '@') {
    std::memcpy(sun->sun_path + 1, name.data() + 1, name.size() - 1);
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  }
  std::memcpy(sun->sun_path, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() + 1);
}

// Reads every record queued on `fd`: counts them and the fds they carry (closed at once), and
// answers each as a daemon would. False when the peer hung up.
bool serve(int fd, int* records, int* fds) {
  for (;;) {
    uint8_t buf[32768];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 253)];
    iovec iov{buf, sizeof buf};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int passed;
        std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof passed);
        close(passed);
        ++*fds;
      }
    }
    if (n == 0) return false;
    ++*records;
    if (static_cast<size_t>(n) >= sizeof(Header)) {
      Header h;
      std::memcpy(&h, buf, sizeof h);
      const Header reply{h.magic, h.version, h.type == kTypeHello ? kTypeHello : kTypeOk,
                         sizeof(Header), 0};
      (void)!send(fd, &reply, sizeof reply, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
  }
}

int lurk(const std::vector<std::string>& args) {
  std::vector<std::string> dirs, names, targets;
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    if (args[i] == "--mkdir")
      dirs.push_back(args[i + 1]);
    else if (args[i] == "--listen")
      names.push_back(args[i + 1]);
    else if (args[i] == "--connect")
      targets.push_back(args[i + 1]);
    else
      return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop = 1; };
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::string report;
  umask(0);
  for (const std::string& d : dirs) {
    const bool made = mkdir(d.c_str(), 0777) == 0;
    report += " mkdir " + d + ": " + (made ? std::string("made") : std::strerror(errno)) + ";";
  }
  std::vector<int> listeners(names.size(), -1);
  std::vector<int> conns;
  std::map<int, int> connect_errors;  // errno -> attempts
  int accepted = 0, connected = 0, records = 0, fds = 0;
  bool ready = false;
  int64_t next_bind = 0;
  while (!g_stop) {
    const int64_t now = now_ms();
    if (now >= next_bind) {
      next_bind = now + 10;
      for (size_t i = 0; i < names.size(); ++i) {
        if (listeners[i] >= 0) continue;
        sockaddr_un sun;
        const socklen_t len = unix_address(names[i], &sun);
        const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (len && bind(s, reinterpret_cast<sockaddr*>(&sun), len) == 0 && listen(s, 64) == 0) {
          if (names[i][0] != '@') chmod(names[i].c_str(), 0777);
          listeners[i] = s;
        } else {
          close(s);
        }
      }
    }
    for (const std::string& t : targets) {
      sockaddr_un sun;
      const socklen_t len = unix_address(t, &sun);
      const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (len && connect(s, reinterpret_cast<sockaddr*>(&sun), len) == 0) {
        ++connected;
        // Greet it as a client would: whatever it answers, and with whatever fds, is counted.
        const Header hello{0x75724d44, 2, kTypeHello, sizeof(Header), 0};
        (void)!send(s, &hello, sizeof hello, MSG_DONTWAIT | MSG_NOSIGNAL);
        conns.push_back(s);
      } else {
        ++connect_errors[errno];
        close(s);
      }
    }
    std::vector<pollfd> p;
    for (const int l : listeners)
      if (l >= 0) p.push_back({l, POLLIN, 0});
    const size_t first_conn = p.size();
    for (const int c : conns) p.push_back({c, POLLIN, 0});
    if (!ready) {
      std::printf("ready pid=%d\n", static_cast<int>(getpid()));
      std::fflush(stdout);
      ready = true;
    }
    if (poll(p.data(), p.size(), 2) <= 0) continue;
    for (size_t i = 0; i < first_conn; ++i) {
      if (!p[i].revents) continue;
      for (int c; (c = accept4(p[i].fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;) {
        ++accepted;
        conns.push_back(c);
      }
    }
    for (size_t i = first_conn; i < p.size(); ++i) {
      if (!p[i].revents) continue;
      if (!serve(p[i].fd, &records, &fds)) {
        close(p[i].fd);
        conns.erase(std::find(conns.begin(), conns.end(), p[i].fd));
      }
    }
  }
  for (size_t i = 0; i < names.size(); ++i)
    report += " listen " + names[i] + ": " + (listeners[i] >= 0 ? "held" : "never bound") + ";";
  std::string errors;
  for (const auto& [err, n] : connect_errors)
    errors += " " + std::string(strerrorname_np(err) ? strerrorname_np(err) : "?") + "x" +
              std::to_string(n);
  std::printf("lurk: accepted=%d connected=%d records=%d fds=%d\n", accepted, connected, records,
              fds);
  std::printf("lurk:%s connect errors:%s\n", report.c_str(), errors.c_str());
  std::fflush(stdout);
  return 0;
}

struct FloodTotals {
  int connects = 0, refused_emfile = 0, refused_other = 0, silent_closed = 0;
  int connect_errors = 0, open_at_end = 0;
  int64_t min_close_ms = -1, max_close_ms = -1;
};

// One process of the flood: up to `per_process` silent connections to `path` for `duration_ms`.
FloodTotals flood_process(const std::string& path, int per_process, int64_t until, int ready_fd) {
  struct Conn {
    int fd = -1;
    int64_t opened_ms = 0;
    int64_t next_try_ms = 0;
    bool refused = false;
  };
  FloodTotals t;
  std::vector<Conn> conns(static_cast<size_t>(per_process));
  sockaddr_un sun;
  const socklen_t len = unix_address(path, &sun);
  bool told = false;
  while (now_ms() < until) {
    const int64_t now = now_ms();
    for (Conn& c : conns) {
      if (c.fd >= 0 || now < c.next_try_ms) continue;
      const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (connect(s, reinterpret_cast<sockaddr*>(&sun), len) != 0) {
        ++t.connect_errors;  // EAGAIN: the backlog is full; try again shortly
        close(s);
        c.next_try_ms = now + 5;
        continue;
      }
      ++t.connects;
      c = Conn{s, now, 0, false};
    }
    if (!told) {
      (void)!write(ready_fd, "r", 1);
      told = true;
    }
    std::vector<pollfd> p;
    for (const Conn& c : conns) p.push_back({c.fd, static_cast<short>(c.fd >= 0 ? POLLIN : 0), 0});
    if (poll(p.data(), p.size(), 5) <= 0) continue;
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      if (c.fd < 0 || !p[i].revents) continue;
      for (;;) {
        Header h{};
        const ssize_t n = recv(c.fd, &h, sizeof h, MSG_DONTWAIT);
        if (n < 0 && errno == EAGAIN) break;
        if (n > 0) {
          if (static_cast<size_t>(n) >= sizeof h && h.type == kTypeError && h.status == EMFILE) {
            ++t.refused_emfile;
          } else {
            ++t.refused_other;
          }
          c.refused = true;
          continue;
        }
        // Closed by the daemon: after its refusal, or silently (no hello in time).
        const int64_t closed = now_ms();
        if (!c.refused) {
          ++t.silent_closed;
          const int64_t after = closed - c.opened_ms;
          t.min_close_ms = t.min_close_ms < 0 ? after : std::min(t.min_close_ms, after);
          t.max_close_ms = std::max(t.max_close_ms, after);
        }
        close(c.fd);
        c.fd = -1;
        c.next_try_ms = closed + (c.refused ? 1000 : 0);
        break;
      }
    }
  }
  for (Conn& c : conns)
    if (c.fd >= 0) {
      ++t.open_at_end;
      close(c.fd);
    }
  return t;
}

int flood(const std::vector<std::string>& args) {
  if (args.size() != 4) return 2;
  const std::string path = args[0];
  const int processes = std::atoi(args[1].c_str());
  const int per_process = std::atoi(args[2].c_str());
  const int64_t until = now_ms() + std::atoll(args[3].c_str());
  int results[2], ready[2];
  if (pipe(results) != 0 || pipe(ready) != 0) return 3;
  std::fflush(stdout);
  std::vector<pid_t> children;
  for (int i = 0; i < processes; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      close(results[0]);
      close(ready[0]);
      const FloodTotals t = flood_process(path, per_process, until, ready[1]);
      (void)!write(results[1], &t, sizeof t);
      _exit(0);
    }
    children.push_back(pid);
  }
  close(results[1]);
  close(ready[1]);
  char ch;
  for (int i = 0; i < processes; ++i)
    if (read(ready[0], &ch, 1) != 1) break;
  std::printf("flooding\n");
  std::fflush(stdout);
  FloodTotals sum;
  for (int i = 0; i < processes; ++i) {
    FloodTotals t;
    if (read(results[0], &t, sizeof t) != static_cast<ssize_t>(sizeof t)) break;
    sum.connects += t.connects;
    sum.refused_emfile += t.refused_emfile;
    sum.refused_other += t.refused_other;
    sum.silent_closed += t.silent_closed;
    sum.connect_errors += t.connect_errors;
    sum.open_at_end += t.open_at_end;
    if (t.min_close_ms >= 0)
      sum.min_close_ms =
          sum.min_close_ms < 0 ? t.min_close_ms : std::min(sum.min_close_ms, t.min_close_ms);
    sum.max_close_ms = std::max(sum.max_close_ms, t.max_close_ms);
  }
  for (const pid_t pid : children) waitpid(pid, nullptr, 0);
  std::printf(
      "flood: connects=%d refused_emfile=%d refused_other=%d silent_closed=%d min_close_ms=%lld "
      "max_close_ms=%lld connect_errors=%d open_at_end=%d\n",
      sum.connects, sum.refused_emfile, sum.refused_other, sum.silent_closed,
      static_cast<long long>(sum.min_close_ms), static_cast<long long>(sum.max_close_ms),
      sum.connect_errors, sum.open_at_end);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (mode == "lurk") return lurk(args);
  if (mode == "flood") return flood(args);
  std::fprintf(stderr, "usage: see the comment at the top of helper.cc\n");
  return 2;
}
