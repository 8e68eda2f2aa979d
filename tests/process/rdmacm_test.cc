// librdmacm.so.1 over urdma (src/cm/librdmacm): the seed's examples (built against Debian's
// librdmacm) and Debian's rping run unmodified with LD_LIBRARY_PATH naming the build's lib/
// directory, so the loader gives them OUR librdmacm and libibverbs; urdmad starts by itself.
// Every test body runs in a fresh network namespace (netns_harness.h); the two-host test adds a
// second namespace joined by a veth pair (10.90.0.0/24), with a urdmad of its own.
//
// What is checked is what the programs print and how they exit: the server of each example
// pair prints the message the client moved with RDMA WRITE / SEND / READ, and rping -V (its own
// buffer validation) completes the number of pings asked for.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "netns_harness.h"
#include "tool_run.h"

namespace urdma::process_test {
namespace {

struct Pair {
  const char* server;
  const char* client;
  const char* server_says;  // what the server prints when the client's data arrived
  const char* client_says;
};

constexpr Pair kPairs[] = {
    {URDMA_WRITE_SERVER, URDMA_WRITE_CLIENT, "Received data: Hello from RDMA client!",
     "RDMA Write completed successfully!"},
    {URDMA_SEND_SERVER, URDMA_SEND_CLIENT, "Received 24 bytes: Hello from RDMA client!",
     "SEND completed successfully! Sent message: Hello from RDMA client!"},
    {URDMA_READ_SERVER, URDMA_READ_CLIENT, "Client disconnected",
     "RDMA Read completed successfully! Read: Hello from RDMA server!"},
};

void run_pair(const Pair& p, const std::string& server_addr) {
  SCOPED_TRACE(p.server);
  const Started server = start(p.server);
  ASSERT_TRUE(wait_output(server, "Server listening on port", 10000))
      << finish(server, 0).output;
  const ToolRun client = finish(start(std::string(p.client) + " " + server_addr), 20000);
  const ToolRun srv = finish(server, 20000);
  EXPECT_EQ(client.exit_code, 0) << client.output << "\n--- server:\n" << srv.output;
  EXPECT_NE(client.output.find(p.client_says), std::string::npos) << client.output;
  EXPECT_EQ(srv.exit_code, 0) << srv.output;
  EXPECT_NE(srv.output.find(p.server_says), std::string::npos) << srv.output;
}

TEST(Rdmacm, SeedExamplesBetweenTwoProcesses) {
  in_fresh_netns([] {
    for (const Pair& p : kPairs) run_pair(p, "127.0.0.1");
  }, 90);
}

// The seed's write pair exchanges exactly this message: the read pair reads the server's.
TEST(Rdmacm, WritePairPrintsTheSeedsMessage) {
  in_fresh_netns([] {
    const Started server = start(URDMA_WRITE_SERVER);
    ASSERT_TRUE(wait_output(server, "Server listening on port 51216", 10000));
    const ToolRun client = finish(start(std::string(URDMA_WRITE_CLIENT) + " 127.0.0.1"), 20000);
    const ToolRun srv = finish(server, 20000);
    EXPECT_EQ(count(srv.output, "Received data: Hello from RDMA client!\n"), 1) << srv.output;
    EXPECT_NE(client.output.find("Sent message: Hello from RDMA client!"), std::string::npos)
        << client.output;
  });
}

// rping -V checks every ping's buffer itself and fails on a mismatch; -v prints them.
TEST(Rdmacm, RpingVerifiesTenPings) {
  if (std::system("command -v rping >/dev/null 2>&1") != 0) GTEST_SKIP() << "no rping";
  in_fresh_netns([] {
    const Started server = start("rping -s -V -v -C 10 -a 127.0.0.1 -p 7174");
    usleep(500000);
    const ToolRun client = finish(start("rping -c -V -v -C 10 -a 127.0.0.1 -p 7174"), 30000);
    const ToolRun srv = finish(server, 20000);
    EXPECT_EQ(client.exit_code, 0) << client.output << "\n--- server:\n" << srv.output;
    EXPECT_EQ(srv.exit_code, 0) << srv.output;
    EXPECT_EQ(count(client.output, "ping data: rdma-ping-"), 10) << client.output;
    EXPECT_EQ(count(client.output, "mismatch"), 0) << client.output;
    EXPECT_EQ(count(srv.output, "server ping data: rdma-ping-"), 10) << srv.output;
  }, 60);
}

// ucmatose: several connections at once, data both ways, each checked by the tool itself.
TEST(Rdmacm, UcmatoseFourConnections) {
  if (std::system("command -v ucmatose >/dev/null 2>&1") != 0) GTEST_SKIP() << "no ucmatose";
  in_fresh_netns([] {
    const Started server = start("ucmatose -c 4 -C 10");
    usleep(500000);
    const ToolRun client = finish(start("ucmatose -s 127.0.0.1 -c 4 -C 10"), 30000);
    const ToolRun srv = finish(server, 20000);
    EXPECT_EQ(client.exit_code, 0) << client.output << "\n--- server:\n" << srv.output;
    EXPECT_EQ(srv.exit_code, 0) << srv.output;
    EXPECT_NE(client.output.find("data transfers complete"), std::string::npos) << client.output;
    EXPECT_NE(srv.output.find("return status 0"), std::string::npos) << srv.output;
    EXPECT_NE(client.output.find("return status 0"), std::string::npos) << client.output;
  }, 60);
}

// IPv6: rping over ::1 (the GID is the address itself).
TEST(Rdmacm, RpingOverIpv6Loopback) {
  if (std::system("command -v rping >/dev/null 2>&1") != 0) GTEST_SKIP() << "no rping";
  in_fresh_netns([] {
    const Started server = start("rping -s -V -C 5 -a ::1 -p 7177");
    usleep(500000);
    const ToolRun client = finish(start("rping -c -V -v -C 5 -a ::1 -p 7177"), 30000);
    const ToolRun srv = finish(server, 20000);
    EXPECT_EQ(client.exit_code, 0) << client.output << "\n--- server:\n" << srv.output;
    EXPECT_EQ(srv.exit_code, 0) << srv.output;
    EXPECT_EQ(count(client.output, "ping data: rdma-ping-"), 5) << client.output;
  }, 60);
}

// Many connections at once: 50, then 200, establish, move data and disconnect cleanly. The
// server's 200 DREQs reach urdmad as one burst; it used to lose some (slot 0's receive buffer
// overflowed, the client's MAD channel was full), leaving them to the CM's retransmissions,
// and about one run in ten a side waited forever for a DISCONNECTED (daemon/mad_backlog.h).
void run_ucmatose(int connections) {
  SCOPED_TRACE(connections);
  const std::string c = std::to_string(connections);
  const Started server = start("ucmatose -c " + c);
  usleep(500000);
  const ToolRun client = finish(start("ucmatose -s 127.0.0.1 -c " + c), 60000);
  const ToolRun srv = finish(server, 30000);
  EXPECT_EQ(client.exit_code, 0) << client.output << "\n--- server:\n" << srv.output;
  EXPECT_EQ(srv.exit_code, 0) << srv.output;
  EXPECT_NE(client.output.find("return status 0"), std::string::npos) << client.output;
  EXPECT_NE(srv.output.find("disconnected"), std::string::npos) << srv.output;
  EXPECT_NE(srv.output.find("return status 0"), std::string::npos) << srv.output;
}

TEST(Rdmacm, Ucmatose50And200Connections) {
  if (std::system("command -v ucmatose >/dev/null 2>&1") != 0) GTEST_SKIP() << "no ucmatose";
  in_fresh_netns([] {
    run_ucmatose(50);
    run_ucmatose(200);
  }, 110);
}

// udaddy: UD QPs, the server's QPN and Q_Key found by SIDR, datagrams both ways.
TEST(Rdmacm, UdaddySidrAndDatagrams) {
  if (std::system("command -v udaddy >/dev/null 2>&1") != 0) GTEST_SKIP() << "no udaddy";
  in_fresh_netns([] {
    const Started server = start("udaddy -c 2 -C 10");
    usleep(500000);
    const ToolRun client = finish(start("udaddy -s 127.0.0.1 -c 2 -C 10"), 30000);
    const ToolRun srv = finish(server, 20000);
    EXPECT_EQ(client.exit_code, 0) << client.output << "\n--- server:\n" << srv.output;
    EXPECT_EQ(srv.exit_code, 0) << srv.output;
    EXPECT_NE(client.output.find("data transfers complete"), std::string::npos) << client.output;
    EXPECT_NE(srv.output.find("return status 0"), std::string::npos) << srv.output;
  }, 60);
}

// rdma_server/rdma_client: the synchronous API (NULL channel, rdma_getaddrinfo, rdma_create_ep,
// rdma_get_request, implicit CQs) and rdma_verbs.h's inline helpers.
TEST(Rdmacm, RdmaServerAndClientSynchronousApi) {
  if (std::system("command -v rdma_server >/dev/null 2>&1") != 0) GTEST_SKIP() << "no rdma_server";
  in_fresh_netns([] {
    const Started server = start("rdma_server -p 7472");
    usleep(500000);
    const ToolRun client = finish(start("rdma_client -s 127.0.0.1 -p 7472"), 30000);
    const ToolRun srv = finish(server, 20000);
    EXPECT_EQ(client.exit_code, 0) << client.output << "\n--- server:\n" << srv.output;
    EXPECT_NE(client.output.find("rdma_client: end 0"), std::string::npos) << client.output;
    EXPECT_NE(srv.output.find("rdma_server: end 0"), std::string::npos) << srv.output;
  }, 60);
}

// The server rejects with private data: the client's REJECTED event carries it, and the reject
// reason (IB_CM_REJ_CONSUMER_DEFINED, 28) as its status.
TEST(Rdmacm, RejectWithPrivateDataReachesTheClient) {
  in_fresh_netns([] {
    const Started server = start(std::string(URDMA_RDMACM_PEER) + " reject-server 7180 no-room");
    ASSERT_TRUE(wait_output(server, "listening", 10000)) << finish(server, 0).output;
    const ToolRun client =
        finish(start(std::string(URDMA_RDMACM_PEER) + " client 127.0.0.1 7180"), 20000);
    const ToolRun srv = finish(server, 10000);
    EXPECT_EQ(srv.exit_code, 0) << srv.output;
    EXPECT_NE(srv.output.find("rejected"), std::string::npos) << srv.output;
    EXPECT_EQ(client.exit_code, 0) << client.output;
    EXPECT_NE(client.output.find("event RDMA_CM_EVENT_REJECTED status 28 private_data 'no-room'"),
              std::string::npos)
        << client.output;
  });
}

// RDMA_CM_EVENT_CONNECT_ERROR, as librdmacm makes it (ucma_process_conn_resp): the client's QP
// (rdma_create_qp's) cannot move to RTR after the REP — it was put in ERR before rdma_connect —
// so the client gets CONNECT_ERROR with status -1 and sends no RTU; destroying its id sends a
// REJ (consumer defined, 28), which the server sees as REJECTED instead of ESTABLISHED.
TEST(Rdmacm, AQpThatCannotMoveAfterTheRepIsAConnectError) {
  in_fresh_netns([] {
    const Started server = start(std::string(URDMA_RDMACM_PEER) + " recv-server 7182");
    ASSERT_TRUE(wait_output(server, "listening", 10000)) << finish(server, 0).output;
    const ToolRun client =
        finish(start(std::string(URDMA_RDMACM_PEER) + " client 127.0.0.1 7182 err-qp"), 20000);
    const ToolRun srv = finish(server, 20000);
    EXPECT_EQ(client.exit_code, 0) << client.output << "\n--- server:\n" << srv.output;
    EXPECT_NE(client.output.find("event RDMA_CM_EVENT_CONNECT_ERROR status -1 private_data "
                                 "'accepted'"),
              std::string::npos)
        << client.output;
    EXPECT_NE(srv.output.find("expected RDMA_CM_EVENT_ESTABLISHED, got RDMA_CM_EVENT_REJECTED "
                              "status 28"),
              std::string::npos)
        << srv.output;
  });
}

// rdma_establish(3): a client that created its QP itself (no rdma_create_qp) gets
// CONNECT_RESPONSE with the server's QPN and private data, moves the QP to RTS with
// rdma_init_qp_attr(3) + ibv_modify_qp, and rdma_establish sends the RTU: the server sees
// ESTABLISHED and its RECV gets the client's SEND.
TEST(Rdmacm, EstablishAfterConnectResponseOnTheApplicationsOwnQp) {
  in_fresh_netns([] {
    const Started server = start(std::string(URDMA_RDMACM_PEER) + " recv-server 7181");
    ASSERT_TRUE(wait_output(server, "listening", 10000)) << finish(server, 0).output;
    const ToolRun client = finish(
        start(std::string(URDMA_RDMACM_PEER) + " establish-client 127.0.0.1 7181 own-qp-data"),
        20000);
    const ToolRun srv = finish(server, 20000);
    EXPECT_EQ(client.exit_code, 0) << client.output << "\n--- server:\n" << srv.output;
    EXPECT_EQ(srv.exit_code, 0) << srv.output;
    unsigned server_qpn = 0;
    const size_t at = srv.output.find("server qp_num ");
    ASSERT_NE(at, std::string::npos) << srv.output;
    server_qpn = static_cast<unsigned>(std::stoul(srv.output.substr(at + 14)));
    EXPECT_NE(client.output.find("event RDMA_CM_EVENT_CONNECT_RESPONSE status 0 qp_num " +
                                 std::to_string(server_qpn) + " private_data 'accepted'"),
              std::string::npos)
        << client.output;
    EXPECT_NE(client.output.find("established\nsend status success"), std::string::npos)
        << client.output;
    EXPECT_NE(srv.output.find("event RDMA_CM_EVENT_ESTABLISHED"), std::string::npos) << srv.output;
    EXPECT_NE(srv.output.find("recv status success byte_len 12 data 'own-qp-data'"),
              std::string::npos)
        << srv.output;
  });
}

// rdma_create_srq(3): the server's SRQ comes from rdma_create_srq on the request's id (the id's
// PD), rdma_create_qp puts the QP on it, and eight SENDs land in the SRQ's RECVs with the
// client's bytes; the QP goes before the SRQ, which then leaves the id. The client's
// rdma_set_option TOS 0x48 (before rdma_resolve_route) is the traffic class of its route and
// of both connected QPs (the REQ carries it), its ACK_TIMEOUT 14 the timeout of its QP instead
// of the path's 19 (the server's, which set none); a TOS of the wrong size is EINVAL.
TEST(Rdmacm, SrqFromRdmaCreateSrqAndOptionsThatTakeEffect) {
  in_fresh_netns([] {
    const Started server = start(std::string(URDMA_RDMACM_PEER) + " srq-server 7182 8 id");
    ASSERT_TRUE(wait_output(server, "listening", 10000)) << finish(server, 0).output;
    const ToolRun client =
        finish(start(std::string(URDMA_RDMACM_PEER) + " send-client 127.0.0.1 7182 8 72 14"),
               20000);
    const ToolRun srv = finish(server, 20000);
    EXPECT_EQ(client.exit_code, 0) << client.output << "\n--- server:\n" << srv.output;
    EXPECT_EQ(srv.exit_code, 0) << srv.output;
    const size_t at = client.output.find("checksum ");
    ASSERT_NE(at, std::string::npos) << client.output;
    const std::string checksum = client.output.substr(at + 9, 8);
    EXPECT_NE(client.output.find("sent 8 failed 0 bytes 512 checksum"), std::string::npos)
        << client.output;
    EXPECT_NE(srv.output.find("srq created: yes, pd set"), std::string::npos) << srv.output;
    EXPECT_NE(srv.output.find("qp on the id's srq: yes"), std::string::npos) << srv.output;
    EXPECT_NE(srv.output.find("received 8 failed 0 bytes 512 checksum " + checksum),
              std::string::npos)
        << srv.output << "\n--- client:\n" << client.output;
    EXPECT_NE(srv.output.find("srq destroyed: yes"), std::string::npos) << srv.output;
    EXPECT_NE(client.output.find("tos optlen 4: errno 22"), std::string::npos) << client.output;
    EXPECT_NE(client.output.find("route traffic_class 72"), std::string::npos) << client.output;
    EXPECT_NE(client.output.find("client traffic_class 72 timeout 14"), std::string::npos)
        << client.output;
    EXPECT_NE(srv.output.find("server traffic_class 72 timeout 19"), std::string::npos)
        << srv.output;
  });
}

// rdma_destroy_ep takes the endpoint's SRQ with its QP and id (rdma-core's order): the PD they
// were on is free after it.
TEST(Rdmacm, DestroyEpDestroysTheSrq) {
  in_fresh_netns([] {
    const Started server = start(std::string(URDMA_RDMACM_PEER) + " srq-server 7183 2 ep");
    ASSERT_TRUE(wait_output(server, "listening", 10000)) << finish(server, 0).output;
    const ToolRun client =
        finish(start(std::string(URDMA_RDMACM_PEER) + " send-client 127.0.0.1 7183 2 -1 -1"),
               20000);
    const ToolRun srv = finish(server, 20000);
    EXPECT_EQ(client.exit_code, 0) << client.output << "\n--- server:\n" << srv.output;
    EXPECT_EQ(srv.exit_code, 0) << srv.output;
    EXPECT_NE(srv.output.find("srq created: yes, pd set"), std::string::npos) << srv.output;
    EXPECT_NE(srv.output.find("received 2 failed 0 bytes 128"), std::string::npos) << srv.output;
    EXPECT_NE(srv.output.find("pd dealloc after rdma_destroy_ep: 0"), std::string::npos)
        << srv.output;
    EXPECT_NE(client.output.find("client traffic_class 0 timeout 19"), std::string::npos)
        << client.output;
  });
}

// rdma_migrate_id(3): after the move, the id's events arrive on the new channel, none on the old.
TEST(Rdmacm, MigrateIdMovesLaterEvents) {
  in_fresh_netns([] {
    const ToolRun r = run(std::string(URDMA_RDMACM_PEER) + " migrate 127.0.0.1 acked", 20000);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("id channel is the new one: yes\n"
                            "new channel: RDMA_CM_EVENT_ROUTE_RESOLVED\n"
                            "old channel after: nothing\n"),
              std::string::npos)
        << r.output;
  });
}

// rdma_migrate_id(3): "moves any pending events associated with the rdma_cm_id to the new
// channel".
TEST(Rdmacm, MigrateIdMovesPendingEvents) {
  in_fresh_netns([] {
    const ToolRun r = run(std::string(URDMA_RDMACM_PEER) + " migrate 127.0.0.1 pending", 20000);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("id channel is the new one: yes\n"
                            "pending event on the old channel: no\n"
                            "new channel: RDMA_CM_EVENT_ADDR_RESOLVED\n"
                            "new channel: RDMA_CM_EVENT_ROUTE_RESOLVED\n"
                            "old channel after: nothing\n"),
              std::string::npos)
        << r.output;
  });
}

