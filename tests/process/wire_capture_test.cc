// Real RoCEv2 on the wire: two engines on real UDP sockets (net::make_packet_io_from_env, the
// runtime's path: a UdpSocketIo with its per-flow source-port pool) in a fresh network namespace,
// doing RC SEND/WRITE/READ/atomics and UD SENDs while tcpdump captures, then every captured
// packet is checked by `urdma decode` (every ICRC correct, nothing malformed) and by tshark's
// InfiniBand dissector (every packet decoded as InfiniBand, nothing malformed, no expert warning).
//
// On loopback (127.0.0.1 <-> 127.0.0.2, each engine's socket on its address's port 4791), on two
// urdmad slot sockets ([::]:4791, steered by DestQP, as the runtime runs) and across a veth pair
// between two namespaces (10.89.0.1 <-> 10.89.0.2: one process, the second socket opened inside
// the second namespace with setns). One thread polls both engines in turn.
// Also under URDMA_FAULTS (loss, duplication, reordering, delay — no corruption, so the capture
// must still be clean): RC recovers over real sockets and the data arrives intact; and with
// corruption alone, where every flipped datagram must fail its ICRC at the engine and in
// `urdma decode`.
// The engines run as processes do (64 packets per send_batch), so the packets of one message
// leave as segmented sends (UDP GSO, net/udp_socket_io.h). A capture on lo or veth would show
// each such send as one super-packet, which is not what any wire carries: so UDP segmentation
// offload is off on the captured interfaces (ethtool), the kernel splits every super-packet in
// software before the capture sees it — as before a NIC without USO — and each segment, with
// the IPv4 ID Linux gave it, is checked. The tests also require that segmented sends happened.
// Skipped, with the reason, without tcpdump, tshark, ethtool or a network namespace.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "daemon/client.h"
#include "engine/engine.h"
#include "net/clock.h"
#include "net/faulty_packet_io.h"
#include "net/packet_io_env.h"
#include "net/udp_socket_io.h"
#include "netns_harness.h"
#include "tshark.h"
#include "provider/device.h"
#include "support/qp_setup.h"

