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
//   * RC WRITE, SEND (into one SRQ of the server's four QPs), READ and atomics under
//     URDMA_FAULTS (1% loss, 1% reordering, 0.1% duplication, both directions);
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
#include <memory>
#include <optional>
#include <set>
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
    use_daemon(URDMA_DAEMON_PATH, "30000");
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

// Two urdma processes of one host exchange their datagrams through shared memory
// (net/shm_packet_io.h): the kernel's UDP counters of the namespace see only the few that left
// before urdmad made the region — the transfer's 16 MiB per operation are thousands.
TEST_F(RuntimeProcess, TwoProcessesOnOneHostEveryOperation) {
  in_fresh_netns(
      [] {
        const std::string bytes = kSanitized ? "4194304" : "16777216";
        const uint64_t udp_before = udp_datagrams_received();
        PeerProcess server(server_args("127.0.0.1", 7001, {"--qps", "2", "--bytes", bytes}));
        PeerProcess client(
            client_args("127.0.0.1", "127.0.0.1", 7001, {"--qps", "2", "--bytes", bytes}));
        expect_transfer(server, client, kAllOps, 90000);
        const uint64_t udp = udp_datagrams_received() - udp_before;
        std::printf("UDP datagrams in the namespace: %llu\n", static_cast<unsigned long long>(udp));
        EXPECT_LT(udp, 500u) << "the transfer went by UDP, not shared memory";
      },
      100);
}

// WRITE and READ through type 2 memory windows (ibv_bind_mw(3)), one bound on each RC QP over
// the peer's whole region, across shared memory: every byte arrives checked, and the data
// crossed no UDP socket.
TEST_F(RuntimeProcess, TwoProcessesOnOneHostThroughMemoryWindows) {
  in_fresh_netns(
      [] {
        const std::string bytes = kSanitized ? "4194304" : "16777216";
        const std::vector<std::string> common = {"--qps", "2", "--mw", "--ops", "write,read",
                                                 "--bytes", bytes};
        const uint64_t udp_before = udp_datagrams_received();
        PeerProcess server(server_args("127.0.0.1", 7015, common));
        PeerProcess client(client_args("127.0.0.1", "127.0.0.1", 7015, common));
        expect_transfer(server, client, {"write", "read"}, 90000);
        const uint64_t udp = udp_datagrams_received() - udp_before;
        std::printf("UDP datagrams in the namespace: %llu\n", static_cast<unsigned long long>(udp));
        EXPECT_LT(udp, 500u) << "the transfer went by UDP, not shared memory";
      },
      100);
}

// A process of the same user scribbles random bytes over the region it shares with the server
// — both rings, their indices and wake flags — and rings the server's doorbell, all through a
// transfer between the server and a client: the server's ring from it breaks (dropped and
// counted), nothing else does. Every operation's bytes arrive checked, and each peer's
// registered buffers sit between guard pages (runtime_peer.cc), so a stray write would have
// killed it.
TEST_F(RuntimeProcess, APeerScribblingOnItsSharedRegionBreaksNothingElse) {
  in_fresh_netns(
      [] {
        PeerProcess server(server_args("127.0.0.1", 7013, {"--bytes", "4194304"}));
        const auto listening = server.wait_line("LISTENING ", 20000);
        ASSERT_TRUE(listening) << server.output();
        const size_t at = listening->find("qpn_base=");
        ASSERT_NE(at, std::string::npos) << *listening;
        const std::string qpn = listening->substr(at + 9, listening->find(' ', at) - at - 9);
        PeerProcess scribbler({"--scribble", qpn, "3"});
        ASSERT_TRUE(scribbler.wait_line("SCRIBBLING", 20000)) << scribbler.output();
        PeerProcess client(client_args("127.0.0.1", "127.0.0.1", 7013, {"--bytes", "4194304"}));
        expect_transfer(server, client, kAllOps, 90000);
        EXPECT_EQ(scribbler.exit_code(20000), 0) << scribbler.output();
        EXPECT_NE(scribbler.output().find("SCRIBBLED bytes="), std::string::npos);
      },
      100);
}

