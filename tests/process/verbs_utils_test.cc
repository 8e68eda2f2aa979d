// Unmodified Debian binaries (ibverbs-utils) on urdma: each runs with LD_LIBRARY_PATH naming
// the build's lib/ directory, so the dynamic loader gives it OUR libibverbs.so.1, which starts a
// urdmad in the test's namespace by itself (no setup step). Every test body runs in a fresh
// network namespace (netns_harness.h); the two-host tests add a second namespace joined by a
// veth pair (10.89.0.0/24), with a urdmad of its own.
//
// What is checked is what the tools print and how they exit: ibv_devices lists urdma0,
// ibv_devinfo -v prints a sane RoCE v2 port, and ibv_{rc,uc,ud,srq}_pingpong with -c (their
// buffer validation) report the bytes and iterations they were asked for, at several sizes, with
// the GID index of the address used (-g, read from ibv_devinfo's GID table).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "netns_harness.h"
#include "tool_run.h"

namespace urdma::process_test {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

// ibv_devinfo's "name:<tabs>value" lines: the value of the first line whose name is `name`.
std::string devinfo_field(const std::string& out, const std::string& name) {
  for (const std::string& line : lines_of(out)) {
    const std::string t = trim(line);
    if (t.starts_with(name + ":")) return trim(t.substr(name.size() + 1));
  }
  return "";
}

// "819200 bytes in 0.14 seconds" and "100 iters in 0.14 seconds": what a pingpong moved.
struct PingpongReport {
  long long bytes = -1;
  long long iters = -1;
};

PingpongReport parse_pingpong(const std::string& out) {
  return {number_before(out, " bytes in "), number_before(out, " iters in ")};
}

// ibv_devices lists "urdma0" followed by a 16-digit hexadecimal node GUID.
bool lists_urdma0(const std::string& out) {
  for (const std::string& line : lines_of(out)) {
    std::istringstream in(line);
    std::string name, guid;
    in >> name >> guid;
    if (name == "urdma0" && guid.size() == 16 &&
        guid.find_first_not_of("0123456789abcdef") == std::string::npos)
      return true;
  }
  return false;
}

struct Pingpong {
  const char* tool;
  std::vector<int> sizes;
};

// The four pingpongs and the sizes they run at (UD: one packet, at most the path MTU). The
// first size of each busy-polls its CQ (the tools' default); the others wait on a completion
// channel (-e), which exercises ibv_get_cq_event in the Debian binaries.
std::vector<Pingpong> pingpongs(int ud_max) {
  return {{"ibv_rc_pingpong", {1, 4096, 65536}},
          {"ibv_uc_pingpong", {64, 4096}},
          {"ibv_ud_pingpong", {64, ud_max}},
          {"ibv_srq_pingpong", {64, 4096}}};
}

constexpr int kIters = 50;

std::string pingpong_args(const char* tool, int size, unsigned port, int gid, bool events) {
  return std::string(tool) + " -d urdma0 -c -s " + std::to_string(size) + " -n " +
         std::to_string(kIters) + " -p " + std::to_string(port) + " -g " + std::to_string(gid) +
         (events ? " -e" : "");
}

// Checks one side's output and exit code.
void expect_pingpong_ok(const ToolRun& r, const char* tool, int size, const char* side) {
  SCOPED_TRACE(std::string(tool) + " " + side + " -s " + std::to_string(size));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const PingpongReport rep = parse_pingpong(r.output);
  EXPECT_EQ(rep.iters, kIters) << r.output;
  // Each iteration is one message each way.
  EXPECT_EQ(rep.bytes, 2LL * size * kIters) << r.output;
  EXPECT_EQ(r.output.find("Failed"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Couldn't"), std::string::npos) << r.output;
}

class VerbsUtils : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* t : {"ibv_devices", "ibv_devinfo", "ibv_rc_pingpong", "ibv_uc_pingpong",
                          "ibv_ud_pingpong", "ibv_srq_pingpong"})
      if (!have_tool(t)) GTEST_SKIP() << t << " not installed (scripts/deps.sh: ibverbs-utils)";
  }
};

