// `urdma capture` against real processes: Debian's ibv_rc_pingpong pairs under our libraries
// and the urdmad built here, in a fresh network namespace. The captures are checked by other
// code than the one that wrote them: `urdma decode` (every ICRC), tshark's InfiniBand dissector
// (every frame, IP and UDP checksums, no expert warning), and the file's own frames (each
// datagram recorded once by its sender and once by its receiver).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "capture/capture.h"
#include "netns_harness.h"
#include "tool_run.h"
#include "tshark.h"

namespace urdma::process_test {
namespace {

constexpr int kIters = 1000;  // long enough that the region, made ~1 ms in, carries most
constexpr int kSize = 1024;  // one RC SEND Only each way per iteration (MTU 1024)

std::string tool() {
  return URDMA_TOOL_PATH;
}

std::string scratch(const char* name) {
  return "/tmp/urdma_capture_test_" + std::to_string(getpid()) + "_" + name;
}

std::string pingpong(unsigned port) {
  return "ibv_rc_pingpong -g 0 -c -p " + std::to_string(port) + " -n " + std::to_string(kIters) +
         " -s " + std::to_string(kSize);
}

// Runs a pingpong pair to the end; both sides must succeed.
void run_pair(unsigned port) {
  const Started server = start(pingpong(port));
  ASSERT_TRUE(wait_listening(port, 10000));
  const ToolRun client = run(pingpong(port) + " 127.0.0.1", 20000);
  const ToolRun srv = finish(server, 10000);
  ASSERT_EQ(client.exit_code, 0) << client.output;
  ASSERT_EQ(srv.exit_code, 0) << srv.output;
}

// `urdma capture ARGS` as a process of its own (not under a shell: stop() signals it), with the
// environment tool_env() gives the programs: the urdmad built here, if it is the one to start it.
Started start_capture(const std::vector<std::string>& args) {
  static int counter = 0;
  Started s;
  s.out_path = scratch(("capture" + std::to_string(counter++) + ".out").c_str());
  const std::string out = s.out_path;
  s.pid = fork_process([&] {
    const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) return 126;
    setenv("URDMA_DAEMON", URDMA_DAEMON_PATH, 1);
    setenv("URDMA_IDLE_TIMEOUT_MS", "2000", 1);
    std::vector<char*> argv{const_cast<char*>(URDMA_TOOL_PATH), const_cast<char*>("capture")};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(URDMA_TOOL_PATH, argv.data());
    return 127;
  });
  return s;
}

// The capture's own line: how many processes it started with ("writing F: N processes now").
bool started_capturing(const Started& s) {
  return wait_output(s, "processes now", 10000);
}

// Stops a capture with `sig` (SIGINT, as Ctrl-C, or SIGTERM) and returns its output.
ToolRun stop(const Started& s, int sig = SIGINT) {
  kill(s.pid, sig);
  return finish(s, 10000);
}

// The frames of a capture: UDP payloads (BTH..ICRC) in file order.
std::vector<std::vector<uint8_t>> frames(const std::string& pcap) {
  std::vector<std::vector<uint8_t>> out;
  const std::string err = capture::for_each_udp(pcap, [&](const capture::UdpDatagram& d) {
    out.emplace_back(d.payload.begin(), d.payload.end());
  });
  EXPECT_EQ(err, "");
  return out;
}

// urdma decode and tshark over the whole file: every frame RoCEv2 with a correct ICRC, decoded
// as InfiniBand, valid IP and UDP checksums, no expert warning.
void check_decodes(const std::string& pcap, size_t packets) {
  const ToolRun decode = run(tool() + " decode " + pcap, 20000);
  EXPECT_EQ(decode.exit_code, 0) << decode.output.substr(0, 3000);
  EXPECT_NE(decode.output.find(std::to_string(packets) + " RoCEv2 packets, 0 malformed, 0 with a "
                                                         "bad ICRC"),
            std::string::npos)
      << decode.output.substr(decode.output.size() > 500 ? decode.output.size() - 500 : 0);
  if (!have_tool("tshark")) return;
  // tshark's standard output only (it says on stderr that it runs as root).
  const auto output = [](const std::string& command) {
    std::string out;
    FILE* p = popen(command.c_str(), "r");
    if (p == nullptr) return std::string("(popen failed)");
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    pclose(p);
    return out;
  };
  const std::string tshark = tshark_reading(pcap) + " -o udp.check_checksum:TRUE 2>/dev/null";
  const std::string ib = output(tshark + " -Y infiniband -T fields -e frame.number");
  EXPECT_EQ(count(ib, "\n"), static_cast<int>(packets)) << "tshark decodes every frame";
  const std::string bad = output(tshark +
                                 " -Y '_ws.expert.severity >= warning || _ws.malformed' -T fields "
                                 "-e frame.number -e _ws.expert.message");
  EXPECT_EQ(bad, "") << "frames tshark warns about";
}

class Capture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_tool("ibv_rc_pingpong")) GTEST_SKIP() << "no ibv_rc_pingpong (ibverbs-utils)";
  }
};

