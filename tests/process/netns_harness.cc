#include "netns_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cerrno>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace urdma::process_test {

namespace {

constexpr int kSkipExit = 77;
bool g_real_root = false;
int g_reason_fd = -1;  // in the test's child: where a skip reason goes

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

bool write_file(const char* path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.close();
  return !f.fail();
}

// Root: a plain network namespace. Otherwise a user namespace mapping us to root, and a
// network namespace inside it. Returns an empty string on success, else why not.
std::string enter_fresh_netns() {
  if (unshare(CLONE_NEWNET) == 0) {
    g_real_root = true;
    return "";
  }
  const std::string as_root = std::strerror(errno);
  const uid_t uid = getuid();
  const gid_t gid = getgid();
  if (unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0)
    return "cannot create a network namespace (unshare(CLONE_NEWNET): " + as_root +
           "; with a user namespace: " + std::strerror(errno) + ")";
  if (!write_file("/proc/self/setgroups", "deny") ||
      !write_file("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
      !write_file("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1"))
    return "cannot map the user namespace";
  return "";
}

ino_t netns_inode(const std::string& pid) {
  struct stat st;
  return stat(("/proc/" + pid + "/ns/net").c_str(), &st) == 0 ? st.st_ino : 0;
}

long parent_of(const char* pid) {
  std::ifstream f(std::string("/proc/") + pid + "/stat");
  std::string line;
  std::getline(f, line);
  const auto paren = line.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos) return -1;
  std::istringstream rest(line.substr(paren + 1));
  std::string state;
  long ppid = -1;
  rest >> state >> ppid;
  return ppid;
}

// SIGKILLs every process of this network namespace but us, and every child of ours (a daemon
// spawned in another namespace of the test is reparented to us, the subreaper), and reaps them,
// until none is left (bounded).
void kill_everything_else_here() {
  const ino_t mine = netns_inode("self");
  const pid_t self = getpid();
  const int64_t deadline = now_ms() + 3000;
  while (now_ms() < deadline) {
    if (DIR* d = opendir("/proc")) {
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        const pid_t pid = std::atoi(e->d_name);
        if (pid == self) continue;
        if (netns_inode(e->d_name) == mine || parent_of(e->d_name) == self) kill(pid, SIGKILL);
      }
      closedir(d);
    }
    pid_t p;
    while ((p = waitpid(-1, nullptr, WNOHANG)) > 0) {
    }
    if (p < 0 && errno == ECHILD) return;
    usleep(2000);
  }
}

}  // namespace

bool real_root() {
  return g_real_root;
}

void skip_test(const std::string& why) {
  if (g_reason_fd >= 0) (void)!write(g_reason_fd, why.data(), std::min<size_t>(why.size(), 511));
  kill_everything_else_here();
  _exit(kSkipExit);
}

void in_fresh_netns(const std::function<void()>& body, int timeout_s) {
  Pipe reason;
  fflush(stdout);
  fflush(stderr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    reason.close_rd();
    alarm(static_cast<unsigned>(timeout_s));
    const std::string why = enter_fresh_netns();
    if (!why.empty()) {
      reason.put(why.data(), std::min<size_t>(why.size(), 511));
      _exit(kSkipExit);
    }
    g_reason_fd = reason.wr;
    if (!link_up("lo")) _exit(3);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    body();
    kill_everything_else_here();
    fflush(stdout);
    _exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  reason.close_wr();
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == kSkipExit) {
    char text[512] = {};
    reason.get(text, 1, 100);
    size_t n = 1;
    while (n < sizeof text - 1 && reason.get(text + n, 1, 0)) ++n;
    GTEST_SKIP() << text;
  }
  ASSERT_TRUE(WIFEXITED(status)) << "the test's process died by signal " << WTERMSIG(status)
                                 << (WTERMSIG(status) == SIGALRM ? " (timeout)" : "");
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the test body failed (see above)";
}

pid_t fork_process(const std::function<int()>& fn) {
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int rc = fn();
    fflush(stdout);
    _exit(rc);
  }
  return pid;
}

std::optional<int> wait_exit(pid_t pid, int timeout_ms) {
  const int64_t deadline = now_ms() + timeout_ms;
  for (;;) {
    int status;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    // Not our child (urdmad's daemon is its keeper's): its end is all we can see.
    if (r < 0 && errno == ECHILD && kill(pid, 0) != 0 && errno == ESRCH) return 0;
    if (r < 0 && errno != EINTR && errno != ECHILD) return std::nullopt;
    if (now_ms() >= deadline) return std::nullopt;
    usleep(2000);
  }
}

