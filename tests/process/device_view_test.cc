// The device view (`urdma run`, tools/urdma/view.h) and the middleware that needs it: every test
// body runs in a fresh network namespace (netns_harness.h) and runs its programs through the
// build's `urdma` (tool_run.h).
//
// The view is checked by device_view_check.py, which reads it as any sysfs reader does and
// compares it with `ibv_devinfo -v`, ibv_device's paths (ctypes) and `ip -o addr` — code that
// shares nothing with the view's: as root, as uid 65534, for a child of a child, and after a GID
// is added. UCX 1.13 (Debian's ucx-utils, unmodified): `ucx_info -d` lists urdma0:1 for rc_verbs
// and ud_verbs, and ucx_perftest's UCT and UCP tests pass on one host and across a veth pair.
// Skipped without python3, ibverbs-utils or ucx-utils (scripts/deps.sh installs them).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "netns_harness.h"
#include "tool_run.h"

namespace urdma::process_test {
namespace {

const std::string kUrdma = URDMA_TOOL_PATH;

std::string check_script(const std::string& args = "") {
  return std::string("/usr/bin/python3 ") + URDMA_VIEW_CHECK_SCRIPT + " " + args;
}

void skip_without(const char* tool, const char* package) {
  if (!have_tool(tool)) skip_test(std::string(tool) + " is missing (scripts/deps.sh installs " +
                                   package + ")");
}

void expect_view_ok(const ToolRun& r) {
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ok "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("runs without the device view"), std::string::npos) << r.output;
}

TEST(DeviceView, FilesAgreeWithTheVerbsForAChildOfAChild) {
  in_fresh_netns([] {
    skip_without("ibv_devinfo", "ibverbs-utils");
    skip_without("python3", "python3");
    // The program is a shell whose child's child reads the view: mounts are inherited.
    const ToolRun r =
        run(kUrdma + " run sh -c 'sh -c \"" + check_script() + "\"'", 30000);
    expect_view_ok(r);
  }, 60);
}

TEST(DeviceView, AnUnprivilegedProgramGetsTheViewWithItsOwnIds) {
  in_fresh_netns([] {
    skip_without("ibv_devinfo", "ibverbs-utils");
    skip_without("setpriv", "util-linux");
    if (!real_root()) skip_test("needs root to become uid 65534");
    const std::string as_nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups ";
    if (run(as_nobody + "test -r " + std::string(URDMA_LIB_DIR) + "/libibverbs.so.1").exit_code !=
        0)
      skip_test("uid 65534 cannot read the build tree");
    const ToolRun r = run(as_nobody + kUrdma + " run sh -c '" + check_script() + " && id -u && id -g'",
                          30000);
    expect_view_ok(r);
    // The program keeps its uid and gid (identity maps of the caller's own).
    EXPECT_NE(r.output.find("\n65534\n65534"), std::string::npos) << r.output;
  }, 60);
}

TEST(DeviceView, AGidAddedToAnInterfaceAppearsInTheView) {
  in_fresh_netns([] {
    skip_without("ibv_devinfo", "ibverbs-utils");
    ASSERT_TRUE(sh("ip link add urdmav0 type veth peer name urdmav1 && ip link set urdmav0 up"));
    // The program waits for the address, then checks every file again, the new GID and the
    // interface in device/net included.
    const std::string wait =
        "for i in $(seq 100); do grep -qx 0000:0000:0000:0000:0000:ffff:0a3b:0007 "
        "/sys/class/infiniband/urdma0/ports/1/gids/* && "
        "[ -d /sys/class/infiniband/urdma0/device/net/urdmav0 ] && break; sleep 0.05; done; ";
    const Started s = start(kUrdma + " run sh -c '" + wait + check_script("--expect-gid 10.59.0.7") +
                            "'");
    usleep(500 * 1000);
    ASSERT_TRUE(sh("ip addr add 10.59.0.7/24 dev urdmav0"));
    expect_view_ok(finish(s, 30000));
  }, 60);
}

TEST(DeviceView, ANestedUrdmaRunKeepsTheViewItIsIn) {
  in_fresh_netns([] {
    const ToolRun r = run(kUrdma + " run " + kUrdma +
                              " run sh -c 'cat /sys/class/infiniband_verbs/uverbs*/ibdev'",
                          30000);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, "urdma0\n");  // one view, said nothing
  });
}

TEST(DeviceView, NoViewIsMadeWhenAskedNot) {
  in_fresh_netns([] {
    const ToolRun r =
        run(kUrdma + " run --no-view sh -c 'test -e /sys/class/infiniband/urdma0; echo $?'");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, "1\n");
  });
}

