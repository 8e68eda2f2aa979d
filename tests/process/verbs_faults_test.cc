// Debian's RC tools, unmodified, under URDMA_FAULTS on both sides (README: seeded loss,
// reordering and duplication on each process's own sockets): ibv_rc_pingpong -c (its buffer
// validation checks every byte), ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw, the four
// perftest _lat tools, and qperf's RC tests (its ver_ tests check the atomics' results). RC's
// retransmission hides the faults, so every tool must finish exactly as on a clean link: exit 0,
// the bytes and iterations asked for, no error line.
//
// ibv_srq_pingpong is not run here: under loss it ends in RETRY_EXC_ERR on one side in about half
// the pairs, by its own end of run (docs/COMPATIBILITY.md). Each side counts -n sends and -n
// receives over its 16 QPs together and destroys them as soon as both counts are reached, so an
// ACK lost in its last ACK timeout (67 ms) has nobody left to answer the resend; rc_pingpong has
// one such ACK a run (lost_last_ack() reruns it), srq_pingpong one per QP. SENDs into an SRQ
// under these faults are checked by urdma_runtime_peer --srq in
// RuntimeProcess.RcUnderLossReorderingAndDuplicationArrivesBitExact.
//
// The faults must be real, not merely configured: while a pair runs, the test reads
// `urdma status --json` (each process pushes its counters to urdmad at most once a second and
// as it closes its device, under rxe's `rdma statistic` names; a process that left stays as a
// "departed" row with its last report) and keeps, per
// process, the largest completer_retry_err seen — retransmissions the requester started, on a
// timeout or a NAK. A pair whose processes together report none fails. The iteration counts
// are chosen so each pair runs for seconds, long enough for a report.
//
// UC and UD are not run here: they have no retransmission, a lost packet is a lost message by
// design (IBA 9.7.7, 9.8), and ibv_uc_pingpong / ibv_ud_pingpong then wait forever for it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "netns_harness.h"
#include "tool_run.h"

namespace urdma::process_test {
namespace {

// 1% loss, 1% reordering, 0.5% duplication (parts per million), a seed per side.
std::string faults(int seed) {
  return "URDMA_FAULTS=seed=" + std::to_string(seed) + ",loss=10000,reorder=10000,dup=5000 ";
}

// `urdma status --json` as "<pid> <completer_retry_err>" lines, one per process that reported.
constexpr char kRetriesScript[] = R"PY(
import json, sys
s = json.load(sys.stdin)
for c in s.get("clients", []):
    k = c.get("counters")
    if k is not None:
        print(c["pid"], k["completer_retry_err"])
)PY";

// Per process, the largest completer_retry_err it reported.
using Retries = std::map<long, long long>;

void sample_retries(Retries* seen) {
  const std::string cmd = std::string(URDMA_TOOL_PATH) + " status --json 2>/dev/null | " +
                          "/usr/bin/python3 -c '" + kRetriesScript + "'";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return;
  long pid;
  long long n;
  while (std::fscanf(p, "%ld %lld", &pid, &n) == 2) (*seen)[pid] = std::max((*seen)[pid], n);
  pclose(p);
}

// A started program that has not exited yet (a zombie has exited: its row in urdmad is gone).
bool running(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm, state;
  if (!(f >> pid_field >> comm >> state)) return false;
  return state != "Z";
}

long long total(const Retries& r) {
  long long sum = 0;
  for (const auto& [pid, n] : r) sum += n;
  return sum;
}

struct PairResult {
  ToolRun server, client;
  long long retries = 0;  // completer_retry_err over both processes, as last seen
};

// Server and client under faults (seeds 2k+1, 2k+2), the client until it exits or `timeout_ms`
// passes, sampling urdmad's counters meanwhile.
PairResult run_pair(const std::string& args, unsigned port, int seed, int timeout_ms) {
  PairResult r;
  // The rows already there are earlier pairs' (urdmad keeps departed processes' counters):
  // not this pair's.
  Retries earlier;
  sample_retries(&earlier);
  const Started server = start(faults(2 * seed + 1) + args);
  if (!wait_listening(port, 10000)) {
    r.server = finish(server, 1000);
    ADD_FAILURE() << "server did not listen (exit " << r.server.exit_code << "):\n"
                  << r.server.output;
    return r;
  }
  const Started client = start(faults(2 * seed + 2) + args + " 127.0.0.1");
  Retries seen;
  for (int waited = 0; waited < timeout_ms && running(client.pid); waited += 200) {
    sample_retries(&seen);
    usleep(200000);
  }
  r.client = finish(client, 1000);
  r.server = finish(server, 10000);
  sample_retries(&seen);  // the last reports, made as the two closed their devices
  for (const auto& [pid, n] : earlier) seen.erase(pid);
  r.retries = total(seen);
  return r;
}

// ---- ibverbs-utils ----

void expect_pingpong_ok(const ToolRun& r, int size, int iters, const char* side) {
  SCOPED_TRACE(side);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(number_before(r.output, " iters in "), iters) << r.output;
  // One message each way per iteration.
  EXPECT_EQ(number_before(r.output, " bytes in "), 2LL * size * iters) << r.output;
  for (const char* bad : {"Failed", "Couldn't", "failed", "rror"})
    EXPECT_EQ(r.output.find(bad), std::string::npos) << bad << " in:\n" << r.output;
}

struct PingpongCase {
  const char* tool;
  int size;
  int iters;
  bool events;  // -e: wait on a completion channel instead of busy-polling
};

class VerbsUtilsUnderFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_tool("ibv_rc_pingpong"))
      GTEST_SKIP() << "ibv_rc_pingpong not installed (scripts/deps.sh: ibverbs-utils)";
  }
};