TEST_F(VerbsUtils, DevicesAndDevinfoShowASaneRoceDevice) {
  in_fresh_netns([] {
    const ToolRun devices = run("ibv_devices");
    EXPECT_EQ(devices.exit_code, 0) << devices.output;
    EXPECT_TRUE(lists_urdma0(devices.output)) << devices.output;

    const ToolRun info = run("ibv_devinfo -v");
    ASSERT_EQ(info.exit_code, 0) << info.output;
    const std::string& o = info.output;
    auto field = [&](const std::string& name) { return devinfo_field(o, name); };
    EXPECT_EQ(field("hca_id"), "urdma0");
    EXPECT_EQ(field("transport"), "InfiniBand (0)");
    EXPECT_EQ(field("state"), "PORT_ACTIVE (4)");
    EXPECT_EQ(field("link_layer"), "Ethernet");
    EXPECT_EQ(field("phys_port_cnt"), "1");
    EXPECT_EQ(field("active_mtu"), "4096 (5)");  // lo's 65536-byte MTU
    EXPECT_NE(field("node_guid"), "0000:0000:0000:0000");
    for (const char* n : {"max_qp", "max_cq", "max_mr", "max_pd", "max_qp_wr", "max_cqe"}) {
      const std::string v = field(n);
      EXPECT_FALSE(v.empty()) << n;
      if (!v.empty()) {
        EXPECT_GT(std::stoll(v), 0) << n;
      }
    }
    EXPECT_GE(std::stoll(field("max_sge")), 32);
    EXPECT_GE(std::stoll(field("max_cqe")), 32767);
    // rxe's (6.1) limits, as the issue quotes them, through the unmodified tool.
    EXPECT_GE(std::stoll(field("max_qp_wr")), 1 << 20);
    EXPECT_GE(std::stoll(field("max_srq_wr")), 1 << 20);
    EXPECT_GE(std::stoll(field("max_mr")), 524287);
    EXPECT_GE(std::stoll(field("max_pd")), 1 << 20);
    EXPECT_GE(std::stoll(field("max_ah")), 32767);
    EXPECT_GE(std::stoll(field("gid_tbl_len")), 1024);
    EXPECT_EQ(gid_index_of(o, "127.0.0.1"), 0) << o;
  });
}

// KNOWN OPEN BUG: under a loaded CI (ctest -j2) a pair hung twice — both sides still running
// when their time ran out: ibv_rc_pingpong -e -s 65536 here (ASan stage), ibv_uc_pingpong -s 64
// across the veth pair below — with no output (a killed tool loses its buffered stdout); 750
// pairs by hand under load did not reproduce it. Until it is found, a pair whose two sides both
// hang is run once more, and what each side was doing goes to stderr (tool_run's hang report:
// urdmad's per-process counters and every thread's stack); a second hang, or any other
// failure, fails the test.
TEST_F(VerbsUtils, PingpongsBetweenTwoProcessesOnOneHost) {
  in_fresh_netns(
      [] {
        unsigned port = 18600;
        for (const Pingpong& p : pingpongs(2048)) {
          for (int size : p.sizes) {
            const bool events = size != p.sizes[0];
            auto run_pair = [&](unsigned at, ToolRun* client, ToolRun* srv) {
              const std::string args = pingpong_args(p.tool, size, at, 0, events);
              const Started server = start(args);
              if (!wait_listening(at, 10000)) {
                *srv = finish(server, 1000);
                return false;
              }
              *client = run(args + " 127.0.0.1", 20000);
              *srv = finish(server, 10000);
              return true;
            };
            ToolRun client, srv;
            if (!run_pair(port, &client, &srv)) {
              FAIL() << p.tool << " server did not listen (exit " << srv.exit_code << "):\n"
                     << srv.output;
            }
            if (client.exit_code == -1 && srv.exit_code == -1) {
              std::fprintf(stderr,
                           "%s -s %d: both sides hung (known open bug); running it again. "
                           "What they were doing:\nclient:\n%s\nserver:\n%s\n",
                           p.tool, size, client.output.c_str(), srv.output.c_str());
              if (!run_pair(port + 1000, &client, &srv)) {
                FAIL() << p.tool << " server did not listen (exit " << srv.exit_code << "):\n"
                       << srv.output;
              }
            }
            expect_pingpong_ok(client, p.tool, size, "client");
            expect_pingpong_ok(srv, p.tool, size, "server");
            ++port;
          }
        }
      },
      90);
}

// What a finished process counted stays in `urdma status`, as rxe's port counters outlive the
// processes that moved them: each process reports its engine counters once more as it closes
// its device, and urdmad keeps a slot holder's last report as a "departed" row. A 20-iteration
// pair ends well inside the once-a-second report interval, so without the last report neither
// side would show up at all.
TEST_F(VerbsUtils, AFinishedPairsCountersStayInUrdmaStatus) {
  in_fresh_netns([] {
    const std::string args = pingpong_args("ibv_rc_pingpong", 1024, 18650, 0, false);
    const Started server = start(args);
    ASSERT_TRUE(wait_listening(18650, 10000));
    const ToolRun client = run(args + " 127.0.0.1", 20000);
    const ToolRun srv = finish(server, 10000);
    ASSERT_EQ(client.exit_code, 0) << client.output;
    ASSERT_EQ(srv.exit_code, 0) << srv.output;
    // "<role> <rdma_sends> <rdma_recvs>" per row.
    const ToolRun status = run(std::string(URDMA_TOOL_PATH) +
                               " status --json | /usr/bin/python3 -c 'import json, sys\n"
                               "for c in json.load(sys.stdin)[\"clients\"]:\n"
                               "    k = c.get(\"counters\") or {}\n"
                               "    print(c[\"role\"], k.get(\"rdma_sends\", -1), "
                               "k.get(\"rdma_recvs\", -1))'");
    ASSERT_EQ(status.exit_code, 0) << status.output;
    // Each side sent and received one message per iteration.
    EXPECT_EQ(count(status.output, "departed " + std::to_string(kIters) + " " +
                                       std::to_string(kIters)),
              2)
        << status.output;
  });
}

