// Attacks on root's urdma programs by an unprivileged local user (uid 65534, nobody; a second
// user is 65533) and by a remote peer, each scripted in network namespaces of one host
// (tests/process/netns_harness.h). Every test fails if its attack works; docs/SECURITY.md says
// what urdma promises.
//
//   local   squatting the daemon's names and directories before it starts; taking over a
//           killed daemon's clients; a planted urdmad; a flood of silent connections to a system
//           daemon; two users under one system daemon (their processes, captures and
//           shared-memory regions; and a system daemon with no privilege at all); a planted path
//           for the daemon's log
//   remote  forged CM REPs that would make urdmad send DREQs to addresses of the attacker's
//           choosing; guessing the rkey of a UC QP's memory
//
// Each test body runs in a fresh network namespace and a mount namespace of its own, with fresh
// tmpfs on /tmp and /run: whatever an attacker plants there (/tmp/urdma-<uid>, /run/urdma) is
// this test's alone, and tests that run at once never meet. The attacker is a helper program
// run under setpriv (helper.cc), or code of this file in a second namespace for a remote one.
// Programs run with a clean environment (env -i), as a user would start them.
//
// URDMA_SECURITY_TARGET_BUILD=<a build tree> aims the attacks at that tree's urdma, urdmad and
// libraries instead of this build's (the attackers stay this build's): with a build of a commit
// older than the defences, the tests show that the attacks worked there.
#include <arpa/inet.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "capture/capture.h"
#include "daemon/client.h"
#include "daemon/cm_agent.h"
#include "daemon/mad_router.h"
#include "daemon/steering.h"
#include "gsi/gmp.h"
#include "netns_harness.h"
#include "support/datagram.h"
#include "tool_run.h"
#include "wire/cm.h"
#include "wire/headers.h"
#include "wire/mad.h"
#include "wire/opcode.h"

namespace urdma::process_test {
namespace {

using nlohmann::json;

constexpr uid_t kAttacker = 65534;  // nobody
constexpr uid_t kOtherUser = 65533;
constexpr uid_t kDaemonUser = 65532;  // the socket-activated system daemon's
constexpr uint16_t kRocePort = 4791;

// ---- the programs under attack ----

struct Target {
  std::string lib, urdmad, urdma;
};

const Target& target() {
  static const Target t = [] {
    const char* other = std::getenv("URDMA_SECURITY_TARGET_BUILD");
    if (other && *other) {
      const std::string b = other;
      return Target{b + "/lib", b + "/tools/urdmad/urdmad", b + "/tools/urdma/urdma"};
    }
    return Target{URDMA_LIB_DIR, URDMA_DAEMON_PATH, URDMA_TOOL_PATH};
  }();
  return t;
}

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

// A clean environment with `vars` ("NAME=value ..."), as a login shell would give a program
// (under ASan our libraries need their runtime preloaded into Debian's binaries).
std::string env(const std::string& vars = "") {
  std::string e = "env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin ";
#ifdef URDMA_PRELOAD
  e += std::string("LD_PRELOAD=") + URDMA_PRELOAD + " ASAN_OPTIONS=detect_leaks=0 ";
#endif
  return e + vars + (vars.empty() ? "" : " ");
}

// The prefix that runs a command as `uid` (its own group, no supplementary groups).
std::string as(uid_t uid) {
  if (uid == 0) return "";
  const std::string u = std::to_string(uid);
  return "setpriv --reuid=" + u + " --regid=" + u + " --clear-groups ";
}

// Starts a shell command line (no environment added: see env()) with its output to a file;
// finish() and wait_output() (tool_run.h) take it from there.
Started launch(const std::string& line) {
  static int counter = 0;
  Started s;
  s.out_path = "/tmp/security_" + std::to_string(getpid()) + "_" + std::to_string(counter++);
  const std::string full = line + " >" + s.out_path + " 2>&1";
  s.pid = fork_process([full] {
    execl("/bin/sh", "sh", "-c", full.c_str(), static_cast<char*>(nullptr));
    return 127;
  });
  return s;
}

ToolRun run_line(const std::string& line, int timeout_ms = 15000) {
  return finish(launch(line), timeout_ms);
}

// `urdma status --json` as `uid`: the parsed object, or null when it printed none.
json status(uid_t uid, const std::string& vars = "") {
  const ToolRun r = run_line(env(vars) + as(uid) + target().urdma + " status --json", 10000);
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("{")) return json::parse(line, nullptr, false);
  return nullptr;
}

// Polls status(uid) every 50 ms until `ok` holds: that status, or null when time ran out.
template <class Ok>
json wait_status(uid_t uid, Ok ok, int timeout_ms, const std::string& vars = "") {
  const int64_t deadline = now_ms() + timeout_ms;
  for (;;) {
    json s = status(uid, vars);
    if (s.is_object() && s.value("running", false) && ok(s)) return s;
    if (now_ms() >= deadline) return nullptr;
    usleep(50 * 1000);
  }
}

// A member of a JSON object that is an object (`daemon`, `counters`), or an empty object: never
// a throw or undefined behaviour for output that is not what a test expects.
const json& object_of(const json& j, const char* key) {
  static const json none = json::object();
  if (!j.is_object()) return none;
  const auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : none;
}
// The same for an array (`clients`).
const json& array_of(const json& j, const char* key) {
  static const json none = json::array();
  if (!j.is_object()) return none;
  const auto it = j.find(key);
  return it != j.end() && it->is_array() ? *it : none;
}
const json& daemon_of(const json& s) {
  return object_of(s, "daemon");
}

// The connections of a status whose program is `comm` and whose role is `role`.
std::vector<json> clients_of(const json& s, const std::string& comm, const std::string& role) {
  std::vector<json> out;
  for (const json& c : array_of(s, "clients"))
    if (c.value("comm", "") == comm && c.value("role", "") == role) out.push_back(c);
  return out;
}

// "key=value" from a helper's output; -1 when absent.
long long field(const std::string& out, const std::string& key) {
  const size_t at = out.find(key + "=");
  if (at == std::string::npos) return -1;
  return std::strtoll(out.c_str() + at + key.size() + 1, nullptr, 0);
}

// The seconds of ibv_*_pingpong's report ("1000 iters in 0.14 seconds = ..."), or -1.
double seconds_of(const std::string& out) {
  const size_t at = out.find(" iters in ");
  return at == std::string::npos ? -1 : std::strtod(out.c_str() + at + 10, nullptr);
}

// "Uid:" (real) and "CapEff:" of a process, from /proc/<pid>/status.
std::string proc_status_line(pid_t pid, const std::string& key) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.starts_with(key + ":")) return line;
  return "";
}

// Running: neither gone nor a zombie waiting to be reaped.
bool alive(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

uint64_t netns_inode() {
  struct stat st;
  return stat("/proc/self/ns/net", &st) == 0 ? st.st_ino : 0;
}

// The file name of a daemon's socket for this namespace (paths.h).
std::string socket_name() {
  return "net-" + std::to_string(netns_inode()) + ".sock";
}

// ---- the test's own world ----

void need_root() {
  if (!real_root())
    skip_test("not root: the attacks need other uids (setpriv) and a mount namespace");
}

void need_tool(const char* name, const char* package) {
  if (!have_tool(name))
    skip_test(std::string("no ") + name + " (Debian's " + package + "; scripts/deps.sh)");
}

// Fresh tmpfs on /tmp and /run, seen by this test's processes only.
void private_filesystem() {
  if (unshare(CLONE_NEWNS) != 0) skip_test(std::string("unshare(CLONE_NEWNS): ") + strerror(errno));
  ASSERT_EQ(mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), 0) << strerror(errno);
  ASSERT_EQ(mount("tmpfs", "/tmp", "tmpfs", 0, "mode=1777"), 0) << strerror(errno);
  ASSERT_EQ(mount("tmpfs", "/run", "tmpfs", 0, "mode=0755"), 0) << strerror(errno);
}

// Runs `body` in a fresh network namespace with its own /tmp and /run, as root.
void attack(const std::function<void()>& body, int timeout_s = 100) {
  in_fresh_netns(
      [&] {
        need_root();
        need_tool("setpriv", "util-linux");
        private_filesystem();
        if (::testing::Test::HasFatalFailure()) return;
        // An exception must not leave the body: gtest would catch it in this forked child and
        // carry on as the test program, leaving the namespace's processes running.
        try {
          body();
        } catch (const std::exception& e) {
          ADD_FAILURE() << "exception: " << e.what();
        }
      },
      timeout_s);
}