// rdma_destroy_id(3): "will block until related events have been acknowledged". An event whose
// wake-up a reader already took from the channel (rdma_get_cm_event's first step) is that
// reader's: rdma_destroy_id waits for its ack instead of dropping it. Dropped, the reader found
// nothing and read again — rping's CM thread, on a channel its main thread then closed:
// "rdma_get_cm_event: Bad file descriptor" (seen once in RpingVerifiesTenPings under load).
TEST(Rdmacm, DestroyIdLeavesAnEventAReaderTookToThatReader) {
  in_fresh_netns([] {
    const ToolRun r = run(std::string(URDMA_RDMACM_PEER) + " destroy-taken 127.0.0.1", 20000);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output,
              "rdma_destroy_id waits\n"
              "reader got RDMA_CM_EVENT_ADDR_RESOLVED of the destroyed id: yes\n"
              "rdma_destroy_id 0\n")
        << r.output;
  });
}

// rdma_migrate_id(3): "If the channel parameter is NULL, the specified rdma_cm_id will be placed
// into synchronous operation mode": rdma_resolve_route then returns with the route resolved.
TEST(Rdmacm, MigrateIdToNullIsSynchronous) {
  in_fresh_netns([] {
    const ToolRun r = run(std::string(URDMA_RDMACM_PEER) + " migrate 127.0.0.1 sync", 20000);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("synchronous rdma_resolve_route 0, route paths 1\n"
                            "old channel after: nothing\n"),
              std::string::npos)
        << r.output;
  });
}