// Both ends are urdma processes of the namespace, which exchange their datagrams through shared
// memory, not the kernel: each datagram is in the file twice, as its sender sent it and as its
// receiver received it (a datagram lost between them would break the pairing; none is). Every
// ICRC is correct — for received IPv4 datagrams the capture writes the ID the ICRC names.
TEST_F(Capture, EveryDatagramOfAPairIsRecordedBySenderAndReceiverAndDecodes) {
  in_fresh_netns(
      [] {
        const std::string pcap = scratch("all.pcap");
        const Started cap = start_capture({pcap});
        ASSERT_TRUE(started_capturing(cap)) << read_file(cap.out_path);
        const uint64_t udp_before = udp_datagrams_received();
        run_pair(18700);
        // The pair talked through shared memory (net/shm_packet_io.h): the kernel carried only
        // what left before urdmad made the region, far fewer than the 2 * kIters SENDs.
        const uint64_t udp = udp_datagrams_received() - udp_before;
        EXPECT_LT(udp, static_cast<uint64_t>(kIters)) << "the pair went by UDP";
        const ToolRun out = stop(cap);
        EXPECT_EQ(out.exit_code, 0) << out.output;
        EXPECT_NE(out.output.find(" 0 dropped"), std::string::npos) << out.output;

        const auto all = frames(pcap);
        // kIters SEND Only each way, each recorded twice; plus ACKs.
        EXPECT_GE(all.size(), static_cast<size_t>(4 * kIters));
        // Compared without their ICRC: a datagram that left as segment i of a segmented send
        // (UDP GSO) carries IPv4 ID i and the ICRC resealed for it, which its receiver records,
        // while its sender recorded the ID-0 form; decode checks both.
        std::map<std::vector<uint8_t>, int> copies;
        for (const auto& f : all) ++copies[std::vector<uint8_t>(f.begin(), f.end() - 4)];
        size_t sends = 0;
        for (const auto& [bytes, n] : copies) {
          EXPECT_EQ(n % 2, 0) << "a datagram recorded " << n << " times";
          sends += bytes.size() == 12 + kSize && bytes[0] == 0x04 ? n : 0;  // SEND Only
        }
        EXPECT_EQ(sends, static_cast<size_t>(4 * kIters));
        check_decodes(pcap, all.size());
        unlink(pcap.c_str());
      },
      90);
}

// A GMP's CM attribute ID (MAD bytes 16-17), or 0 for anything else: BTH (DestQP 1) + DETH + the
// 256-byte MAD + ICRC.
uint16_t cm_attribute(const std::vector<uint8_t>& f) {
  const bool gmp = f.size() == 12 + 8 + 256 + 4 && f[5] == 0 && f[6] == 0 && f[7] == 1;
  return gmp ? static_cast<uint16_t>(f[20 + 16] << 8 | f[20 + 17]) : 0;
}

// rdma_cm's MADs are in the capture too: librdmacm's, as it sends them from its own socket, and
// as urdmad reads them from QP1's socket (a capture of everything by root captures the host).
// Debian's rping pair: its REQ, REP, RTU, DREQ and DREP, each recorded by its sender and on its
// arrival — the DREP too when its receiver has exited already (rdma_disconnect does not wait for
// it) and urdmad delivers it to nobody.
TEST_F(Capture, ConnectionManagementMadsAreRecordedBySenderAndReceiver) {
  if (!have_tool("rping")) GTEST_SKIP() << "no rping (rdmacm-utils)";
  in_fresh_netns(
      [] {
        const std::string pcap = scratch("cm.pcap");
        const Started cap = start_capture({pcap});
        ASSERT_TRUE(started_capturing(cap)) << read_file(cap.out_path);
        const Started server = start("rping -s -V -C 5 -a 127.0.0.1 -p 7181");
        usleep(500000);
        const ToolRun client = finish(start("rping -c -V -C 5 -a 127.0.0.1 -p 7181"), 30000);
        const ToolRun srv = finish(server, 20000);
        ASSERT_EQ(client.exit_code, 0) << client.output;
        ASSERT_EQ(srv.exit_code, 0) << srv.output;
        EXPECT_EQ(stop(cap).exit_code, 0);

        const auto all = frames(pcap);
        std::map<uint16_t, int> by_attribute;
        for (const auto& f : all)
          if (const uint16_t a = cm_attribute(f)) ++by_attribute[a];
        for (const auto& [name, attribute] : std::vector<std::pair<const char*, uint16_t>>{
                 {"REQ", 0x10}, {"REP", 0x13}, {"RTU", 0x14}, {"DREQ", 0x15}, {"DREP", 0x16}}) {
          const int n = by_attribute.count(attribute) ? by_attribute.at(attribute) : 0;
          EXPECT_GE(n, 2) << name;
          EXPECT_EQ(n % 2, 0) << name << " recorded " << n << " times";
        }
        check_decodes(pcap, all.size());
        unlink(pcap.c_str());
      },
      90);
}