// ---- sockets as the kernel lists them ----

struct UdpSocketState {
  unsigned local_port = 0;
  uint64_t rx_queue = 0;  // bytes waiting to be read
  uint64_t drops = 0;     // datagrams the kernel dropped (receive buffer full)
};

// Every UDP socket of the namespace of `pid` ("self" for ours), by inode.
std::map<uint64_t, UdpSocketState> udp_sockets(const std::string& pid = "self") {
  std::map<uint64_t, UdpSocketState> out;
  for (const char* file : {"/net/udp", "/net/udp6"}) {
    std::ifstream f("/proc/" + pid + file);
    std::string line;
    std::getline(f, line);  // the header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::vector<std::string> t;
      for (std::string w; in >> w;) t.push_back(w);
      if (t.size() < 13) continue;
      UdpSocketState s;
      s.local_port =
          static_cast<unsigned>(std::stoul(t[1].substr(t[1].rfind(':') + 1), nullptr, 16));
      s.rx_queue = std::stoull(t[4].substr(t[4].find(':') + 1), nullptr, 16);
      s.drops = std::stoull(t[12]);
      out[std::stoull(t[9])] = s;
    }
  }
  return out;
}

// The distinct UDP sockets bound to port 4791 that process `pid` holds (by inode).
std::set<uint64_t> roce_sockets_of(pid_t pid) {
  const std::string p = std::to_string(pid);
  const auto udp = udp_sockets(p);
  std::set<uint64_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + p + "/fd", ec)) {
    const std::string link = std::filesystem::read_symlink(e.path(), ec).string();
    if (ec || !link.starts_with("socket:[")) continue;
    const uint64_t inode = std::stoull(link.substr(8));
    const auto it = udp.find(inode);
    if (it != udp.end() && it->second.local_port == kRocePort) out.insert(inode);
  }
  return out;
}

// ---- 1. squatting the daemon's names before it starts ----

// The local attacker listening where a daemon might be looked for and connecting where one is
// (helper.cc, `lurk`), as uid 65534. However the test ends, it is stopped and what reached it is
// checked: nothing — no connection, no record, no fd.
class Lurker {
 public:
  explicit Lurker(const std::string& args) {
    started_ = launch(env() + as(kAttacker) + URDMA_SECURITY_HELPER + " lurk " + args);
    if (wait_output(started_, "ready", 5000))
      pid_ = static_cast<pid_t>(field(read_file(started_.out_path), "ready pid"));
  }
  ~Lurker() { stop(); }
  bool ready() const { return pid_ > 0; }

  // Stops it and checks its counts; its report.
  const std::string& stop() {
    if (stopped_) return report_;
    stopped_ = true;
    if (pid_ > 0) kill(pid_, SIGTERM);
    report_ = finish(started_, 5000).output;
    EXPECT_TRUE(ready()) << "the attacker did not start:\n" << report_;
    if (!ready()) return report_;
    EXPECT_EQ(field(report_, "accepted"), 0) << "connections reached the attacker:\n" << report_;
    EXPECT_EQ(field(report_, "connected"), 0) << "the attacker reached a daemon:\n" << report_;
    EXPECT_EQ(field(report_, "records"), 0) << report_;
    EXPECT_EQ(field(report_, "fds"), 0) << "fds were handed to the attacker:\n" << report_;
    return report_;
  }

 private:
  Started started_;
  pid_t pid_ = -1;
  bool stopped_ = false;
  std::string report_;
};

// uid 65534 binds the abstract name every urdmad used to listen on, makes the directories a
// root daemon or client could fall back to and listens on every socket path it can make; then
// root runs a program. It must find its own daemon, running as root, and the squatter must hear
// nothing.
TEST(Security, SquattedNamesAndDirectoriesAreNeverUsedByRoot) {
  attack([] {
    need_tool("ibv_devinfo", "ibverbs-utils");
    const std::string sock = socket_name();
    Lurker squatter(
        "--mkdir /run/urdma --mkdir /run/urdma/uid-0 --mkdir /run/user/0"
        " --mkdir /tmp/urdma-0 --listen @urdma/v1 --listen /tmp/urdma-0/" +
        sock + " --listen /tmp/" + sock + " --listen /run/urdma/" + sock +
        " --listen /run/urdma/urdmad.sock");
    ASSERT_TRUE(squatter.ready());

    const ToolRun r =
        run_line(env("URDMA_IDLE_TIMEOUT_MS=20000") + target().urdma + " run ibv_devinfo");
    const std::string report = squatter.stop();
    EXPECT_NE(report.find("mkdir /tmp/urdma-0: made"), std::string::npos)
        << "the squat was in place:\n"
        << report;
    EXPECT_NE(report.find("listen @urdma/v1: held"), std::string::npos) << report;
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("hca_id:\turdma0"), std::string::npos) << r.output;

    // The daemon that served it is root's, by its own word and by the kernel's.
    const json st = status(0);
    EXPECT_EQ(daemon_of(st).value("uid", -1), 0) << st.dump();
    EXPECT_EQ(daemon_of(st).value("socket", ""), "/run/urdma/uid-0/" + sock) << st.dump();
    const pid_t daemon_pid = daemon_of(st).value("pid", 0);
    EXPECT_TRUE(proc_status_line(daemon_pid, "Uid").starts_with("Uid:\t0\t"))
        << "pid " << daemon_pid << ": " << proc_status_line(daemon_pid, "Uid");
  });
}

// uid 65534 makes /tmp/urdma-65533 — where user 65533's daemon would listen — before 65533
// ever runs urdma, and listens in it and on the old abstract name. The victim's program refuses
// the directory with an error naming its owner, and sends the squatter nothing.
TEST(Security, AUsersRuntimeDirectoryMadeByAnotherUserIsRefusedWithItsOwner) {
  attack([] {
    need_tool("ibv_devinfo", "ibverbs-utils");
    const std::string dir = "/tmp/urdma-" + std::to_string(kOtherUser);
    const std::string sock = socket_name();
    Lurker squatter("--mkdir " + dir + " --listen " + dir + "/" + sock + " --listen @urdma/v1");
    ASSERT_TRUE(squatter.ready());

    // Through `urdma run`, and as a plain program on our libraries (which says why only under
    // URDMA_DEBUG: ibv_open_device can return nothing but an errno).
    const ToolRun run = run_line(env() + as(kOtherUser) + target().urdma + " run ibv_devinfo");
    const ToolRun plain = run_line(env("LD_LIBRARY_PATH=" + target().lib + " URDMA_DEBUG=1") +
                                   as(kOtherUser) + "ibv_devinfo");
    squatter.stop();
    const std::string why = dir + " belongs to uid 65534 (nobody)";
    EXPECT_NE(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find(why), std::string::npos) << run.output;
    EXPECT_NE(plain.exit_code, 0) << plain.output;
    EXPECT_NE(plain.output.find(why), std::string::npos) << plain.output;
    // The victim made nothing in the squatted directory.
    std::vector<std::string> entries;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      entries.push_back(e.path().filename());
    EXPECT_EQ(entries, std::vector<std::string>{sock});
  });
}

// ---- 2. taking over a killed daemon's clients ----