// The one way a pingpong under loss may fail without a fault of urdma: one side, done, exits
// while the ACK of the other side's last message is lost — dropped by the fault profile (copies
// its reordering still holds go out as the exiting process closes its device). The other side's
// retransmissions then reach no QP and it ends in IBV_WC_RETRY_EXC_ERR for its send (wr_id 2) —
// exactly what an rxe or hardware pair does when the peer is gone. About one pair in 8, either
// side.
bool finished(const ToolRun& r, int iters) {
  return r.exit_code == 0 && number_before(r.output, " iters in ") == iters;
}
bool last_ack_lost(const ToolRun& r) {
  return r.exit_code == 1 &&
         r.output.find("transport retry counter exceeded (12) for wr_id 2") != std::string::npos;
}
bool lost_last_ack(const PairResult& r, int iters) {
  return (finished(r.client, iters) && last_ack_lost(r.server)) ||
         (finished(r.server, iters) && last_ack_lost(r.client));
}

// Each case as a pair under faults, on its own port: the data checked (-c), the counts printed,
// the retransmissions seen.
void run_pingpongs(const std::vector<PingpongCase>& cases, unsigned first_port) {
  unsigned port = first_port;
  int seed = 0;
  for (const PingpongCase& c : cases) {
    SCOPED_TRACE(std::string(c.tool) + " -s " + std::to_string(c.size) + (c.events ? " -e" : ""));
    const auto args = [&](unsigned at) {
      return std::string(c.tool) + " -d urdma0 -g 0 -c -s " + std::to_string(c.size) + " -n " +
             std::to_string(c.iters) + " -p " + std::to_string(at) + (c.events ? " -e" : "");
    };
    PairResult r = run_pair(args(port), port, seed++, 60000);
    for (unsigned again = 1; again <= 2 && lost_last_ack(r, c.iters); ++again) {
      std::fprintf(stderr, "%s: the ACK of one side's last send was lost after the other "
                           "exited; running the pair again\n", c.tool);
      r = run_pair(args(port + 100 * again), port + 100 * again, seed++, 60000);
    }
    expect_pingpong_ok(r.client, c.size, c.iters, "client");
    expect_pingpong_ok(r.server, c.size, c.iters, "server");
    EXPECT_GT(r.retries, 0) << "no retransmission reported: were the faults applied?";
    std::fprintf(stderr, "%s -s %d -n %d: %lld retransmissions\n", c.tool, c.size, c.iters,
                 r.retries);
    ++port;
  }
}

// Busy-polling (the tools' default): see the -e test below.
TEST_F(VerbsUtilsUnderFaults, RcPingpongChecksItsDataAndFinishes) {
  in_fresh_netns([] { run_pingpongs({{"ibv_rc_pingpong", 4096, 1500, false}}, 18800); }, 290);
}

