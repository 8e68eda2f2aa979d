// What urdmad answers on QP1 for the host (src/daemon/cm_agent.h), seen from unmodified Debian
// rping run on our libraries (tool_run.h) in a fresh namespace (netns_harness.h):
//  * a connect to a port nobody listens on is REJECTED with status 8 (invalid service ID) once
//    urdmad's wait for a listener (1 s, daemon::ListenWaits) is over, as on Linux but for the
//    wait — not after the client's REQ retries run out (~100 s); a SIDR_REQ (udaddy) is
//    UNREACHABLE with status 1; a server that binds within the wait is served instead;
//  * a server killed with SIGKILL while connected: urdmad sends its peer a DREQ, and the client
//    sees DISCONNECTED while its RC retries (seconds each) are still running;
//  * the same at the daemon's own level, byte for byte: two processes talking to urdmad through
//    its client API (daemon/client.h), the MADs built and decoded with src/wire.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "daemon/client.h"
#include "daemon/cm_agent.h"
#include "daemon/daemon.h"
#include "daemon/mad_router.h"
#include "gsi/gmp.h"
#include "netns_harness.h"
#include "support/daemon_view.h"
#include "tool_run.h"
#include "wire/cm.h"
#include "wire/headers.h"
#include "wire/opcode.h"
#include "wire/packet.h"

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

TEST(CmTeardown, ConnectToAClosedPortIsRejectedAfterTheListenWait) {
  if (!have_rping()) GTEST_SKIP() << "no rping";
  in_fresh_netns(
      [] {
        const auto t0 = std::chrono::steady_clock::now();
        const ToolRun r = run("rping -c -a 127.0.0.1 -p 7190 -C 1", 20000);
        const auto took = std::chrono::steady_clock::now() - t0;
        // The REJ comes when urdmad's wait for a listener ends (daemon::kDefaultListenWaitMs);
        // without it, rping would wait out its REQ retries (~100 s).
        EXPECT_GE(took, std::chrono::milliseconds(daemon::kDefaultListenWaitMs)) << r.output;
        EXPECT_LT(took, std::chrono::seconds(20)) << r.output;
        EXPECT_NE(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find("RDMA_CM_EVENT_REJECTED, error 8"), std::string::npos) << r.output;
        EXPECT_EQ(daemon_counter("cm_rejects_sent"), 1);
        EXPECT_EQ(daemon_counter("cm_requests_waited"), 1);
        EXPECT_EQ(daemon_counter("cm_requests_served"), 0);
      },
      60);
}

// URDMA_LISTEN_WAIT_MS=0 for urdmad: refused at once, exactly as Linux refuses it.
TEST(CmTeardown, ConnectToAClosedPortIsRejectedAtOnceWithoutTheWait) {
  if (!have_rping()) GTEST_SKIP() << "no rping";
  in_fresh_netns(
      [] {
        setenv("URDMA_LISTEN_WAIT_MS", "0", 1);
        const auto t0 = std::chrono::steady_clock::now();
        const ToolRun r = run("rping -c -a 127.0.0.1 -p 7190 -C 1", 20000);
        const auto took = std::chrono::steady_clock::now() - t0;
        EXPECT_LT(took, std::chrono::milliseconds(daemon::kDefaultListenWaitMs)) << r.output;
        EXPECT_NE(r.output.find("RDMA_CM_EVENT_REJECTED, error 8"), std::string::npos) << r.output;
        EXPECT_EQ(daemon_counter("cm_rejects_sent"), 1);
        EXPECT_EQ(daemon_counter("cm_requests_waited"), 0);
      },
      60);
}

// A client quicker than its server: its REQ reaches urdmad before the server has even bound the
// port (perftest -R's data connection, whose server binds and listens only after its
// out-of-band handshake). urdmad holds the REQ until the bind, hands it to the server's process,
// where it waits again for rdma_listen (the server below listens 200 ms after binding). Before,
// urdmad refused it at once (REJ 8) and perftest 4.5 crashed in its retry path.
TEST(CmTeardown, ARequestBeforeTheBindWaitsForTheBindAndTheListen) {
  in_fresh_netns(
      [] {
        const Started client = start(std::string(URDMA_RDMACM_PEER) + " client 127.0.0.1 7194");
        usleep(300 * 1000);
        const Started server =
            start(std::string(URDMA_RDMACM_PEER) + " late-listen-server 7194 200");
        const ToolRun cl = finish(client, 30000);
        const ToolRun srv = finish(server, 10000);
        EXPECT_EQ(cl.exit_code, 0) << cl.output << srv.output;
        EXPECT_NE(cl.output.find("event RDMA_CM_EVENT_ESTABLISHED status 0"), std::string::npos)
            << cl.output << srv.output;
        EXPECT_EQ(srv.exit_code, 0) << srv.output;
        EXPECT_EQ(daemon_counter("cm_rejects_sent"), 0);
        EXPECT_EQ(daemon_counter("cm_requests_waited"), 1);
        EXPECT_EQ(daemon_counter("cm_requests_served"), 1);
      },
      60);
}