// root runs an ibv_rc_pingpong pair; uid 65534 keeps trying to reach root's daemon (its socket)
// and to be found instead of it (every name it can listen on); urdmad's daemon process is
// killed with SIGKILL mid-run. The keeper starts a new daemon, both processes reattach to it,
// both pingpongs finish with their data checked, and the attacker got no connection and no fd.
// Each process holds exactly one UDP socket on port 4791, its own slot: nothing that would let
// it read another process's traffic.
TEST(Security, AKilledDaemonsClientsReattachToRootsKeeperOnly) {
  attack([] {
    need_tool("ibv_rc_pingpong", "ibverbs-utils");
    // The daemon logs to a file of root's own (its --verbose lines: which process reattached).
    const std::string log = "/tmp/urdmad.log";
    const std::string run =
        env("URDMA_IDLE_TIMEOUT_MS=20000 URDMA_DAEMON_LOG=" + log) + target().urdma + " run ";
    const ToolRun devinfo = run_line(run + "ibv_devinfo -v");
    const int gid = gid_index_of(devinfo.output, "127.0.0.1");
    ASSERT_GE(gid, 0) << devinfo.output;
    auto pingpong = [&](int iters, int port) {
      const std::string p = "ibv_rc_pingpong -g " + std::to_string(gid) + " -n " +
                            std::to_string(iters) + " -s 4096 -c -p " + std::to_string(port);
      Started server = launch(run + p);
      EXPECT_TRUE(wait_listening(port, 10000)) << read_file(server.out_path);
      return std::pair{server, launch(run + p + " 127.0.0.1")};
    };
    // The pair must outlast the kill and the reattachment (~0.1 s, up to a second on a loaded
    // machine): a short pair first measures how long an exchange takes now, and the pair
    // attacked is made to last about 3 s, and no less than 20,000 exchanges.
    auto [warm_server, warm_client] = pingpong(2000, 18599);
    const ToolRun warm = finish(warm_client, 30000);
    finish(warm_server, 5000);
    const double per_iter = seconds_of(warm.output) / 2000;
    ASSERT_GT(per_iter, 0) << warm.output;
    const int iters = static_cast<int>(std::clamp(3.0 / per_iter, 20000.0, 200000.0));
    auto [server, client] = pingpong(iters, 18600);

    const json before = wait_status(
        0, [](const json& s) { return clients_of(s, "ibv_rc_pingpong", "slot").size() == 2; },
        10000);
    ASSERT_TRUE(before.is_object()) << finish(client, 0).output << finish(server, 0).output;
    for (const json& p : clients_of(before, "ibv_rc_pingpong", "slot"))
      EXPECT_EQ(roce_sockets_of(p.value("pid", 0)).size(), 1u)
          << "pid " << p.value("pid", 0) << " holds UDP sockets on 4791 other than its slot's";
    // The attacker comes once the daemon serves (squatting before it starts is test 1): what
    // it can bind now, and what is in use until the daemon dies (the old abstract name).
    const std::string sock = socket_name();
    Lurker lurker("--mkdir /tmp/urdma-0 --listen @urdma/v1 --listen /tmp/urdma-0/" + sock +
                  " --listen /tmp/" + sock + " --connect /run/urdma/uid-0/" + sock +
                  " --connect /run/urdma/" + sock);
    ASSERT_TRUE(lurker.ready());
    const pid_t killed = daemon_of(before).value("pid", 0);
    const pid_t keeper = daemon_of(before).value("keeper_pid", 0);
    ASSERT_GT(killed, 0);
    ASSERT_EQ(kill(killed, SIGKILL), 0);
    const int64_t killed_at = now_ms();

    // The keeper's new daemon took both processes back: its count of survivors (which stays
    // after they exit), its log naming each, and the slots of those still running.
    const json after = wait_status(
        0,
        [&](const json& s) {
          return daemon_of(s).value("pid", 0) != killed && daemon_of(s).value("survivors", 0) == 2;
        },
        20000);
    EXPECT_TRUE(after.is_object()) << "no restarted daemon with both survivors:\n"
                                   << status(0).dump();
    std::printf("both reattached to the restarted daemon %lld ms after the kill\n",
                static_cast<long long>(now_ms() - killed_at));
    EXPECT_EQ(daemon_of(after).value("keeper_pid", 0), keeper) << after.dump();
    EXPECT_EQ(daemon_of(after).value("restarts", 0), 1) << after.dump();
    EXPECT_EQ(daemon_of(after).value("uid", -1), 0) << after.dump();
    const std::string logged = read_file(log);
    for (const json& p : clients_of(before, "ibv_rc_pingpong", "slot"))
      EXPECT_NE(logged.find("pid " + std::to_string(p.value("pid", 0)) + " reattached slot "),
                std::string::npos)
          << logged;
    for (const json& p : clients_of(after, "ibv_rc_pingpong", "slot")) {
      EXPECT_TRUE(p.value("reattached", false)) << p.dump();
      if (alive(p.value("pid", 0))) {
        EXPECT_EQ(roce_sockets_of(p.value("pid", 0)).size(), 1u) << p.dump();
      }
    }

    for (Started* s : {&server, &client}) {
      const ToolRun r = finish(*s, 60000);
      std::printf("a pingpong ended %lld ms after the kill\n",
                  static_cast<long long>(now_ms() - killed_at));
      EXPECT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(number_before(r.output, "iters in"), iters) << r.output;
    }
    const std::string report = lurker.stop();
    EXPECT_NE(report.find("EACCES"), std::string::npos) << "it did try root's socket:\n" << report;
  });
}

// ---- 3. a planted daemon ----

// uid 65534 owns a directory holding a copy of ibv_devinfo and an executable `urdmad` of its
// own (a script that leaves a mark and exits). root runs that copy of ibv_devinfo on our
// libraries: the planted urdmad must never run — not when named by URDMA_DAEMON (refused, with
// the reason), not when found beside the program (the build tree's library runs the build
// tree's urdmad).
TEST(Security, APlantedUrdmadNeverRuns) {
  attack([] {
    need_tool("ibv_devinfo", "ibverbs-utils");
    const std::string dir = "/tmp/planted";
    const std::string mark = dir + "/ran";
    ASSERT_TRUE(sh(as(kAttacker) + "sh -c 'mkdir " + dir + " && cp /usr/bin/ibv_devinfo " + dir +
                   "/ && printf \"#!/bin/sh\\nid -u > " + mark + "\\n\" > " + dir +
                   "/urdmad && chmod 755 " + dir + "/urdmad'"));
    const std::string lib = "LD_LIBRARY_PATH=" + target().lib;

    // Named by URDMA_DAEMON: refused. The library says why under URDMA_DEBUG, `urdma run` always.
    const ToolRun named = run_line(env(lib + " URDMA_DAEMON=" + dir + "/urdmad URDMA_DEBUG=1") +
                                   dir + "/ibv_devinfo");
    EXPECT_NE(named.exit_code, 0) << named.output;
    const std::string why = "not running " + dir + "/urdmad: " + dir + "/urdmad belongs to uid " +
                            std::to_string(kAttacker);
    EXPECT_NE(named.output.find(why), std::string::npos) << named.output;
    const ToolRun via_run = run_line(env("URDMA_DAEMON=" + dir + "/urdmad") + target().urdma +
                                     " run " + dir + "/ibv_devinfo");
    EXPECT_NE(via_run.exit_code, 0) << via_run.output;
    EXPECT_NE(via_run.output.find(why), std::string::npos) << via_run.output;
    EXPECT_FALSE(std::filesystem::exists(mark))
        << "the planted urdmad ran as uid " << read_file(mark);

    // Beside the program, no URDMA_DAEMON: the build tree's urdmad serves it.
    const ToolRun beside =
        run_line(env(lib + " URDMA_IDLE_TIMEOUT_MS=20000") + dir + "/ibv_devinfo");
    EXPECT_EQ(beside.exit_code, 0) << beside.output;
    EXPECT_NE(beside.output.find("hca_id:\turdma0"), std::string::npos) << beside.output;
    const json st = status(0);
    ASSERT_TRUE(st.is_object() && st.value("running", false)) << st.dump();
    const pid_t daemon_pid = daemon_of(st).value("pid", 0);
    std::error_code ec;
    EXPECT_EQ(std::filesystem::read_symlink("/proc/" + std::to_string(daemon_pid) + "/exe", ec),
              std::filesystem::canonical(target().urdmad));
    usleep(200 * 1000);
    EXPECT_FALSE(std::filesystem::exists(mark))
        << "the planted urdmad ran as uid " << read_file(mark);
  });
}

// ---- 4. forged CM REPs ----

// What the attacker in host C saw of urdmad's answers.
struct Reflected {
  uint32_t reps_sent = 0;
  uint32_t dreqs = 0;       // DREQs to the forged peers: the attack's goal
  uint32_t other_mads = 0;  // anything else on QP1 (a process may REJ an unknown REP, as Linux)
};

constexpr unsigned kForgedSources = 20;