// 65536 bytes: 64 packets a message. The client's modify to RTS and first post_send often land
// while an engine turn runs; the turn must not send that WQE before the engine applied the
// modify (Engine::qp_state; requester_test.cc WorkPostedBeforeTheEngineAppliedRtsWaitsForIt), or
// the process aborts on "requester PSN outside its WQE". Like the 4 KiB cases it can end in
// RETRY_EXC_ERR when a peer gets no CPU for longer than the tool's retry budget (timeout 14:
// 67 ms × 8 tries), which a 2-core host at load ~10 can cause (3 of 20 runs at CPU pressure 98%).
TEST_F(VerbsUtilsUnderFaults, RcPingpongOf64KiBChecksItsDataAndFinishes) {
  in_fresh_netns([] { run_pingpongs({{"ibv_rc_pingpong", 65536, 400, false}}, 18810); }, 290);
}

// Completion events (-e): the tool (a send queue of 1 WR) wakes on the CQ event, polls the
// completion and posts its next send at once — the slot must be free by then (Engine::retire
// pops the WQE before pushing its completion, as rxe's do_complete), and a WR posted while the
// engine thread is mid-turn must be sent (the requester is not "blocked" by an empty queue).
TEST_F(VerbsUtilsUnderFaults, RcPingpongWithCompletionEvents) {
  in_fresh_netns([] { run_pingpongs({{"ibv_rc_pingpong", 4096, 1500, true}}, 18850); }, 290);
}

// The same between two network namespaces joined by a veth pair, a urdmad in each: B runs the
// server, A (this namespace) the client; the faults are on both processes' sockets, so every
// lost or reordered packet crosses the veth between two daemons' slots. B reports its side's
// exit status and counts; the retransmissions are A's (its urdmad's view), which a run of 1500
// 4 KiB messages under 1% loss always has.
TEST_F(VerbsUtilsUnderFaults, RcPingpongBetweenTwoNamespacesOverAVethPair) {
  in_fresh_netns(
      [] {
        constexpr int kSize = 4096, kIters = 1500;
        struct Report {
          int exit_code;
          long long iters;
          long long bytes;
          int last_ack_lost;
        };
        Pipe ports, ready, reports;
        // Each side names the GID of its veth address, as `ibv_devinfo -v` shows it (GID 0 is
        // loopback's): the tool sends its own GID to the peer.
        const auto args = [](unsigned port, const char* address) {
          const int gid = gid_index_of(run("ibv_devinfo -v", 10000).output, address);
          return "ibv_rc_pingpong -d urdma0 -g " + std::to_string(gid) + " -c -s " +
                 std::to_string(kSize) + " -n " + std::to_string(kIters) + " -p " +
                 std::to_string(port);
        };
        const pid_t b = start_second_host("fa", "fb", "10.89.3", [&] {
          unsigned port;
          for (int seed = 61; ports.get(&port, 60000) && port != 0; seed += 2) {
            const Started server = start(faults(seed) + args(port, "10.89.3.2"));
            ready.put(static_cast<char>(wait_listening(port, 10000) ? 'y' : 'n'));
            const ToolRun r = finish(server, 90000);
            if (r.exit_code != 0) std::fprintf(stderr, "B's server:\n%s\n", r.output.c_str());
            reports.put(Report{r.exit_code, number_before(r.output, " iters in "),
                               number_before(r.output, " bytes in "), last_ack_lost(r) ? 1 : 0});
          }
          return 0;
        });
        ASSERT_GE(gid_index_of(run("ibv_devinfo -v", 10000).output, "10.89.3.1"), 0);
        Retries earlier;
        sample_retries(&earlier);
        Retries seen;
        Report rep{};
        ToolRun client;
        for (unsigned attempt = 0, port = 18860; attempt < 3; ++attempt, ++port) {
          ASSERT_TRUE(ports.put(port));
          char up = 'n';
          ASSERT_TRUE(ready.get(&up, 20000));
          ASSERT_EQ(up, 'y') << "B's server did not listen";
          const std::string cmd =
              faults(62 + 2 * static_cast<int>(attempt)) + args(port, "10.89.3.1") + " 10.89.3.2";
          const Started started = start(cmd);
          for (int waited = 0; waited < 90000 && running(started.pid); waited += 200) {
            sample_retries(&seen);
            usleep(200000);
          }
          client = finish(started, 1000);
          sample_retries(&seen);
          ASSERT_TRUE(reports.get(&rep, 95000));
          const bool b_done = rep.exit_code == 0 && rep.iters == kIters;
          // The end-of-run race described at lost_last_ack(): rerun the pair.
          if ((finished(client, kIters) && rep.last_ack_lost) ||
              (b_done && last_ack_lost(client))) {
            std::fprintf(stderr,
                         "the ACK of one side's last send was lost after the other "
                         "exited; running the pair again\n");
            continue;
          }
          break;
        }
        ports.put(0u);
        expect_pingpong_ok(client, kSize, kIters, "client (A)");
        EXPECT_EQ(rep.exit_code, 0) << "B's server";
        EXPECT_EQ(rep.iters, kIters) << "B's server";
        EXPECT_EQ(rep.bytes, 2LL * kSize * kIters) << "B's server";
        for (const auto& [pid, n] : earlier) seen.erase(pid);
        EXPECT_GT(total(seen), 0) << "no retransmission reported: were the faults applied?";
        std::fprintf(stderr, "ibv_rc_pingpong across the veth: %lld retransmissions in A\n",
                     total(seen));
        const std::optional<int> status = wait_exit(b, 15000);
        ASSERT_TRUE(status.has_value());
        EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
      },
      290);
}