// URDMA_SHM=0: the same transfer, every datagram through the kernel (at least one UDP datagram
// per 4 KiB of SEND, WRITE and READ data, and one per UD message).
TEST_F(RuntimeProcess, TwoProcessesOnOneHostEveryOperationWithSharedMemoryOff) {
  in_fresh_netns(
      [] {
        setenv("URDMA_SHM", "0", 1);
        const uint64_t udp_before = udp_datagrams_received();
        PeerProcess server(server_args("127.0.0.1", 7011, {"--bytes", "4194304"}));
        PeerProcess client(client_args("127.0.0.1", "127.0.0.1", 7011, {"--bytes", "4194304"}));
        expect_transfer(server, client, kAllOps, 90000);
        const uint64_t udp = udp_datagrams_received() - udp_before;
        std::printf("UDP datagrams in the namespace: %llu\n", static_cast<unsigned long long>(udp));
        EXPECT_GT(udp, 3u * 4194304 / 4096);
      },
      100);
}

TEST_F(RuntimeProcess, TwoNamespacesJoinedByAVethPairEveryOperation) {
  in_fresh_netns(
      [] {
        // Host A is this namespace, host B a child's own namespace; each peer starts the urdmad
        // of its namespace. The veth's 1500-byte MTU gives a 1024-byte path MTU.
        Pipe b_ready, veth_made;
        const std::string bytes = kSanitized ? "4194304" : "16777216";
        const std::vector<std::string> common = {"--qps", "2", "--bytes", bytes, "--mtu", "1024"};
        PeerProcess server(server_args("10.89.0.2", 7002, common), [&] {
          if (unshare(CLONE_NEWNET) != 0 || !link_up("lo")) _exit(120);
          b_ready.put(getpid());
          char ch;
          if (!veth_made.get(&ch, 10000)) _exit(121);
          if (!address_there("vb", "10.89.0")) _exit(122);
        });
        pid_t b_pid = 0;
        ASSERT_TRUE(b_ready.get(&b_pid));
        ASSERT_TRUE(veth_into(b_pid, "va", "vb", "10.89.0"));
        veth_made.put('x');
        const uint64_t udp_before = udp_datagrams_received();
        PeerProcess client(client_args("10.89.0.1", "10.89.0.2", 7002, common));
        expect_transfer(server, client, kAllOps, 90000);
        // A peer in another namespace is no local slot: its datagrams stay on UDP. This
        // namespace's socket received at least the READ responses, one per 1024 bytes.
        const uint64_t udp = udp_datagrams_received() - udp_before;
        EXPECT_GT(udp, std::stoull(bytes) / 1024) << "UDP datagrams received: " << udp;
        // Two hosts, two daemons: each peer leased a slot of its own namespace's urdmad, so
        // both got the first client slot's QPN range.
        EXPECT_EQ(server.result().at("qpn_base"), client.result().at("qpn_base"));
      },
      100);
}

// ------------------------------------------------------------------ 2. RC under faults

TEST_F(RuntimeProcess, RcUnderLossReorderingAndDuplicationArrivesBitExact) {
  in_fresh_netns(
      [] {
        // 1% loss, 1% reordering, 0.1% duplication on every datagram either side sends. The plain
        // build moves 2 GiB of WRITEs (plus SEND and READ at 16 MiB); under the sanitizers, whose
        // engines run several times slower, 256 MiB of WRITEs is the volume.
        const std::string write_bytes = kSanitized ? "268435456" : "2147483648";
        const std::vector<std::string> common = {
            "--region", "67108864", "--qps", "4", "--phase-timeout", "120",
            // Local ACK timeout 4.096 us << 16 = 268 ms: 8 timeouts in a row without progress
            // (RETRY_EXC_ERR at retry_cnt 7) stay out of reach of a loaded 2-core machine. With
            // 67 ms and 134 ms, 2 GiB runs under CPU contention sometimes ended in RETRY_EXC_ERR.
            // Four QPs keep the link busy while one of them waits out a lost tail's timeout.
            "--timeout", "16"};
        auto args = [&](std::vector<std::string> a, const std::string& ops, const std::string& b) {
          a.insert(a.end(), common.begin(), common.end());
          a.insert(a.end(), {"--ops", ops, "--bytes", b});
          return a;
        };
        const auto start = Clock::now();
        // Both processes are of this host: the faults act on the shared-memory path.
        const uint64_t udp_before = udp_datagrams_received();
        {
          setenv("URDMA_FAULTS", "seed=101,loss=10000,reorder=10000,dup=1000", 1);
          PeerProcess server(args(server_args("127.0.0.1", 7003), "write", write_bytes));
          setenv("URDMA_FAULTS", "seed=202,loss=10000,reorder=10000,dup=1000", 1);
          PeerProcess client(
              args(client_args("127.0.0.1", "127.0.0.1", 7003), "write", write_bytes));
          expect_transfer(server, client, {"write"}, 130000);
          const Fields c = client.result();
          EXPECT_GE(num(c, "write_bytes"), std::strtoull(write_bytes.c_str(), nullptr, 0));
          // The faults were there: the requester resent after NAKs and timeouts, the responder
          // saw duplicates and out-of-sequence packets.
          EXPECT_GT(num(c, "retries"), 0u);
          EXPECT_GT(num(server.result(), "out_of_seq"), 0u);
          EXPECT_GT(num(server.result(), "dup_requests"), 0u);
          EXPECT_LT(udp_datagrams_received() - udp_before, 5000u)
              << "the transfer went by UDP, not shared memory";
        }
        {
          // The server's four QPs take their SENDs from one SRQ: a resent or duplicated SEND
          // must be answered without taking another of its WQEs (IBA 9.7.5.2.2). Each WQE
          // carries its posting number, and the numbers completed must have no gap.
          setenv("URDMA_FAULTS", "seed=303,loss=10000,reorder=10000,dup=1000", 1);
          std::vector<std::string> srv =
              args(server_args("127.0.0.1", 7004), "send,read,atomic", "16777216");
          srv.push_back("--srq");
          PeerProcess server(srv);
          setenv("URDMA_FAULTS", "seed=404,loss=10000,reorder=10000,dup=1000", 1);
          PeerProcess client(
              args(client_args("127.0.0.1", "127.0.0.1", 7004), "send,read,atomic", "16777216"));
          expect_transfer(server, client, {"send", "read", "atomic"}, 60000);
          const Fields s = server.result();
          EXPECT_EQ(num(s, "srq"), 1u);
          EXPECT_EQ(num(s, "srq_gaps"), 0u) << "an SRQ WQE was taken and never completed";
          EXPECT_EQ(num(s, "send_qps"), 4u);
          EXPECT_GT(num(s, "dup_requests") + num(s, "out_of_seq"), 0u);
        }
        std::printf("faults: %s of WRITEs and 16 MiB of SEND and READ in %.1f s\n",
                    kSanitized ? "256 MiB" : "2 GiB", ms_since(start) / 1000.0);
      },
      180);
}