// Host C: sends `count` REPs with valid ICRCs to comm IDs of every slot of 10.89.42.1, from 20
// addresses of its own subnet (.10 to .29) and many source ports, then counts what comes back
// to those addresses on 4791 until told to stop.
int forge_reps(Pipe& go, Pipe& stop, Pipe& result, uint32_t count) {
  const net::Address victim = net::Address::from_v4(10, 89, 42, 1);
  std::vector<int> senders;
  std::vector<net::Endpoint> sources;
  for (unsigned i = 0; i < kForgedSources; ++i) {
    const std::string a = "10.89.42." + std::to_string(10 + i);
    if (std::system(("ip addr add " + a + "/24 dev stc").c_str()) != 0) return 20;
    const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    inet_pton(AF_INET, a.c_str(), &sin.sin_addr);
    socklen_t len = sizeof sin;
    if (bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &len) != 0)
      return 21;
    senders.push_back(fd);
    sources.push_back({net::Address::from_v4(ntohl(sin.sin_addr.s_addr)), ntohs(sin.sin_port)});
  }
  // Where urdmad's DREQs for the forged connections would come: port 4791 of C's addresses.
  const int listener = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_port = htons(kRocePort);
  if (bind(listener, reinterpret_cast<sockaddr*>(&any), sizeof any) != 0) return 22;
  char ch;
  if (!go.get(&ch, 60000)) return 23;

  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(kRocePort);
  inet_pton(AF_INET, "10.89.42.1", &to.sin_addr);
  uint32_t x = 0x9e3779b9;
  auto next = [&x] {  // xorshift: IDs the victim cannot have chosen
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return x;
  };
  Reflected r;
  for (uint32_t i = 0; i < count; ++i) {
    std::array<uint8_t, wire::kMadSize> mad{};
    wire::CmRep rep = wire::init_cm_message<wire::CmRep>(mad, (uint64_t{next()} << 32) | next());
    rep.set_local_comm_id(next());
    rep.set_remote_comm_id(daemon::comm_id_for_slot(i % daemon::kDefaultSlots, next()));
    rep.set_local_qpn(next() & wire::kQpnMask);
    rep.set_starting_psn(next() & wire::kQpnMask);
    const net::Endpoint& from = sources[i % kForgedSources];
    std::array<uint8_t, gsi::kGmpBytes> d;
    const size_t n = gsi::build_gmp(d, mad, next() & wire::kQpnMask, from, {victim, kRocePort});
    if (sendto(senders[i % kForgedSources], d.data(), n, 0, reinterpret_cast<sockaddr*>(&to),
               sizeof to) == static_cast<ssize_t>(n))
      ++r.reps_sent;
    if (i % 250 == 249) usleep(10 * 1000);  // ~25,000 a second: what urdmad can route
  }
  result.put('s');
  auto drain = [&] {
    uint8_t buf[512];
    for (ssize_t n; (n = recv(listener, buf, sizeof buf, 0)) > 0;) {
      const bool to_qp1 = n >= 20 + 24 && buf[0] == wire::op::kUdSendOnly &&
                          wire::BthView(buf).dest_qp() == wire::kMadGsiQpn;
      const uint16_t attr = to_qp1 ? static_cast<uint16_t>(buf[20 + 16] << 8 | buf[20 + 17]) : 0;
      if (attr == static_cast<uint16_t>(wire::CmAttr::kDreq)) {
        ++r.dreqs;
      } else {
        ++r.other_mads;
      }
    }
  };
  while (!stop.get(&ch, 10)) drain();
  drain();
  result.put(r);
  return 0;
}

// A root rping server in host A is connected to a client in host B; a remote attacker in host C
// sends 20,000 forged REPs (valid ICRCs) to communication IDs of every slot of A, from 20
// addresses and many ports, then the server is killed. urdmad sends exactly one DREQ — for the
// server's one real connection, to B — and none to the forged peers.
TEST(Security, ForgedRepsMakeUrdmadSendNoDreq) {
  attack([] {
    need_tool("rping", "rdmacm-utils");
    constexpr uint32_t kForged = 20000;
    const std::string run = env("URDMA_IDLE_TIMEOUT_MS=30000") + target().urdma + " run ";
    Pipe server_up, client_up, client_result, c_go, c_stop, c_result;
    const pid_t b = start_second_host("rsa", "rsb", "10.89.41", [&] {
      char go;
      if (!server_up.get(&go, 20000)) return 31;
      // rping -s says nothing when it listens: a client that came too early waits for the
      // listener (urdmad holds its REQ up to the listen wait) or is rejected and tries again. -v prints every ping: then the connection is up.
      for (int attempt = 0; attempt < 20; ++attempt) {
        Started c = launch(run + "rping -c -v -a 10.89.41.1 -p 7300 -C 100000000");
        // Up (its output is a file: stdio flushes it 4 KiB at a time), or rejected and gone.
        bool up = false;
        for (const int64_t until = now_ms() + 20000; !up && now_ms() < until;) {
          up = read_file(c.out_path).find("ping data") != std::string::npos;
          if (!up && !alive(c.pid)) break;
          usleep(20 * 1000);
        }
        if (up) {
          client_up.put('u');
          const bool told = wait_output(c, "DISCONNECT EVENT", 30000);
          client_result.put(told ? 'd' : 'n');
          finish(c, 5000);
          return 0;
        }
        const ToolRun early = finish(c, 5000);
        std::printf("rping -c, attempt %d (exit %d):\n%s\n", attempt, early.exit_code,
                    early.output.substr(0, 2000).c_str());
        usleep(100 * 1000);
      }
      return 30;
    });
    const pid_t c = start_second_host("rta", "stc", "10.89.42",
                                      [&] { return forge_reps(c_go, c_stop, c_result, kForged); });

    Started server = launch(run + "rping -s -a 10.89.41.1 -p 7300 -C 100000000");
    // The client starts once the server's MAD channel is open, when it listens: a REQ that
    // comes earlier is rejected (the client tries again) or waits for the listen (seconds).
    wait_status(
        0, [](const json& s) { return !clients_of(s, "rping", "mad-channel").empty(); }, 10000);
    server_up.put('s');
    char ch;
    ASSERT_TRUE(client_up.get(&ch, 40000)) << "the rping pair never connected:\n"
                                           << finish(server, 0).output;
    const json st = wait_status(
        0, [](const json& s) { return clients_of(s, "rping", "slot").size() == 1; }, 5000);
    ASSERT_TRUE(st.is_object()) << status(0).dump();
    const pid_t rping = clients_of(st, "rping", "slot").front().value("pid", 0);
    EXPECT_EQ(daemon_of(st).value("cm_dreqs_sent", -1), 0);

    c_go.put('g');
    ASSERT_TRUE(c_result.get(&ch, 30000)) << "the forger did not finish";
    usleep(300 * 1000);  // the last REPs routed
    ASSERT_EQ(kill(rping, SIGKILL), 0);
    finish(server, 5000);
    // The real peer hears of it (urdmad's DREQ, or its own retries) ...
    ASSERT_TRUE(client_result.get(&ch, 35000));
    EXPECT_EQ(ch, 'd') << "rping -c saw no DISCONNECT";
    // ... and urdmad sends nothing more (its DREQs go out 256 at once, then 1000 a second:
    // hundreds for forged connections would have gone by now).
    usleep(1000 * 1000);
    const json end = status(0);
    ASSERT_TRUE(end.is_object()) << end.dump();
    EXPECT_EQ(daemon_of(end).value("cm_dreqs_sent", -1), 1)
        << "one DREQ, for the one real connection:\n"
        << daemon_of(end).dump();
    c_stop.put('x');
    Reflected r;
    ASSERT_TRUE(c_result.get(&r, 10000));
    EXPECT_EQ(r.reps_sent, kForged);
    EXPECT_EQ(r.dreqs, 0u) << "urdmad sent DREQs to the forged peers";
    std::printf("forged REPs: %u sent; at the forged peers: %u DREQs, %u other MADs\n", r.reps_sent,
                r.dreqs, r.other_mads);
    EXPECT_TRUE(wait_exit(b, 10000));
    EXPECT_TRUE(wait_exit(c, 10000));
  });
}

// ---- 5. guessing the key of a UC QP's memory ----

struct VictimInfo {
  uint32_t qpn = 0;
  uint32_t rkey = 0;
  uint64_t addr = 0;
};

// Every rkey urdma gave before its keys were random: (index << 8) | key byte with an index
// below 4096.
constexpr uint32_t kOldKeySpace = 1u << 20;
constexpr size_t kControlOffset = 2048;  // where the control write goes (uc_victim.cc)
constexpr uint32_t kChunk = 2048;        // guesses between two looks at the victim's queue