// ---- UCX ----

void skip_without_ucx() {
  skip_without("ucx_info", "ucx-utils");
  skip_without("ucx_perftest", "ucx-utils");
}

TEST(Ucx, UcxInfoListsRcAndUdVerbsOnUrdma0) {
  in_fresh_netns([] {
    skip_without_ucx();
    const ToolRun r = run(kUrdma + " run ucx_info -d", 30000);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const char* tl : {"rc_verbs", "ud_verbs"}) {
      const std::string block = std::string("Transport: ") + tl + "\n#         Device: urdma0:1";
      EXPECT_NE(r.output.find(block), std::string::npos) << tl << "\n" << r.output;
    }
  }, 60);
}

struct PerfCase {
  const char* name;
  const char* env;   // UCP: the transports
  const char* args;  // both sides (the server ignores what it does not need)
};

// Small sizes and counts: each case is a second or two on a loaded 2-core machine.
constexpr const char* kRc = "UCX_NET_DEVICES=urdma0:1 UCX_TLS=rc_verbs,ud_verbs,self";
constexpr const char* kUd = "UCX_NET_DEVICES=urdma0:1 UCX_TLS=ud_verbs,self";
const PerfCase kCases[] = {
    {"uct rc am_lat", "", "-d urdma0:1 -x rc_verbs -t am_lat -n 500"},
    {"uct rc am_bw", "", "-d urdma0:1 -x rc_verbs -t am_bw -D bcopy -s 4096 -n 500"},
    {"uct rc put_bw", "", "-d urdma0:1 -x rc_verbs -t put_bw -D zcopy -s 65536 -n 200"},
    {"uct rc get", "", "-d urdma0:1 -x rc_verbs -t get -D zcopy -s 65536 -n 200"},
    {"uct ud am_lat", "", "-d urdma0:1 -x ud_verbs -t am_lat -n 500"},
    {"ucp rc tag_lat", kRc, "-t tag_lat -n 500"},
    {"ucp rc tag_bw", kRc, "-t tag_bw -s 65536 -n 200"},
    {"ucp rc stream_bw", kRc, "-t stream_bw -s 65536 -n 200"},
    {"ucp rc ucp_put_bw", kRc, "-t ucp_put_bw -s 65536 -n 200"},
    {"ucp rc ucp_get", kRc, "-t ucp_get -s 65536 -n 200"},
    {"ucp ud tag_lat", kUd, "-t tag_lat -n 500"},
    {"ucp ud tag_bw", kUd, "-t tag_bw -s 65536 -n 200"},
};

// The numbers of ucx_perftest's "Final:" row: iterations, then latency (50%, average, overall),
// bandwidth (average, overall), message rate (average, overall).
std::vector<double> final_row(const std::string& out) {
  std::vector<double> v;
  const size_t at = out.find("Final:");
  if (at == std::string::npos) return v;
  std::istringstream in(out.substr(at + 6, out.find('\n', at) - at - 6));
  for (double x; in >> x;) v.push_back(x);
  return v;
}

unsigned iterations_of(const char* args) {
  const std::string a = args;
  return static_cast<unsigned>(std::atoi(a.c_str() + a.find("-n ") + 3));
}