// ------------------------------------------------------------------ 3. kill -9 mid-transfer

// urdmad's status, asked over its socket (no spawning).
std::optional<daemon::StatusInfo> daemon_status() {
  daemon::ClientOptions o;
  o.spawn = false;
  daemon::Client c;
  std::string why;
  if (daemon::Client::connect_or_spawn(o, &c, &why) != 0) return std::nullopt;
  daemon::StatusInfo st{};
  if (c.query_status(&st) != 0) return std::nullopt;
  return st;
}

// Waits until urdmad reports `leased` slots and at least `reclaims` reclaims.
std::optional<daemon::StatusInfo> wait_status(uint32_t leased, uint64_t reclaims, int timeout_ms) {
  const auto start = Clock::now();
  std::optional<daemon::StatusInfo> st;
  while (ms_since(start) < timeout_ms) {
    st = daemon_status();
    if (st && st->slots_leased == leased && st->reclaims >= reclaims) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return st;
}

unsigned slot_of(const std::string& line, unsigned slot_count) {
  const auto at = line.find("qpn_base=");
  if (at == std::string::npos) return ~0u;
  const auto qpn = static_cast<uint32_t>(std::strtoul(line.c_str() + at + 9, nullptr, 0));
  return daemon::slot_of_qpn(qpn, slot_count);
}

TEST_F(RuntimeProcess, KillNineMidTransferPeerFailsSlotReclaimedNewProcessWorks) {
  in_fresh_netns(
      [] {
        PeerProcess server(server_args("127.0.0.1", 7005, {"--ops", "write"}));
        // 67 ms local ACK timeout, 2 retries: the client gives up ~200 ms after the kill.
        PeerProcess client(client_args("127.0.0.1", "127.0.0.1", 7005,
                                       {"--ops", "write", "--stream", "--bytes", "1099511627776",
                                        "--timeout", "14", "--retry", "2", "--hold"}));
        ASSERT_TRUE(server.wait_line("LISTENING ", 20000)) << server.output();
        ASSERT_TRUE(client.wait_line("STREAMING", 20000)) << client.output();
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // mid-transfer
        const auto st0 = daemon_status();
        ASSERT_TRUE(st0);
        EXPECT_EQ(st0->slots_leased, 2u);
        server.kill9();
        const auto status = server.wait(5000);
        ASSERT_TRUE(status);
        EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL);

        // The peer's work completes with RETRY_EXC_ERR (the rest of its WRs flushed).
        const auto result = client.wait_line("RESULT ", 20000);
        ASSERT_TRUE(result) << client.output();
        const Fields c = client.result();
        EXPECT_EQ(c.at("status"), "transport_retry_counter_exceeded") << *result;
        EXPECT_EQ(num(c, "exit"), 3u);
        EXPECT_GT(num(c, "write_bytes"), 0u);

        // urdmad reclaimed the dead process's slot (the client still holds its own).
        const auto st1 = wait_status(1, st0->reclaims + 1, 5000);
        ASSERT_TRUE(st1);
        EXPECT_EQ(st1->slots_leased, 1u);
        EXPECT_EQ(st1->reclaims, st0->reclaims + 1);

        // A new pair gets working slots and transfers, checked.
        client.release_hold();
        EXPECT_EQ(client.exit_code(10000), 3);
        ASSERT_TRUE(wait_status(0, st1->reclaims + 1, 5000));
        PeerProcess server2(server_args("127.0.0.1", 7006));
        PeerProcess client2(client_args("127.0.0.1", "127.0.0.1", 7006));
        expect_transfer(server2, client2, kAllOps, 60000);
      },
      90);
}