void use_daemon(const char* daemon, const char* idle_timeout_ms) {
  setenv("URDMA_DAEMON", daemon, 1);
  setenv("URDMA_IDLE_TIMEOUT_MS", idle_timeout_ms, 1);
  unsetenv("URDMA_SOCKET");
  unsetenv("URDMA_UDP_PORT");
  unsetenv("URDMA_SLOTS");
}

pid_t start_second_host(const std::string& here, const std::string& there,
                        const std::string& subnet, const std::function<int()>& host_b) {
  Pipe unshared, veth_made;
  const pid_t b = fork_process([&] {
    if (unshare(CLONE_NEWNET) != 0 || !link_up("lo")) return 10;
    unshared.put('u');
    char ch;
    if (!veth_made.get(&ch, 5000)) return 11;
    if (!address_there(there, subnet)) return 12;
    return host_b();
  });
  char ch;
  if (b < 0 || !unshared.get(&ch, 5000)) {
    ADD_FAILURE() << "the second host did not start";
    return b;
  }
  if (!veth_into(b, here, there, subnet)) kill(b, SIGKILL);
  veth_made.put('x');
  return b;
}

bool veth_into(pid_t pid, const std::string& here, const std::string& there,
               const std::string& subnet) {
  if (std::system(("ip link add " + here + " type veth peer name " + there + " netns " +
                   std::to_string(pid) + " 2>&1")
                      .c_str()) != 0) {
    kill(pid, SIGKILL);
    skip_test("cannot create a veth pair between two namespaces (no veth in this kernel?)");
  }
  return sh("ip addr add " + subnet + ".1/24 dev " + here + " && ip link set " + here + " up");
}

bool address_there(const std::string& there, const std::string& subnet) {
  return std::system(("ip addr add " + subnet + ".2/24 dev " + there + " && ip link set " +
                      there + " up")
                         .c_str()) == 0;
}

bool sh(const std::string& command) {
  const int rc = std::system((command + " 2>&1").c_str());
  if (rc != 0) ADD_FAILURE() << "`" << command << "` failed (" << rc << ")";
  return rc == 0;
}

bool add_local_veth(const std::string& name, const std::string& address) {
  const std::string a = name + "0", b = name + "1";
  const bool v6 = address.find(':') != std::string::npos;
  return sh("ip link add " + a + " type veth peer name " + b + " && ip addr add " + address +
            " dev " + a + (v6 ? " nodad" : "") + " && ip link set " + a + " up && ip link set " +
            b + " up");
}

uint64_t udp_datagrams_received() {
  uint64_t total = 0;
  {
    // Two "Udp:" lines: the field names, then the values in the same order.
    std::ifstream in("/proc/net/snmp");
    std::string line, names;
    while (std::getline(in, line)) {
      if (line.rfind("Udp: ", 0) != 0) continue;
      if (names.empty()) {
        names = line;
        continue;
      }
      std::istringstream n(names), v(line);
      std::string name, value;
      while (n >> name && v >> value)
        if (name == "InDatagrams") total += std::stoull(value);
      break;
    }
  }
  std::ifstream in6("/proc/net/snmp6");
  std::string name;
  uint64_t value = 0;
  while (in6 >> name >> value)
    if (name == "Udp6InDatagrams") total += value;
  return total;
}

bool link_up(const char* ifname) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname, IFNAMSIZ - 1);
  bool ok = ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
  ifr.ifr_flags |= IFF_UP;
  ok = ok && ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
  close(fd);
  return ok;
}

Pipe::Pipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) == 0) {
    rd = fds[0];
    wr = fds[1];
  }
}
Pipe::~Pipe() {
  close_rd();
  close_wr();
}
void Pipe::close_rd() {
  if (rd >= 0) close(rd);
  rd = -1;
}
void Pipe::close_wr() {
  if (wr >= 0) close(wr);
  wr = -1;
}
bool Pipe::put(const void* data, size_t size) {
  return wr >= 0 && write(wr, data, size) == static_cast<ssize_t>(size);
}
bool Pipe::get(void* data, size_t size, int timeout_ms) {
  auto* p = static_cast<uint8_t*>(data);
  size_t got = 0;
  const int64_t deadline = now_ms() + timeout_ms;
  while (got < size) {
    pollfd pfd{rd, POLLIN, 0};
    const int left = static_cast<int>(std::max<int64_t>(deadline - now_ms(), 0));
    const int r = poll(&pfd, 1, left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t n = read(rd, p + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace urdma::process_test