// What urdmad sends for the host and what it delivers to nobody are in a capture of everything:
// rping asks for a port nobody listens on; its REQ, recorded as rping sent it, is recorded again
// as urdmad read it (nobody takes it), and the REJ urdmad answers with for the host (status 8,
// after its wait for a listener) as urdmad sent it and as it read it back for rping. Each ICRC is
// correct. `-i` urdmad's pid and `-i 0` (QP1's slot) capture the same host MADs, not rping's
// own REQ.
TEST_F(Capture, TheHostsOwnMadsAreRecordedAsItSendsAndReadsThem) {
  if (!have_tool("rping")) GTEST_SKIP() << "no rping (rdmacm-utils)";
  in_fresh_netns(
      [] {
        const std::string pcap = scratch("host.pcap");
        const Started cap = start_capture({pcap});
        ASSERT_TRUE(started_capturing(cap)) << read_file(cap.out_path);
        // This namespace's urdmad, as it reports itself.
        const ToolRun pid = run(tool() +
                                " status --json | /usr/bin/python3 -c 'import json, sys\n"
                                "print(json.load(sys.stdin)[\"daemon\"][\"pid\"])'");
        ASSERT_EQ(pid.exit_code, 0) << pid.output;
        const std::string daemon_pid = pid.output.substr(0, pid.output.find('\n'));
        ASSERT_FALSE(daemon_pid.empty());
        const std::string host_pcap = scratch("host-pid.pcap");
        const Started by_pid = start_capture({"-i", daemon_pid, host_pcap});
        ASSERT_TRUE(started_capturing(by_pid)) << read_file(by_pid.out_path);
        const std::string slot0_pcap = scratch("host-slot0.pcap");
        const Started by_slot = start_capture({"-i", "0", slot0_pcap});
        ASSERT_TRUE(started_capturing(by_slot)) << read_file(by_slot.out_path);
        const ToolRun r = run("rping -c -a 127.0.0.1 -p 7190 -C 1", 20000);
        EXPECT_NE(r.output.find("RDMA_CM_EVENT_REJECTED, error 8"), std::string::npos) << r.output;
        EXPECT_EQ(stop(cap).exit_code, 0);
        EXPECT_EQ(stop(by_pid).exit_code, 0);
        EXPECT_EQ(stop(by_slot).exit_code, 0);

        std::map<uint16_t, int> everything, host;
        const auto all = frames(pcap);
        for (const auto& f : all)
          if (const uint16_t a = cm_attribute(f)) ++everything[a];
        const auto of_host = frames(host_pcap);
        for (const auto& f : of_host)
          if (const uint16_t a = cm_attribute(f)) ++host[a];
        const auto of_slot0 = frames(slot0_pcap);
        EXPECT_EQ(of_slot0, of_host) << "-i 0 and -i urdmad's pid capture the same";
        const int reqs = everything.count(0x10) ? everything.at(0x10) : 0;
        const int rejs = everything.count(0x12) ? everything.at(0x12) : 0;
        EXPECT_GE(reqs, 2) << "the REQ as rping sent it and as urdmad read it";
        EXPECT_EQ(reqs % 2, 0) << "REQ recorded " << reqs << " times";
        EXPECT_EQ(rejs, 2) << "the host's REJ as urdmad sent it and read it back";
        EXPECT_EQ(host.count(0x10) ? host.at(0x10) : 0, reqs / 2) << "the REQs urdmad read";
        EXPECT_EQ(host.count(0x12) ? host.at(0x12) : 0, 2) << "the REJ, sent and read";
        check_decodes(pcap, all.size());
        check_decodes(host_pcap, of_host.size());
        unlink(pcap.c_str());
        unlink(host_pcap.c_str());
        unlink(slot0_pcap.c_str());
      },
      90);
}