// Host B, the victim's UC peer: an RDMA WRITE Only with every rkey of the old key space to the
// victim's buffer, in chunks (the test lets the next chunk go when the victim's socket has taken
// the last one: no guess is lost to a full receive buffer), then one with the real key at
// kControlOffset — the control: a guess that is right lands.
int guess_keys(Pipe& info_pipe, Pipe& chunk_sent, Pipe& go_on) {
  VictimInfo v;
  if (!info_pipe.get(&v, 30000)) return 40;
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  inet_pton(AF_INET, "10.89.43.2", &sin.sin_addr);
  socklen_t len = sizeof sin;
  if (bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &len) != 0)
    return 41;
  const net::Endpoint from{net::Address::from_v4(10, 89, 43, 2), ntohs(sin.sin_port)};
  const net::Endpoint to{net::Address::from_v4(10, 89, 43, 1), kRocePort};
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(kRocePort);
  inet_pton(AF_INET, "10.89.43.1", &dst.sin_addr);
  constexpr size_t kPayload = 8;
  constexpr size_t kSize = wire::Bth::kSize + wire::Reth::kSize + kPayload + 4;
  using Payload = std::array<uint8_t, kPayload>;
  uint32_t psn = 0;
  auto packet = [&](uint32_t rkey, uint64_t va, const Payload& payload) {
    std::array<uint8_t, kSize> d{};
    wire::Bth bth(d.data());
    bth.set_opcode(wire::op::kUcWriteOnly);
    bth.set_pkey(wire::kDefaultPkey);
    bth.set_dest_qp(v.qpn);
    bth.set_psn(psn++ & wire::kQpnMask);
    wire::Reth reth(d.data() + wire::Bth::kSize);
    reth.set_va(va);
    reth.set_rkey(rkey);
    reth.set_dma_length(kPayload);
    std::copy(payload.begin(), payload.end(), d.begin() + wire::Bth::kSize + wire::Reth::kSize);
    net::seal_icrc(d, from, to);
    return d;
  };
  Payload guess;
  guess.fill(0xEE);
  constexpr size_t kBatch = 64;
  std::vector<std::array<uint8_t, kSize>> batch(kBatch);
  std::vector<mmsghdr> msgs(kBatch);
  std::vector<iovec> iovs(kBatch);
  for (uint32_t first = 0; first < kOldKeySpace; first += kChunk) {
    for (uint32_t k = first; k < first + kChunk; k += kBatch) {
      for (size_t i = 0; i < kBatch; ++i) {
        batch[i] = packet(k + static_cast<uint32_t>(i), v.addr, guess);
        iovs[i] = {batch[i].data(), kSize};
        msgs[i] = {};
        msgs[i].msg_hdr.msg_name = &dst;
        msgs[i].msg_hdr.msg_namelen = sizeof dst;
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
      for (size_t sent = 0; sent < kBatch;) {
        const int n = sendmmsg(fd, msgs.data() + sent, static_cast<unsigned>(kBatch - sent), 0);
        if (n <= 0) return 42;
        sent += static_cast<size_t>(n);
      }
    }
    chunk_sent.put('c');
    char ch;
    if (!go_on.get(&ch, 30000)) return 43;
  }
  // The control: uc_victim.cc looks for exactly these bytes at kControlOffset.
  const auto control =
      packet(v.rkey, v.addr + kControlOffset, {0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xC5, 0xC6, 0xC7});
  if (sendto(fd, control.data(), kSize, 0, reinterpret_cast<sockaddr*>(&dst), sizeof dst) !=
      static_cast<ssize_t>(kSize))
    return 44;
  chunk_sent.put('d');
  return 0;
}

// A root process registers a buffer with IBV_ACCESS_REMOTE_WRITE behind a UC QP; its peer
// (host B) sends RDMA WRITEs with every rkey below 2^20 — the whole space urdma's keys used to
// fall in — with valid ICRCs. None lands: the buffer is unchanged, and the victim's counters
// show every guess dropped. The one write with the real key lands (the control).
TEST(Security, GuessingAUcRkeyInTheOldKeySpaceWritesNothing) {
  attack(
      [] {
        Pipe info, chunk_sent, go_on;
        const pid_t b = start_second_host("uva", "uvb", "10.89.43",
                                          [&] { return guess_keys(info, chunk_sent, go_on); });
        Started victim =
            launch(env("LD_LIBRARY_PATH=" + target().lib + " URDMA_DAEMON=" + target().urdmad +
                       " URDMA_IDLE_TIMEOUT_MS=30000") +
                   URDMA_UC_VICTIM + " 10.89.43.1 10.89.43.2 0x123");
        ASSERT_TRUE(wait_output(victim, "ready", 10000)) << finish(victim, 0).output;
        const std::string ready = read_file(victim.out_path);
        const pid_t pid = static_cast<pid_t>(field(ready, "ready pid"));
        const VictimInfo v{static_cast<uint32_t>(field(ready, "qpn")),
                           static_cast<uint32_t>(field(ready, "rkey")),
                           static_cast<uint64_t>(field(ready, "addr"))};
        // Its socket on 4791, its slot's (the only one it holds: test 2), where the guesses
        // queue: the kernel's count of what it queued and dropped there, and the engine's.
        const std::set<uint64_t> sockets = roce_sockets_of(pid);
        EXPECT_EQ(sockets.size(), 1u) << ready;
        auto queued_and_dropped = [&sockets] {
          std::pair<uint64_t, uint64_t> q{0, 0};
          for (const auto& [inode, state] : udp_sockets())
            if (sockets.contains(inode)) q = {q.first + state.rx_queue, q.second + state.drops};
          return q;
        };
        auto engine_dropped = [](const json& s) {
          const auto c = clients_of(s, "urdma_uc_victim", "slot");
          return c.empty() ? 0
                           : object_of(c.front(), "counters").value("dropped_pkts", uint64_t{0});
        };
        const uint64_t kernel_dropped_before = queued_and_dropped().second;
        const uint64_t dropped_before = engine_dropped(status(0));  // none reported yet: 0

        info.put(v);
        const int64_t t0 = now_ms();
        for (char ch = 0; ch != 'd';) {
          ASSERT_TRUE(chunk_sent.get(&ch, 30000)) << "the attacker stopped";
          if (ch == 'd') break;
          // The victim's engine has read the last chunk from its socket.
          for (int64_t until = now_ms() + 10000; queued_and_dropped().first > 0;) {
            ASSERT_LT(now_ms(), until) << "the victim stopped reading its socket";
            usleep(500);
          }
          go_on.put('g');
        }
        std::printf("%u guesses sent and taken in %lld ms\n", kOldKeySpace,
                    static_cast<long long>(now_ms() - t0));
        EXPECT_EQ(queued_and_dropped().second, kernel_dropped_before)
            << "guesses the kernel dropped were never tried";

        // Every guess was dropped by the engine and counted as a UC access error
        // (`uc_access_err`, within dropped_pkts; reported about once a second).
        auto uc_access_errors = [](const json& s) {
          const auto c = clients_of(s, "urdma_uc_victim", "slot");
          return c.empty() ? 0
                           : object_of(c.front(), "counters").value("uc_access_err", uint64_t{0});
        };
        const json st = wait_status(
            0,
            [&](const json& s) {
              return engine_dropped(s) >= dropped_before + kOldKeySpace &&
                     uc_access_errors(s) >= kOldKeySpace;
            },
            10000);
        EXPECT_TRUE(st.is_object()) << "the victim did not count every guess a UC access error:\n"
                                    << status(0).dump();
        std::printf("victim rkey 0x%08x; its dropped_pkts: %llu before, %llu after\n", v.rkey,
                    static_cast<unsigned long long>(dropped_before),
                    static_cast<unsigned long long>(engine_dropped(st)));

        ASSERT_EQ(kill(pid, SIGUSR1), 0);
        const ToolRun r = finish(victim, 10000);
        EXPECT_NE(r.output.find("buffer: changed=0 "), std::string::npos)
            << "a guessed key wrote to the buffer:\n"
            << r.output;
        EXPECT_NE(r.output.find("control=1"), std::string::npos)
            << "the write with the real key did not land: the guesses were dropped for "
               "another reason than their key\n"
            << r.output;
        // The real key is random over 32 bits: it falls in the space guessed here with
        // probability 2^20 / 2^32 = 1/4096, and then the attack rightly succeeds. That chance
        // is a property of 32-bit keys, and this run met it if the next line fails.
        EXPECT_GE(v.rkey, kOldKeySpace)
            << "the real rkey fell in the guessed space (1 run in 4096)";
        const auto status_b = wait_exit(b, 10000);
        ASSERT_TRUE(status_b);
        EXPECT_TRUE(WIFEXITED(*status_b) && WEXITSTATUS(*status_b) == 0)
            << "the attacker failed: " << WEXITSTATUS(*status_b);
      },
      110);
}