// rdma_bind_addr(3) on an address and port another id holds: -1, errno EADDRINUSE.
TEST(Rdmacm, BindToAPortAlreadyBoundIsEaddrinuse) {
  in_fresh_netns([] {
    const ToolRun r = run(std::string(URDMA_RDMACM_PEER) + " bind-twice 7182", 20000);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("second bind -1 errno EADDRINUSE"), std::string::npos) << r.output;
  });
}

// rdma_get_devices(3): a NULL-terminated array of opened devices, as many as num_devices says,
// each usable (ibv_query_device succeeds on it).
TEST(Rdmacm, GetDevicesListsOpenedDevices) {
  in_fresh_netns([] {
    const ToolRun r = run(std::string(URDMA_RDMACM_PEER) + " devices", 20000);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("num_devices 1 listed 1"), std::string::npos) << r.output;
    EXPECT_EQ(count(r.output, " query 0\n"), 1) << r.output;
    EXPECT_NE(r.output.find("device urdma"), std::string::npos) << r.output;
  });
}

// Both libraries loaded with dlopen and unloaded again while the process goes on, as Open MPI
// unloads its OFI MTL (and libfabric, and with it ours) at MPI_Finalize: they stay mapped (linked
// with -z nodelete), because the threads the device started (engine, GID watcher, daemon keeper,
// rdma_cm's MAD thread) live until exit. Unmapped, the process died of SIGSEGV in the keeper's
// next wake-up (Open MPI's ranks did, in 4 runs of 7).
TEST(Rdmacm, LibrariesStayMappedAfterDlcloseWhileTheirThreadsRun) {
  in_fresh_netns([] {
    const ToolRun r = run(URDMA_DLCLOSE_PEER, 20000);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("opened urdma0\nbound 0\n"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("after dlclose: libibverbs mapped, librdmacm mapped\n"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("alive after 3 s\n"), std::string::npos) << r.output;
  });
}

// Two hosts: each server in a namespace of its own (B, with its own urdmad), its client in the
// test's namespace (A), a veth pair between them (10.90.0.1 - 10.90.0.2).
struct TwoHostStep {
  std::string server;                     // run in B
  const char* ready;                      // what the server prints when it listens; nullptr: 0.5 s
  std::string client;                     // run in A against 10.90.0.2
  std::vector<std::string> server_says;   // each must appear in the server's output
  std::vector<std::string> client_says;   // each must appear in the client's output
  std::pair<const char*, int> client_count{nullptr, 0};  // a line the client prints N times
  unsigned tcp_port = 0;  // with no `ready` text: the server listens on this TCP port first
};

void run_between_two_namespaces(const std::vector<TwoHostStep>& steps) {
  Pipe result;
  const pid_t b = start_second_host("va", "vb", "10.90.0", [&] {
    int failed = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      const TwoHostStep& st = steps[i];
      const Started server = start(st.server);
      bool listening = true;
      if (st.ready) {
        listening = wait_output(server, st.ready, 10000);
      } else if (st.tcp_port) {
        listening = wait_listening(st.tcp_port, 10000);
      } else {
        usleep(500000);  // these tools say nothing when they listen
      }
      if (!listening && !failed) failed = 20 + static_cast<int>(i);
      result.put('r');
      const ToolRun srv = finish(server, 30000);
      bool ok = srv.exit_code == 0;
      for (const std::string& says : st.server_says) ok &= srv.output.find(says) != std::string::npos;
      if (!ok) {
        std::fprintf(stderr, "B's %s (exit %d):\n%s\n", st.server.c_str(), srv.exit_code,
                     srv.output.c_str());
        if (!failed) failed = 40 + static_cast<int>(i);
      }
    }
    return failed;
  });
  for (const TwoHostStep& st : steps) {
    SCOPED_TRACE(st.client);
    char ch;
    ASSERT_TRUE(result.get(&ch, 20000)) << "B's server never started";
    const ToolRun client = finish(start(st.client), 40000);
    EXPECT_EQ(client.exit_code, 0) << client.output;
    for (const std::string& says : st.client_says)
      EXPECT_NE(client.output.find(says), std::string::npos) << says << "\n" << client.output;
    if (st.client_count.first) {
      EXPECT_EQ(count(client.output, st.client_count.first), st.client_count.second)
          << client.output;
    }
  }
  const std::optional<int> status = wait_exit(b, 40000);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "B exited " << (WIFEXITED(*status) ? WEXITSTATUS(*status) : -1)
      << " (20+i: step i's server never listened; 40+i: its output or exit was wrong)";
}