void expect_perf_passed(const PerfCase& c, const ToolRun& client, const ToolRun& server) {
  SCOPED_TRACE(c.name);
  EXPECT_EQ(client.exit_code, 0) << client.output << "\nserver:\n" << server.output;
  EXPECT_EQ(server.exit_code, 0) << server.output;
  const std::vector<double> row = final_row(client.output);
  ASSERT_EQ(row.size(), 8u) << client.output;
  EXPECT_EQ(row[0], iterations_of(c.args));
  EXPECT_GT(row[1], 0);  // a latency
  EXPECT_GT(row[6], 0);  // a message rate
  EXPECT_EQ(client.output.find("ERROR"), std::string::npos) << client.output;
}

std::string perftest(const PerfCase& c, unsigned port, const std::string& extra_env,
                     const std::string& server_ip = "") {
  return "env " + extra_env + " " + c.env + " " + kUrdma + " run ucx_perftest " + server_ip +
         " -p " + std::to_string(port) + " " + c.args;
}

TEST(Ucx, PerftestOnOneHost) {
  in_fresh_netns([] {
    skip_without_ucx();
    unsigned port = 13500;
    for (const PerfCase& c : kCases) {
      ++port;
      const Started server = start(perftest(c, port, ""));
      ASSERT_TRUE(wait_listening(port, 15000)) << c.name << finish(server, 1000).output;
      const ToolRun client = run(perftest(c, port, "", "127.0.0.1"), 30000);
      expect_perf_passed(c, client, finish(server, 10000));
    }
  }, 150);
}

// Across a veth pair. urdma's GID 0 is loopback's and UCX takes the first RoCE v2 IPv4 GID, so
// each side names its veth GID (UCX_IB_GID_INDEX), as on a host whose first GID is not routable.
TEST(Ucx, PerftestAcrossAVethPair) {
  in_fresh_netns([] {
    skip_without_ucx();
    skip_without("ibv_devinfo", "ibverbs-utils");
    Pipe go, done;
    const pid_t b = start_second_host("ucxa", "ucxb", "10.89.7", [&] {
      const int gid = gid_index_of(run("ibv_devinfo -v").output, "10.89.7.2");
      const std::string env = "UCX_IB_GID_INDEX=" + std::to_string(gid);
      int failures = 0;
      for (unsigned port; go.get(&port, 60000) && port != 0;) {
        const PerfCase& c = kCases[port - 13600];
        const ToolRun client = run(perftest(c, port, env, "10.89.7.1"), 30000);
        const std::vector<double> row = final_row(client.output);
        const bool ok = client.exit_code == 0 && row.size() == 8 &&
                        row[0] == iterations_of(c.args) && row[6] > 0;
        if (!ok) {
          ++failures;
          std::fprintf(stderr, "B: %s failed:\n%s\n", c.name, client.output.c_str());
        }
        done.put(static_cast<int>(ok));
      }
      return failures;
    });
    const int gid = gid_index_of(run("ibv_devinfo -v").output, "10.89.7.1");
    ASSERT_GE(gid, 0);
    const std::string env = "UCX_IB_GID_INDEX=" + std::to_string(gid);
    unsigned port = 13600;
    for (const PerfCase& c : kCases) {
      SCOPED_TRACE(c.name);
      const Started server = start(perftest(c, port, env));
      ASSERT_TRUE(wait_listening(port, 15000)) << finish(server, 1000).output;
      ASSERT_TRUE(go.put(port));
      int ok = 0;
      ASSERT_TRUE(done.get(&ok, 40000));
      EXPECT_TRUE(ok);
      const ToolRun srv = finish(server, 10000);
      EXPECT_EQ(srv.exit_code, 0) << srv.output;
      ++port;
    }
    go.put(0u);
    const auto status = wait_exit(b, 10000);
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(*status, 0);
  }, 180);
}

}  // namespace
}  // namespace urdma::process_test