// ---- 6. a flood of silent connections ----

// Starts a system daemon (root, this namespace) and waits for its socket.
void start_system_daemon() {
  const Started d = launch(env() + target().urdmad + " --system --foreground --idle-timeout-ms 0");
  const std::string path = "/run/urdma/" + socket_name();
  for (int i = 0; i < 500 && !std::filesystem::exists(path); ++i) usleep(10 * 1000);
  EXPECT_TRUE(std::filesystem::exists(path)) << read_file(d.out_path);
}

// uid 65534 keeps 1,100 connections to the system daemon that never greet it, from 55
// processes, for 8 s (reopening each one the daemon closes). Beyond 256 (per user) and 16 (per
// process) they are refused with EMFILE; the silent ones are closed after the hello timeout
// (2 s); and meanwhile user 65533 and root connect and lease a slot within seconds (at once on
// an idle machine: the daemon's time goes to refusing the flood).
TEST(Security, ASilentConnectionFloodLeavesRoomForOtherUsers) {
  attack([] {
    need_tool("ibv_devinfo", "ibverbs-utils");
    start_system_daemon();
    const std::string path = "/run/urdma/" + socket_name();
    constexpr int kProcesses = 55, kPerProcess = 20;  // 1,100
    Started flood =
        launch(env() + as(kAttacker) + URDMA_SECURITY_HELPER + " flood " + path + " " +
               std::to_string(kProcesses) + " " + std::to_string(kPerProcess) + " 8000");
    ASSERT_TRUE(wait_output(flood, "flooding", 10000)) << finish(flood, 0).output;
    auto attackers = [](const json& s) {
      int n = 0;
      for (const json& c : array_of(s, "clients"))
        n += c.value("uid", -1) == static_cast<int>(kAttacker);
      return n;
    };
    int most = 0;
    const json full = wait_status(
        0,
        [&](const json& s) {
          most = std::max(most, attackers(s));
          return attackers(s) >= 256;
        },
        8000);
    ASSERT_TRUE(full.is_object()) << "the flood never reached the per-user cap:\n"
                                  << status(0).dump();
    for (const uid_t uid : {kOtherUser, uid_t{0}}) {
      const int64_t t0 = now_ms();
      const ToolRun r = run_line(env("LD_LIBRARY_PATH=" + target().lib) + as(uid) + "ibv_devinfo");
      const int64_t took = now_ms() - t0;
      EXPECT_EQ(r.exit_code, 0) << "uid " << uid << ":\n" << r.output;
      EXPECT_NE(r.output.find("hca_id:\turdma0"), std::string::npos) << r.output;
      EXPECT_LT(took, 5000) << "uid " << uid << " waited for the flood";
      std::printf("uid %u: ibv_devinfo through the flood in %lld ms\n", uid,
                  static_cast<long long>(took));
      const json s = status(0);
      if (s.is_object()) most = std::max(most, attackers(s));
    }
    EXPECT_LE(most, 256) << "more connections of one user than the cap";

    const ToolRun f = finish(flood, 20000);
    std::printf("%s", f.output.c_str());
    EXPECT_GE(field(f.output, "refused_emfile"), kProcesses * kPerProcess - 256) << f.output;
    EXPECT_EQ(field(f.output, "refused_other"), 0) << f.output;
    EXPECT_GE(field(f.output, "silent_closed"), 256) << f.output;
    // Closed by the hello timeout, 2 s after the daemon accepted them: never before (here 2 s
    // after they were queued, or later when the daemon got to accept them late).
    EXPECT_GE(field(f.output, "min_close_ms"), 1950) << f.output;
    EXPECT_LE(field(f.output, "max_close_ms"), 6000) << f.output;
    const json end = status(0);
    EXPECT_GT(daemon_of(end).value("clients_refused", 0), 0) << end.dump();
  });
}

// ---- 7. users under one system daemon ----

// `ibv_rc_pingpong -n ITERS ARGS -c -p PORT[ PEER]` as `uid` under `urdma run`, on GID `gid`.
Started pingpong_as(uid_t uid, int gid, int iters, const std::string& args, int port,
                    const std::string& peer) {
  return launch(env() + as(uid) + target().urdma + " run ibv_rc_pingpong -g " +
                std::to_string(gid) + " -n " + std::to_string(iters) + " " + args + " -c -p " +
                std::to_string(port) + peer);
}

// The system daemon started, the GID index of 127.0.0.1 as root's `ibv_devinfo -v` shows it
// (-1 with a failure when there is none).
int system_daemon_loopback_gid() {
  start_system_daemon();
  const ToolRun devinfo = run_line(env() + target().urdma + " run ibv_devinfo -v");
  const int gid = gid_index_of(devinfo.output, "127.0.0.1");
  EXPECT_GE(gid, 0) << devinfo.output;
  return gid;
}

// uids 65534 and 65533 each run an ibv_rc_pingpong pair at once through the namespace's system
// daemon. All four finish with their data checked; each user's `urdma status` lists that user's
// processes only, root's lists everyone's.
TEST(Security, TwoUsersOfTheSystemDaemonSeeOnlyTheirOwnProcesses) {
  attack([] {
    need_tool("ibv_rc_pingpong", "ibverbs-utils");
    const int gid = system_daemon_loopback_gid();
    ASSERT_GE(gid, 0);
    constexpr int kIters = 2000;
    auto pingpong = [&](uid_t uid, int port, const std::string& peer) {
      return pingpong_as(uid, gid, kIters, "-s 4096", port, peer);
    };
    Started s1 = pingpong(kAttacker, 18611, "");
    Started s2 = pingpong(kOtherUser, 18612, "");
    ASSERT_TRUE(wait_listening(18611, 10000)) << finish(s1, 0).output;
    ASSERT_TRUE(wait_listening(18612, 10000)) << finish(s2, 0).output;

    // The servers hold their slots while they wait for their clients.
    const json all = wait_status(
        0, [](const json& s) { return clients_of(s, "ibv_rc_pingpong", "slot").size() == 2; },
        5000);
    ASSERT_TRUE(all.is_object()) << status(0).dump();
    EXPECT_EQ(daemon_of(all).value("mode", ""), "system");
    EXPECT_EQ(daemon_of(all).value("shows", ""), "all users");
    std::set<int> uids;
    for (const json& c : clients_of(all, "ibv_rc_pingpong", "slot"))
      uids.insert(c.value("uid", -1));
    EXPECT_EQ(uids, (std::set<int>{static_cast<int>(kOtherUser), static_cast<int>(kAttacker)}));
    auto only_own = [](uid_t uid) {
      const json s = status(uid);
      EXPECT_TRUE(s.is_object() && s.value("running", false)) << s.dump();
      if (!s.is_object() || !s.contains("clients")) return;
      EXPECT_EQ(daemon_of(s).value("shows", ""), "uid " + std::to_string(uid));
      EXPECT_FALSE(array_of(s, "clients").empty());
      for (const json& c : array_of(s, "clients"))
        EXPECT_EQ(c.value("uid", -1), static_cast<int>(uid))
            << "uid " << uid << " sees " << c.dump();
      EXPECT_FALSE(clients_of(s, "ibv_rc_pingpong", "slot").empty()) << s.dump();
    };
    only_own(kAttacker);
    only_own(kOtherUser);

    Started c1 = pingpong(kAttacker, 18611, " 127.0.0.1");
    Started c2 = pingpong(kOtherUser, 18612, " 127.0.0.1");
    for (Started* p : {&s1, &s2, &c1, &c2}) {
      const ToolRun r = finish(*p, 60000);
      EXPECT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(number_before(r.output, "iters in"), kIters) << r.output;
    }
    // Afterwards too (the departed processes' records): each user sees only their own.
    for (const uid_t uid : {kAttacker, kOtherUser}) {
      const json s = status(uid);
      ASSERT_TRUE(s.is_object() && s.contains("clients")) << s.dump();
      for (const json& c : array_of(s, "clients"))
        EXPECT_EQ(c.value("uid", -1), static_cast<int>(uid))
            << "uid " << uid << " sees " << c.dump();
      EXPECT_GE(clients_of(s, "ibv_rc_pingpong", "departed").size(), 2u) << s.dump();
    }
  });
}