// The seed's three example pairs and rping -V.
TEST(Rdmacm, ExamplesAndRpingBetweenTwoNamespaces) {
  in_fresh_netns([] {
    std::vector<TwoHostStep> steps;
    for (const Pair& p : kPairs)
      steps.push_back({p.server, "Server listening on port", std::string(p.client) + " 10.90.0.2",
                       {p.server_says}, {p.client_says}});
    steps.push_back({"rping -s -V -C 5 -a 10.90.0.2 -p 7190", nullptr,
                     "rping -c -V -v -C 5 -a 10.90.0.2 -p 7190", {}, {},
                     {"ping data: rdma-ping-", 5}});
    run_between_two_namespaces(steps);
  }, 110);
}

// ucmatose (RC, several connections), udaddy (UD by SIDR), rdma_server/rdma_client (the
// synchronous API), with the checks of their one-host tests above.
TEST(Rdmacm, RdmacmUtilsBetweenTwoNamespaces) {
  for (const char* tool : {"ucmatose", "udaddy", "rdma_server"})
    if (!have_tool(tool)) GTEST_SKIP() << "no " << tool;
  in_fresh_netns([] {
    run_between_two_namespaces({
        {"ucmatose -c 4 -C 10", nullptr, "ucmatose -s 10.90.0.2 -c 4 -C 10",
         {"return status 0"}, {"data transfers complete", "return status 0"}},
        {"udaddy -c 2 -C 10", nullptr, "udaddy -s 10.90.0.2 -c 2 -C 10", {"return status 0"},
         {"data transfers complete"}},
        {"rdma_server -p 7472", nullptr, "rdma_client -s 10.90.0.2 -p 7472",
         {"rdma_server: end 0"}, {"rdma_client: end 0"}},
    });
  }, 110);
}