// A peer that stops (SIGSTOP) mid-transfer keeps its lease and its region, so no kShmOff comes:
// what is sent waits in its ring unread (or, once the ring has been full for kStuckNs, is
// dropped: net/shm_packet_io.h), no ACK comes back, and the RC retry count ends the transfer
// with RETRY_EXC_ERR — the sender neither hangs nor crashes.
TEST_F(RuntimeProcess, APeerStoppedMidTransferEndsInRetryExceeded) {
  in_fresh_netns(
      [] {
        PeerProcess server(server_args("127.0.0.1", 7014, {"--ops", "write"}));
        PeerProcess client(client_args("127.0.0.1", "127.0.0.1", 7014,
                                       {"--ops", "write", "--stream", "--bytes", "1099511627776",
                                        "--timeout", "14", "--retry", "2"}));
        ASSERT_TRUE(server.wait_line("LISTENING ", 20000)) << server.output();
        ASSERT_TRUE(client.wait_line("STREAMING", 20000)) << client.output();
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // mid-transfer
        kill(server.pid(), SIGSTOP);
        const auto result = client.wait_line("RESULT ", 20000);
        kill(server.pid(), SIGCONT);
        ASSERT_TRUE(result) << client.output();
        const Fields c = client.result();
        EXPECT_EQ(c.at("status"), "transport_retry_counter_exceeded") << *result;
        EXPECT_EQ(num(c, "exit"), 3u);
        EXPECT_GT(num(c, "write_bytes"), 0u);
        server.kill9();
      },
      60);
}

// The same slot again after a reclaim: with two client slots (URDMA_SLOTS=3, slot 0 is the
// daemon's) and two processes per round, every round after the first runs on both reclaimed
// slots. Regression: urdmad's reclaim used to connect(AF_UNSPEC) the slot socket, and the
// kernel's UDP disconnect rehashes a socket bound to the wildcard address, which detaches it from
// its reuseport group — the BPF's indices no longer named it, every datagram for the reused slot
// landed on slot 0 (dropped MADs) and the pair ended in RETRY_EXC_ERR.
TEST_F(RuntimeProcess, ReclaimedSlotLeasedAgainCarriesTraffic) {
  in_fresh_netns(
      [] {
        constexpr unsigned kSlots = 3;
        setenv("URDMA_SLOTS", std::to_string(kSlots).c_str(), 1);
        for (int round = 0; round < 3; ++round) {
          SCOPED_TRACE("round " + std::to_string(round));
          PeerProcess server(
              server_args("127.0.0.1", 7020 + round,
                          {"--bytes", "1048576", "--timeout", "14", "--retry", "2"}));
          PeerProcess client(
              client_args("127.0.0.1", "127.0.0.1", 7020 + round,
                          {"--bytes", "1048576", "--timeout", "14", "--retry", "2"}));
          const auto listening = server.wait_line("LISTENING ", 20000);
          ASSERT_TRUE(listening) << server.output();
          const unsigned slot = slot_of(*listening, kSlots);
          EXPECT_TRUE(slot == 1 || slot == 2) << *listening;
          expect_transfer(server, client, kAllOps, 30000);
          if (::testing::Test::HasFailure()) return;
          // Both slots back before the next round leases them again.
          ASSERT_TRUE(wait_status(0, 2u * (round + 1), 5000));
        }
      },
      90);
}

// ------------------------------------------------------------------ 4. 1,000 QPs