// uid 65534 runs `urdma capture` under the namespace's system daemon while it and uid 65533 each
// run an ibv_rc_pingpong pair (1024-byte and 2048-byte messages, one packet each), and root's
// rping asks for a port nobody listens on, which the daemon itself rejects. Its capture holds
// its own pair's datagrams and not one of the other user's, nor a MAD (root's REQ, the host's
// REJ); asked for the other user's server by pid it gets nothing. Root's capture of the same
// traffic holds both pairs and the host's REJ.
TEST(Security, ACaptureHoldsItsOwnUsersTrafficOnly) {
  attack([] {
    need_tool("ibv_rc_pingpong", "ibverbs-utils");
    const int gid = system_daemon_loopback_gid();
    ASSERT_GE(gid, 0);
    constexpr int kIters = 100;
    auto pingpong = [&](uid_t uid, int size, int port, const std::string& peer) {
      const std::string s = std::to_string(size);
      return pingpong_as(uid, gid, kIters, "-s " + s + " -m " + s, port, peer);
    };
    // Captures as a user would start them; `tag` names the file and stops it (pkill -f).
    auto capture = [&](uid_t uid, const std::string& tag, const std::string& args) {
      return launch(env() + as(uid) + target().urdma + " capture " + args + " /tmp/" + tag +
                    ".pcap");
    };
    const Started mine = capture(kAttacker, "mine", "");
    const Started root = capture(0, "root", "");
    ASSERT_TRUE(wait_output(mine, "processes now", 10000)) << finish(mine, 0).output;
    ASSERT_TRUE(wait_output(root, "processes now", 10000)) << finish(root, 0).output;
    Started s1 = pingpong(kAttacker, 1024, 18621, "");
    Started s2 = pingpong(kOtherUser, 2048, 18622, "");
    ASSERT_TRUE(wait_listening(18621, 10000)) << finish(s1, 0).output;
    ASSERT_TRUE(wait_listening(18622, 10000)) << finish(s2, 0).output;
    // The other user's server, by pid, as root's status shows it.
    const json all = wait_status(
        0, [](const json& st) { return clients_of(st, "ibv_rc_pingpong", "slot").size() == 2; },
        5000);
    int victim = -1;
    for (const json& c : clients_of(all, "ibv_rc_pingpong", "slot"))
      if (c.value("uid", -1) == static_cast<int>(kOtherUser)) victim = c.value("pid", -1);
    ASSERT_GT(victim, 0) << all.dump();
    const Started theirs = capture(kAttacker, "theirs", "-i " + std::to_string(victim));
    ASSERT_TRUE(wait_output(theirs, ": 0 processes now", 10000)) << finish(theirs, 0).output;

    Started c1 = pingpong(kAttacker, 1024, 18621, " 127.0.0.1");
    Started c2 = pingpong(kOtherUser, 2048, 18622, " 127.0.0.1");
    for (Started* p : {&s1, &s2, &c1, &c2}) {
      const ToolRun r = finish(*p, 60000);
      EXPECT_EQ(r.exit_code, 0) << r.output;
    }
    if (have_tool("rping")) {
      const ToolRun rej = finish(
          launch(env() + target().urdma + " run rping -c -a 127.0.0.1 -p 18623 -C 1"), 30000);
      EXPECT_NE(rej.output.find("RDMA_CM_EVENT_REJECTED, error 8"), std::string::npos)
          << rej.output;
    }
    // Ctrl-C to each capture (the [m] keeps the pattern from matching pkill's own shell).
    for (const char* tag : {"mine", "root", "theirs"}) {
      const std::string t = tag;
      sh("pkill -INT -f 'capture .*/tmp/[" + t.substr(0, 1) + "]" + t.substr(1) + "[.]pcap'");
    }
    for (const Started* p : {&mine, &root, &theirs}) {
      // (The shell around it may take the signal too: the tool's last line says it finished.)
      const ToolRun r = finish(*p, 10000);
      EXPECT_NE(r.output.find("packets written"), std::string::npos) << r.output;
    }
    // SEND Only datagrams by size: BTH + payload + ICRC; MADs (UD SEND Only to QP1) apart, at
    // size 0.
    auto sends_of = [](const std::string& pcap) {
      std::map<size_t, int> sizes;
      const std::string err = capture::for_each_udp(pcap, [&](const capture::UdpDatagram& d) {
        const auto& p = d.payload;
        if (p.size() > 8 && p[0] == 0x64 && p[5] == 0 && p[6] == 0 && p[7] == 1)
          ++sizes[0];
        else if (!p.empty() && p[0] == 0x04)
          ++sizes[p.size()];
      });
      EXPECT_EQ(err, "") << pcap;
      return sizes;
    };
    const auto m = sends_of("/tmp/mine.pcap");
    const auto r = sends_of("/tmp/root.pcap");
    const auto t = sends_of("/tmp/theirs.pcap");
    constexpr size_t kOwn = 12 + 1024 + 4, kOther = 12 + 2048 + 4;
    EXPECT_EQ(m.count(kOther), 0u) << "the other user's messages in uid 65534's capture";
    EXPECT_EQ(m.count(0), 0u) << "root's or the host's MADs in uid 65534's capture";
    if (have_tool("rping")) {
      EXPECT_GE(r.count(0) ? r.at(0) : 0, 4) << "root sees the host's MADs";
    }
    EXPECT_GE(m.count(kOwn) ? m.at(kOwn) : 0, 4 * kIters) << "its own pair's, sent and received";
    EXPECT_TRUE(t.empty()) << "a capture of the other user's process by pid";
    EXPECT_GE(r.count(kOther) ? r.at(kOther) : 0, 4 * kIters) << "root sees every user's";
    EXPECT_GE(r.count(kOwn) ? r.at(kOwn) : 0, 4 * kIters);
  });
}

// With no system daemon, uid 65534's `urdma capture` starts the user's own urdmad, and the host
// that daemon answers for is the user's: its capture of everything holds the REJ that urdmad
// sends for a port nobody listens on, as sent and as read back, beside the user's rping's REQ.
TEST(Security, AUsersOwnDaemonShowsThatUserTheHostsMads) {
  attack([] {
    need_tool("rping", "rdmacm-utils");
    const Started cap = launch(env() + as(kAttacker) + target().urdma + " capture /tmp/own.pcap");
    ASSERT_TRUE(wait_output(cap, "processes now", 10000)) << finish(cap, 0).output;
    const ToolRun rej = finish(
        launch(env() + as(kAttacker) + target().urdma + " run rping -c -a 127.0.0.1 -p 18624 -C 1"),
        30000);
    EXPECT_NE(rej.output.find("RDMA_CM_EVENT_REJECTED, error 8"), std::string::npos) << rej.output;
    sh("pkill -INT -f 'capture /tmp/[o]wn[.]pcap'");
    const ToolRun r = finish(cap, 10000);
    EXPECT_NE(r.output.find("packets written"), std::string::npos) << r.output;
    std::map<uint16_t, int> by_attribute;  // GMPs (UD SEND Only to QP1) by CM attribute ID
    const std::string err =
        capture::for_each_udp("/tmp/own.pcap", [&](const capture::UdpDatagram& d) {
          const auto& p = d.payload;
          if (p.size() == 12 + 8 + 256 + 4 && p[0] == 0x64 && p[5] == 0 && p[6] == 0 && p[7] == 1)
            ++by_attribute[static_cast<uint16_t>(p[20 + 16] << 8 | p[20 + 17])];
        });
    EXPECT_EQ(err, "");
    EXPECT_GE(by_attribute[0x10], 2) << "the REQ as rping sent it and as urdmad read it";
    EXPECT_EQ(by_attribute[0x12], 2) << "the host's REJ as urdmad sent it and read it back";
  });
}

