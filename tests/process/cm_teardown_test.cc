// What urdmad answers on QP1 for the host (src/daemon/cm_agent.h), seen from unmodified Debian
// rping run on our libraries (tool_run.h) in a fresh namespace (netns_harness.h):
//  * a connect to a port nobody listens on is REJECTED with status 8 (invalid service ID) at
//    once, as on Linux — not after the client's REQ retries run out (~100 s); a SIDR_REQ
//    (udaddy) is UNREACHABLE with status 1;
//  * a server killed with SIGKILL while connected: urdmad sends its peer a DREQ, and the client
//    sees DISCONNECTED while its RC retries (seconds each) are still running.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "netns_harness.h"
#include "tool_run.h"

namespace urdma::process_test {
namespace {

bool have_rping() {
  return std::system("command -v rping >/dev/null 2>&1") == 0;
}

// `urdma status --json`'s value of a daemon counter, or -1.
long daemon_counter(const std::string& name) {
  const ToolRun st = run(std::string(URDMA_TOOL_PATH) + " status --json", 10000);
  const auto at = st.output.find("\"" + name + "\"");
  if (st.exit_code != 0 || at == std::string::npos) return -1;
  const auto digits = st.output.find_first_of("0123456789", at + name.size() + 2);
  return digits == std::string::npos ? -1 : std::strtol(st.output.c_str() + digits, nullptr, 10);
}

TEST(CmTeardown, ConnectToAClosedPortIsRejectedAtOnce) {
  if (!have_rping()) GTEST_SKIP() << "no rping";
  in_fresh_netns(
      [] {
        const auto t0 = std::chrono::steady_clock::now();
        const ToolRun r = run("rping -c -a 127.0.0.1 -p 7190 -C 1", 20000);
        const auto took = std::chrono::steady_clock::now() - t0;
        // Within the deadline at all: without the REJ, rping waits out its REQ retries (~100 s).
        EXPECT_LT(took, std::chrono::seconds(20)) << r.output;
        EXPECT_NE(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find("RDMA_CM_EVENT_REJECTED, error 8"), std::string::npos) << r.output;
        EXPECT_EQ(daemon_counter("cm_rejects_sent"), 1);
      },
      60);
}

// RDMA_PS_UDP: the SIDR_REQ gets SIDR_REP status 1 (service ID not supported), which rdma_cm
// reports as UNREACHABLE with that status (Linux cma_sidr_rep_handler).
TEST(CmTeardown, SidrToAClosedPortIsUnreachableAtOnce) {
  if (std::system("command -v udaddy >/dev/null 2>&1") != 0) GTEST_SKIP() << "no udaddy";
  in_fresh_netns(
      [] {
        const auto t0 = std::chrono::steady_clock::now();
        const ToolRun r = run("udaddy -s 127.0.0.1", 20000);  // its fixed port 7174: nobody there
        EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20)) << r.output;
        EXPECT_NE(r.output.find("RDMA_CM_EVENT_UNREACHABLE, error: 1"), std::string::npos)
            << r.output;
        EXPECT_EQ(daemon_counter("cm_rejects_sent"), 1);
      },
      60);
}

TEST(CmTeardown, KilledServersPeerSeesDisconnected) {
  if (!have_rping()) GTEST_SKIP() << "no rping";
  in_fresh_netns(
      [] {
        const Started server = start("rping -s -a 127.0.0.1 -p 7191 -C 100000000");
        // rping -s says nothing when it listens: a client that came too early is REJECTED at once
        // (the test above) and tries again. -v prints every ping: then the connection is up.
        Started client;
        bool up = false;
        for (int attempt = 0; attempt < 20 && !up; ++attempt) {
          client = start("rping -c -v -a 127.0.0.1 -p 7191 -C 100000000");
          up = wait_output(client, "ping data", 3000);
          if (!up) {
            const ToolRun early = finish(client, 5000);
            ASSERT_NE(early.output.find("REJECTED"), std::string::npos) << early.output;
            usleep(100 * 1000);
          }
        }
        ASSERT_TRUE(up) << finish(server, 0).output;
        // start() runs it under sh (with redirections): rping is the shell's one child.
        const std::string task =
            "/proc/" + std::to_string(server.pid) + "/task/" + std::to_string(server.pid);
        const pid_t rping = static_cast<pid_t>(std::atol(read_file(task + "/children").c_str()));
        ASSERT_GT(rping, 0);
        ASSERT_EQ(read_file("/proc/" + std::to_string(rping) + "/comm"), "rping\n");
        ASSERT_EQ(kill(rping, SIGKILL), 0);
        const ToolRun srv = finish(server, 5000);
        EXPECT_EQ(srv.exit_code, 128 + SIGKILL) << "the shell saw rping killed";
        // rping reports the DISCONNECTED event and ends its loop. Its own RC retries would fail
        // only after 7 × 2.1 s (local ACK timeout 19); the DREQ comes from urdmad at once.
        EXPECT_TRUE(wait_output(client, "DISCONNECT EVENT", 8000)) << finish(client, 0).output;
        const ToolRun cl = finish(client, 20000);
        EXPECT_NE(cl.exit_code, -1) << "rping ended by itself\n" << cl.output;
        EXPECT_EQ(daemon_counter("cm_dreqs_sent"), 1) << "one DREQ, for the one connection";
      },
      90);
}

}  // namespace
}  // namespace urdma::process_test