// The engine settings a process takes from its environment (README, "Tuning"): a value out of
// range fails ibv_open_device with EINVAL and says why on stderr, whatever URDMA_DEBUG is; the
// settings other than the defaults (one packet per sendmmsg, delayed ACKs, a completion channel
// waited on in read()) still move data.
TEST_F(VerbsUtils, EngineSettingsComeFromTheEnvironment) {
  in_fresh_netns([] {
    for (const char* bad : {"URDMA_TX_BATCH=0", "URDMA_TX_BATCH=65", "URDMA_TX_BATCH=4x",
                            "URDMA_ACK_DELAY_US=-1", "URDMA_ACK_DELAY_US=1001",
                            "URDMA_BUSY_POLL_US=1001", "URDMA_BUSY_POLL_US=x",
                            "URDMA_UDP_GSO=2", "URDMA_UDP_GRO=yes", "URDMA_WAIT_DRIVES=2",
                            "URDMA_SHM=2"}) {
      const ToolRun r = run(std::string(bad) + " ibv_devinfo -d urdma0", 10000);
      EXPECT_NE(r.exit_code, 0) << bad << ":\n" << r.output;
      const std::string setting(bad);
      EXPECT_NE(r.output.find("urdma: " + setting + " is not a number in "), std::string::npos)
          << r.output;
    }
    // The errno ibv_open_device left: ibv_devinfo does not print it, pyverbs' error does.
    if (std::system("/usr/bin/python3 -c 'import pyverbs.device' 2>/dev/null") == 0) {
      const ToolRun r = run(
          "URDMA_TX_BATCH=0 /usr/bin/python3 -c 'import pyverbs.device as d; "
          "d.Context(name=\"urdma0\")'",
          10000);
      EXPECT_NE(r.output.find("Errno: 22, Invalid argument"), std::string::npos) << r.output;
    }
    // -e: the completion channel, waited on in read() with URDMA_WAIT_DRIVES=0.
    const std::string env =
        "URDMA_TX_BATCH=1 URDMA_ACK_DELAY_US=20 URDMA_BUSY_POLL_US=50 URDMA_UDP_GSO=0 "
        "URDMA_UDP_GRO=00 URDMA_WAIT_DRIVES=0 ";  // "00": a number, as the other settings read it
    const std::string args = pingpong_args("ibv_rc_pingpong", 4096, 18660, 0, true);
    const Started server = start(env + args);
    ASSERT_TRUE(wait_listening(18660, 10000));
    const ToolRun client = run(env + args + " 127.0.0.1", 20000);
    const ToolRun srv = finish(server, 10000);
    expect_pingpong_ok(client, "ibv_rc_pingpong", 4096, "client");
    expect_pingpong_ok(srv, "ibv_rc_pingpong", 4096, "server");
  });
}