// -c: the capture ends by itself after exactly that many packets.
TEST_F(Capture, CountStopsAfterExactlyThatManyPackets) {
  in_fresh_netns(
      [] {
        const std::string pcap = scratch("count.pcap");
        const Started cap = start_capture({"-c", "25", pcap});
        ASSERT_TRUE(started_capturing(cap)) << read_file(cap.out_path);
        run_pair(18701);
        const ToolRun out = finish(cap, 10000);
        EXPECT_EQ(out.exit_code, 0) << out.output;
        EXPECT_EQ(frames(pcap).size(), 25u);
        check_decodes(pcap, 25);
        unlink(pcap.c_str());
      },
      90);
}

// -i PID: only that process's datagrams, each once (it sent or received it), so exactly half of
// what a capture of everything holds for the same traffic. A capture started after the process
// leased its slot gets it too (urdmad hands the capture to holders that are there already).
TEST_F(Capture, APidFilterRecordsOneProcessOnlyEachDatagramOnce) {
  in_fresh_netns(
      [] {
        const std::string all_pcap = scratch("every.pcap"), one_pcap = scratch("one.pcap");
        const Started all = start_capture({all_pcap});
        ASSERT_TRUE(started_capturing(all)) << read_file(all.out_path);
        const unsigned port = 18702;
        const Started server = start(pingpong(port));
        ASSERT_TRUE(wait_listening(port, 10000));
        // The server's pid, as urdmad knows it: the one slot holder.
        const ToolRun pid = run(tool() +
                                " status --json | /usr/bin/python3 -c 'import json, sys\n"
                                "print(*[c[\"pid\"] for c in json.load(sys.stdin)[\"clients\"] "
                                "if c[\"role\"] == \"slot\"])'");
        ASSERT_EQ(pid.exit_code, 0) << pid.output;
        const std::string server_pid = pid.output.substr(0, pid.output.find('\n'));
        ASSERT_FALSE(server_pid.empty());
        ASSERT_EQ(server_pid.find(' '), std::string::npos) << "one slot holder: " << pid.output;
        const Started one = start_capture({"-i", server_pid, one_pcap});
        ASSERT_TRUE(wait_output(one, ": 1 processes now", 10000)) << read_file(one.out_path);
        const ToolRun client = run(pingpong(port) + " 127.0.0.1", 20000);
        const ToolRun srv = finish(server, 10000);
        ASSERT_EQ(client.exit_code, 0) << client.output;
        ASSERT_EQ(srv.exit_code, 0) << srv.output;
        EXPECT_EQ(stop(one, SIGTERM).exit_code, 0);
        EXPECT_EQ(stop(all).exit_code, 0);

        const size_t every = frames(all_pcap).size(), mine = frames(one_pcap).size();
        EXPECT_GE(mine, static_cast<size_t>(2 * kIters));
        EXPECT_EQ(every, 2 * mine);
        check_decodes(one_pcap, mine);
        unlink(all_pcap.c_str());
        unlink(one_pcap.c_str());
      },
      90);
}

// A capture that ends (-c 100) in the middle of a pair's 4,000 iterations, started after the
// server leased its slot: its 100 packets are written, and the pair completes after the
// capturer is gone (each process ends the capture when its writes fail).
TEST_F(Capture, APairOutlivesTheCaptureThatWatchedIt) {
  in_fresh_netns(
      [] {
        const std::string pcap = scratch("gone.pcap");
        const unsigned port = 18703;
        const std::string slow = "ibv_rc_pingpong -g 0 -c -p " + std::to_string(port) +
                                 " -n 4000 -s " + std::to_string(kSize);
        const Started server = start(slow);
        ASSERT_TRUE(wait_listening(port, 10000));
        const Started cap = start_capture({"-c", "100", pcap});
        ASSERT_TRUE(wait_output(cap, ": 1 processes now", 10000)) << read_file(cap.out_path);
        const ToolRun client = run(slow + " 127.0.0.1", 60000);
        const ToolRun srv = finish(server, 20000);
        EXPECT_EQ(client.exit_code, 0) << client.output;
        EXPECT_EQ(srv.exit_code, 0) << srv.output;
        EXPECT_EQ(finish(cap, 10000).exit_code, 0);
        EXPECT_EQ(frames(pcap).size(), 100u);
        unlink(pcap.c_str());
      },
      120);
}

}  // namespace
}  // namespace urdma::process_test
