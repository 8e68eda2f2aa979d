// The runtime proven across real processes: urdma_runtime_peer (runtime_peer.cc, built on the
// runtime and provider API) in separate processes, each leasing a slot from a real urdmad it
// starts itself, talking RoCEv2 over the steered slot sockets. Every test body runs in a fresh
// network namespace (netns_harness.h).
//
// What a test asserts comes from the peers' result lines: the client's and the server's exit
// codes, the first failed completion's status, and per operation the checksums over the whole
// transfer on both sides (the sender's over the PRNG stream it sent, the receiver's over what
// arrived, also compared with the stream it regenerated: *_bad counts the messages that differ).
//
//   * one host (loopback GIDs) and two namespaces joined by a veth pair, a urdmad in each: RC
//     SEND, WRITE, READ, FETCH_ADD and CMP_SWP with checked results, UD SEND, 1 B .. 4 MiB;
//   * RC WRITE under URDMA_FAULTS (1% loss, 1% reordering, 0.1% duplication, both directions);
//   * kill -9 of one process mid-transfer: the peer's work completes with RETRY_EXC_ERR, urdmad
//     reclaims the dead process's slot (its status, and a slot table of two client slots that a
//     new process can lease again), and a new pair transfers on it;
//   * 1,000 RC QPs in one process; 16 processes at once (8 pairs); an idle pair's CPU time.
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon/client.h"
#include "daemon/steering.h"
#include "netns_harness.h"