// ---- perftest ----

struct BwCase {
  const char* tool;
  int size;
  int iters;
};

void expect_bw_ok(const ToolRun& r, const BwCase& c, const char* side) {
  SCOPED_TRACE(side);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* bad : {"rror", "Couldn't", "Failed", "Unable", "failed"})
    EXPECT_EQ(r.output.find(bad), std::string::npos) << bad << " in:\n" << r.output;
  // #bytes #iterations BW_peak BW_average MsgRate
  const std::vector<double> v = result_row(r.output);
  ASSERT_GE(v.size(), 5u) << r.output;
  EXPECT_EQ(v[0], c.size) << r.output;
  EXPECT_EQ(v[1], c.iters) << r.output;
  EXPECT_GT(v[3], 0.0) << r.output;
}

class PerftestUnderFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* t : {"ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_atomic_bw", "ib_write_lat",
                          "ib_read_lat", "ib_send_lat", "ib_atomic_lat"})
      if (!have_tool(t)) GTEST_SKIP() << t << " not installed (scripts/deps.sh: perftest)";
  }
};

// GID 0: 127.0.0.1.
std::string perftest_args(const BwCase& c, unsigned port) {
  return perftest_command(c.tool, c.size, c.iters, port, 0);
}

// perftest_command (tool_run.h) says why -u 16. ib_atomic_bw keeps several ATOMICs in flight:
// a lost ATOMIC ACK is asked for again when the next one's ACK arrives (before that fix, 5000
// iterations took ~34 s here; now ~1.5 s).
TEST_F(PerftestUnderFaults, BandwidthToolsFinishWithTheCountsAskedFor) {
  in_fresh_netns(
      [] {
        const std::vector<BwCase> cases = {{"ib_write_bw", 65536, 1500},
                                           {"ib_read_bw", 65536, 1500},
                                           {"ib_send_bw", 65536, 1500},
                                           {"ib_atomic_bw", 8, 5000}};
        unsigned port = 18900;
        int seed = 10;
        for (const BwCase& c : cases) {
          SCOPED_TRACE(std::string(c.tool) + " -s " + std::to_string(c.size));
          const PairResult r = run_pair(perftest_args(c, port), port, seed++, 60000);
          expect_bw_ok(r.client, c, "client");
          expect_bw_ok(r.server, c, "server");
          EXPECT_GT(r.retries, 0) << "no retransmission reported: were the faults applied?";
          std::fprintf(stderr, "%s -s %d -n %d: %lld retransmissions\n", c.tool, c.size, c.iters,
                       r.retries);
          ++port;
        }
      },
      290);
}