TEST_F(RuntimeProcess, AThousandRcQpsInOneProcessEachCarriesCheckedData) {
  in_fresh_netns(
      [] {
        // Every RC QP carries SENDs (each QP's arrival observed by the server), WRITEs and
        // READs (message i on QP i % 1000); the first 64 QPs the atomics too.
        const std::vector<std::string> common = {"--qps",        "1000",  "--bytes",    "4194304",
                                                 "--max-size",   "65536", "--send-max", "4096",
                                                 "--recv-depth", "2",     "--region",   "8388608"};
        PeerProcess server(server_args("127.0.0.1", 7007, common));
        PeerProcess client(client_args("127.0.0.1", "127.0.0.1", 7007, common));
        expect_transfer(server, client, kAllOps, 100000);
        const Fields s = server.result();
        EXPECT_EQ(num(s, "send_qps"), 1000u);
        EXPECT_GE(num(s, "send_msgs"), 1000u);
        EXPECT_GE(num(client.result(), "write_msgs"), 1000u);
        EXPECT_GE(num(client.result(), "read_msgs"), 1000u);
      },
      110);
}

// ------------------------------------------------------------------ 5. 16 processes

TEST_F(RuntimeProcess, SixteenProcessesOnOneHostAllTransferAtOnce) {
  in_fresh_netns(
      [] {
        // 8 pairs started together: 16 processes race to start the one urdmad, lease 16 slots
        // and run every operation at the same time, each pair with its own data.
        constexpr int kPairs = 8;
        const std::string bytes = kSanitized ? "1048576" : "4194304";
        std::vector<std::unique_ptr<PeerProcess>> servers, clients;
        for (int k = 0; k < kPairs; ++k) {
          const std::vector<std::string> common = {
              "--bytes",  bytes,     "--seed",          std::to_string(1000 + k),
              "--region", "4194304", "--phase-timeout", "100"};
          servers.push_back(
              std::make_unique<PeerProcess>(server_args("127.0.0.1", 7100 + k, common)));
          clients.push_back(std::make_unique<PeerProcess>(
              client_args("127.0.0.1", "127.0.0.1", 7100 + k, common)));
        }
        std::set<std::string> ranges;
        for (int k = 0; k < kPairs; ++k) {
          SCOPED_TRACE("pair " + std::to_string(k));
          expect_transfer(*servers[k], *clients[k], kAllOps, 100000);
          ranges.insert(servers[k]->result()["qpn_base"]);
          ranges.insert(clients[k]->result()["qpn_base"]);
        }
        EXPECT_EQ(ranges.size(), 2u * kPairs) << "every process has a QPN range of its own";
      },
      120);
}

// ------------------------------------------------------------------ 6. idle CPU

// utime + stime of a process, in clock ticks (/proc/<pid>/stat fields 14 and 15).
long cpu_ticks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  const auto paren = line.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream rest(line.substr(paren + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

TEST_F(RuntimeProcess, IdleProcessWithConnectedQpsUsesNoCpu) {
  in_fresh_netns(
      [] {
        // After a transfer both processes sit with 4 connected RC QPs and a UD QP open (the
        // client sleeps, the server waits on TCP): their engine threads must sleep too.
        const std::vector<std::string> common = {"--qps", "4", "--bytes", "1048576"};
        PeerProcess server(server_args("127.0.0.1", 7008, common));
        auto cargs = common;
        cargs.insert(cargs.end(), {"--idle-ms", "10600"});
        PeerProcess client(client_args("127.0.0.1", "127.0.0.1", 7008, cargs));
        ASSERT_TRUE(client.wait_line("IDLE", 60000)) << client.output();
        const long hz = sysconf(_SC_CLK_TCK);
        const long s0 = cpu_ticks(server.pid()), c0 = cpu_ticks(client.pid());
        const auto start = Clock::now();
        std::this_thread::sleep_for(std::chrono::seconds(10));
        const long s1 = cpu_ticks(server.pid()), c1 = cpu_ticks(client.pid());
        const double seconds = ms_since(start) / 1000.0;
        const double server_pct = 100.0 * (s1 - s0) / hz / seconds;
        const double client_pct = 100.0 * (c1 - c0) / hz / seconds;
        std::printf("idle over %.1f s: server %.2f%% of a core (%ld ticks), client %.2f%% (%ld)\n",
                    seconds, server_pct, s1 - s0, client_pct, c1 - c0);
        ASSERT_GE(s0, 0);
        ASSERT_GE(c0, 0);
        EXPECT_LT(server_pct, 2.0);
        EXPECT_LT(client_pct, 2.0);
        expect_transfer(server, client, kAllOps, 30000);
      },
      100);
}

}  // namespace
}  // namespace urdma::process_test