namespace urdma::process_test {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

using Clock = std::chrono::steady_clock;
using Fields = std::map<std::string, std::string>;

int64_t ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// One urdma_runtime_peer process: stdout read through a pipe, stdin a pipe (--hold waits for
// its end).
class PeerProcess {
 public:
  // `in_child` runs in the forked child before exec (entering another namespace).
  PeerProcess(std::vector<std::string> args, const std::function<void()>& in_child = {}) {
    Pipe out, in;
    fflush(stdout);
    fflush(stderr);
    pid_ = fork();
    if (pid_ == 0) {
      if (in_child) in_child();
      dup2(out.wr, STDOUT_FILENO);
      dup2(in.rd, STDIN_FILENO);
      std::vector<char*> argv;
      args.insert(args.begin(), URDMA_RUNTIME_PEER_PATH);
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    out_ = out.rd;
    out.rd = -1;
    in_ = in.wr;
    in.wr = -1;
  }
  ~PeerProcess() {
    if (pid_ > 0 && !status_) {
      kill(pid_, SIGKILL);
      wait_exit(pid_, 5000);
    }
    if (out_ >= 0) close(out_);
    if (in_ >= 0) close(in_);
  }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& output() const { return text_; }
  void release_hold() {
    if (in_ >= 0) close(in_);
    in_ = -1;
  }
  void kill9() { kill(pid_, SIGKILL); }

  // Waits until a line starting with `prefix` was printed; the line, or nullopt on timeout/exit.
  std::optional<std::string> wait_line(const std::string& prefix, int timeout_ms) {
    const auto start = Clock::now();
    for (;;) {
      if (auto l = find_line(prefix)) return l;
      if (ms_since(start) > timeout_ms || !read_some(50)) return find_line(prefix);
    }
  }
  // Waits for the exit (reading the output meanwhile); the waitpid status or nullopt.
  std::optional<int> wait(int timeout_ms) {
    const auto start = Clock::now();
    while (!status_ && ms_since(start) <= timeout_ms) {
      read_some(20);
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) status_ = st;
    }
    while (read_some(0)) {
    }
    return status_;
  }
  // The exit code (-1: killed by a signal or did not end within the time).
  int exit_code(int timeout_ms) {
    const auto st = wait(timeout_ms);
    if (!st) return -1;
    return WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
  }
  Fields result() const {
    Fields f;
    const auto line = find_line("RESULT ");
    if (!line) return f;
    std::istringstream in(*line);
    std::string kv;
    while (in >> kv) {
      const auto eq = kv.find('=');
      if (eq != std::string::npos) f[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    return f;
  }

 private:
  std::optional<std::string> find_line(const std::string& prefix) const {
    std::istringstream in(text_);
    std::string line;
    while (std::getline(in, line))
      if (line.rfind(prefix, 0) == 0 && in.good()) return line;  // a complete line only
    return std::nullopt;
  }
  // Reads what is there within `timeout_ms`; false at end of file.
  bool read_some(int timeout_ms) {
    if (out_ < 0) return false;
    pollfd pfd{out_, POLLIN, 0};
    if (poll(&pfd, 1, timeout_ms) <= 0) return true;
    char buf[4096];
    const ssize_t n = read(out_, buf, sizeof buf);
    if (n <= 0) {
      close(out_);
      out_ = -1;
      return false;
    }
    text_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_ = -1, in_ = -1;
  std::string text_;
  std::optional<int> status_;
};

class RuntimeProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("URDMA_DAEMON", URDMA_DAEMON_PATH, 1);
    setenv("URDMA_IDLE_TIMEOUT_MS", "30000", 1);
    unsetenv("URDMA_SOCKET");
    unsetenv("URDMA_UDP_PORT");
    unsetenv("URDMA_SLOTS");
    unsetenv("URDMA_FAULTS");
  }
};

std::vector<std::string> server_args(const std::string& addr, int port,
                                     std::vector<std::string> more = {}) {
  std::vector<std::string> a = {"--role", "server",   "--addr",
                                addr,     "--listen", std::to_string(port)};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}
std::vector<std::string> client_args(const std::string& addr, const std::string& server_addr,
                                     int port, std::vector<std::string> more = {}) {
  std::vector<std::string> a = {"--role", "client",    "--addr",
                                addr,     "--connect", server_addr + ":" + std::to_string(port)};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

uint64_t num(const Fields& f, const std::string& key) {
  const auto it = f.find(key);
  return it == f.end() ? ~0ull : std::strtoull(it->second.c_str(), nullptr, 0);
}

// The two result lines of a finished pair agree: both exited 0, and for every operation in
// `ops` messages moved, nothing differed, and the receiver's checksum over the whole transfer
// equals the sender's (both as each side printed it).
void expect_transfer(PeerProcess& server, PeerProcess& client, const std::vector<std::string>& ops,
                     int timeout_ms) {
  const int client_exit = client.exit_code(timeout_ms);
  const int server_exit = server.exit_code(timeout_ms);
  EXPECT_EQ(client_exit, 0) << "client output:\n" << client.output();
  EXPECT_EQ(server_exit, 0) << "server output:\n" << server.output();
  const Fields c = client.result();
  const Fields s = server.result();
  ASSERT_FALSE(c.empty()) << "no client result line:\n" << client.output();
  ASSERT_FALSE(s.empty()) << "no server result line:\n" << server.output();
  EXPECT_EQ(c.at("status"), "success");
  for (const std::string& op : ops) {
    SCOPED_TRACE(op);
    EXPECT_GT(num(c, op + "_msgs"), 0u);
    EXPECT_NE(num(c, op + "_msgs"), ~0ull);
    EXPECT_EQ(num(c, op + "_bad"), 0u);
    EXPECT_EQ(num(s, op + "_bad"), 0u);
    EXPECT_EQ(c.at(op + "_sum"), c.at(op + "_peer_sum"));
    EXPECT_EQ(c.at(op + "_peer_sum"), s.at(op + "_sum"));
    if (op != "atomic") {
      EXPECT_EQ(num(c, op + "_bytes"), num(s, op + "_bytes"));
    }
  }
  EXPECT_EQ(num(c, "ud_lost"), 0u);
  std::printf("client: %s\n", client.wait_line("RESULT ", 0).value_or("?").c_str());
}

const std::vector<std::string> kAllOps = {"send", "write", "read", "atomic", "ud"};

// ------------------------------------------------------------------ 1. every operation

TEST_F(RuntimeProcess, TwoProcessesOnOneHostEveryOperation) {
  in_fresh_netns(
      [] {
        const std::string bytes = kSanitized ? "4194304" : "16777216";
        PeerProcess server(server_args("127.0.0.1", 7001, {"--qps", "2", "--bytes", bytes}));
        PeerProcess client(
            client_args("127.0.0.1", "127.0.0.1", 7001, {"--qps", "2", "--bytes", bytes}));
        expect_transfer(server, client, kAllOps, 90000);
      },
      100);
}

}  // namespace
}  // namespace urdma::process_test
