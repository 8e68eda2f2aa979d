// The `urdma` command with real processes, each test in a fresh network namespace
// (netns_harness.h): `urdma status` / `urdma devices` / `urdma run` (their output parsed by
// /usr/bin/python3's json module and compared with `ip -j addr`, an oracle that shares no code with
// ours), the installed tree (`cmake --install` into a temporary prefix), and urdmad's takeover:
// kill -9 urdmad while two processes' runtimes run an RC WRITE stream; the stream completes
// bit-exact, a restarted urdmad takes their slots over and serves a new process.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "netns_harness.h"
#include "runtime/runtime.h"
#include "support/qp_setup.h"
#include "support/checksum.h"

namespace urdma::process_test {
namespace {

using test_support::fill_pattern;
using test_support::fnv1a;

class UrdmaCli : public ::testing::Test {
 protected:
  void SetUp() override {
    use_daemon(URDMA_DAEMON_PATH, "10000");
    unsetenv("URDMA_LIBDIR");
  }
};

// Runs a shell command; its stdout, and its exit status in *rc (-1: killed by a signal).
std::string shell(const std::string& command, int* rc) {
  FILE* p = popen(command.c_str(), "r");
  if (!p) {
    *rc = -1;
    return "";
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

std::string real_path(const std::string& p) {
  char out[PATH_MAX];
  return realpath(p.c_str(), out) ? std::string(out) : p;
}

const std::string kUrdma = URDMA_TOOL_PATH;

// `urdma status --json`, flattened by python into one line per client:
//   "<pid> <role> <slot> <reattached 0/1> <sent_pkts> <rcvd_pkts> <rdma_sends> <rdma_recvs>"
// plus a first line "daemon <pid> <survivors> <takeover>". rc 1: no daemon.
constexpr char kStatusScript[] = R"PY(
import json, sys
s = json.load(sys.stdin)
if not s["running"]:
    sys.exit(3)
d = s["daemon"]
print("daemon", d["pid"], d["survivors"], d["takeover"].replace(" ", "_"))
for c in s["clients"]:
    k = c.get("counters", {})
    print(c["pid"], c["role"], -1 if c["slot"] is None else c["slot"], int(c["reattached"]),
          k.get("sent_pkts", -1), k.get("rcvd_pkts", -1), k.get("rdma_sends", -1),
          k.get("rdma_recvs", -1), -1 if c.get("qps") is None else c["qps"])
)PY";

struct ClientRow {
  std::string role;
  long slot = -1;
  bool reattached = false;
  long long sent_pkts = -1, rcvd_pkts = -1, rdma_sends = -1, rdma_recvs = -1;
  long qps = -1;  // as last reported; -1: none reported
};
struct StatusView {
  int rc = -1;
  pid_t daemon = 0;
  unsigned survivors = 0;
  std::string takeover;
  std::map<pid_t, ClientRow> slot_holders;  // by pid
};

StatusView status(const std::string& urdma = kUrdma) {
  StatusView v;
  const std::string out = shell(urdma + " status --json | /usr/bin/python3 -c '" +
                                    std::string(kStatusScript) + "'",
                                &v.rc);
  if (v.rc == 3) v.rc = 1;  // the script saw "running": false (urdma status exits 1)
  for (const auto& line : lines_of(out)) {
    std::istringstream in(line);
    std::string first;
    in >> first;
    if (first == "daemon") {
      in >> v.daemon >> v.survivors >> v.takeover;
      continue;
    }
    ClientRow r;
    int reattached = 0;
    in >> r.role >> r.slot >> reattached >> r.sent_pkts >> r.rcvd_pkts >> r.rdma_sends >>
        r.rdma_recvs >> r.qps;
    r.reattached = reattached != 0;
    if (r.role == "slot") v.slot_holders[std::stoi(first)] = r;
  }
  return v;
}

// ---- a process on urdma: a Runtime over urdmad, RC WRITEs to a peer process ----

constexpr size_t kPart = 4 << 20;  // bytes per part of the stream
constexpr size_t kChunk = 64 << 10;
const net::Address kLo = net::Address::from_v4(127, 0, 0, 1);

struct Peer {
  std::unique_ptr<runtime::Runtime> rt;
  provider::Pd* pd = nullptr;
  provider::Cq* cq = nullptr;
  provider::Qp* qp = nullptr;

  // Opens a runtime (leasing a slot; urdmad started if absent) and an RC QP; false with why.
  bool open() {
    runtime::RuntimeConfig c;
    c.device = test::device_config(nullptr, kLo, IBV_MTU_4096);
    c.engine.local_address = kLo;
    int err = 0;
    std::string why;
    rt = runtime::Runtime::open({}, c, &err, &why);
    if (!rt) {
      std::fprintf(stderr, "Runtime::open: %s (%s)\n", std::strerror(err), why.c_str());
      return false;
    }
    pd = rt->device().alloc_pd().value();
    cq = rt->device().create_cq(1024).value();
    provider::QpInitAttr init;
    init.qp_type = IBV_QPT_RC;
    init.pd = pd;
    init.send_cq = cq;
    init.recv_cq = cq;
    init.cap.max_send_wr = 256;
    init.cap.max_recv_wr = 16;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    auto q = rt->device().create_qp(init);
    if (!q.ok()) return false;
    qp = q.value();
    return true;
  }
  bool connect(uint32_t peer_qpn, bool first) {
    test::QpParams p;
    p.mtu = IBV_MTU_4096;
    p.timeout = 16;  // 268 ms: a loaded machine (or ASan) does not exhaust the retries
    if (!first) std::swap(p.sq_psn, p.rq_psn);
    return test::bring_up(*qp, p, kLo, peer_qpn).ok();
  }
  provider::Mr* reg(void* p, size_t n) {
    auto mr = rt->device().reg_mr(pd, p, n, reinterpret_cast<uintptr_t>(p),
                                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    return mr.ok() ? mr.value() : nullptr;
  }
  // WRITEs `bytes` from src to remote in kChunk WRITEs and waits for every completion; 0 or a
  // failure code.
  int write_all(const uint8_t* src, provider::Mr* mr, size_t bytes, uint64_t remote,
                uint32_t rkey) {
    const size_t n = bytes / kChunk;
    for (size_t i = 0; i < n; ++i) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(src + i * kChunk), static_cast<uint32_t>(kChunk),
                  mr->lkey()};
      ibv_send_wr wr{};
      wr.wr_id = i;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.wr.rdma.remote_addr = remote + i * kChunk;
      wr.wr.rdma.rkey = rkey;
      ibv_send_wr* bad = nullptr;
      if (!qp->post_send(&wr, &bad).ok()) return 10;
    }
    size_t done = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    ibv_wc wc[32];
    while (done < n) {
      const int k = cq->poll(32, wc);
      for (int i = 0; i < k; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS) {
          std::fprintf(stderr, "WRITE %llu: %s\n", static_cast<unsigned long long>(wc[i].wr_id),
                       ibv_wc_status_str(wc[i].status));
          return 11;
        }
      }
      done += static_cast<size_t>(k);
      if (k == 0 && std::chrono::steady_clock::now() > deadline) return 12;
      if (k == 0 && !rt->try_progress()) std::this_thread::yield();
    }
    return 0;
  }
};

struct Target {  // B's buffer, as A needs it
  uint32_t qpn;
  uint32_t rkey;
  uint64_t addr;
};

// The two processes of a stream: B (the target) and A (the writer), joined by pipes. A writes
// `parts` parts of kPart bytes; before each part after the first it waits for the test's go.
// B checks the whole buffer against the pattern it computes itself and exits 0 if bit-exact.
struct Stream {
  Pipe a_to_b, b_to_a, a_to_test, test_to_a, b_to_test;
  pid_t a = -1, b = -1;
  int parts = 1;

