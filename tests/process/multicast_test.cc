// UD multicast between real processes on our libraries (ibv_attach_mcast, rdma_join_multicast):
// urdmad joins a group on the slot socket of each process that attached a QP to it, the kernel
// hands every such socket a copy of each datagram sent to the group (looped back on this host,
// over the veth pair from another), and each engine gives it to its attached QPs.
//
// urdma_mcast_peer (mcast_peer.cc) is the verbs side: its receivers check every datagram's
// payload (a pattern seeded per datagram) and its GRH (destination = the group). Debian's mckey
// is the rdma_cm side, unmodified.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

#include <cstdlib>
#include <string>

#include "netns_harness.h"
#include "tool_run.h"

namespace urdma::process_test {
namespace {

constexpr int kCount = 50;

std::string peer(const std::string& args) {
  return std::string(URDMA_MCAST_PEER) + " " + args;
}

// Two receivers attached, one attached and detached again, one sender: every attached receiver
// gets all kCount datagrams intact, the detached one nothing.
TEST(Multicast, TwoAttachedReceiversGetEveryDatagramAndADetachedOneNothing) {
  in_fresh_netns(
      [] {
        // A veth pair inside the namespace: a multicast-capable interface besides loopback.
        ASSERT_TRUE(add_local_veth("mc", "10.92.0.1/24"));
        const Started r1 = start(peer("recv 230.92.0.5 10.92.0.1 50 7"));
        const Started r2 = start(peer("recv 230.92.0.5 10.92.0.1 50 7"));
        const Started gone = start(peer("recv 230.92.0.5 10.92.0.1 50 7 detach"));
        for (const Started* r : {&r1, &r2, &gone})
          ASSERT_TRUE(wait_output(*r, "ready", 10000)) << finish(*r, 0).output;
        const ToolRun sender = finish(start(peer("send 230.92.0.5 10.92.0.1 50 7")), 20000);
        EXPECT_EQ(sender.exit_code, 0) << sender.output;
        EXPECT_NE(sender.output.find("sent 50"), std::string::npos) << sender.output;
        const std::string all =
            "received " + std::to_string(kCount) + " checked " + std::to_string(kCount);
        for (const Started* r : {&r1, &r2}) {
          const ToolRun got = finish(*r, 20000);
          EXPECT_EQ(got.exit_code, 0) << got.output;
          EXPECT_NE(got.output.find(all), std::string::npos) << got.output;
        }
        const ToolRun none = finish(gone, 20000);
        EXPECT_EQ(none.exit_code, 0) << none.output;
        EXPECT_NE(none.output.find("received 0 checked 0"), std::string::npos) << none.output;
      },
      60);
}

// Across a veth pair: host B's receiver hears host A's sender over the wire (IGMP-joined on
// B's interface), and A's own receiver hears it through the loopback copy.
TEST(Multicast, AReceiverOnAnotherHostAndOneOnTheSendersHostBothGetEveryDatagram) {
  in_fresh_netns(
      [] {
        Pipe ready, go;
        const pid_t b = start_second_host("mca", "mcb", "10.93.0", [&] {
          const Started r = start(peer("recv 230.93.0.5 10.93.0.2 50 11"));
          if (!wait_output(r, "ready", 10000)) return 3;
          ready.put('r');
          const ToolRun got = finish(r, 20000);
          std::fprintf(stderr, "B: %s\n", got.output.c_str());
          return got.exit_code == 0 &&
                         got.output.find("received 50 checked 50") != std::string::npos
                     ? 0
                     : 4;
        });
        const Started local = start(peer("recv 230.93.0.5 10.93.0.1 50 11"));
        ASSERT_TRUE(wait_output(local, "ready", 10000)) << finish(local, 0).output;
        char ch;
        ASSERT_TRUE(ready.get(&ch, 20000)) << "B's receiver never got ready";
        const ToolRun sender = finish(start(peer("send 230.93.0.5 10.93.0.1 50 11")), 20000);
        EXPECT_NE(sender.output.find("sent 50"), std::string::npos) << sender.output;
        const ToolRun got = finish(local, 20000);
        EXPECT_NE(got.output.find("received 50 checked 50"), std::string::npos) << got.output;
        const std::optional<int> status = wait_exit(b, 30000);
        ASSERT_TRUE(status.has_value());
        EXPECT_EQ(*status, 0) << "host B's receiver (its output above)";
      },
      90);
}

// The wire: captured on the veth the group's datagrams leave by, each is a UD SEND Only to the
// group's address, port 4791, DestQP 0xFFFFFF, with a correct ICRC (urdma decode) and decoded by
// tshark's InfiniBand dissector without a malformed packet or an expert warning.
TEST(Multicast, OnTheWireADatagramGoesToTheGroupWithTheMulticastQpnAndACorrectIcrc) {
  if (!have_tool("tcpdump") || !have_tool("tshark")) GTEST_SKIP() << "no tcpdump or tshark";
  in_fresh_netns(
      [] {
        ASSERT_TRUE(add_local_veth("mc", "10.96.0.1/24"));
        char dir[] = "/tmp/urdma-mcast-wire-XXXXXX";
        ASSERT_NE(mkdtemp(dir), nullptr);
        const std::string pcap = std::string(dir) + "/mc.pcap";
        // tcpdump exits after the 8 datagrams (-c 8).
        const Started cap =
            start("timeout 20 tcpdump -i mc0 -U -c 8 -w " + pcap + " udp port 4791");
        usleep(1000000);  // tcpdump is listening
        const Started r = start(peer("recv 230.96.0.5 10.96.0.1 8 21"));
        ASSERT_TRUE(wait_output(r, "ready", 10000)) << finish(r, 0).output;
        const ToolRun sender = finish(start(peer("send 230.96.0.5 10.96.0.1 8 21")), 20000);
        EXPECT_NE(sender.output.find("sent 8"), std::string::npos) << sender.output;
        const ToolRun got = finish(r, 20000);
        EXPECT_NE(got.output.find("received 8 checked 8"), std::string::npos) << got.output;
        const ToolRun captured = finish(cap, 20000);
        EXPECT_EQ(captured.exit_code, 0) << captured.output;
        const ToolRun decode = run(std::string(URDMA_TOOL_PATH) + " decode " + pcap);
        EXPECT_EQ(decode.exit_code, 0) << decode.output;
        EXPECT_NE(decode.output.find("8 RoCEv2 packets, 0 malformed, 0 with a bad ICRC"),
                  std::string::npos)
            << decode.output;
        const ToolRun fields = run("tshark -r " + pcap +
                                   " -o ip.check_checksum:TRUE -T fields -e ip.dst -e udp.dstport "
                                   "-e infiniband.bth.opcode "
                                   "-e infiniband.bth.destqp");
        EXPECT_EQ(fields.exit_code, 0) << fields.output;
        std::istringstream in(fields.output);
        std::string line;
        int lines = 0;
        while (std::getline(in, line)) {
          if (line.rfind("Running as user", 0) == 0) continue;  // tshark's note to root
          ++lines;
          EXPECT_EQ(line, "230.96.0.5\t4791\t100\t0xffffff") << "UD SEND Only (100) to the group";
        }
        EXPECT_EQ(lines, 8);
        const ToolRun bad = run("tshark -r " + pcap +
                                " -Y '_ws.malformed || _ws.expert.severity >= warning' -T fields "
                                "-e frame.number");
        EXPECT_EQ(bad.output.find_first_of("0123456789"), std::string::npos) << bad.output;
        std::filesystem::remove_all(dir);
      },
      60);
}

// Debian's mckey (rdma_join_multicast, RDMA_PS_UDP): two receivers and a sender on one host
// (line-buffered: the receivers say when they wait for data).
TEST(Multicast, MckeyTwoReceiversAndASender) {
  if (!have_tool("mckey")) GTEST_SKIP() << "no mckey (rdmacm-utils)";
  in_fresh_netns(
      [] {
        ASSERT_TRUE(add_local_veth("mc", "10.94.0.1/24"));
        const Started r1 = start("stdbuf -oL mckey -m 230.94.0.7 -b 10.94.0.1 -C 20 -S 1000");
        const Started r2 = start("stdbuf -oL mckey -m 230.94.0.7 -b 10.94.0.1 -C 20 -S 1000");
        for (const Started* r : {&r1, &r2})
          ASSERT_TRUE(wait_output(*r, "receiving data transfers", 10000)) << finish(*r, 0).output;
        const ToolRun sender =
            finish(start("mckey -s -m 230.94.0.7 -b 10.94.0.1 -C 20 -S 1000"), 20000);
        EXPECT_EQ(sender.exit_code, 0) << sender.output;
        EXPECT_NE(sender.output.find("joined dgid: ::ffff:230.94.0.7"), std::string::npos)
            << sender.output;
        for (const Started* r : {&r1, &r2}) {
          const ToolRun got = finish(*r, 20000);
          EXPECT_EQ(got.exit_code, 0) << got.output;
          EXPECT_NE(got.output.find("data transfers complete"), std::string::npos) << got.output;
          EXPECT_NE(got.output.find("return status 0"), std::string::npos) << got.output;
        }
      },
      60);
}

// The same with an IPv6 group (ff0e::/16) from a global IPv6 address: urdmad's MLD join
// (IPV6_JOIN_GROUP) on the slot sockets, datagrams to the group's IPv6 address.
TEST(Multicast, MckeyOverAnIpv6Group) {
  if (!have_tool("mckey")) GTEST_SKIP() << "no mckey (rdmacm-utils)";
  in_fresh_netns(
      [] {
        ASSERT_TRUE(add_local_veth("mc", "fd00:97::1/64"));
        const Started r = start("stdbuf -oL mckey -m ff0e::97 -b fd00:97::1 -C 20 -S 1000");
        ASSERT_TRUE(wait_output(r, "receiving data transfers", 10000)) << finish(r, 0).output;
        const ToolRun sender =
            finish(start("stdbuf -oL mckey -s -m ff0e::97 -b fd00:97::1 -C 20 -S 1000"), 20000);
        EXPECT_EQ(sender.exit_code, 0) << sender.output;
        EXPECT_NE(sender.output.find("joined dgid: ff0e::97"), std::string::npos) << sender.output;
        const ToolRun got = finish(r, 20000);
        EXPECT_EQ(got.exit_code, 0) << got.output;
        EXPECT_NE(got.output.find("data transfers complete"), std::string::npos) << got.output;
      },
      60);
}

}  // namespace
}  // namespace urdma::process_test