// RDMA_PS_UDP: the SIDR_REQ gets SIDR_REP status 1 (service ID not supported), which rdma_cm
// reports as UNREACHABLE with that status (Linux cma_sidr_rep_handler).
TEST(CmTeardown, SidrToAClosedPortIsUnreachableAfterTheListenWait) {
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
        // rping -s says nothing when it listens: a client that came more than urdmad's listen
        // wait too early is REJECTED (the test above) and tries again. -v prints every ping: then
        // the connection is up.
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

// A passive side that takes DISCONNECTED and neither calls rdma_disconnect nor destroys its id
// (qperf 0.4.11's server: it destroys only the listening id, then the channel, then exits) still
// answers the DREQ at once, as Linux does when the id's rdma_cm fd closes (ucma_close ->
// ib_destroy_cm_id -> DREP). Before: no DREP came from the process; the client waited ~6 s
// for its DREQ's retransmission, which urdmad answered for the exited server (each qperf -cm1
// test took 7 s instead of 1).
struct LeftServer {
  Started server;
  ToolRun client;
};
LeftServer leave_and_disconnect(const char* how) {
  LeftServer r;
  r.server = start(std::string(URDMA_RDMACM_PEER) + " leave-server 7192 " + how);
  EXPECT_TRUE(wait_output(r.server, "listening", 10000)) << finish(r.server, 0).output;
  r.client = run(std::string(URDMA_RDMACM_PEER) + " disconnect-client 127.0.0.1 7192", 40000);
  return r;
}

// The channel destroyed, the process alive: only its librdmacm can have sent the DREP.
TEST(CmTeardown, DestroyingTheChannelAnswersTheDreqOfAnIdLeftOnIt) {
  in_fresh_netns(
      [] {
        LeftServer r = leave_and_disconnect("channel");
        EXPECT_TRUE(wait_output(r.server, "channel destroyed", 5000));
        kill(r.server.pid, SIGTERM);
        const ToolRun srv = finish(r.server, 5000);
        EXPECT_EQ(r.client.exit_code, 0) << r.client.output << srv.output;
        EXPECT_NE(r.client.output.find("event RDMA_CM_EVENT_DISCONNECTED status 0"),
                  std::string::npos)
            << r.client.output;
        EXPECT_EQ(daemon_counter("cm_dreps_sent"), 0) << "urdmad answered no DREQ";
      },
      90);
}

// exit() with the connected id never destroyed: the DREP is the exiting process's, not urdmad's
// answer to the DREQ's retransmission.
TEST(CmTeardown, ExitingAnswersTheDreqOfAnIdNeverDestroyed) {
  in_fresh_netns(
      [] {
        LeftServer r = leave_and_disconnect("exit");
        const ToolRun srv = finish(r.server, 5000);
        EXPECT_EQ(srv.exit_code, 0) << srv.output;
        EXPECT_EQ(r.client.exit_code, 0) << r.client.output << srv.output;
        EXPECT_NE(r.client.output.find("event RDMA_CM_EVENT_DISCONNECTED status 0"),
                  std::string::npos)
            << r.client.output;
        EXPECT_EQ(daemon_counter("cm_dreps_sent"), 0) << "urdmad answered no DREQ";
      },
      90);
}

// A REQ that arrives after rdma_bind_addr and before rdma_listen waits for the listen instead of
// being rejected with REJ 8 (invalid service ID): qperf 0.4.11 sends its port to the client
// before it calls rdma_listen (fixed upstream in qperf 118a571, never released), and about one
// first connection in ten of a fresh namespace lost that race. The server here widens the window
// to 300 ms; the client connects the moment the port is bound. Without the fix: REJECTED status
// 8, every time.
TEST(CmTeardown, ARequestBeforeListenWaitsForIt) {
  in_fresh_netns(
      [] {
        const Started server =
            start(std::string(URDMA_RDMACM_PEER) + " late-listen-server 7193 300");
        ASSERT_TRUE(wait_output(server, "bound", 10000)) << finish(server, 0).output;
        const ToolRun client =
            run(std::string(URDMA_RDMACM_PEER) + " client 127.0.0.1 7193", 30000);
        const ToolRun srv = finish(server, 10000);
        EXPECT_EQ(client.exit_code, 0) << client.output;
        EXPECT_NE(client.output.find("event RDMA_CM_EVENT_ESTABLISHED status 0"), std::string::npos)
            << client.output << srv.output;
        EXPECT_EQ(srv.exit_code, 0) << srv.output;
        EXPECT_NE(srv.output.find("established"), std::string::npos) << srv.output;
        EXPECT_EQ(daemon_counter("cm_rejects_sent"), 0);
      },
      60);
}

// A REQ sent to a local address that is no GID of the device (127.0.0.2: all of 127/8 reaches
// lo, but only 127.0.0.1 is an interface address) is rejected at once with REJ 12 "invalid GID",
// as Linux's cm_req_handler rejects a path it cannot build. Before, the server accepted it and
// its QP answered from 127.0.0.1: rping to 127.0.0.2 connected, then both sides failed with
// RETRY_EXC_ERR.
TEST(CmTeardown, ARequestToALocalAddressThatIsNoGidIsRejectedWithInvalidGid) {
  in_fresh_netns(
      [] {
        const Started server = start(std::string(URDMA_RDMACM_PEER) + " recv-server 7196");
        ASSERT_TRUE(wait_output(server, "listening", 10000)) << finish(server, 0).output;
        const ToolRun client =
            run(std::string(URDMA_RDMACM_PEER) + " client 127.0.0.2 7196", 20000);
        kill(server.pid, SIGTERM);
        const ToolRun srv = finish(server, 5000);
        EXPECT_EQ(client.exit_code, 0) << client.output;
        EXPECT_NE(client.output.find("event RDMA_CM_EVENT_REJECTED status 12 private_data ''"),
                  std::string::npos)
            << client.output;
        EXPECT_EQ(srv.output.find("server qp_num"), std::string::npos)
            << "the server never saw the request\n"
            << srv.output;
      },
      60);
}

// The same for a SIDR_REQ (udaddy: UD, the server's QPN found by SIDR): it carries no path, and
// the address rdma_cm's header says it went to, 127.0.0.2, is no GID. Linux answers SIDR_REP
// status 2 ("reject"; cma_ib_req_handler fails and cm_destroy_id rejects the request), and the
// client's udaddy ends at once with UNREACHABLE, error 2. Before, the server got the request,
// could not make the reply AH ("failed to create reply AH") and the client waited until killed.
TEST(CmTeardown, ASidrRequestToALocalAddressThatIsNoGidIsRejected) {
  if (std::system("command -v udaddy >/dev/null 2>&1") != 0) GTEST_SKIP() << "no udaddy";
  in_fresh_netns(
      [] {
        const Started server = start("stdbuf -oL udaddy -c 1 -C 2");
        ASSERT_TRUE(wait_output(server, "starting server", 10000)) << finish(server, 0).output;
        usleep(500000);  // listening (udaddy says nothing more until a request comes)
        const ToolRun client = run("udaddy -s 127.0.0.2 -c 1 -C 2", 20000);
        kill(server.pid, SIGTERM);
        const ToolRun srv = finish(server, 5000);
        EXPECT_NE(client.output.find("RDMA_CM_EVENT_UNREACHABLE, error: 2"), std::string::npos)
            << client.output;
        EXPECT_EQ(srv.output.find("reply AH"), std::string::npos) << srv.output;
        EXPECT_EQ(srv.output.find("receiving data transfers"), std::string::npos)
            << "the server got the request\n"
            << srv.output;
      },
      60);
}

// A client that destroys its connecting id before any answer sends REJ "timeout" with
// RemoteCommID 0 (it never heard the server's ID; Linux cm_destroy_id does the same) and its CA
// GUID as ARI. urdmad routes it by the client's own comm ID to the process its REQ went to, and
// the server, still holding the request, gets REJECTED with status 4 (timeout) on that id;
// accepting it afterwards fails. Before, urdmad dropped the REJ (no slot in a comm ID of 0): the
// server heard nothing, and its REP would have been retried for seconds.
TEST(CmTeardown, AClientThatGivesUpBeforeAnyAnswerIsRejectedOnTheServer) {
  in_fresh_netns(
      [] {
        const Started server = start(std::string(URDMA_RDMACM_PEER) + " hold-server 7195 5000");
        ASSERT_TRUE(wait_output(server, "listening", 10000)) << finish(server, 0).output;
        const ToolRun client =
            run(std::string(URDMA_RDMACM_PEER) + " client 127.0.0.1 7195 abandon", 20000);
        const ToolRun srv = finish(server, 20000);
        EXPECT_EQ(client.exit_code, 0) << client.output;
        EXPECT_NE(client.output.find("abandoned"), std::string::npos) << client.output;
        EXPECT_EQ(srv.exit_code, 0) << srv.output;
        EXPECT_NE(srv.output.find("request\nevent RDMA_CM_EVENT_REJECTED status 4 on the "
                                  "request's id: yes"),
                  std::string::npos)
            << srv.output;
        EXPECT_NE(srv.output.find("accept -1"), std::string::npos) << srv.output;
      },
      60);
}

// A process's rdma_cm outlives its urdmad. The daemon is killed (SIGKILL) while a server
// listens; the server's library starts a new one and hands its slot over (README "Takeover after
// a restart"), reopens its MAD channel and its GID watcher with it, and the listen is registered
// again. An address added afterwards reaches the server's GID table through the new daemon: a
// client connecting to that address is accepted and its SEND arrives. Before, the CM thread
// and the GID watcher stopped when the daemon hung up: no mad-channel connection came back and
// the REQ went unanswered.
TEST(CmTeardown, AListenerAcceptsAfterUrdmadIsKilledAndTakenOver) {
  in_fresh_netns(
      [] {
        setenv("URDMA_TAKEOVER_GRACE_MS", "300", 1);
        const Started server = start(std::string(URDMA_RDMACM_PEER) + " recv-server 7194");
        ASSERT_TRUE(wait_output(server, "listening", 10000)) << finish(server, 0).output;
        const auto before = test::view_daemon();
        ASSERT_TRUE(before);
        const pid_t peer = before->slot_holder();
        ASSERT_GT(peer, 0);
        ASSERT_TRUE(before->has(peer, daemon::ClientRole::kMadChannel));
        ASSERT_TRUE(before->has(peer, daemon::ClientRole::kGidWatcher));
        ASSERT_EQ(kill(before->pid, SIGKILL), 0);
        const auto after = test::wait_daemon(
            [&](const test::DaemonView& v) {
              return v.pid != before->pid && v.takeover == daemon::kTakeoverDone &&
                     v.has(peer, daemon::ClientRole::kSlotHolder) &&
                     v.has(peer, daemon::ClientRole::kMadChannel) &&
                     v.has(peer, daemon::ClientRole::kGidWatcher);
            },
            10000);
        ASSERT_TRUE(after) << "no new daemon with the server's slot, MAD channel and GID watcher";
        ASSERT_EQ(std::system("ip addr add 10.57.0.1/32 dev lo"), 0);
        const ToolRun client = finish(
            start(std::string(URDMA_RDMACM_PEER) + " establish-client 10.57.0.1 7194 taken-over"),
            30000);
        const ToolRun srv = finish(server, 20000);
        EXPECT_EQ(client.exit_code, 0) << client.output << "\n--- server:\n" << srv.output;
        EXPECT_EQ(srv.exit_code, 0) << srv.output;
        EXPECT_NE(client.output.find("established\nsend status success"), std::string::npos)
            << client.output;
        EXPECT_NE(srv.output.find("recv status success byte_len 11 data 'taken-over'"),
                  std::string::npos)
            << srv.output;
      },
      90);
}

// --- urdmad alone -----------------------------------------------------------------------------

using daemon::Client;
using daemon::Slot;
using Mad = daemon::CmMad;

const net::Address kLoopback = net::Address::from_v4(127, 0, 0, 1);
constexpr uint16_t kPort = 4791;  // a fresh namespace: the real port

int connect_client(Client* c) {
  daemon::ClientOptions o;
  o.timeout_ms = 5000;
  std::string detail;
  return Client::connect_or_spawn(o, c, &detail);
}

// A slot and its MAD channel: what a process's librdmacm holds.
struct Process {
  Client control, channel;
  Slot slot;
  int open() {
    if (int e = connect_client(&control)) return e;
    if (int e = control.acquire_slot(&slot)) return e;
    if (int e = connect_client(&channel)) return e;
    return channel.open_mad_channel(slot.info.slot);
  }
  uint32_t comm_id(uint32_t low) const { return daemon::comm_id_for_slot(slot.info.slot, low); }
  // Sends `mad` to QP1 at 127.0.0.1 from the slot's socket, as librdmacm does.
  bool send(const Mad& mad) const {
    std::array<uint8_t, gsi::kGmpBytes> buf{};
    const size_t n = gsi::build_gmp(buf, mad, 0, {kLoopback, kPort}, {kLoopback, kPort});
    sockaddr_storage to{};
    const socklen_t len = net::Endpoint{kLoopback, kPort}.to_sockaddr(slot.info.family, to);
    return n && sendto(slot.fd.get(), buf.data(), n, 0, reinterpret_cast<sockaddr*>(&to), len) ==
                    static_cast<ssize_t>(n);
  }
  // The next datagram the daemon hands to the channel, its ICRC checked for the flow it names.
  std::optional<std::vector<uint8_t>> next(int timeout_ms) {
    pollfd p{channel.fd(), POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1) return std::nullopt;
    daemon::MadDelivery info{};
    std::vector<uint8_t> d;
    if (channel.next_mad(&info, &d) != 0) return std::nullopt;
    const net::Endpoint src{net::Address(std::to_array(info.src_address)), info.src_port};
    const net::Endpoint dst{net::Address(std::to_array(info.dst_address)), info.dst_port};
    EXPECT_TRUE(gsi::icrc_ok(d, src, dst)) << "sealed for the flow it came on";
    return d;
  }
};

template <class View, class Fill>
Mad cm(Fill fill, uint64_t tid) {
  Mad m{};
  fill(wire::init_cm_message<View>(std::span<uint8_t, wire::kMadSize>(m), tid));
  return m;
}

// The CM message of a GMP datagram from the daemon, after checking its BTH and DETH are those
// of a GMP (as rxe's in tests/data/rxe-guest-to-host.pcap).
template <class View>
std::optional<View> gmp_message(const std::vector<uint8_t>& d) {
  const auto p = wire::parse_packet(d);
  if (!p || p->opcode() != wire::op::kUdSendOnly || !p->deth()) return std::nullopt;
  EXPECT_EQ(p->bth().pkey(), wire::kDefaultPkey);
  EXPECT_EQ(p->bth().dest_qp(), wire::kMadGsiQpn);
  EXPECT_EQ(p->bth().ack_req(), 1);
  EXPECT_EQ(p->deth()->qkey(), wire::kMadGsiQKey);
  EXPECT_EQ(p->deth()->src_qp(), wire::kMadGsiQpn);
  const wire::CmParse cm = wire::parse_cm(p->payload().first(wire::kMadSize));
  if (!cm.ok() || !std::holds_alternative<View>(cm.message.view)) return std::nullopt;
  // The view points into `d`, which the caller keeps.
  return std::get<View>(cm.message.view);
}

TEST(CmTeardown, UrdmadReleasesADeadProcesssConnectionAndAnswersForIt) {
  setenv("URDMA_DAEMON", URDMA_DAEMON_PATH, 1);
  setenv("URDMA_IDLE_TIMEOUT_MS", "10000", 1);
  in_fresh_netns(
      [] {
        // A: holds a connection to B, which it reports to urdmad as librdmacm does once it is
        // established (kConnUp), then dies. A second REP, for a connection A never reports (a
        // forged one, say), must not make urdmad send anything.
        Pipe pipe;
        const pid_t a = fork_process([&pipe] {
          Process p;
          if (p.open() != 0) return 1;
          pipe.put(uint32_t{p.slot.info.slot});
          const auto rep = p.next(5000);
          if (!rep) return 2;  // the REP reached A
          const auto m = gmp_message<wire::CmRepView>(*rep);
          if (!m) return 3;
          daemon::ConnRecord conn{.local_comm_id = m->remote_comm_id(),
                                  .remote_comm_id = m->local_comm_id(),
                                  .remote_qpn = m->local_qpn()};
          std::memcpy(conn.local_address, kLoopback.bytes().data(), 16);
          std::memcpy(conn.peer_address, kLoopback.bytes().data(), 16);
          if (p.control.conn_up(conn) != 0) return 4;
          if (!p.next(5000)) return 5;  // the REP A never reports
          pipe.put(uint32_t{1});
          pause();
          return 0;
        });
        Process b;
        ASSERT_EQ(b.open(), 0);
        uint32_t a_slot = 0, got_rep = 0;
        ASSERT_TRUE(pipe.get(&a_slot));
        const uint32_t a_id = daemon::comm_id_for_slot(a_slot, 5), b_id = b.comm_id(7);
        ASSERT_TRUE(b.send(cm<wire::CmRep>(
            [&](wire::CmRep r) {
              r.set_local_comm_id(b_id);
              r.set_remote_comm_id(a_id);
              r.set_local_qpn(0x1234);  // B's QP
            },
            0x42)));
        ASSERT_TRUE(b.send(cm<wire::CmRep>(
            [&](wire::CmRep r) {
              r.set_local_comm_id(b.comm_id(10));
              r.set_remote_comm_id(daemon::comm_id_for_slot(a_slot, 9));
              r.set_local_qpn(0x5678);
            },
            0x43)));
        ASSERT_TRUE(pipe.get(&got_rep));
        ASSERT_EQ(kill(a, SIGKILL), 0);
        ASSERT_TRUE(wait_exit(a, 5000));

        // B gets urdmad's DREQ on A's behalf.
        const auto dreq_dgram = b.next(5000);
        ASSERT_TRUE(dreq_dgram) << "no DREQ";
        const auto dreq = gmp_message<wire::CmDreqView>(*dreq_dgram);
        ASSERT_TRUE(dreq);
        EXPECT_EQ(dreq->local_comm_id(), a_id);
        EXPECT_EQ(dreq->remote_comm_id(), b_id);
        EXPECT_EQ(dreq->remote_qpn_eecn(), 0x1234u) << "B's QP, which B checks";
        // B answers (its DREP is urdmad's, not forwarded anywhere).
        ASSERT_TRUE(b.send(cm<wire::CmDrep>(
            [&](wire::CmDrep r) {
              r.set_local_comm_id(b_id);
              r.set_remote_comm_id(a_id);
            },
            dreq->header().transaction_id())));

        // B's DREQ for another connection of A's (B started its disconnect as A died): urdmad
        // answers it with a DREP, TID echoed.
        ASSERT_TRUE(b.send(cm<wire::CmDreq>(
            [&](wire::CmDreq r) {
              r.set_local_comm_id(b.comm_id(8));
              r.set_remote_comm_id(daemon::comm_id_for_slot(a_slot, 6));
            },
            0x77)));
        const auto drep_dgram = b.next(5000);
        ASSERT_TRUE(drep_dgram) << "no DREP";
        const auto drep = gmp_message<wire::CmDrepView>(*drep_dgram);
        ASSERT_TRUE(drep);
        EXPECT_EQ(drep->header().transaction_id(), 0x77u);
        EXPECT_EQ(drep->local_comm_id(), daemon::comm_id_for_slot(a_slot, 6));
        EXPECT_EQ(drep->remote_comm_id(), b.comm_id(8));

        // B's REQ to a service nobody listens on: REJ reason 8 when the listen wait ends.
        ASSERT_TRUE(b.send(cm<wire::CmReq>(
            [&](wire::CmReq r) {
              r.set_local_comm_id(b.comm_id(9));
              r.set_service_id(0x0000000001060000 | 7195);
            },
            0x99)));
        const auto rej_dgram = b.next(5000);
        ASSERT_TRUE(rej_dgram) << "no REJ";
        const auto rej = gmp_message<wire::CmRejView>(*rej_dgram);
        ASSERT_TRUE(rej);
        EXPECT_EQ(rej->header().transaction_id(), 0x99u);
        EXPECT_EQ(rej->local_comm_id(), 0u);
        EXPECT_EQ(rej->remote_comm_id(), b.comm_id(9));
        EXPECT_EQ(rej->message_rejected(), static_cast<uint8_t>(wire::CmRejMessage::kReq));
        EXPECT_EQ(rej->reason(), static_cast<uint16_t>(wire::CmRejReason::kInvalidServiceId));

        daemon::StatusInfo st{};
        ASSERT_EQ(b.control.query_status(&st), 0);
        EXPECT_EQ(st.cm_dreqs_sent, 1u);
        EXPECT_EQ(st.cm_dreps_sent, 1u);
        EXPECT_EQ(st.cm_rejects_sent, 1u);
        EXPECT_FALSE(b.next(0)) << "nothing else came to B";
      },
      60);
}

}  // namespace
}  // namespace urdma::process_test