namespace urdma::process_test {
namespace {

constexpr uint16_t kRocePort = 4791;
constexpr auto kOpDeadline = std::chrono::seconds(10);


bool have(const char* tool) {
  return std::system((std::string("command -v ") + tool + " >/dev/null").c_str()) == 0;
}

// Runs a command; its exit status and standard output.
std::pair<int, std::string> run(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// tcpdump writing `pcap` from `iface` (of the namespace it is started in) until stop().
class Capture {
 public:
  Capture(const std::string& iface, const std::string& pcap) : pcap_(pcap), log_(pcap + ".log") {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 2);
      dup2(fd, 1);
      execlp("tcpdump", "tcpdump", "-i", iface.c_str(), "--immediate-mode", "-U", "-n", "-Z",
             "root", "-s", "0", "-B", "32768", "-w", pcap.c_str(), "udp", "port", "4791",
             static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  // Waits until tcpdump says it is listening.
  bool ready() const {
    for (int i = 0; i < 500; ++i) {
      if (slurp(log_).find("listening on") != std::string::npos) return true;
      usleep(10'000);
    }
    return false;
  }
  // Stops it and returns its log ("N packets captured ... 0 packets dropped by kernel").
  std::string stop() {
    if (pid_ > 0) {
      // The last packets reach the file: wait until it stops growing for 300 ms (bounded).
      off_t last = -1;
      for (int still = 0, i = 0; still < 3 && i < 50; ++i) {
        struct stat st {};
        stat(pcap_.c_str(), &st);
        still = st.st_size == last ? still + 1 : 0;
        last = st.st_size;
        usleep(100'000);
      }
      kill(pid_, SIGINT);
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
    }
    return slurp(log_);
  }
  ~Capture() { stop(); }

 private:
  pid_t pid_ = -1;
  std::string pcap_;
  std::string log_;
};

// One engine on a real UDP socket bound to (address, 4791), with its device, PD and CQ.
struct UdpHost {
  UdpHost(const net::Address& address, std::unique_ptr<net::PacketIo> packet_io, uint32_t qpn_base)
      : addr(address),
        io(std::move(packet_io)),
        dev(with_qpn_base(test::device_config(&relay, address, IBV_MTU_4096), qpn_base)),
        engine(dev, *io, clock, process_engine_config()) {
    pd = dev.alloc_pd().value();
    cq = dev.create_cq(1024).value();
  }

  provider::Qp* create_qp(const test::QpParams& p) {
    provider::QpInitAttr init;
    init.qp_type = p.type;
    init.pd = pd;
    init.send_cq = cq;
    init.recv_cq = cq;
    init.cap = {64, 64, 4, 4, 64};
    auto r = dev.create_qp(init);
    EXPECT_TRUE(r.ok()) << r.error();
    return r.ok() ? r.value() : nullptr;
  }
  provider::Mr* reg(void* buf, size_t len, int access) {
    auto r = dev.reg_mr(pd, buf, len, reinterpret_cast<uint64_t>(buf), access);
    EXPECT_TRUE(r.ok()) << r.error();
    return r.ok() ? r.value() : nullptr;
  }

  // As processes run (verbs/device.cc): up to 64 packets per send_batch, so the runs of one
  // message leave as segmented sends; and ACKs held for a reply, so an answer and the ACK it
  // carries leave in one segmented send of two different packets. Held up to 1 ms (the most
  // URDMA_ACK_DELAY_US allows) rather than 50 us: a loaded machine keeps the conversation.
  static engine::EngineConfig process_engine_config() {
    engine::EngineConfig c;
    c.tx_batch = net::kMaxBatch;
    c.ack_delay_ns = 1'000'000;
    return c;
  }
  static provider::DeviceConfig with_qpn_base(provider::DeviceConfig c, uint32_t qpn_base) {
    c.qpn_base = qpn_base;
    return c;
  }

  net::Address addr;
  net::MonotonicClock clock;
  std::unique_ptr<net::PacketIo> io;
  engine::DoorbellRelay relay;
  provider::Device dev;
  engine::Engine engine;
  provider::Pd* pd = nullptr;
  provider::Cq* cq = nullptr;
};

// The engine's PacketIo on a socket bound to (address, 4791), as the runtime will make it.
std::unique_ptr<net::PacketIo> open_io(const net::Address& address, const net::Clock& clock) {
  std::string error;
  const int fd = net::UdpSocketIo::bind_udp(net::Endpoint{address, kRocePort}, &error);
  EXPECT_GE(fd, 0) << error;
  if (fd < 0) return nullptr;
  auto io = net::make_packet_io_from_env(fd, clock, &error);
  EXPECT_TRUE(io) << error;
  return io;
}

ibv_sge sge(const void* addr, uint32_t len, const provider::Mr* mr) {
  return ibv_sge{reinterpret_cast<uint64_t>(addr), len, mr->lkey()};
}

ibv_send_wr send_wr(uint64_t wr_id, ibv_wr_opcode opcode, ibv_sge* s) {
  ibv_send_wr wr = {};
  wr.wr_id = wr_id;
  wr.opcode = opcode;
  wr.sg_list = s;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  return wr;
}

void fill(std::vector<uint8_t>& b, uint32_t seed) {
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) & 0xFF);
}

// Polls both engines in turn until `n` completions are in `host`'s CQ (or the deadline).
std::vector<ibv_wc> wait_cqes(UdpHost& a, UdpHost& b, UdpHost& host, size_t n) {
  std::vector<ibv_wc> got;
  const auto deadline = std::chrono::steady_clock::now() + kOpDeadline;
  while (got.size() < n && std::chrono::steady_clock::now() < deadline) {
    a.engine.poll();
    b.engine.poll();
    ibv_wc wc[16];
    const int k = host.cq->poll(16, wc);
    for (int i = 0; i < k; ++i) got.push_back(wc[i]);
  }
  EXPECT_EQ(got.size(), n) << "completions before the deadline";
  for (const ibv_wc& wc : got) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "wr_id " << wc.wr_id;
  return got;
}

// Every operation once between a and b, checking the data. Returns the QPNs used (RC a, RC b,
// UD a, UD b).
std::vector<uint32_t> exchange_traffic(UdpHost& a, UdpHost& b, bool corrupting = false) {
  test::QpParams p;
  p.mtu = IBV_MTU_1024;
  provider::Qp* qa = a.create_qp(p);
  provider::Qp* qb = b.create_qp(p);
  if (!qa || !qb) return {};
  test::QpParams pb = p;
  std::swap(pb.sq_psn, pb.rq_psn);
  EXPECT_TRUE(test::bring_up(*qa, p, b.addr, qb->qp_num()).ok());
  EXPECT_TRUE(test::bring_up(*qb, pb, a.addr, qa->qp_num()).ok());

  // RC SEND of 5 MTUs, a WRITE of 10 and a READ of 9 (multi-packet both ways).
  std::vector<uint8_t> src(10'000), dst(10'000, 0), back(9'000, 0);
  fill(src, 1);
  const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  provider::Mr* mr_src = a.reg(src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  provider::Mr* mr_dst = b.reg(dst.data(), dst.size(), remote);
  provider::Mr* mr_back = a.reg(back.data(), back.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_sge r = sge(dst.data(), 5000, mr_dst);
  ibv_recv_wr rwr = {};
  rwr.wr_id = 100;
  rwr.sg_list = &r;
  rwr.num_sge = 1;
  ibv_recv_wr* bad_r = nullptr;
  EXPECT_TRUE(qb->post_recv(&rwr, &bad_r).ok());
  ibv_send_wr* bad = nullptr;
  ibv_sge s = sge(src.data(), 5000, mr_src);
  ibv_send_wr wr = send_wr(1, IBV_WR_SEND, &s);
  EXPECT_TRUE(qa->post_send(&wr, &bad).ok());
  wait_cqes(a, b, b, 1);
  wait_cqes(a, b, a, 1);
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), 5000)) << "SEND";

  fill(src, 2);
  s = sge(src.data(), 10'000, mr_src);
  wr = send_wr(2, IBV_WR_RDMA_WRITE, &s);
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data());
  wr.wr.rdma.rkey = mr_dst->rkey();
  EXPECT_TRUE(qa->post_send(&wr, &bad).ok());
  wait_cqes(a, b, a, 1);
  EXPECT_EQ(src, dst) << "WRITE";

  s = sge(back.data(), 9'000, mr_back);
  wr = send_wr(3, IBV_WR_RDMA_READ, &s);
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data()) + 1000;
  wr.wr.rdma.rkey = mr_dst->rkey();
  EXPECT_TRUE(qa->post_send(&wr, &bad).ok());
  wait_cqes(a, b, a, 1);
  EXPECT_EQ(0, std::memcmp(back.data(), dst.data() + 1000, 9'000)) << "READ";

  // Atomics: compare-and-swap and fetch-and-add.
  alignas(8) uint64_t target[2] = {100, 7};
  alignas(8) uint64_t result[2] = {0, 0};
  provider::Mr* mr_t =
      b.reg(target, sizeof target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  provider::Mr* mr_r = a.reg(result, sizeof result, IBV_ACCESS_LOCAL_WRITE);
  ibv_sge s0 = sge(&result[0], 8, mr_r);
  ibv_send_wr cas = send_wr(4, IBV_WR_ATOMIC_CMP_AND_SWP, &s0);
  cas.wr.atomic.remote_addr = reinterpret_cast<uint64_t>(&target[0]);
  cas.wr.atomic.rkey = mr_t->rkey();
  cas.wr.atomic.compare_add = 100;
  cas.wr.atomic.swap = 555;
  ibv_sge s1 = sge(&result[1], 8, mr_r);
  ibv_send_wr fa = send_wr(5, IBV_WR_ATOMIC_FETCH_AND_ADD, &s1);
  fa.wr.atomic.remote_addr = reinterpret_cast<uint64_t>(&target[1]);
  fa.wr.atomic.rkey = mr_t->rkey();
  fa.wr.atomic.compare_add = 5;
  EXPECT_TRUE(qa->post_send(&cas, &bad).ok());
  EXPECT_TRUE(qa->post_send(&fa, &bad).ok());
  wait_cqes(a, b, a, 2);
  EXPECT_EQ(result[0], 100u);
  EXPECT_EQ(target[0], 555u);
  EXPECT_EQ(result[1], 7u);
  EXPECT_EQ(target[1], 12u);

  // A conversation: 8-byte SENDs answered by SENDs, as a ping-pong runs (unsignaled: only the
  // receives complete). From the second round on, each side's SEND leaves with the ACK it held
  // for the peer's last one, in one segmented send (FaultyPacketIo sends one datagram at a
  // time: then only the data is checked).
  const uint64_t gso_a = a.io->counters().tx_gso_sends, gso_b = b.io->counters().tx_gso_sends;
  constexpr uint32_t kRounds = 8;
  std::vector<uint64_t> slots_a(kRounds, 0), slots_b(kRounds, 0);
  provider::Mr* mr_sa = a.reg(slots_a.data(), kRounds * 8, IBV_ACCESS_LOCAL_WRITE);
  provider::Mr* mr_sb = b.reg(slots_b.data(), kRounds * 8, IBV_ACCESS_LOCAL_WRITE);
  for (uint32_t i = 0; i < kRounds; ++i) {
    for (auto [q, slots, mr] : {std::tuple{qa, &slots_a, mr_sa}, std::tuple{qb, &slots_b, mr_sb}}) {
      ibv_sge rs = sge(&(*slots)[i], 8, mr);
      ibv_recv_wr prw = {};
      prw.wr_id = 300 + i;
      prw.sg_list = &rs;
      prw.num_sge = 1;
      EXPECT_TRUE(q->post_recv(&prw, &bad_r).ok());
    }
  }
  for (uint32_t i = 0; i < kRounds; ++i) {
    for (auto [to, q, slots, value] :
         {std::tuple{&b, qa, &slots_b, 1000 + i}, std::tuple{&a, qb, &slots_a, 2000 + i}}) {
      uint64_t v = value;
      ibv_sge ps = {reinterpret_cast<uint64_t>(&v), 8, 0};
      ibv_send_wr pw = send_wr(400 + i, IBV_WR_SEND, &ps);
      pw.send_flags = IBV_SEND_INLINE;
      EXPECT_TRUE(q->post_send(&pw, &bad).ok());
      const std::vector<ibv_wc> got = wait_cqes(a, b, *to, 1);
      if (got.size() == 1) {
        EXPECT_EQ(got[0].opcode, IBV_WC_RECV);
        EXPECT_EQ(got[0].wr_id, 300 + i);
      }
      EXPECT_EQ((*slots)[i], value) << "round " << i;
    }
  }
  if (gso_a > 0 && gso_b > 0) {
    EXPECT_GT(a.io->counters().tx_gso_sends, gso_a) << "no request left with its held ACK";
    EXPECT_GT(b.io->counters().tx_gso_sends, gso_b) << "no answer left with its held ACK";
  }

  // UD SEND with a GRH, each way. (Unreliable: under faults a lost one is tried again.)
  test::QpParams pu;
  pu.type = IBV_QPT_UD;
  provider::Qp* ua = a.create_qp(pu);
  provider::Qp* ub = b.create_qp(pu);
  if (!ua || !ub) return {};
  EXPECT_TRUE(test::bring_up(*ua, pu, b.addr, 0).ok());
  EXPECT_TRUE(test::bring_up(*ub, pu, a.addr, 0).ok());
  for (auto [from, to, qfrom, qto] : {std::tuple{&a, &b, ua, ub}, std::tuple{&b, &a, ub, ua}}) {
    ibv_ah_attr ah_attr = {};
    ah_attr.is_global = 1;
    ah_attr.port_num = 1;
    ah_attr.grh.dgid = test::gid_of(to->addr);
    ah_attr.grh.hop_limit = 64;
    auto* ah = from->dev.create_ah(from->pd, ah_attr).value();
    ibv_ah verbs_ah = {};
    verbs_ah.handle = ah->handle();
    std::vector<uint8_t> msg(200), rbuf(40 + 256, 0);
    fill(msg, 9);
    provider::Mr* mr_m = from->reg(msg.data(), msg.size(), 0);
    provider::Mr* mr_rb = to->reg(rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
    bool received = false;
    for (int attempt = 0; attempt < 20 && !received; ++attempt) {
      ibv_sge rs = sge(rbuf.data(), static_cast<uint32_t>(rbuf.size()), mr_rb);
      ibv_recv_wr urwr = {};
      urwr.wr_id = 200;
      urwr.sg_list = &rs;
      urwr.num_sge = 1;
      if (attempt == 0) {
        EXPECT_TRUE(qto->post_recv(&urwr, &bad_r).ok());
      }
      ibv_sge us = sge(msg.data(), 200, mr_m);
      ibv_send_wr uwr = send_wr(10, IBV_WR_SEND, &us);
      uwr.wr.ud.ah = &verbs_ah;
      uwr.wr.ud.remote_qpn = qto->qp_num();
      uwr.wr.ud.remote_qkey = pu.qkey;
      EXPECT_TRUE(qfrom->post_send(&uwr, &bad).ok());
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      bool sent = false;
      while (std::chrono::steady_clock::now() < until && !(sent && received)) {
        a.engine.poll();
        b.engine.poll();
        ibv_wc wc[4];
        for (UdpHost* h : {from, to}) {
          const int k = h->cq->poll(4, wc);
          for (int i = 0; i < k; ++i) {
            EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS);
            if (wc[i].wr_id == 200) received = true;
            if (wc[i].wr_id == 10) sent = true;
          }
        }
      }
    }
    EXPECT_TRUE(received) << "UD";
    EXPECT_EQ(0, std::memcmp(msg.data(), rbuf.data() + 40, 200)) << "UD payload";
  }
  if (!corrupting) {
    EXPECT_EQ(a.engine.counters().drop_icrc, 0u);
    EXPECT_EQ(b.engine.counters().drop_icrc, 0u);
  }
  return {qa->qp_num(), qb->qp_num(), ua->qp_num(), ub->qp_num()};
}

// Two engines on 127.0.0.1 and 127.0.0.2, each on a socket bound to its address's port 4791 as
// the runtime makes it (open_io); null hosts if a socket could not be opened.
struct LoopbackPair {
  net::MonotonicClock clock;  // outlives the I/Os (a fault wrapper keeps it)
  std::unique_ptr<UdpHost> a, b;
  LoopbackPair() {
    const net::Address a_addr = net::Address::from_v4(127, 0, 0, 1);
    const net::Address b_addr = net::Address::from_v4(127, 0, 0, 2);
    auto a_io = open_io(a_addr, clock);
    auto b_io = open_io(b_addr, clock);
    if (!a_io || !b_io) return;
    a = std::make_unique<UdpHost>(a_addr, std::move(a_io), provider::DeviceConfig{}.qpn_base);
    b = std::make_unique<UdpHost>(b_addr, std::move(b_io), provider::DeviceConfig{}.qpn_base);
  }
};

// The capture's checks: urdma decode (every ICRC, nothing malformed) and tshark (every packet
// InfiniBand, nothing malformed, no expert warning or error); every packet from a pool port.
void check_capture(const std::string& pcap, const std::string& tcpdump_log,
                   const std::vector<uint32_t>& qpns, const std::string& a_src,
                   const std::string& b_src) {
  // Nothing lost by the capture (on lo the filter sees each packet twice: out and in).
  EXPECT_NE(tcpdump_log.find("\n0 packets dropped by kernel"), std::string::npos) << tcpdump_log;
  const auto [decode_rc, decode_out] = run(std::string(URDMA_TOOL_PATH) + " decode " + pcap);
  EXPECT_EQ(decode_rc, 0) << decode_out.substr(decode_out.size() > 3000 ? decode_out.size() - 3000
                                                                        : 0);
  const size_t summary = decode_out.rfind('\n', decode_out.size() - 2);
  const std::string last = decode_out.substr(summary == std::string::npos ? 0 : summary + 1);
  EXPECT_NE(last.find(", 0 malformed, 0 with a bad ICRC"), std::string::npos) << last;
  std::printf("urdma decode: %s", last.c_str());
  const size_t packets = std::strtoul(last.c_str(), nullptr, 10);
  EXPECT_GE(packets, 30u) << "the capture holds the exchange";

  const std::string tshark = tshark_reading(pcap);
  const auto [all_rc, all] = run(tshark + " -T fields -e frame.number");
  EXPECT_EQ(all_rc, 0) << all;
  const auto [ib_rc, ib] = run(tshark + " -Y infiniband -T fields -e frame.number");
  EXPECT_EQ(ib_rc, 0) << ib;
  const auto lines = [](const std::string& s) {
    return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
  };
  EXPECT_EQ(lines(all), packets) << "tshark reads every frame";
  EXPECT_EQ(lines(ib), packets) << "tshark decodes every frame as InfiniBand";
  const auto [bad_rc, bad] = run(tshark +
                                 " -Y '_ws.malformed || _ws.expert.severity >= warning' -T fields "
                                 "-e frame.number -e _ws.expert.message");
  EXPECT_EQ(bad_rc, 0);
  EXPECT_EQ(bad, "") << "malformed packets or expert warnings";

  // Source ports: every packet leaves from a per-flow port; each QP from one port (its own
  // slot of the pool), and the QPs of one host spread over different ports.
  const auto [ports_rc, ports] =
      run(tshark + " -T fields -e ip.src -e udp.srcport -e infiniband.bth.destqp");
  EXPECT_EQ(ports_rc, 0);
  std::istringstream in(ports);
  std::string src, port, destqp;
  std::map<std::string, std::set<std::string>> ports_of_flow;  // "src > destqp" -> ports
  std::map<std::string, std::set<std::string>> ports_of_host;
  while (in >> src >> port >> destqp) {
    const unsigned long p = std::strtoul(port.c_str(), nullptr, 10);
    EXPECT_GE(p, 0xC000u) << src << " sent from port " << port;
    ports_of_flow[src + " > " + destqp].insert(port);
    ports_of_host[src].insert(port);
  }
  for (const auto& [flow, set] : ports_of_flow) EXPECT_EQ(set.size(), 1u) << flow;
  // Host a sends from its RC and its UD QP's ports (qpns[0], qpns[2]), host b from qpns[1] and
  // qpns[3]'s: slot qpn % K of each pool, so as many ports as distinct slots.
  ASSERT_EQ(qpns.size(), 4u);
  EXPECT_EQ(ports_of_host.size(), 2u);
  const auto slots = [](uint64_t x, uint64_t y) {
    return std::set<uint64_t>{x % net::kDefaultSourcePorts, y % net::kDefaultSourcePorts}.size();
  };
  EXPECT_EQ(ports_of_host[a_src].size(), slots(qpns[0], qpns[2])) << a_src;
  EXPECT_EQ(ports_of_host[b_src].size(), slots(qpns[1], qpns[3])) << b_src;
}

// A scratch directory for the capture (kept when the test fails, for a look with urdma decode).
std::string scratch_dir() {
  char tmpl[] = "/tmp/urdma-wire-XXXXXX";
  const char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  if (d) chmod(d, 0777);  // tcpdump may write as another user
  return d ? d : "/tmp";
}

void skip_without_tools() {
  if (!have("tcpdump")) skip_test("no tcpdump (scripts/deps.sh installs it)");
  if (!have("tshark")) skip_test("no tshark (scripts/deps.sh installs it)");
  if (!have("ethtool")) skip_test("no ethtool (scripts/deps.sh installs it)");
}

// Waits (up to 5 s) until `iface` of this thread's namespace is operationally up. A veth end
// whose peer just came up keeps the noop qdisc until the kernel's link-watch work runs (it may
// wait up to a second), and what is sent before is dropped. Seen in CI: an RC QP's first request
// and all 7 retransmissions left va at once, ~2 s late — held in the neighbour queue, most
// likely because the first ARP request was dropped that way (ARP retries a second later; the
// capture filter does not show ARP, and a by-hand reproduction did not hit the window).
bool wait_oper_up(const std::string& iface) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string link = run("ip -o link show " + iface).second;
    if (link.find(" state UP ") != std::string::npos && link.find("qdisc noop") == std::string::npos)
      return true;
    usleep(10'000);
  }
  ADD_FAILURE() << iface << " did not come up: " << run("ip -o link show " + iface).second;
  return false;
}

// Segmented sends are split before `iface` transmits them (see the top of the file).
bool split_before(const std::string& iface) {
  return sh("ethtool -K " + iface + " tx-udp-segmentation off");
}

// An engine's PacketIo and the QPNs that reach it.
struct Opened {
  std::unique_ptr<net::PacketIo> io;
  uint32_t qpn_base = provider::DeviceConfig{}.qpn_base;
};
using Opener = std::function<Opened(const net::Clock&)>;

// Where the two engines' sockets live: this namespace's `iface` carries their traffic.
struct Topology {
  std::string iface;
  net::Address a, b;
  // Open a's and b's I/O (a urdmad slot, or in another namespace for the veth form); null =
  // a socket bound to the address's port 4791 here.
  Opener open_a, open_b;
};

// Captures on t.iface while the engines exchange every operation, then checks the capture.
void exchange_and_check(const Topology& t, const char* faults) {
  if (faults) {
    setenv(net::kFaultsEnvVar, faults, 1);
  } else {
    unsetenv(net::kFaultsEnvVar);
  }
  const std::string dir = scratch_dir();
  const std::string pcap = dir + "/" + t.iface + ".pcap";
  ASSERT_TRUE(split_before(t.iface));
  Capture cap(t.iface, pcap);
  ASSERT_TRUE(cap.ready()) << slurp(pcap + ".log");
  net::MonotonicClock clock;
  Opened a_io = t.open_a ? t.open_a(clock) : Opened{open_io(t.a, clock)};
  Opened b_io = t.open_b ? t.open_b(clock) : Opened{open_io(t.b, clock)};
  ASSERT_TRUE(a_io.io && b_io.io);
  UdpHost a(t.a, std::move(a_io.io), a_io.qpn_base);
  UdpHost b(t.b, std::move(b_io.io), b_io.qpn_base);
  const std::vector<uint32_t> qpns = exchange_traffic(a, b);
  const std::string log = cap.stop();
  for (UdpHost* h : {&a, &b}) {
    const net::IoCounters c = h->io->counters();
    std::printf("%s: %lu datagrams, %lu of them in %lu segmented sends\n",
                h->addr.to_string().c_str(), c.tx_datagrams, c.tx_gso_datagrams, c.tx_gso_sends);
    // The multi-packet messages left in runs (FaultyPacketIo sends one datagram at a time).
    if (!faults) {
      EXPECT_GT(c.tx_gso_sends, 0u) << h->addr.to_string();
    }
  }
  if (faults) {
    // The profile really was at work, and RC went through it.
    uint64_t faulted = 0, lost = 0;
    for (UdpHost* h : {&a, &b}) {
      auto* f = dynamic_cast<net::FaultyPacketIo*>(h->io.get());
      ASSERT_NE(f, nullptr) << "URDMA_FAULTS was not applied";
      const net::FaultCounters& c = f->fault_counters();
      faulted += c.dropped_loss + c.duplicated + c.reordered + c.delayed;
      lost += c.dropped_loss;
      std::printf("%s: %lu datagrams, %lu lost, %lu duplicated, %lu reordered, %lu delayed\n",
                  h->addr.to_string().c_str(), c.offered, c.dropped_loss, c.duplicated, c.reordered,
                  c.delayed);
    }
    EXPECT_GT(faulted, 0u);
    EXPECT_GT(lost, 0u) << "the seed loses a datagram among the first ones it sees";
  }
  check_capture(pcap, log, qpns, t.a.to_string(), t.b.to_string());
  if (!::testing::Test::HasFailure()) {
    std::remove(pcap.c_str());
    std::remove((pcap + ".log").c_str());
    rmdir(dir.c_str());
  } else {
    std::printf("capture kept: %s\n", pcap.c_str());
  }
}

void loopback_exchange(const char* faults) {
  in_fresh_netns(
      [faults] {
        skip_without_tools();
        exchange_and_check(Topology{"lo", net::Address::from_v4(127, 0, 0, 1),
                                    net::Address::from_v4(127, 0, 0, 2), nullptr, nullptr},
                           faults);
      },
      60);
}

TEST(WireCapture, EveryPacketOnLoopbackPassesUrdmaDecodeAndTshark) {
  loopback_exchange(nullptr);
}

// Without splitting on lo, a segmented send reaches the peer's socket whole and, with UDP_GRO,
// is one receive that the engine splits into its packets: every operation still checks its data
// (exchange_traffic), and both engines did receive such coalesced datagrams.
TEST(WireCapture, OnLoopbackSegmentedSendsArriveCoalescedAndEveryOperationKeepsItsData) {
  in_fresh_netns(
      [] {
        unsetenv(net::kFaultsEnvVar);
        LoopbackPair pair;
        ASSERT_TRUE(pair.a && pair.b);
        UdpHost& a = *pair.a;
        UdpHost& b = *pair.b;
        EXPECT_EQ(exchange_traffic(a, b).size(), 4u);
        for (UdpHost* h : {&a, &b}) {
          const net::IoCounters c = h->io->counters();
          std::printf("%s: sent %lu datagrams (%lu in %lu segmented sends); received %lu (%lu in "
                      "%lu coalesced receives)\n",
                      h->addr.to_string().c_str(), c.tx_datagrams, c.tx_gso_datagrams,
                      c.tx_gso_sends, c.rx_datagrams, c.rx_gro_datagrams, c.rx_gro_receives);
          EXPECT_GT(c.tx_gso_sends, 0u) << h->addr.to_string();
          EXPECT_GT(c.rx_gro_receives, 0u) << h->addr.to_string();
          EXPECT_EQ(h->engine.counters().rcvd_pkts, c.rx_datagrams) << "one packet per datagram";
        }
      },
      60);
}

// RC recovers from loss, duplication, reordering and delay over real sockets, and what reaches
// the wire is still well-formed with correct ICRCs (no corruption in this profile).
TEST(WireCapture, UnderAFaultProfileRcRecoversAndTheWireStaysClean) {
  loopback_exchange("seed=7,loss=50000,dup=20000,reorder=50000,delay_us=0-100");
}

}  // namespace
}  // namespace urdma::process_test

namespace urdma::process_test {
namespace {

// Two namespaces joined by a veth pair (10.89.0.1 here on va, 10.89.0.2 on vb in the other):
// one process, b's sockets opened inside the other namespace (setns there and back), so one
// thread still polls both engines; tcpdump captures on va.
TEST(WireCapture, EveryPacketAcrossAVethPairPassesUrdmaDecodeAndTshark) {
  in_fresh_netns(
      [] {
        skip_without_tools();
        Pipe ready, done;
        const pid_t holder = fork_process([&] {
          done.close_wr();
          if (unshare(CLONE_NEWNET) != 0 || !link_up("lo")) return 10;
          const pid_t me = getpid();
          ready.put(me);
          char end;
          done.get(&end, 60'000);  // until the test is done with the namespace
          return 0;
        });
        done.close_rd();
        pid_t other;
        ASSERT_TRUE(ready.get(&other));
        ASSERT_TRUE(veth_into(other, "va", "vb", "10.89.0"));
        const int here = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
        const int there =
            open(("/proc/" + std::to_string(other) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC);
        ASSERT_GE(here, 0);
        ASSERT_GE(there, 0);
        Topology t{"va", net::Address::from_v4(10, 89, 0, 1), net::Address::from_v4(10, 89, 0, 2),
                   nullptr, [&](const net::Clock& clock) {
                     Opened o;
                     if (setns(there, CLONE_NEWNET) != 0) return o;
                     if (address_there("vb", "10.89.0") && split_before("vb") &&
                         wait_oper_up("vb"))
                       o.io = open_io(net::Address::from_v4(10, 89, 0, 2), clock);
                     EXPECT_EQ(setns(here, CLONE_NEWNET), 0);
                     if (!wait_oper_up("va")) o.io.reset();
                     return o;
                   }};
        exchange_and_check(t, nullptr);
        close(here);
        close(there);
        done.close_wr();
        const auto status = wait_exit(holder, 5000);
        EXPECT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
      },
      60);
}

}  // namespace
}  // namespace urdma::process_test

namespace urdma::process_test {
namespace {

// As the runtime runs: each engine on a urdmad slot socket ([::]:4791, dual-stack, steered to
// it by the BTH DestQP) with its slot's QPN range — two slots of one namespace's daemon, both
// sending from their pools' ports.
TEST(WireCapture, EveryPacketBetweenTwoUrdmadSlotsPassesUrdmaDecodeAndTshark) {
  in_fresh_netns(
      [] {
        skip_without_tools();
        use_daemon(URDMA_DAEMON_PATH, "10000");
        daemon::Client ca, cb;
        daemon::ClientOptions o;
        o.timeout_ms = 5000;
        std::string detail;
        ASSERT_EQ(daemon::Client::connect_or_spawn(o, &ca, &detail), 0) << detail;
        ASSERT_EQ(daemon::Client::connect_or_spawn(o, &cb, &detail), 0) << detail;
        daemon::Slot sa, sb;
        ASSERT_EQ(ca.acquire_slot(&sa), 0);
        ASSERT_EQ(cb.acquire_slot(&sb), 0);
        ASSERT_NE(sa.info.qpn_base, sb.info.qpn_base);
        const auto slot_io = [](daemon::Slot& slot) {
          return [&slot](const net::Clock& clock) {
            std::string error;
            Opened op;
            op.io = net::make_packet_io_from_env(dup(slot.fd.get()), clock, &error);
            EXPECT_TRUE(op.io) << error;
            op.qpn_base = slot.info.qpn_base;
            return op;
          };
        };
        exchange_and_check(Topology{"lo", net::Address::from_v4(127, 0, 0, 1),
                                    net::Address::from_v4(127, 0, 0, 2), slot_io(sa), slot_io(sb)},
                           nullptr);
      },
      60);
}

}  // namespace
}  // namespace urdma::process_test

namespace urdma::process_test {
namespace {

// Corruption on real sockets: a bit flipped after sealing fails the receiver's ICRC check (the
// engine drops it, RC retransmits, every operation still completes with its data), and
// `urdma decode` finds exactly such packets in the capture.
TEST(WireCapture, CorruptedDatagramsFailTheirIcrcAndRcRecovers) {
  in_fresh_netns(
      [] {
        skip_without_tools();
        setenv(net::kFaultsEnvVar, "seed=1,corrupt=100000", 1);
        const std::string dir = scratch_dir();
        const std::string pcap = dir + "/lo.pcap";
        Capture cap("lo", pcap);
        ASSERT_TRUE(cap.ready()) << slurp(pcap + ".log");
        LoopbackPair pair;
        ASSERT_TRUE(pair.a && pair.b);
        UdpHost& a = *pair.a;
        UdpHost& b = *pair.b;
        exchange_traffic(a, b, /*corrupting=*/true);
        cap.stop();
        uint64_t corrupted = 0;
        for (UdpHost* h : {&a, &b}) {
          auto* f = dynamic_cast<net::FaultyPacketIo*>(h->io.get());
          ASSERT_NE(f, nullptr);
          corrupted += f->fault_counters().corrupted;
        }
        const uint64_t dropped = a.engine.counters().drop_icrc + b.engine.counters().drop_icrc;
        const auto [rc, out] = run(std::string(URDMA_TOOL_PATH) + " decode " + pcap);
        const size_t nl = out.rfind('\n', out.size() - 2);
        const std::string last = out.substr(nl == std::string::npos ? 0 : nl + 1);
        unsigned long packets = 0, malformed = 0, bad = 0;
        ASSERT_EQ(
            std::sscanf(last.c_str(), "%lu RoCEv2 packets, %lu malformed, %lu with a bad ICRC",
                        &packets, &malformed, &bad),
            3)
            << last;
        std::printf("%lu corrupted; engines dropped %lu on ICRC; urdma decode: %s",
                    static_cast<unsigned long>(corrupted), static_cast<unsigned long>(dropped),
                    last.c_str());
        EXPECT_NE(rc, 0) << "urdma decode reports the damage";
        EXPECT_GT(bad, 0u);
        EXPECT_GT(dropped, 0u);
        // Every damaged packet was one the profile corrupted (a flip in BTH byte 4, which the ICRC
        // masks, passes unseen).
        EXPECT_LE(bad + malformed, corrupted);
        EXPECT_LE(dropped, corrupted);
        std::remove(pcap.c_str());
        std::remove((pcap + ".log").c_str());
        rmdir(dir.c_str());
      },
      60);
}

}  // namespace
}  // namespace urdma::process_test