// The latency tools: one message in flight, so every lost packet costs a whole ACK timeout
// (-u 16: 268 ms) and a run of 500 iterations takes a few seconds. Both sides exit 0 and the
// client prints its row for the size and iterations asked for, 0 < t_min <= t_avg <= t_max.
TEST_F(PerftestUnderFaults, LatencyToolsFinishWithTheCountsAskedFor) {
  in_fresh_netns(
      [] {
        const std::vector<BwCase> cases = {{"ib_write_lat", 64, 500},
                                           {"ib_send_lat", 4096, 500},
                                           {"ib_read_lat", 4096, 500},
                                           {"ib_atomic_lat", 8, 500}};
        unsigned port = 18950;
        int seed = 20;
        for (const BwCase& c : cases) {
          SCOPED_TRACE(std::string(c.tool) + " -s " + std::to_string(c.size));
          const PairResult r = run_pair(perftest_args(c, port), port, seed++, 60000);
          for (const ToolRun* side : {&r.client, &r.server}) {
            EXPECT_EQ(side->exit_code, 0) << side->output;
            for (const char* bad : {"rror", "Couldn't", "Failed", "Unable", "failed"})
              EXPECT_EQ(side->output.find(bad), std::string::npos) << bad << " in:\n"
                                                                   << side->output;
          }
          // #bytes #iterations t_min t_max t_typical t_avg (t_stdev: perftest prints -nan for
          // a spread this wide; the row is read up to it)
          const std::vector<double> v = result_row(r.client.output);
          ASSERT_GE(v.size(), 6u) << r.client.output;
          EXPECT_EQ(v[0], c.size) << r.client.output;
          EXPECT_EQ(v[1], c.iters) << r.client.output;
          EXPECT_GT(v[2], 0.0) << r.client.output;
          EXPECT_LE(v[2], v[5]) << r.client.output;
          EXPECT_LE(v[5], v[3]) << r.client.output;
          EXPECT_GT(r.retries, 0) << "no retransmission reported: were the faults applied?";
          std::fprintf(stderr, "%s -s %d -n %d: %lld retransmissions, t_avg %.1f us\n", c.tool,
                       c.size, c.iters, r.retries, v[5]);
          ++port;
        }
      },
      290);
}

// ---- qperf ----

// qperf's RC tests through rdma_cm under the same faults on both sides. rdma_cm gives the QPs
// Linux's ACK timeout for RoCE (packet lifetime 16 + 1: 537 ms), so every lost packet of a
// ping-pong costs half a second and the results are small; what is checked is that each test
// finishes and prints its result, and that the two ver_ tests, which check every atomic's
// returned value themselves, report no error.
TEST(QperfUnderFaults, RcTestsFinishAndTheirAtomicsVerify) {
  if (!have_tool("qperf")) GTEST_SKIP() << "qperf not installed (scripts/deps.sh)";
  in_fresh_netns(
      [] {
        Retries earlier;
        sample_retries(&earlier);
        const Started server = start(faults(41) + "qperf -lp 18990");
        ASSERT_TRUE(wait_listening(18990, 10000)) << finish(server, 0).output;
        // 1 latency test, 3 bandwidth tests, 3 message rates.
        const std::vector<std::string> tests = {"rc_lat",
                                                "rc_bw",
                                                "rc_rdma_write_bw",
                                                "rc_rdma_read_bw",
                                                "rc_compare_swap_mr",
                                                "ver_rc_compare_swap",
                                                "ver_rc_fetch_add"};
        std::string names;
        for (const std::string& t : tests) names += " " + t;
        const Started client = start(faults(42) + "qperf -lp 18990 -cm1 -t 2 127.0.0.1" + names);
        Retries seen;
        for (int waited = 0; waited < 120000 && running(client.pid); waited += 200) {
          sample_retries(&seen);
          usleep(200000);
        }
        const ToolRun events = finish(client, 1000);
        kill(server.pid, SIGTERM);
        const ToolRun srv = finish(server, 5000);
        sample_retries(&seen);
        for (const auto& [pid, n] : earlier) seen.erase(pid);
        expect_qperf_ran(events, tests, 1, 3, 3);
        expect_no_qperf_failure(srv);
        EXPECT_GT(total(seen), 0) << "no retransmission reported: were the faults applied?";
        std::fprintf(stderr, "qperf under faults: %lld retransmissions\n%s", total(seen),
                     events.output.c_str());
      },
      200);
}

}  // namespace
}  // namespace urdma::process_test