  static constexpr uint64_t kSeed = 7;

  void start(int part_count) {
    parts = part_count;
    b = fork_process([this] {
      Peer p;
      if (!p.open()) return 2;
      const size_t bytes = kPart * static_cast<size_t>(parts);
      std::vector<uint8_t> dst(bytes, 0);
      provider::Mr* mr = p.reg(dst.data(), bytes);
      if (!mr) return 3;
      b_to_a.put(Target{p.qp->qp_num(), mr->rkey(), reinterpret_cast<uintptr_t>(dst.data())});
      uint32_t a_qpn = 0;
      if (!a_to_b.get(&a_qpn, 10000) || !p.connect(a_qpn, false)) return 4;
      b_to_a.put(Target{});  // ready: A may write
      b_to_test.put(uint32_t{1});  // connected
      int done = 0;
      if (!a_to_b.get(&done, 60000) || done != 1) return 5;
      (void)p.rt->counters();  // orders the engine's placement before our reads
      std::vector<uint8_t> want(bytes);
      fill_pattern(want, kSeed);
      if (fnv1a(dst.data(), bytes) != fnv1a(want.data(), bytes)) return 6;
      // Stay (holding the slot) until told to go.
      a_to_b.get(&done, 60000);
      return 0;
    });
    a = fork_process([this] {
      Peer p;
      if (!p.open()) return 2;
      Target t{};
      if (!b_to_a.get(&t, 10000)) return 3;
      a_to_b.put(p.qp->qp_num());
      if (!p.connect(t.qpn, true)) return 4;
      Target ready{};
      if (!b_to_a.get(&ready, 10000)) return 4;
      const size_t bytes = kPart * static_cast<size_t>(parts);
      std::vector<uint8_t> src(bytes);
      fill_pattern(src, kSeed);
      provider::Mr* mr = p.reg(src.data(), bytes);
      if (!mr) return 5;
      for (int part = 0; part < parts; ++part) {
        if (part > 0) {
          int go = 0;
          if (!test_to_a.get(&go, 60000)) return 6;
        }
        const size_t off = kPart * static_cast<size_t>(part);
        if (const int e = p.write_all(src.data() + off, mr, kPart, t.addr + off, t.rkey)) return e;
        a_to_test.put(part);
      }
      a_to_b.put(1);  // done: B checks
      int stay = 0;
      test_to_a.get(&stay, 60000);
      return 0;
    });
  }
  // Lets A write its next part.
  void go() { test_to_a.put(1); }
  bool part_done(int want) {
    int part = -1;
    return a_to_test.get(&part, 30000) && part == want;
  }
  // Ends both (B after its check): their exit codes must be 0.
  void finish() {
    a_to_b.put(1);
    test_to_a.put(1);
    for (pid_t p : {b, a}) {
      const auto st = wait_exit(p, 30000);
      ASSERT_TRUE(st) << "pid " << p << " did not exit";
      EXPECT_TRUE(WIFEXITED(*st)) << "pid " << p << " died";
      EXPECT_EQ(WEXITSTATUS(*st), 0) << (p == a ? "the writer" : "the target") << " failed";
    }
  }
};

// Polls `urdma status` until `ok` holds (bounded).
template <class Pred>
StatusView wait_status(Pred ok, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  StatusView v;
  for (;;) {
    v = status();
    if (ok(v) || std::chrono::steady_clock::now() > deadline) return v;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

TEST_F(UrdmaCli, StatusShowsBothClientProcessesWithTheirSlotsAndCounters) {
  in_fresh_netns([] {
    // No daemon yet: the first process's runtime starts it.
    EXPECT_EQ(status().rc, 1) << "no urdmad in a fresh namespace";
    Stream s;
    s.start(1);
    uint32_t connected = 0;
    ASSERT_TRUE(s.b_to_test.get(&connected, 10000));
    ASSERT_TRUE(s.part_done(0));
    // Counters arrive about once a second; wait for both reports to cover the stream.
    constexpr long long kPackets = kPart / 4096;
    const StatusView v = wait_status(
        [&](const StatusView& x) {
          return x.slot_holders.count(s.a) && x.slot_holders.count(s.b) &&
                 x.slot_holders.at(s.a).rdma_sends >= kPackets &&
                 x.slot_holders.at(s.b).rdma_recvs >= kPackets;
        },
        5000);
    ASSERT_EQ(v.rc, 0);
    EXPECT_GT(v.daemon, 0);
    ASSERT_TRUE(v.slot_holders.count(s.a)) << "the writer is not listed";
    ASSERT_TRUE(v.slot_holders.count(s.b)) << "the target is not listed";
    const ClientRow& a = v.slot_holders.at(s.a);
    const ClientRow& b = v.slot_holders.at(s.b);
    EXPECT_NE(a.slot, b.slot);
    EXPECT_GT(a.slot, 0);
    EXPECT_GE(a.rdma_sends, kPackets) << "every WRITE packet was a request sent";
    EXPECT_GE(a.sent_pkts, a.rdma_sends);
    EXPECT_GE(b.rdma_recvs, kPackets);
    EXPECT_GE(b.rcvd_pkts, b.rdma_recvs);
    EXPECT_GT(b.sent_pkts, 0) << "ACKs";
    EXPECT_EQ(a.qps, 1) << "each process has one RC QP";
    EXPECT_EQ(b.qps, 1);
    // The text form names them too.
    int rc = 0;
    const std::string text = shell(kUrdma + " status", &rc);
    EXPECT_EQ(rc, 0);
    EXPECT_NE(text.find("slots: 2 of 63 leased"), std::string::npos) << text;
    EXPECT_NE(text.find("rdma_sends"), std::string::npos) << text;
    s.finish();
  });
}

TEST_F(UrdmaCli, DevicesListTheNamespacesGidsAsIpReportsThem) {
  in_fresh_netns([] {
    ASSERT_TRUE(sh("ip link add ud0 type veth peer name ud1 && ip link set ud0 up && "
                   "ip addr add 10.77.0.1/24 dev ud0 && ip -6 addr add fd77::1/64 dev ud0 nodad"));
    // Both sides as "address/prefix netdev" sets, by python: the GIDs' addresses from
    // `urdma devices --json`, and every address `ip -j addr` reports.
    int rc = 0;
    const std::string ours = shell(kUrdma +
                                       " devices --json | /usr/bin/python3 -c '"
                                       "import json,sys,ipaddress\n"
                                       "d=json.load(sys.stdin)[\"devices\"]\n"
                                       "assert [x[\"name\"] for x in d]==[\"urdma0\"]\n"
                                       "for g in d[0][\"gids\"]:\n"
                                       "  a=ipaddress.IPv6Address(g[\"gid\"])\n"
                                       "  a=a.ipv4_mapped or a\n"
                                       "  assert g[\"type\"]==\"RoCE v2\"\n"
                                       "  print(g[\"index\"],a,g[\"prefix_len\"],g[\"netdev\"])'",
                                   &rc);
    ASSERT_EQ(rc, 0) << ours;
    const std::string theirs = shell(
        "ip -j addr | /usr/bin/python3 -c '"
        "import json,sys\n"
        "for l in json.load(sys.stdin):\n"
        "  for a in l.get(\"addr_info\",[]):\n"
        "    print(a[\"local\"],a[\"prefixlen\"],l[\"ifname\"])'",
        &rc);
    ASSERT_EQ(rc, 0);
    const auto their_lines = lines_of(theirs);
    const std::set<std::string> want(their_lines.begin(), their_lines.end());
    std::set<std::string> got;
    std::set<std::string> indices;
    for (const auto& line : lines_of(ours)) {
      const auto space = line.find(' ');
      indices.insert(line.substr(0, space));
      got.insert(line.substr(space + 1));
    }
    EXPECT_EQ(got, want);
    EXPECT_EQ(indices.size(), got.size()) << "every GID has its own index";
    EXPECT_TRUE(want.count("10.77.0.1 24 ud0")) << theirs;
    // The text form tells which flag takes the index.
    const std::string text = shell(kUrdma + " devices", &rc);
    EXPECT_EQ(rc, 0);
    EXPECT_NE(text.find("urdma0"), std::string::npos);
    EXPECT_NE(text.find("-x of perftest"), std::string::npos) << text;
  });
}

TEST_F(UrdmaCli, RunPassesExitStatusAndEnvironmentAndStartsTheDaemon) {
  in_fresh_netns([] {
    EXPECT_EQ(status().rc, 1);
    int rc = 0;
    const std::string out = shell(
        "URDMA_TEST_VAR='a b' LD_LIBRARY_PATH=/opt/theirs " + kUrdma +
            " run sh -c 'echo \"$LD_LIBRARY_PATH\"; echo \"$URDMA_DAEMON\"; "
            "echo \"$URDMA_TEST_VAR\"; echo \"$0\" \"$1\"; exit 7' zero 'one two'",
        &rc);
    EXPECT_EQ(rc, 7) << "the program's exit status is urdma's";
    const auto lines = lines_of(out);
    ASSERT_EQ(lines.size(), 4u) << out;
    // Our library directory first, the caller's path kept behind ours.
    EXPECT_EQ(lines[0].substr(0, lines[0].find(':')), real_path(URDMA_BUILD_LIBDIR)) << lines[0];
    EXPECT_EQ(lines[0].substr(lines[0].rfind(':') + 1), "/opt/theirs");
    EXPECT_EQ(lines[1], std::string(URDMA_DAEMON_PATH));
    EXPECT_EQ(lines[2], "a b");
    EXPECT_EQ(lines[3], "zero one two") << "arguments pass unchanged";
    // urdmad was started before the program and is still up.
    const StatusView v = status();
    EXPECT_EQ(v.rc, 0);
    EXPECT_GT(v.daemon, 0);
    // Errors: a program that does not exist, none at all; options after the program are its own.
    shell(kUrdma + " run /nonexistent/program 2>/dev/null", &rc);
    EXPECT_EQ(rc, 127);
    shell(kUrdma + " run 2>/dev/null", &rc);
    EXPECT_EQ(rc, 2);
    EXPECT_EQ(lines_of(shell(kUrdma + " run -- printf \"%s\\n\" --help", &rc)), std::vector<std::string>{"--help"});
    EXPECT_EQ(rc, 0);
    shell(kUrdma + " run --help", &rc);
    EXPECT_EQ(rc, 0);
  });
}

// --help everywhere (CLI11): every command and subcommand prints its usage and exits 0; an
// option nobody knows is an error (CLI11 exits non-zero: 106 or 109), not ignored.
TEST_F(UrdmaCli, EveryCommandHasHelpAndRefusesUnknownOptions) {
  in_fresh_netns([] {
    const std::string daemon = URDMA_DAEMON_PATH;
    for (const std::string& cmd :
         {kUrdma, kUrdma + " run", kUrdma + " status", kUrdma + " devices", kUrdma + " decode",
          daemon}) {
      SCOPED_TRACE(cmd);
      int rc = -1;
      const std::string out = shell(cmd + " --help 2>&1", &rc);
      EXPECT_EQ(rc, 0) << out;
      EXPECT_NE(out.find("Usage:"), std::string::npos) << out;
      EXPECT_NE(out.find("--help"), std::string::npos) << out;
      if (cmd == kUrdma + " run") continue;  // run's options end at the program's name
      shell(cmd + " --no-such-option > /dev/null 2>&1", &rc);
      EXPECT_NE(rc, 0);
    }
  });
}

TEST_F(UrdmaCli, InstalledTreeWorksLikeTheBuildTree) {
  in_fresh_netns([] {
    char tmpl[] = "/tmp/urdma-install-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const std::string prefix = tmpl;
    int rc = 0;
    const std::string log = shell(std::string(URDMA_CMAKE_COMMAND) + " --install " +
                                      URDMA_BINARY_DIR + " --prefix " + prefix + " 2>&1",
                                  &rc);
    ASSERT_EQ(rc, 0) << log;
    const std::string bin = prefix + "/bin/urdma";
    const std::string libdir = prefix + "/" URDMA_INSTALL_LIBDIR "/urdma";
    struct stat st;
    ASSERT_EQ(stat(bin.c_str(), &st), 0) << log;
    ASSERT_EQ(stat((prefix + "/bin/urdmad").c_str(), &st), 0) << log;
#ifdef URDMA_HAVE_VERBS
    EXPECT_EQ(stat((libdir + "/libibverbs.so.1").c_str(), &st), 0) << log;
#endif
    // Nothing may point the installed urdma at the build tree.
    unsetenv("URDMA_DAEMON");
    const std::string out = shell(
        "PATH=/usr/bin:/bin " + bin + " run sh -c 'echo \"$LD_LIBRARY_PATH\"; echo \"$URDMA_DAEMON\"'",
        &rc);
    EXPECT_EQ(rc, 0);
    const auto lines = lines_of(out);
    ASSERT_EQ(lines.size(), 2u) << out;
    EXPECT_EQ(lines[0].substr(0, lines[0].find(':')), real_path(libdir)) << lines[0];
    EXPECT_EQ(lines[0].find(real_path(URDMA_BUILD_LIBDIR)), std::string::npos)
        << "the installed urdma put the build tree's libraries on the path: " << lines[0];
    EXPECT_EQ(lines[1], real_path(prefix + "/bin/urdmad"));
    // The system service: both units, naming the installed urdmad, and valid to systemd.
    const auto file = [](const std::string& path) {
      std::ifstream in(path);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    const std::string units = prefix + "/lib/systemd/system/";
    EXPECT_NE(file(units + "urdmad.socket").find("ListenSequentialPacket=/run/urdma/urdmad.sock"),
              std::string::npos)
        << log;
    EXPECT_NE(file(units + "urdmad.service")
                  .find("ExecStart=" + prefix + "/bin/urdmad --system --foreground"),
              std::string::npos)
        << file(units + "urdmad.service");
    shell("command -v systemd-analyze > /dev/null", &rc);
    if (rc == 0) {
      const std::string verdict = shell("systemd-analyze verify " + units + "urdmad.socket " +
                                            units + "urdmad.service 2>&1",
                                        &rc);
      EXPECT_EQ(rc, 0) << verdict;
    }
    // The daemon `urdma run` started is the installed one.
    const StatusView v = status(bin);
    ASSERT_EQ(v.rc, 0);
    char exe[PATH_MAX] = {};
    ASSERT_GT(readlink(("/proc/" + std::to_string(v.daemon) + "/exe").c_str(), exe, sizeof exe - 1),
              0);
    EXPECT_EQ(std::string(exe), real_path(prefix + "/bin/urdmad"));
    // `urdma devices` answers alike from both trees.
    const std::string installed = shell(bin + " devices --json", &rc);
    EXPECT_EQ(rc, 0);
    EXPECT_EQ(installed, shell(kUrdma + " devices --json", &rc));
    // pkg-config links against the installed library directory.
    const std::string libs =
        shell("PKG_CONFIG_PATH=" + prefix + "/" URDMA_INSTALL_LIBDIR "/pkgconfig pkg-config --libs urdma", &rc);
    EXPECT_EQ(rc, 0);
    std::istringstream words(libs);
    std::string first;
    words >> first;
    ASSERT_EQ(first.rfind("-L", 0), 0u) << libs;
    EXPECT_EQ(real_path(first.substr(2)), real_path(libdir)) << libs;
#if defined(URDMA_HAVE_VERBS) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    // A Debian verbs program through the installed tree alone: ibv_rc_pingpong checks its data.
    // (Not under a sanitizer: an uninstrumented program needs the sanitizer's runtime preloaded
    // before our library, which tool_run.cc arranges for the tool tests.)
    shell("command -v ibv_rc_pingpong > /dev/null", &rc);
    if (rc == 0) {
      const std::string pp =
          "PATH=/usr/bin:/bin timeout 60 " + bin + " run ibv_rc_pingpong -g 0 -n 20 -c -p 18811";
      shell("(" + pp + " > " + prefix + "/server.log 2>&1 &)", &rc);
      for (int i = 0; i < 200; ++i) {
        shell("ss -Hltn 'sport = :18811' | grep -q .", &rc);
        if (rc == 0) break;
        usleep(50'000);
      }
      ASSERT_EQ(rc, 0) << "the pingpong server did not listen: " << file(prefix + "/server.log");
      const std::string client = shell(pp + " 127.0.0.1 2>&1", &rc);
      EXPECT_EQ(rc, 0) << client;
      EXPECT_NE(client.find("163840 bytes in"), std::string::npos) << client;
      for (int i = 0; i < 100 && file(prefix + "/server.log").find("iters in") == std::string::npos; ++i)
        usleep(50'000);
      EXPECT_NE(file(prefix + "/server.log").find("163840 bytes in"), std::string::npos)
          << file(prefix + "/server.log");
    }
#endif
    kill(v.daemon, SIGTERM);
    wait_exit(v.daemon, 3000);
    shell("rm -rf " + prefix, &rc);
  }, 60);
}

TEST_F(UrdmaCli, KilledDaemonIsTakenOverWhileAStreamRunsAndServesANewProcess) {
  in_fresh_netns(
      [] {
        setenv("URDMA_TAKEOVER_GRACE_MS", "300", 1);
        Stream s;
        s.start(4);
        uint32_t connected = 0;
        ASSERT_TRUE(s.b_to_test.get(&connected, 10000));
        ASSERT_TRUE(s.part_done(0));
        const StatusView before = status();
        ASSERT_EQ(before.rc, 0);
        ASSERT_TRUE(before.slot_holders.count(s.a) && before.slot_holders.count(s.b));
        // Part 1 in flight when urdmad dies.
        s.go();
        ASSERT_EQ(kill(before.daemon, SIGKILL), 0);
        ASSERT_TRUE(wait_exit(before.daemon, 3000));
        ASSERT_TRUE(s.part_done(1)) << "the stream stalled without a daemon";
        // The processes' keepers start a new daemon and hand their slots over.
        const StatusView after = wait_status(
            [&](const StatusView& v) {
              return v.rc == 0 && v.daemon != before.daemon && v.takeover == "took_over" &&
                     v.slot_holders.count(s.a) && v.slot_holders.at(s.a).reattached &&
                     v.slot_holders.count(s.b) && v.slot_holders.at(s.b).reattached;
            },
            10000);
        ASSERT_EQ(after.rc, 0);
        EXPECT_NE(after.daemon, before.daemon);
        EXPECT_EQ(after.takeover, "took_over");
        EXPECT_EQ(after.survivors, 2u);
        ASSERT_TRUE(after.slot_holders.count(s.a)) << "the writer is not listed";
        ASSERT_TRUE(after.slot_holders.count(s.b)) << "the target is not listed";
        EXPECT_TRUE(after.slot_holders.at(s.a).reattached);
        EXPECT_EQ(after.slot_holders.at(s.a).slot, before.slot_holders.at(s.a).slot);
        EXPECT_EQ(after.slot_holders.at(s.b).slot, before.slot_holders.at(s.b).slot);
        // The rest of the stream under the new daemon.
        for (int part = 2; part < 4; ++part) {
          s.go();
          ASSERT_TRUE(s.part_done(part));
        }
        // A new process gets a working slot of its own: two runtimes, a WRITE, checksummed.
        const pid_t c = fork_process([] {
          Peer x, y;
          if (!x.open() || !y.open()) return 2;
          if (!x.connect(y.qp->qp_num(), true) || !y.connect(x.qp->qp_num(), false)) return 3;
          std::vector<uint8_t> src(1 << 20), dst(1 << 20);
          fill_pattern(src, 3);
          provider::Mr* ms = x.reg(src.data(), src.size());
          provider::Mr* md = y.reg(dst.data(), dst.size());
          if (!ms || !md) return 4;
          if (const int e = x.write_all(src.data(), ms, src.size(),
                                        reinterpret_cast<uintptr_t>(dst.data()), md->rkey()))
            return e;
          (void)y.rt->counters();
          return fnv1a(dst.data(), dst.size()) == fnv1a(src.data(), src.size()) ? 0 : 6;
        });
        const auto st = wait_exit(c, 30000);
        ASSERT_TRUE(st);
        EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
            << "the new process failed: " << (WIFEXITED(*st) ? WEXITSTATUS(*st) : -1);
        // The whole stream arrived bit-exact (B checks).
        s.finish();
      },
      60);
}

// A process kept through urdmad's death accepts shared memory again from the restarted daemon:
// a process that comes after the restart gets a region with it. After a first WRITE (which asks
// for the region), 8 MiB of WRITEs between the two leave the namespace's UDP counters all but
// untouched; by UDP they would be over 2,000 datagrams.
TEST_F(UrdmaCli, AProcessKeptThroughARestartSharesMemoryWithANewOne) {
  in_fresh_netns(
      [] {
        setenv("URDMA_TAKEOVER_GRACE_MS", "300", 1);
        constexpr size_t kBytes = 8 << 20;
        Pipe p_to_test, test_to_p, p_to_q, q_to_p;
        const pid_t p = fork_process([&] {
          Peer x;
          if (!x.open()) return 2;
          p_to_test.put(uint32_t{1});  // leased and accepted: the test restarts urdmad
          Target t{};
          if (!q_to_p.get(&t, 60000)) return 3;
          p_to_q.put(x.qp->qp_num());
          Target ready{};
          if (!x.connect(t.qpn, true) || !q_to_p.get(&ready, 10000)) return 4;
          std::vector<uint8_t> src(kBytes);
          fill_pattern(src, 11);
          provider::Mr* mr = x.reg(src.data(), src.size());
          if (!mr) return 5;
          if (const int e = x.write_all(src.data(), mr, kChunk, t.addr, t.rkey)) return e;
          p_to_test.put(uint32_t{2});  // the first WRITE is done
          int go = 0;
          if (!test_to_p.get(&go, 30000)) return 7;
          if (const int e = x.write_all(src.data() + kChunk, mr, kBytes - kChunk,
                                        t.addr + kChunk, t.rkey))
            return e;
          p_to_q.put(uint32_t{1});  // done: Q checks
          return 0;
        });
        uint32_t step = 0;
        ASSERT_TRUE(p_to_test.get(&step, 20000) && step == 1);
        const StatusView before = status();
        ASSERT_EQ(before.rc, 0);
        ASSERT_EQ(kill(before.daemon, SIGKILL), 0);
        ASSERT_TRUE(wait_exit(before.daemon, 3000));
        const StatusView after = wait_status(
            [&](const StatusView& v) {
              return v.rc == 0 && v.daemon != before.daemon && v.slot_holders.count(p) &&
                     v.slot_holders.at(p).reattached;
            },
            10000);
        ASSERT_TRUE(after.slot_holders.count(p) && after.slot_holders.at(p).reattached);
        const pid_t q = fork_process([&] {
          Peer y;
          if (!y.open()) return 2;
          std::vector<uint8_t> dst(kBytes, 0);
          provider::Mr* mr = y.reg(dst.data(), dst.size());
          if (!mr) return 3;
          q_to_p.put(Target{y.qp->qp_num(), mr->rkey(), reinterpret_cast<uintptr_t>(dst.data())});
          uint32_t p_qpn = 0;
          if (!p_to_q.get(&p_qpn, 10000) || !y.connect(p_qpn, false)) return 4;
          q_to_p.put(Target{});  // ready
          uint32_t done = 0;
          if (!p_to_q.get(&done, 60000) || done != 1) return 5;
          (void)y.rt->counters();  // orders the engine's placement before our reads
          std::vector<uint8_t> want(kBytes);
          fill_pattern(want, 11);
          return fnv1a(dst.data(), kBytes) == fnv1a(want.data(), kBytes) ? 0 : 6;
        });
        ASSERT_TRUE(p_to_test.get(&step, 30000) && step == 2);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the region comes
        const uint64_t udp_before = udp_datagrams_received();
        test_to_p.put(1);
        for (pid_t pid : {p, q}) {
          const auto st = wait_exit(pid, 60000);
          ASSERT_TRUE(st) << "pid " << pid << " did not exit";
          EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
              << (pid == p ? "the kept process" : "the new process") << " failed: "
              << (WIFEXITED(*st) ? WEXITSTATUS(*st) : -1);
        }
        const uint64_t udp = udp_datagrams_received() - udp_before;
        std::printf("UDP datagrams in the namespace during the 8 MiB: %llu\n",
                    static_cast<unsigned long long>(udp));
        EXPECT_LT(udp, 200u) << "the kept process and the new one talked by UDP";
      },
      60);
}

}  // namespace
}  // namespace urdma::process_test