// Host A is this namespace, host B a child in a namespace of its own (its own urdmad, started
// by the library in B's server process); a veth pair joins them. Each side passes -g with the
// GID index its ibv_devinfo shows for its 10.89.0.x address.
TEST_F(VerbsUtils, PingpongsBetweenTwoNamespacesOverAVethPair) {
  in_fresh_netns(
      [] {
        struct Job {
          char tool[32];
          int size;
          unsigned port;
          bool events;
        };
        struct Ready {
          int gid;  // B's GID index for 10.89.0.2 (-1: none)
        };
        struct Done {
          int exit_code;
          long long bytes, iters;
          int failed;  // "Failed"/"Couldn't" in its output
        };
        Pipe jobs, ready, done;
        const pid_t b = start_second_host("va", "vb", "10.89.0", [&] {
          const ToolRun info = run("ibv_devinfo -v");
          const int gid = gid_index_of(info.output, "10.89.0.2");
          if (gid < 0) std::fprintf(stderr, "B's devinfo:\n%s\n", info.output.c_str());
          Job job;
          while (jobs.get(&job, 30000)) {
            if (job.size == 0) break;
            const Started server =
                start(pingpong_args(job.tool, job.size, job.port, gid, job.events));
            Ready r{wait_listening(job.port, 10000) ? gid : -1};
            ready.put(r);
            const ToolRun srv = finish(server, 20000);
            const PingpongReport rep = parse_pingpong(srv.output);
            Done d{srv.exit_code, rep.bytes, rep.iters,
                   srv.output.find("Failed") != std::string::npos ||
                       srv.output.find("Couldn't") != std::string::npos};
            if (d.exit_code != 0 || d.failed) std::fprintf(stderr, "B: %s\n", srv.output.c_str());
            done.put(d);
          }
          return 0;
        });
        const ToolRun info = run("ibv_devinfo -v");
        const int gid = gid_index_of(info.output, "10.89.0.1");
        ASSERT_GE(gid, 0) << info.output;
        // veth's 1500-byte MTU: the port's active MTU is 1024 (rxe computes the same).
        EXPECT_NE(info.output.find("active_mtu:\t\t1024 (3)"), std::string::npos) << info.output;
        // One pair: B's server, then A's client. Empty, or why B did not do its part.
        auto run_job = [&](const Job& job, ToolRun* client, Done* d) -> std::string {
          if (!jobs.put(job)) return "B takes no jobs";
          Ready r{};
          if (!ready.get(&r, 10000)) return "B's server did not report";
          if (r.gid < 0) return "B's server did not start or B has no GID for 10.89.0.2";
          *client = run(pingpong_args(job.tool, job.size, job.port, gid, job.events) +
                            " 10.89.0.2",
                        20000);
          // B's server may run 20 s, and a hang report (gdb) after that.
          if (!done.get(d, 80000)) return "B's server did not finish";
          return "";
        };
        unsigned port = 18700;
        for (const Pingpong& p : pingpongs(1024)) {
          for (int size : p.sizes) {
            Job job{};
            std::snprintf(job.tool, sizeof job.tool, "%s", p.tool);
            job.size = size;
            job.port = port++;
            job.events = size != p.sizes[0];
            ToolRun client;
            Done d{};
            ASSERT_EQ(run_job(job, &client, &d), "");
            // The known open bug of PingpongsBetweenTwoProcessesOnOneHost, seen here once too
            // (ibv_uc_pingpong -s 64, ASan stage): run once more, B printed its side.
            if (client.exit_code == -1 && d.exit_code == -1) {
              std::fprintf(stderr,
                           "%s -s %d: both sides hung (known open bug); running it again. "
                           "What A's client was doing:\n%s\n",
                           p.tool, size, client.output.c_str());
              job.port += 1000;
              ASSERT_EQ(run_job(job, &client, &d), "");
            }
            expect_pingpong_ok(client, p.tool, size, "client (A)");
            SCOPED_TRACE(std::string(p.tool) + " server (B) -s " + std::to_string(size));
            EXPECT_EQ(d.exit_code, 0);
            EXPECT_EQ(d.iters, kIters);
            EXPECT_EQ(d.bytes, 2LL * size * kIters);
            EXPECT_EQ(d.failed, 0);
          }
        }
        Job end{};
        jobs.put(end);
        const std::optional<int> status = wait_exit(b, 10000);
        ASSERT_TRUE(status.has_value());
        EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
      },
      120);
}

// Every symbol (and version) the Debian clients need resolves in our library: each starts with
// LD_BIND_NOW=1 (perftest's libmlx5/libefa included) and the loader reports nothing missing.
TEST(VerbsAbi, DebianClientsLoadBesideOurLibrary) {
  in_fresh_netns([] {
    int checked = 0;
    for (const char* cmd : {"ibv_devices", "ibv_devinfo --help", "ibv_rc_pingpong --help",
                            "ibv_ud_pingpong --help", "ibv_srq_pingpong --help",
                            "ibv_xsrq_pingpong --help", "ib_write_bw --help",
                            "ib_read_lat --help", "ib_atomic_bw --help", "qperf --help",
                            "rping -h", "ucmatose -h"}) {
      const std::string tool = std::string(cmd).substr(0, std::string(cmd).find(' '));
      if (!have_tool(tool.c_str())) continue;
      const ToolRun r = run(cmd);
      EXPECT_EQ(r.output.find("symbol lookup error"), std::string::npos) << cmd << "\n" << r.output;
      EXPECT_EQ(r.output.find("error while loading shared libraries"), std::string::npos)
          << cmd << "\n" << r.output;
      EXPECT_EQ(r.output.find("version `IBVERBS"), std::string::npos) << cmd << "\n" << r.output;
      ++checked;
    }
    EXPECT_GE(checked, 5);
  });
}

}  // namespace
}  // namespace urdma::process_test