// libfabric 1.17's verbs provider (Debian's libfabric1, built on rdma-core) on our libraries:
// fi_pingpong's msg endpoint (verbs over rdma_cm), rdm endpoint (verbs;ofi_rxm) and dgram
// endpoint (verbs UD) between two namespaces — libfabric passes over loopback interfaces, so it
// needs the veth. Two librdmacm behaviours it depends on: rdma_getaddrinfo with neither node nor
// service answers from the hints (the peer's address a name exchange gave), and rdma_bind_addr to
// "localhost" binds no device (Linux's cma_any_addr), so the server's endpoint takes the
// interface's address. ofi_rxm asks for a CQ of (rx + tx size) × FI_UNIVERSE_SIZE = 262144
// entries, which urdma0's max_cqe (ConnectX's 4194303) allows; rxe's 32767 did not (fi_enable
// failed with -22). The dgram endpoint's address is GID[FI_VERBS_GID_IDX] (0 by default) and
// urdma0's GID 0 is loopback's 127.0.0.1: each side would tell the other to send to 127.0.0.1,
// and the datagrams never leave the sender's namespace (fi_pingpong then waits forever).
// FI_VERBS_GID_IDX names the veth's GID instead.
TEST(Rdmacm, LibfabricVerbsPingpongBetweenTwoNamespaces) {
  if (!have_tool("fi_pingpong")) GTEST_SKIP() << "no fi_pingpong (scripts/deps.sh: libfabric-bin)";
  in_fresh_netns([] {
    // Each side reads its own veth GID's index from ibv_devinfo (under our libraries, which the
    // inner sh inherits from tool_env).
    const auto with_veth_gid = [](const std::string& command) {
      return std::string(R"(sh -c 'export FI_VERBS_GID_IDX=$(ibv_devinfo -v | )"
                         R"(sed -n "s/.*GID\[ *\([0-9]*\)\]:.*::ffff:10\.90\.0\..*/\1/p"); )") +
             "exec " + command + "'";
    };
    run_between_two_namespaces({
        // fi_pingpong's out-of-band exchange: a TCP connection to port 47592.
        {"fi_pingpong -p verbs -e msg", nullptr, "fi_pingpong -p verbs -e msg 10.90.0.2",
         {"=10"}, {}, {"=10 ", 6}, 47592},
        {"fi_pingpong -p verbs -e rdm", nullptr, "fi_pingpong -p verbs -e rdm 10.90.0.2", {"=10"},
         {}, {"=10 ", 6}, 47592},
        // Sizes up to the UD endpoint's max_msg_size, the port's active MTU (1024 over the
        // veth's 1500-byte MTU): three rows.
        {with_veth_gid("fi_pingpong -p verbs -e dgram"), nullptr,
         with_veth_gid("fi_pingpong -p verbs -e dgram 10.90.0.2"), {"=10"}, {}, {"=10 ", 3},
         47592},
    });
    // fi_info lists urdma0 for all three endpoint types.
    const ToolRun info = run("fi_info -p verbs", 20000);
    EXPECT_EQ(info.exit_code, 0) << info.output;
    EXPECT_NE(info.output.find("domain: urdma0\n    version: 117.0\n    type: FI_EP_MSG"),
              std::string::npos)
        << info.output;
    EXPECT_NE(info.output.find("provider: verbs;ofi_rxm\n"), std::string::npos) << info.output;
    EXPECT_NE(info.output.find("type: FI_EP_RDM"), std::string::npos) << info.output;
    EXPECT_NE(info.output.find("domain: urdma0-dgram\n    version: 117.0\n    type: FI_EP_DGRAM"),
              std::string::npos)
        << info.output;
  }, 110);
}

}  // namespace
}  // namespace urdma::process_test