// uid 65534 and root each hold a slot of the namespace's system daemon and accept shared-memory
// rings (protocol.h, kShmAccept). Neither gets a region with the other — each side maps the
// other's pages and writes its doorbell: EPERM both ways, root included.
TEST(Security, NoSharedMemoryRegionJoinsTwoUsers) {
  attack([] {
    start_system_daemon();
    daemon::ClientOptions options;
    options.spawn = false;
    const net::Address lo = net::Address::from_v4(127, 0, 0, 1);
    daemon::Client root;
    std::string detail;
    ASSERT_EQ(daemon::Client::connect_or_spawn(options, &root, &detail), 0) << detail;
    daemon::Slot slot;
    daemon::UniqueFd bell;
    ASSERT_EQ(root.acquire_slot(&slot), 0);
    ASSERT_EQ(root.shm_accept(&bell), 0);
    Pipe to_test, to_user;
    const pid_t user = fork_process([&] {
      if (setgroups(0, nullptr) != 0 || setgid(kAttacker) != 0 || setuid(kAttacker) != 0) return 1;
      daemon::Client c;
      std::string why;
      daemon::Slot own;
      daemon::UniqueFd own_bell;
      daemon::ShmPair pair;
      if (daemon::Client::connect_or_spawn(options, &c, &why) != 0 || c.acquire_slot(&own) != 0 ||
          c.shm_accept(&own_bell) != 0)
        return 2;
      const int err = c.shm_connect(lo, slot.info.qpn_base, &pair);
      char done;
      // Its slot held until root has asked for it.
      const bool told = to_test.put(own.info.qpn_base) && to_test.put(err);
      return told && to_user.get(&done, 10000) ? 0 : 3;
    });
    uint32_t user_qpn = 0;
    int user_err = 0;
    const bool told = to_test.get(&user_qpn) && to_test.get(&user_err);
    daemon::ShmPair pair;
    if (told) {
      EXPECT_EQ(user_err, EPERM) << "uid 65534 asked for root's slot";
      EXPECT_EQ(root.shm_connect(lo, user_qpn, &pair), EPERM) << "root asked for uid 65534's";
    }
    to_user.put('d');
    const auto status = wait_exit(user, 5000);
    ASSERT_TRUE(status);
    EXPECT_TRUE(told && WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << "uid 65534's process failed: " << WEXITSTATUS(*status);
  });
}

// systemd's way, without privilege: systemd-socket-activate (root) makes the listening socket
// in a root-owned directory, as urdmad.socket does (mode 0666), and starts urdmad --system as
// uid 65532 with no capabilities. A user's ibv_devinfo works through it.
TEST(Security, ASocketActivatedSystemDaemonNeedsNoPrivilege) {
  attack([] {
    need_tool("systemd-socket-activate", "systemd");
    need_tool("ibv_devinfo", "ibverbs-utils");
    const std::string dir = "/tmp/urdma-system";  // root's, 0755, this test's own
    ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
    const std::string sock = dir + "/urdmad.sock";
    const std::string system_dir = "URDMA_SYSTEM_DIR=" + dir;
    Started activator =
        launch(env() + "systemd-socket-activate --seqpacket -l " + sock + " -E " + system_dir +
               " " + as(kDaemonUser) + target().urdmad + " --system --foreground");
    for (int i = 0; i < 500 && !std::filesystem::exists(sock); ++i) usleep(10 * 1000);
    ASSERT_TRUE(std::filesystem::exists(sock)) << finish(activator, 0).output;
    ASSERT_EQ(chmod(sock.c_str(), 0666), 0);

    const ToolRun r =
        run_line(env("LD_LIBRARY_PATH=" + target().lib + " URDMA_DEBUG=1 " + system_dir) +
                 as(kAttacker) + "ibv_devinfo");
    EXPECT_EQ(r.exit_code, 0) << r.output << read_file(activator.out_path);
    EXPECT_NE(r.output.find("hca_id:\turdma0"), std::string::npos) << r.output;
    const json st = status(kAttacker, system_dir);
    ASSERT_TRUE(st.is_object() && st.value("running", false)) << st.dump();
    EXPECT_EQ(daemon_of(st).value("mode", ""), "system");
    EXPECT_EQ(daemon_of(st).value("uid", -1), static_cast<int>(kDaemonUser));
    EXPECT_EQ(daemon_of(st).value("socket", ""), sock);
    for (const char* who : {"pid", "keeper_pid"}) {
      const pid_t pid = daemon_of(st).value(who, 0);
      const std::string u = std::to_string(kDaemonUser);
      EXPECT_EQ(proc_status_line(pid, "Uid"), "Uid:\t" + u + "\t" + u + "\t" + u + "\t" + u) << who;
      EXPECT_EQ(proc_status_line(pid, "CapEff"), "CapEff:\t0000000000000000") << who;
    }
  });
}

// ---- 8. a planted path for the daemon's log ----

// root-only: /tmp/rootonly (0700) holding `secret` (0600). uid 65534 owns /tmp/logs, where root
// is told to log (URDMA_DAEMON_LOG); it plants there what it likes.
struct LogScene {
  std::string secret = "/tmp/rootonly/secret";
  std::string text = "root's own\n";
};

LogScene plant_log_scene(const std::string& planting) {
  LogScene s;
  EXPECT_TRUE(sh("mkdir -m 700 /tmp/rootonly && printf \"root's own\\n\" > " + s.secret +
                 " && chmod 600 " + s.secret));
  EXPECT_TRUE(sh("mkdir /tmp/logs && chown " + std::to_string(kAttacker) + " /tmp/logs"));
  EXPECT_TRUE(sh(as(kAttacker) + "sh -c '" + planting + "'"));
  return s;
}

// The final component is a symbolic link to root's file, in a directory another user owns:
// refused (the directory is not root's to trust; the link would not be followed either), with
// the reason.
TEST(Security, ALogSymlinkPlantedByAnotherUserIsRefused) {
  attack([] {
    need_tool("ibv_devinfo", "ibverbs-utils");
    const LogScene s = plant_log_scene("ln -s /tmp/rootonly/secret /tmp/logs/urdmad.log");
    const std::string log = "URDMA_DAEMON_LOG=/tmp/logs/urdmad.log";
    const std::string why = log + ": /tmp/logs belongs to uid 65534";
    const ToolRun run = run_line(env(log) + target().urdma + " run ibv_devinfo");
    EXPECT_NE(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("urdma run: " + why), std::string::npos) << run.output;
    const ToolRun plain =
        run_line(env(log + " URDMA_DEBUG=1 LD_LIBRARY_PATH=" + target().lib) + "ibv_devinfo");
    EXPECT_NE(plain.exit_code, 0) << plain.output;
    EXPECT_NE(plain.output.find(why), std::string::npos) << plain.output;
    usleep(200 * 1000);
    EXPECT_EQ(read_file(s.secret), s.text);
  });
}

// A directory on the way is a symbolic link (/tmp/logs/d -> /tmp/rootonly) that root never
// made: O_NOFOLLOW guards the last component only, so the log must be refused by whose the
// path is, not appended to root's file.
TEST(Security, ALogPathThroughAnotherUsersDirectoryLinkIsRefused) {
  attack([] {
    need_tool("ibv_devinfo", "ibverbs-utils");
    const LogScene s = plant_log_scene("ln -s /tmp/rootonly /tmp/logs/d");
    const std::string log = "URDMA_DAEMON_LOG=/tmp/logs/d/secret";
    const ToolRun run =
        run_line(env(log + " URDMA_IDLE_TIMEOUT_MS=300") + target().urdma + " run ibv_devinfo");
    usleep(800 * 1000);  // a daemon that did start has logged and idled out
    EXPECT_EQ(read_file(s.secret), s.text) << "root's file was written through uid 65534's link";
    EXPECT_NE(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find(log), std::string::npos) << "no message naming the log:\n"
                                                       << run.output;
  });
}

// A FIFO planted as the log: opening it for writing waits for a reader that never comes. The
// program must not hang on it.
TEST(Security, AFifoPlantedAsTheLogDoesNotHangTheProgram) {
  attack([] {
    need_tool("ibv_devinfo", "ibverbs-utils");
    plant_log_scene("mkfifo /tmp/logs/urdmad.log");
    const std::string log = "URDMA_DAEMON_LOG=/tmp/logs/urdmad.log";
    // Within the library's own deadline for a daemon to start (5 s), and some.
    const ToolRun run = run_line(env(log) + target().urdma + " run ibv_devinfo", 8000);
    EXPECT_NE(run.exit_code, -1) << "urdma run hung on the FIFO:\n" << run.output;
    EXPECT_NE(run.output.find(log), std::string::npos) << "no message naming the log:\n"
                                                       << run.output;
  });
}

}  // namespace
}  // namespace urdma::process_test
