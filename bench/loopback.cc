// urdma_loopback_bench: RC over the real runtime between two processes on loopback, beside raw
// UDP between the same two processes, measured in the same run and printed as ratios.
//
//   build-bench/bench/urdma_loopback_bench [--seconds S] [--rounds N] [--tx-batch N]
//                                          [--ack-delay-us U] [--no-engine-thread] [--no-netns]
//                                          [--no-gso] [--no-gro] [--shm]
//
// Two processes (fork): host A (127.0.0.1, the requester; it prints) and host B (127.0.0.2).
// Each runs a runtime::Runtime with its engine thread over a net::UdpSocketIo on its own UDP
// 4791 socket — the data path an application gets, without urdmad (each runtime is handed a
// bound socket directly; runtime.h). As root the benchmark first enters a fresh network
// namespace (unshare, lo up), so nothing else on the host shares 4791 or the loopback queue;
// --no-netns stays in the current one (then nothing may hold 127.0.0.{1,2}:4791).
// --no-engine-thread runs both runtimes without their engine thread: only the application
// threads drive the engines (B's busy-polls try_progress() during the WRITE streams), which
// shows what the engine thread's wake-ups cost. --tx-batch N sets EngineConfig::tx_batch (packets
// per sendmmsg; default 64, as processes run: URDMA_TX_BATCH); --ack-delay-us U sets
// EngineConfig::ack_delay_ns (ACKs held for a reply on a QP in a conversation; default 50, as
// processes run: URDMA_ACK_DELAY_US); --no-gso turns off UDP segmentation
// offload (UdpSocketIoOptions::gso, URDMA_UDP_GSO=0 for processes), which a tx batch above 1
// uses for the packets of one message; --no-gro turns off UDP receive offload
// (UdpSocketIoOptions::gro, URDMA_UDP_GRO=0). --shm puts the shared-memory path
// (net/shm_packet_io.h) between the two engines, over a region the benchmark makes as urdmad
// would: the RC rows then cross shared memory, the raw rows still the kernel's UDP.
//
// What it measures (each RC row beside its raw-UDP limit, same processes, same run):
//  * latency: 8-byte ping-pong. Raw: sendto + busy-polling recv(MSG_DONTWAIT) on both sides.
//    RC: SEND 8 B (inline) answered by a SEND from B's application thread; both application
//    threads busy-poll their CQ and drive the engine inline (Runtime::try_progress, as
//    ibv_poll_cq will). One-way latency = half the round trip; median and mean over N rounds.
//    Between the two, raw UDP shaped as RC's datagrams: each hop sends what an RC hop sends — a
//    24-byte SEND and the 20-byte ACK held for the reply, in one send (one UDP_SEGMENT message
//    by sendmsg with GSO), with UdpSocketIo's source-address and TTL cmsgs, from a socket set up
//    as UdpSocketIo's — and reads as UdpSocketIo reads (recvmmsg over 32 buffers, recvmsg after
//    a read that found at most one datagram). No engine: the kernel's cost of RC's datagrams, so
//    that RC over it is what urdma's own code adds. Then the same datagrams as real RC packets
//    with RC's least work (bare_send, bare_packet: parse, ICRC checks and seals, the payload
//    into a receive buffer, a CQE, a WQE; no engine, lock or verbs call), on sockets of their
//    own: least work over shaped is the floor under any RC implementation's code, RC over least
//    work what urdma's structure adds. The four rows run in blocks of 1,000 rounds taken in
//    turn, so that the host's slow and fast spells fall on all of them; besides the ratios of
//    the overall medians, the medians of the per-block ratios are printed.
//  * bandwidth: raw = 4 KiB datagrams, one sendto per datagram, as fast as A can, received by B
//    with one recv per datagram; the rate B receives. RC = RDMA WRITE 64 KiB, 16 outstanding,
//    path MTU 4096; A's application thread posts and polls (driving inline), B's application
//    sleeps and B's engine thread does the work.
//  * message rate: RDMA WRITE 64 B with 64 outstanding, beside raw 64-byte datagrams (one
//    sendto each, received one recv each).
// Proof the RC path worked: every completion is IBV_WC_SUCCESS, each latency round carries its
// number and the peer checks it, and after each streaming phase B's target buffer has the same
// FNV-1a checksum as A's source. Retransmissions and drops of both engines are printed.
// A benchmark, not a test: nothing here asserts a speed.
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sched.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "net/icrc_flow.h"
#include "net/shm_packet_io.h"
#include "net/udp_socket_io.h"
#include "runtime/runtime.h"
#include "support/checksum.h"
#include "support/qp_setup.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace {

using namespace urdma;
using Clock = std::chrono::steady_clock;
using test_support::fnv1a;

constexpr uint16_t kRawPort = 5000;     // the raw-UDP limit's sockets (RoCEv2 uses 4791)
constexpr uint16_t kShapedPort = 5001;  // the RC-shaped raw UDP ping-pong's sockets
constexpr uint16_t kBarePort = 5002;    // the same for RC's least work (bare_send)
// The UDP payloads of one RC hop: SEND Only with 8 bytes inline (BTH 12 + 8 + ICRC 4), and the
// ACK held for it (BTH 12 + AETH 4 + ICRC 4), which leaves in the same sendmmsg.
constexpr size_t kShapedSendBytes = 24;
constexpr size_t kShapedAckBytes = 20;
constexpr int kShapedTtl = 64;  // test::QpParams' hop limit: UdpSocketIo sends it as IP_TTL
constexpr size_t kLatBytes = 8;
constexpr size_t kBwBytes = 64 * 1024;
constexpr uint32_t kBwWindow = 16;
constexpr size_t kRawBwDatagram = 4096;
constexpr size_t kRateBytes = 64;
constexpr uint32_t kRateWindow = 64;
constexpr int kRecvDepth = 128;
constexpr int kCqDepth = 4096;
constexpr int kPollBatch = 32;
constexpr uint32_t kLatBlock = 1000;  // rounds per latency block (latency_rows)
// Local ACK timeout code 14 (4.096 us << 14 = 67 ms): a loaded 2-core machine must not turn a
// slow turn into a retransmission; real losses (a full socket buffer) still recover.
constexpr uint8_t kAckTimeoutCode = 14;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "urdma_loopback_bench: %s: %s\n", what, std::strerror(errno));
  std::exit(2);
}
void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "urdma_loopback_bench: %s\n", what);
    std::exit(2);
  }
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
          .count());
}

// ---------------------------------------------------------------------------------------------
// The control channel between A and B (a SOCK_SEQPACKET pair): fixed-size messages.

enum class Phase : uint32_t {
  kRawLat,
  kShapedLat,
  kBareLat,
  kRcLat,
  kRingLat,
  kLineLat,
  kRawStream,
  kRingStream,
  kRcBw,
  kRcRate,
  kRawRate,
  kEnd
};

struct Msg {
  Phase phase = Phase::kEnd;
  uint32_t rounds = 0;
  uint64_t bytes = 0;      // B → A: bytes (or datagrams) B received
  uint64_t first_ns = 0;   // B → A: when the first arrived
  uint64_t last_ns = 0;    // B → A: when the last arrived
  uint64_t checksum = 0;   // B → A: FNV-1a of the phase's target buffer
  uint64_t errors = 0;     // B → A: bad completions or wrong round numbers
  uint64_t datagram = 0;   // A → B: raw phase datagram size
};

struct HostInfo {
  uint32_t qpn_lat = 0, qpn_bw = 0, qpn_rate = 0;
  uint64_t bw_addr = 0, rate_addr = 0;
  uint32_t rkey = 0;
};

struct CountersMsg {
  uint64_t sent_pkts, rcvd_pkts, retransmits, seq_naks, drops, tx_blocked, duplicate_request;
};

template <typename T>
void ctl_send(int fd, const T& m) {
  if (send(fd, &m, sizeof m, 0) != static_cast<ssize_t>(sizeof m)) die("control send");
}
template <typename T>
T ctl_recv(int fd) {
  T m;
  ssize_t n;
  do {
    n = recv(fd, &m, sizeof m, 0);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof m)) die("control recv");
  return m;
}
bool ctl_ready(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

// ---------------------------------------------------------------------------------------------
// One host: its runtime, RC QPs and buffers.

struct PageBuffer {
  explicit PageBuffer(size_t n)
      : size(n), data(static_cast<uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {
    require(data != nullptr, "aligned_alloc");
    std::memset(data, 0, n);
  }
  ~PageBuffer() { std::free(data); }
  size_t size;
  uint8_t* data;
};

struct Host {
  net::Address addr;
  net::Address peer;
  bool shm = false;  // --shm: the RC rows cross shared memory
  std::unique_ptr<runtime::Runtime> rt;
  provider::Pd* pd = nullptr;
  provider::Cq* cq_lat = nullptr;
  provider::Cq* cq_bw = nullptr;
  provider::Cq* cq_rate = nullptr;
  provider::Qp* lat = nullptr;
  provider::Qp* bw = nullptr;
  provider::Qp* rate = nullptr;
  PageBuffer lat_buf{kRecvDepth * 64 + 64};  // receive slots, then the send slot
  PageBuffer bw_buf{kBwWindow * kBwBytes};
  PageBuffer rate_buf{kRateWindow * kRateBytes};
  provider::Mr* lat_mr = nullptr;
  provider::Mr* bw_mr = nullptr;
  provider::Mr* rate_mr = nullptr;
  int raw_fd = -1;
  int shaped_fd = -1;
  int bare_fd = -1;  // set up as shaped_fd: a row's datagrams left queued stay its own
  // --shm: the limit row's bare rings (net/shm_ring.h), this side's to write and to read.
  std::unique_ptr<net::ShmProducer> ring_tx;
  std::unique_ptr<net::ShmConsumer> ring_rx;
  std::atomic<uint64_t>* line_out = nullptr;  // this side writes, the other reads
  std::atomic<uint64_t>* line_in = nullptr;
  uint64_t line_round = 0;  // rounds the line has carried
  bool gso = false;
  bool gro = false;

  provider::Device& dev() { return rt->device(); }
};

provider::Qp* make_qp(Host& h, provider::Cq* cq, uint32_t send_wr) {
  provider::QpInitAttr init;
  init.qp_type = IBV_QPT_RC;
  init.pd = h.pd;
  init.send_cq = cq;
  init.recv_cq = cq;
  init.cap.max_send_wr = send_wr;
  init.cap.max_recv_wr = kRecvDepth;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = 64;
  auto q = h.dev().create_qp(init);
  require(q.ok(), "create_qp");
  return q.value();
}

provider::Mr* reg(Host& h, PageBuffer& b) {
  auto mr = h.dev().reg_mr(h.pd, b.data, b.size, reinterpret_cast<uintptr_t>(b.data),
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                               IBV_ACCESS_REMOTE_READ);
  require(mr.ok(), "reg_mr");
  return mr.value();
}

int bind_udp(const net::Address& a, uint16_t port) {
  std::string err;
  const int fd = net::UdpSocketIo::bind_udp(net::Endpoint{a, port}, &err);
  if (fd < 0) {
    std::fprintf(stderr, "urdma_loopback_bench: bind %s:%u: %s\n", a.to_string().c_str(), port,
                 err.c_str());
    std::exit(2);
  }
  return fd;
}

// The RC-shaped ping-pong's socket, set up as UdpSocketIo::adopt sets up its own: DF, the
// destination address reported (IP_PKTINFO), 4 MiB buffers, UDP_GRO as --no-gro says.
int open_shaped(const net::Address& addr, uint16_t port, bool gso, bool gro) {
  const int fd = bind_udp(addr, port);
  const int one = 1, df = IP_PMTUDISC_DO;
  const int buffer = static_cast<int>(net::kLargeSocketBufferBytes);
  require(setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &df, sizeof df) == 0 &&
              setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one) == 0,
          "shaped socket options");
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof buffer) != 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  if (gro) require(setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one) == 0, "UDP_GRO");
  (void)gso;  // asked for per send (UDP_SEGMENT cmsg)
  return fd;
}

// --shm: the region and doorbells the two processes share, made before the fork as urdmad
// makes them (a sealed memfd, one eventfd per side). A is side 0 of QPN range 1, B side 1 of
// range 2.
struct ShmShared {
  bool on = false;
  int region = -1;
  int bell[2] = {-1, -1};
  int limit_region = -1;  // the ring ping-pong's (the limit row): two bare rings
  // The hardware's limit: one cache line written by each side in turn (a shared anonymous page).
  std::atomic<uint64_t>* line[2] = {nullptr, nullptr};
};

ShmShared make_shm_shared() {
  ShmShared s;
  s.on = true;
  for (int* fd : {&s.region, &s.limit_region}) {
    *fd = memfd_create("urdma-bench-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    require(*fd >= 0 && ftruncate(*fd, net::kShmRegionBytes) == 0 &&
                fcntl(*fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0,
            "memfd region");
  }
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  require(page != MAP_FAILED, "mmap shared page");
  s.line[0] = static_cast<std::atomic<uint64_t>*>(page);
  s.line[1] = s.line[0] + 64 / sizeof(uint64_t);  // the next cache line
  for (int& b : s.bell) b = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  require(s.bell[0] >= 0 && s.bell[1] >= 0, "eventfd");
  return s;
}

void open_host(Host& h, const net::Address& addr, const net::Address& peer, bool engine_thread,
               size_t tx_batch, uint64_t ack_delay_ns, bool gso, bool gro,
               const ShmShared& shm = {}, unsigned side = 0) {
  h.addr = addr;
  h.peer = peer;
  std::string err;
  // Socket buffers as Runtime::open gives urdmad's slot sockets (4 MiB): the default ~208 KiB
  // drops a window's burst of 4 KiB packets.
  net::UdpSocketIoOptions options;
  options.socket_buffer_bytes = net::kLargeSocketBufferBytes;
  options.gso = gso;
  options.gro = gro;
  std::unique_ptr<net::PacketIo> io =
      net::UdpSocketIo::adopt(bind_udp(addr, net::kRoceV2UdpPort), &err, options);
  require(io != nullptr, "UdpSocketIo::adopt");
  const uint32_t own_range = 1 + side;
  net::ShmPacketIo* shm_io_ptr = nullptr;
  if (shm.on) {
    static const net::MonotonicClock kClock;
    auto shm_io = std::make_unique<net::ShmPacketIo>(
        std::move(io), kClock, own_range, dup(shm.bell[side]), nullptr,
        [](const net::Address& a) { return a.is_loopback(); });
    require(shm_io->add_peer(2 - side, side, dup(shm.region), dup(shm.bell[1 - side])) == 0,
            "ShmPacketIo::add_peer");
    shm_io_ptr = shm_io.get();
    io = std::move(shm_io);
    void* base = mmap(nullptr, net::kShmRegionBytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_POPULATE, shm.limit_region, 0);  // as ShmPacketIo
    require(base != MAP_FAILED, "mmap limit region");
    h.line_out = shm.line[side];
    h.line_in = shm.line[1 - side];
    h.ring_tx = std::make_unique<net::ShmProducer>(net::shm_ring_header(base, side),
                                                   net::shm_ring_data(base, side));
    h.ring_rx = std::make_unique<net::ShmConsumer>(net::shm_ring_header(base, 1 - side),
                                                   net::shm_ring_data(base, 1 - side));
  }
  runtime::RuntimeConfig cfg;
  cfg.device = test::device_config(nullptr, addr, IBV_MTU_4096);
  if (shm.on) cfg.device.qpn_base = own_range << 12;
  h.shm = shm.on;
  cfg.device.max_mtu = IBV_MTU_4096;
  cfg.engine.local_address = addr;
  cfg.engine_thread = engine_thread;
  cfg.engine.tx_batch = tx_batch;
  cfg.engine.ack_delay_ns = ack_delay_ns;
  cfg.shm_io = shm_io_ptr;
  h.rt = std::make_unique<runtime::Runtime>(std::move(io), cfg);
  h.pd = h.dev().alloc_pd().value();
  h.cq_lat = h.dev().create_cq(kCqDepth).value();
  h.cq_bw = h.dev().create_cq(kCqDepth).value();
  h.cq_rate = h.dev().create_cq(kCqDepth).value();
  h.lat = make_qp(h, h.cq_lat, 64);
  h.bw = make_qp(h, h.cq_bw, 2 * kBwWindow);
  h.rate = make_qp(h, h.cq_rate, 2 * kRateWindow);
  h.lat_mr = reg(h, h.lat_buf);
  h.bw_mr = reg(h, h.bw_buf);
  h.rate_mr = reg(h, h.rate_buf);
  h.raw_fd = bind_udp(addr, kRawPort);
  h.shaped_fd = open_shaped(addr, kShapedPort, gso, gro);
  h.bare_fd = open_shaped(addr, kBarePort, gso, gro);
  h.gso = gso;
  h.gro = gro;
}

HostInfo info_of(const Host& h) {
  HostInfo i;
  i.qpn_lat = h.lat->qp_num();
  i.qpn_bw = h.bw->qp_num();
  i.qpn_rate = h.rate->qp_num();
  i.bw_addr = reinterpret_cast<uintptr_t>(h.bw_buf.data);
  i.rate_addr = reinterpret_cast<uintptr_t>(h.rate_buf.data);
  i.rkey = h.bw_mr->rkey();  // the rate buffer's rkey follows (rate_mr), sent separately below
  return i;
}

void connect_host(Host& h, const HostInfo& peer, bool is_a) {
  test::QpParams p;
  p.mtu = IBV_MTU_4096;
  p.timeout = kAckTimeoutCode;
  p.max_rd_atomic = 16;
  p.max_dest_rd_atomic = 16;
  if (!is_a) std::swap(p.sq_psn, p.rq_psn);
  require(test::bring_up(*h.lat, p, h.peer, peer.qpn_lat).ok(), "bring_up lat");
  require(test::bring_up(*h.bw, p, h.peer, peer.qpn_bw).ok(), "bring_up bw");
  require(test::bring_up(*h.rate, p, h.peer, peer.qpn_rate).ok(), "bring_up rate");
}

void post_recv_slot(Host& h, int slot) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(h.lat_buf.data + slot * 64), 64, h.lat_mr->lkey()};
  ibv_recv_wr wr{};
  wr.wr_id = static_cast<uint64_t>(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  require(h.lat->post_recv(&wr, &bad).ok(), "post_recv");
}

// SEND 8 B inline carrying `round`.
void post_lat_send(Host& h, uint64_t round) {
  uint8_t* slot = h.lat_buf.data + kRecvDepth * 64;
  std::memcpy(slot, &round, sizeof round);
  ibv_sge sge{reinterpret_cast<uintptr_t>(slot), kLatBytes, h.lat_mr->lkey()};
  ibv_send_wr wr{};
  wr.wr_id = round;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  require(h.lat->post_send(&wr, &bad).ok(), "post_send SEND");
}

// Busy-polls the latency CQ (driving the engine inline) until a RECV completes; returns the
// round number it carried, reposts its slot. SEND completions on the way are checked and
// dropped. *errors counts bad statuses.
uint64_t wait_lat_recv(Host& h, uint64_t* errors) {
  ibv_wc wc[kPollBatch];
  for (;;) {
    const int n = h.cq_lat->poll(kPollBatch, wc);
    uint64_t got = UINT64_MAX;
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        ++*errors;
        continue;
      }
      if (wc[i].opcode != IBV_WC_RECV) continue;
      const int slot = static_cast<int>(wc[i].wr_id);
      std::memcpy(&got, h.lat_buf.data + slot * 64, sizeof got);
      if (wc[i].byte_len != kLatBytes) ++*errors;
      post_recv_slot(h, slot);
    }
    if (got != UINT64_MAX) return got;
    if (n == 0) h.rt->try_progress();
  }
}

CountersMsg counters_of(Host& h) {
  const engine::EngineCounters c = h.rt->counters();
  return CountersMsg{c.sent_pkts,  c.rcvd_pkts,  c.completer_retry_err,  c.rcvd_seq_err,
                     c.drops(),    c.tx_blocked, c.duplicate_request};
}

// ---------------------------------------------------------------------------------------------
// Raw UDP.

sockaddr_in sockaddr_of(const net::Address& a, uint16_t port) {
  sockaddr_storage ss{};
  net::Endpoint{a, port}.to_sockaddr(AF_INET, ss);
  sockaddr_in sin;
  std::memcpy(&sin, &ss, sizeof sin);
  return sin;
}

void raw_send(int fd, const sockaddr_in& to, const void* p, size_t n) {
  while (sendto(fd, p, n, 0, reinterpret_cast<const sockaddr*>(&to), sizeof to) < 0) {
    if (errno != EAGAIN && errno != ENOBUFS && errno != EINTR) die("sendto");
  }
}
// Busy-polls one datagram.
ssize_t raw_recv_spin(int fd, void* p, size_t n) {
  for (;;) {
    const ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
    if (r >= 0) return r;
    if (errno != EAGAIN && errno != EINTR) die("recv");
  }
}

// One hop of the RC ping-pong as the kernel sees it, without urdma: the SEND (carrying `round`)
// and the ACK behind it in one send — one UDP_SEGMENT message with GSO (a sendmsg, as
// UdpSocketIo sends one message), else two messages (sendmmsg) — each with the source address
// (IP_PKTINFO) and TTL (IP_TTL) cmsgs UdpSocketIo adds.
void shaped_send_bytes(const Host& h, int fd, const sockaddr_in& to, uint8_t* send_bytes,
                       uint8_t* ack_bytes) {
  iovec iov[2] = {{send_bytes, kShapedSendBytes}, {ack_bytes, kShapedAckBytes}};
  alignas(cmsghdr) uint8_t control[2][CMSG_SPACE(sizeof(in_pktinfo)) + CMSG_SPACE(sizeof(int)) +
                                      CMSG_SPACE(sizeof(uint16_t))] = {};
  mmsghdr msgs[2] = {};
  const int n = h.gso ? 1 : 2;
  for (int i = 0; i < n; ++i) {
    msghdr& m = msgs[i].msg_hdr;
    m.msg_name = const_cast<sockaddr_in*>(&to);
    m.msg_namelen = sizeof to;
    m.msg_iov = h.gso ? iov : &iov[i];
    m.msg_iovlen = h.gso ? 2 : 1;
    m.msg_control = control[i];
    size_t used = 0;
    auto add = [&](int level, int type, const void* data, size_t len) {
      cmsghdr* c = reinterpret_cast<cmsghdr*>(control[i] + used);
      c->cmsg_level = level;
      c->cmsg_type = type;
      c->cmsg_len = CMSG_LEN(len);
      std::memcpy(CMSG_DATA(c), data, len);
      used += CMSG_SPACE(len);
    };
    in_pktinfo pi{};
    std::memcpy(&pi.ipi_spec_dst, h.addr.v4_bytes().data(), 4);
    add(IPPROTO_IP, IP_PKTINFO, &pi, sizeof pi);
    add(IPPROTO_IP, IP_TTL, &kShapedTtl, sizeof kShapedTtl);
    const uint16_t segment = kShapedSendBytes;
    if (h.gso) add(SOL_UDP, UDP_SEGMENT, &segment, sizeof segment);
    m.msg_controllen = used;
  }
  int sent = 0;
  while (sent < n) {
    const int r = n - sent == 1 ? (sendmsg(fd, &msgs[sent].msg_hdr, 0) >= 0 ? 1 : -1)
                                : sendmmsg(fd, msgs + sent, static_cast<unsigned>(n - sent), 0);
    if (r > 0) {
      sent += r;
    } else if (errno != EAGAIN && errno != ENOBUFS && errno != EINTR) {
      die("sendmmsg (shaped)");
    }
  }
}

void shaped_send(const Host& h, const sockaddr_in& to, uint64_t round) {
  uint8_t send_bytes[kShapedSendBytes] = {};
  uint8_t ack_bytes[kShapedAckBytes] = {};
  std::memcpy(send_bytes, &round, sizeof round);
  shaped_send_bytes(h, h.shaped_fd, to, send_bytes, ack_bytes);
}

// The bare row: the shaped ping-pong's datagrams as real RC packets, with the least work an RC
// endpoint does for them between the read and the send, and nothing else — no engine turn, no
// lock, no verbs call, no timer. Each packet is parsed (wire::parse_packet) and its ICRC checked
// as a socket's reader must (net::icrc_ok: the flow from the source address and IP_PKTINFO);
// the SEND's payload goes into a receive buffer and a completion into a CQ, the ACK retires a
// send-queue entry; the application takes the completion and writes its next WQE, from which
// the SEND and the ACK behind it are built and sealed (net::seal_icrc; the ACK, segment 1 of the
// send, for IPv4 ID 1 as UdpSocketIo seals it). Queues and buffers each on their own page, as a
// device's are. What a hop costs above the shaped row here is the floor under urdma's own code.
struct BareRc {
  struct Wqe {
    uint64_t wr_id;
    uint32_t length;
    uint32_t flags;
    uint8_t inline_data[16];
  };
  struct Cqe {
    uint64_t wr_id;
    uint32_t byte_len;
    uint32_t qp_num;
    uint32_t opcode;
    uint32_t status;
  };
  static constexpr uint32_t kSlots = 64;
  static constexpr uint32_t kQpn = 0x11;  // both sides' QP number: one flow each way
  alignas(4096) uint8_t recv_buf[4096];   // the posted receive's buffer
  alignas(4096) Cqe cq[kSlots];
  alignas(4096) Wqe sq[kSlots];
  alignas(4096) uint8_t tx[2][64];  // the SEND and the ACK being built
  uint32_t cq_head = 0, cq_tail = 0;
  uint32_t sq_head = 0, sq_tail = 0;
  uint32_t send_psn = 0;  // the next SEND's
  uint32_t recv_psn = 0;  // the next expected
  uint32_t msn = 0;       // SENDs received: the ACK's MSN
  uint64_t errors = 0;    // a SEND out of PSN order, a completion not as posted
};

BareRc& bare_rc() {
  static BareRc* b = new BareRc();
  return *b;
}

// The application posts `round` (inline, 8 bytes); the requester builds the SEND from its WQE
// and the ACK owed for the last SEND received, seals both and sends them as the shaped row does.
void bare_send(const Host& h, const sockaddr_in& to, uint64_t round) {
  BareRc& b = bare_rc();
  BareRc::Wqe& w = b.sq[b.sq_head++ % BareRc::kSlots];
  w.wr_id = round;
  w.length = sizeof round;
  w.flags = 0;
  std::memcpy(w.inline_data, &round, sizeof round);
  const net::Endpoint src{h.addr, kBarePort}, dst{h.peer, kBarePort};
  const wire::Bth send(b.tx[0]);
  send.set_opcode(wire::op::kRcSendOnly);
  send.set_pkey(wire::kDefaultPkey);
  send.set_dest_qp(BareRc::kQpn);
  send.set_ack_req(1);
  send.set_psn(b.send_psn);
  b.send_psn = (b.send_psn + 1) & wire::kQpnMask;
  std::memcpy(b.tx[0] + wire::Bth::kSize, w.inline_data, w.length);
  require(net::seal_icrc({b.tx[0], kShapedSendBytes}, src, dst), "bare: seal SEND");
  const wire::Bth ack(b.tx[1]);
  ack.set_opcode(wire::op::kRcAck);
  ack.set_pkey(wire::kDefaultPkey);
  ack.set_dest_qp(BareRc::kQpn);
  ack.set_psn((b.recv_psn - 1) & wire::kQpnMask);
  const wire::Aeth aeth(b.tx[1] + wire::Bth::kSize);
  aeth.set_syndrome(wire::aeth_syndrome(wire::AethType::kAck, wire::kAethCreditsInvalid));
  aeth.set_msn(b.msn & wire::kQpnMask);
  require(net::seal_icrc({b.tx[1], kShapedAckBytes}, src, dst), "bare: seal ACK");
  if (h.gso) {
    const std::span<uint8_t> a(b.tx[1], kShapedAckBytes);
    wire::store_icrc(a, wire::icrc_of(a) ^ wire::ipv4_id_icrc_delta(1, kShapedAckBytes));
  }
  shaped_send_bytes(h, h.bare_fd, to, b.tx[0], b.tx[1]);
}

// One received packet: parsed, its ICRC checked, then the responder's (a SEND: payload and
// completion) or the completer's (an ACK: the oldest send-queue entry retired) part. True for
// a SEND, whose completion is then the application's to take.
bool bare_packet(std::span<const uint8_t> bytes, const net::Endpoint& src,
                 const net::Endpoint& dst) {
  BareRc& b = bare_rc();
  const wire::ParseResult parsed = wire::parse_packet(bytes);
  // Not counted and answered later: a SEND dropped here is a round never answered.
  require(parsed.ok() && net::icrc_ok(bytes, src, dst, wire::Ipv4DfSearch::kSetOnly),
          "bare RC ping-pong: a packet did not parse or its ICRC did not check");
  const wire::PacketView& pkt = *parsed;
  if (pkt.opcode() == wire::op::kRcAck) {
    if (b.sq_tail != b.sq_head) ++b.sq_tail;
    return false;
  }
  if (pkt.opcode() != wire::op::kRcSendOnly || pkt.bth().psn() != b.recv_psn) {
    ++b.errors;
    return false;
  }
  b.recv_psn = (b.recv_psn + 1) & wire::kQpnMask;
  ++b.msn;
  const std::span<const uint8_t> payload = pkt.payload();
  std::memcpy(b.recv_buf, payload.data(), payload.size());
  BareRc::Cqe& c = b.cq[b.cq_head++ % BareRc::kSlots];
  c.wr_id = 0;
  c.byte_len = static_cast<uint32_t>(payload.size());
  c.qp_num = BareRc::kQpn;
  c.opcode = IBV_WC_RECV;
  c.status = IBV_WC_SUCCESS;
  return true;
}

// One datagram as read from the bare row's socket: its flow from the sender's address and
// IP_PKTINFO, split at the UDP_GRO segment size (as UdpSocketIo reports them), each packet
// through bare_packet. True when one was a SEND.
bool bare_datagram(const Host& h, const mmsghdr& mm, const uint8_t* buf) {
  const msghdr& m = mm.msg_hdr;
  const net::Endpoint src =
      net::Endpoint::from_sockaddr(static_cast<const sockaddr*>(m.msg_name), m.msg_namelen)
          .value_or(net::Endpoint{});
  net::Endpoint dst{h.addr, kBarePort};
  size_t segment = mm.msg_len;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(const_cast<msghdr*>(&m), c)) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
      in_pktinfo pi;
      std::memcpy(&pi, CMSG_DATA(c), sizeof pi);
      uint8_t a[4];
      std::memcpy(a, &pi.ipi_addr, 4);
      dst.address = net::Address::from_v4(std::span<const uint8_t, 4>(a));
    } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
      int g = 0;
      std::memcpy(&g, CMSG_DATA(c), sizeof g);
      if (g > 0) segment = static_cast<size_t>(g);
    }
  }
  bool send = false;
  for (size_t at = 0; at < mm.msg_len; at += segment)
    send |= bare_packet({buf + at, std::min<size_t>(segment, mm.msg_len - at)}, src, dst);
  return send;
}

// The application takes the SEND's completion and reads the round from the receive buffer.
uint64_t bare_take_completion() {
  BareRc& b = bare_rc();
  const BareRc::Cqe& c = b.cq[b.cq_tail++ % BareRc::kSlots];
  uint64_t round = ~uint64_t{0};
  if (c.status != IBV_WC_SUCCESS || c.byte_len != sizeof round) {
    ++b.errors;
    return round;
  }
  std::memcpy(&round, b.recv_buf, sizeof round);
  return round;
}

// Busy-polls recvmmsg over 32 buffers with address and cmsg space — or recvmsg into the first
// when the last read found at most one datagram — as UdpSocketIo reads, until
// a SEND-sized datagram (or, with GRO, a train starting with one) came; returns its round.
// ACK-sized ones are read and dropped, as the engine reads ACKs. With `bare`, the bare row's
// socket, each datagram goes through bare_datagram and the round is the completion's.
uint64_t shaped_recv_spin(const Host& h, bool bare = false) {
  constexpr size_t kSlots = 32;
  static uint8_t bufs[kSlots][256];
  static sockaddr_storage names[kSlots];
  alignas(cmsghdr) static uint8_t control[kSlots][128];
  static bool ones[2] = {};  // as UdpSocketIo: the last read found at most one datagram
  bool& one = ones[bare];
  const int fd = bare ? h.bare_fd : h.shaped_fd;
  iovec iov[kSlots];
  mmsghdr msgs[kSlots];
  for (;;) {
    for (size_t i = 0; i < kSlots; ++i) {
      iov[i] = iovec{bufs[i], sizeof bufs[i]};
      msgs[i] = mmsghdr{};
      msgs[i].msg_hdr.msg_name = &names[i];
      msgs[i].msg_hdr.msg_namelen = sizeof names[i];
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
      msgs[i].msg_hdr.msg_control = control[i];
      msgs[i].msg_hdr.msg_controllen = sizeof control[i];
    }
    int r;
    if (one) {
      const ssize_t k = recvmsg(fd, &msgs[0].msg_hdr, MSG_DONTWAIT);
      if (k >= 0) msgs[0].msg_len = static_cast<unsigned>(k);
      r = k >= 0 ? 1 : -1;
    } else {
      r = recvmmsg(fd, msgs, kSlots, MSG_DONTWAIT, nullptr);
    }
    one = one ? r <= 0 : r <= 1;
    if (r < 0) {
      if (errno != EAGAIN && errno != EINTR) die("recvmmsg (shaped)");
      continue;
    }
    bool got = false;
    uint64_t round = 0;
    if (bare) {
      for (int i = 0; i < r; ++i) got |= bare_datagram(h, msgs[i], bufs[i]);
      if (got) return bare_take_completion();
      continue;
    }
    for (int i = 0; i < r; ++i) {
      if (msgs[i].msg_len != kShapedSendBytes &&
          msgs[i].msg_len != kShapedSendBytes + kShapedAckBytes)
        continue;  // an ACK alone
      std::memcpy(&round, bufs[i], sizeof round);
      got = true;
    }
    if (got) return round;
  }
}

// ---------------------------------------------------------------------------------------------
// Host B: follows A's phases.

// --shm's limit: the bare ring (net/shm_ring.h) carrying one 8-byte record each way, as
// ShmPacketIo carries a datagram: header and payload copied in, published, copied out, released.
void ring_send(Host& h, uint64_t round) {
  const iovec iov{&round, sizeof round};
  net::ShmRecord r{};
  require(h.ring_tx->put(r, {&iov, 1}, sizeof round) == net::ShmProducer::Put::kOk, "ring put");
  (void)h.ring_tx->publish();  // nobody sleeps: no doorbell
}

uint64_t ring_recv_spin(Host& h) {
  net::ShmRecord r;
  uint64_t round = ~uint64_t{0};
  size_t length = 0;
  net::ShmConsumer::Get g;
  while ((g = h.ring_rx->get(&r, {reinterpret_cast<uint8_t*>(&round), sizeof round}, &length)) ==
         net::ShmConsumer::Get::kEmpty) {
  }
  require(g == net::ShmConsumer::Get::kOk && length == sizeof round, "ring get");
  h.ring_rx->release();
  return round;
}

void run_b(Host& h, int ctl) {
  const sockaddr_in to_a = sockaddr_of(h.peer, kRawPort);
  for (int s = 0; s < kRecvDepth; ++s) post_recv_slot(h, s);
  std::vector<uint8_t> dgram(65536);
  for (;;) {
    const Msg m = ctl_recv<Msg>(ctl);
    Msg r;
    r.phase = m.phase;
    switch (m.phase) {
      case Phase::kRawLat:
        for (uint32_t i = 0; i < m.rounds; ++i) {
          uint64_t round = 0;
          if (raw_recv_spin(h.raw_fd, &round, sizeof round) != kLatBytes || round != i) ++r.errors;
          raw_send(h.raw_fd, to_a, &round, sizeof round);
        }
        break;
      case Phase::kShapedLat: {
        const sockaddr_in to = sockaddr_of(h.peer, kShapedPort);
        for (uint32_t i = 0; i < m.rounds; ++i) {
          const uint64_t round = shaped_recv_spin(h);
          if (round != i) ++r.errors;
          shaped_send(h, to, round);
        }
        break;
      }
      case Phase::kBareLat: {
        const sockaddr_in to = sockaddr_of(h.peer, kBarePort);
        for (uint32_t i = 0; i < m.rounds; ++i) {
          const uint64_t round = shaped_recv_spin(h, /*bare=*/true);
          if (round != i) ++r.errors;
          bare_send(h, to, round);
        }
        r.errors += bare_rc().errors;
        bare_rc().errors = 0;
        break;
      }
      case Phase::kRcLat:
        for (uint32_t i = 0; i < m.rounds; ++i) {
          const uint64_t round = wait_lat_recv(h, &r.errors);
          if (round != i) ++r.errors;
          post_lat_send(h, round);
          h.rt->try_progress();  // send it now, from this thread (as a post that drives inline)
        }
        break;
      case Phase::kRingLat:
        for (uint32_t i = 0; i < m.rounds; ++i) {
          const uint64_t round = ring_recv_spin(h);
          if (round != i) ++r.errors;
          ring_send(h, round);
        }
        break;
      case Phase::kLineLat:
        // Round numbers start at 1 (0 is the line's first value): the last block's carry on.
        for (uint32_t i = 0; i < m.rounds; ++i) {
          const uint64_t want = h.line_round + 1 + i;
          while (h.line_in->load(std::memory_order_acquire) != want) {
          }
          h.line_out->store(want, std::memory_order_release);
        }
        h.line_round += m.rounds;
        break;
      case Phase::kRingStream: {
        // Each 4 KiB record copied out of the ring straight into the WRITE stream's target
        // buffer, in turn, until A says stop and the ring is empty.
        ctl_send(ctl, r);  // ready
        uint64_t n = 0;
        bool stop = false;
        for (;;) {
          net::ShmRecord rec;
          size_t length = 0;
          uint8_t* to = h.bw_buf.data + (n % (h.bw_buf.size / kRawBwDatagram)) * kRawBwDatagram;
          const auto g = h.ring_rx->get(&rec, {to, kRawBwDatagram}, &length);
          require(g != net::ShmConsumer::Get::kBroken, "ring stream: broken");
          if (g == net::ShmConsumer::Get::kOk) {
            h.ring_rx->release();
            const uint64_t t = now_ns();
            if (n == 0) r.first_ns = t;
            r.last_ns = t;
            ++n;
          } else if (stop) {
            break;
          }
          if ((g == net::ShmConsumer::Get::kEmpty || (n & 255) == 0) && !stop && ctl_ready(ctl))
            stop = true;  // A stopped putting: empty the ring
        }
        (void)ctl_recv<Msg>(ctl);  // stop
        r.bytes = n;
        break;
      }
      case Phase::kRawStream:
      case Phase::kRawRate: {
        // One recv per datagram until A says stop on the control channel.
        timeval tv{0, 20'000};
        setsockopt(h.raw_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        ctl_send(ctl, r);  // ready
        uint64_t n = 0;
        for (;;) {
          const ssize_t k = recv(h.raw_fd, dgram.data(), dgram.size(), 0);
          if (k == static_cast<ssize_t>(m.datagram)) {
            const uint64_t t = now_ns();
            if (n == 0) r.first_ns = t;
            r.last_ns = t;
            ++n;
          }
          if ((k < 0 || (n & 255) == 0) && ctl_ready(ctl)) break;
        }
        (void)ctl_recv<Msg>(ctl);  // stop
        r.bytes = n;
        timeval off{0, 0};
        setsockopt(h.raw_fd, SOL_SOCKET, SO_RCVTIMEO, &off, sizeof off);
        while (recv(h.raw_fd, dgram.data(), dgram.size(), MSG_DONTWAIT) >= 0) {
        }
        break;
      }
      case Phase::kRcBw:
      case Phase::kRcRate: {
        // The WRITE target's application does nothing: the engine thread places the data.
        ctl_send(ctl, r);  // ready
        if (h.rt->engine_tid() == 0) {
          // --no-engine-thread: the application thread drives the engine until A is done.
          while (!ctl_ready(ctl))
            for (int i = 0; i < 64; ++i) h.rt->try_progress();
        }
        (void)ctl_recv<Msg>(ctl);  // A's completions are in: B's memory holds the data
        (void)h.rt->counters();    // orders the engine's finished placements before our reads
        const PageBuffer& b = m.phase == Phase::kRcBw ? h.bw_buf : h.rate_buf;
        r.checksum = fnv1a(b.data, b.size);
        break;
      }
      case Phase::kEnd:
        ctl_send(ctl, counters_of(h));
        return;
    }
    ctl_send(ctl, r);
  }
}

// ---------------------------------------------------------------------------------------------
// Host A: runs the phases and prints.

struct Latency {
  double median_us = 0, mean_us = 0, p99_us = 0;
};

Latency summarize(std::vector<double>& half_rtt_us) {
  std::sort(half_rtt_us.begin(), half_rtt_us.end());
  Latency l;
  l.median_us = half_rtt_us[half_rtt_us.size() / 2];
  l.p99_us = half_rtt_us[half_rtt_us.size() * 99 / 100];
  double sum = 0;
  for (double v : half_rtt_us) sum += v;
  l.mean_us = sum / static_cast<double>(half_rtt_us.size());
  return l;
}

// A's side of one ping-pong phase: `hop(i)` sends round i and returns the round that came back
// (anything else counts as an error, as do B's). Appends each round's half round trip to `all`
// and returns the median of this phase's rounds.
template <typename Hop>
double ping_pong(int ctl, Phase phase, uint32_t rounds, const char* what, Hop hop,
                 std::vector<double>& all) {
  Msg m;
  m.phase = phase;
  m.rounds = rounds;
  ctl_send(ctl, m);
  std::vector<double> t;
  t.reserve(rounds);
  uint64_t errors = 0;
  for (uint64_t i = 0; i < rounds; ++i) {
    const auto t0 = Clock::now();
    if (hop(i) != i) ++errors;
    t.push_back(seconds_since(t0) * 1e6 / 2);
  }
  const Msg r = ctl_recv<Msg>(ctl);
  require(errors == 0 && r.errors == 0, what);
  all.insert(all.end(), t.begin(), t.end());
  return summarize(t).median_us;
}

double raw_latency(Host& h, int ctl, uint32_t rounds, std::vector<double>& all) {
  const sockaddr_in to_b = sockaddr_of(h.peer, kRawPort);
  return ping_pong(
      ctl, Phase::kRawLat, rounds, "raw ping-pong: a reply was wrong",
      [&](uint64_t i) {
        raw_send(h.raw_fd, to_b, &i, sizeof i);
        uint64_t back = 0;
        const ssize_t n = raw_recv_spin(h.raw_fd, &back, sizeof back);
        return n == static_cast<ssize_t>(kLatBytes) ? back : ~i;
      },
      all);
}

double shaped_latency(Host& h, int ctl, uint32_t rounds, std::vector<double>& all) {
  const sockaddr_in to_b = sockaddr_of(h.peer, kShapedPort);
  return ping_pong(
      ctl, Phase::kShapedLat, rounds, "RC-shaped ping-pong: a reply was wrong",
      [&](uint64_t i) {
        shaped_send(h, to_b, i);
        return shaped_recv_spin(h);
      },
      all);
}

double bare_latency(Host& h, int ctl, uint32_t rounds, std::vector<double>& all) {
  const sockaddr_in to_b = sockaddr_of(h.peer, kBarePort);
  const double median = ping_pong(
      ctl, Phase::kBareLat, rounds, "bare RC ping-pong: a reply was wrong",
      [&](uint64_t i) {
        bare_send(h, to_b, i);
        return shaped_recv_spin(h, /*bare=*/true);
      },
      all);
  require(bare_rc().errors == 0, "bare RC ping-pong: a PSN or a completion was wrong");
  return median;
}

// The last SEND completions (ACKs) may still be on their way at the end: not needed.
double rc_latency(Host& h, int ctl, uint32_t rounds, std::vector<double>& all) {
  return ping_pong(
      ctl, Phase::kRcLat, rounds, "RC ping-pong: a completion or a round number was wrong",
      [&](uint64_t i) {
        post_lat_send(h, i);
        h.rt->try_progress();
        uint64_t bad = 0;
        const uint64_t back = wait_lat_recv(h, &bad);
        return bad == 0 ? back : ~i;
      },
      all);
}

double ring_latency(Host& h, int ctl, uint32_t rounds, std::vector<double>& all) {
  return ping_pong(
      ctl, Phase::kRingLat, rounds, "ring ping-pong: a reply was wrong",
      [&](uint64_t i) {
        ring_send(h, i);
        return ring_recv_spin(h);
      },
      all);
}

double line_latency(Host& h, int ctl, uint32_t rounds, std::vector<double>& all) {
  const uint64_t base = h.line_round;
  h.line_round += rounds;
  return ping_pong(
      ctl, Phase::kLineLat, rounds, "cache-line ping-pong: a reply was wrong",
      [&](uint64_t i) {
        h.line_out->store(base + 1 + i, std::memory_order_release);
        while (h.line_in->load(std::memory_order_acquire) != base + 1 + i) {
        }
        return i;
      },
      all);
}

// The three latency rows in blocks of kLatBlock rounds taken in turn (raw, shaped, RC), so
// that this VM's slow and fast spells, which come and go within minutes, fall on all three
// alike. Each ratio is also taken block by block, and its median over the blocks is printed
// beside the ratio of the overall medians.
struct LatencyRows {
  Latency raw, shaped, bare, rc, ring, line;         // ring, line: --shm only
  double rc_raw = 0, shaped_raw = 0, rc_shaped = 0;  // medians of the per-block ratios
  double bare_shaped = 0, rc_bare = 0;
  double rc_ring = 0;
  uint32_t blocks = 0;
};

LatencyRows latency_rows(Host& h, int ctl, uint32_t rounds) {
  std::vector<double> raw, shaped, bare, rc, ring, line;
  std::vector<double> rc_raw, shaped_raw, rc_shaped, rc_ring, bare_shaped, rc_bare;
  LatencyRows rows;
  for (uint32_t done = 0; done < rounds; done += kLatBlock) {
    const uint32_t n = std::min(kLatBlock, rounds - done);
    const double r = raw_latency(h, ctl, n, raw);
    const double s = shaped_latency(h, ctl, n, shaped);
    const double b = bare_latency(h, ctl, n, bare);
    const double c = rc_latency(h, ctl, n, rc);
    if (h.shm) {
      rc_ring.push_back(c / ring_latency(h, ctl, n, ring));
      (void)line_latency(h, ctl, n, line);
    }
    rc_raw.push_back(c / r);
    shaped_raw.push_back(s / r);
    rc_shaped.push_back(c / s);
    bare_shaped.push_back(b / s);
    rc_bare.push_back(c / b);
    ++rows.blocks;
  }
  rows.raw = summarize(raw);
  rows.shaped = summarize(shaped);
  rows.rc = summarize(rc);
  rows.rc_raw = summarize(rc_raw).median_us;
  rows.shaped_raw = summarize(shaped_raw).median_us;
  rows.rc_shaped = summarize(rc_shaped).median_us;
  rows.bare = summarize(bare);
  rows.bare_shaped = summarize(bare_shaped).median_us;
  rows.rc_bare = summarize(rc_bare).median_us;
  if (h.shm) {
    rows.ring = summarize(ring);
    rows.line = summarize(line);
    rows.rc_ring = summarize(rc_ring).median_us;
  }
  return rows;
}

// Raw stream: datagrams/s B received.
double raw_stream(Host& h, int ctl, Phase phase, size_t datagram, double seconds) {
  const sockaddr_in to_b = sockaddr_of(h.peer, kRawPort);
  Msg m;
  m.phase = phase;
  m.datagram = datagram;
  ctl_send(ctl, m);
  (void)ctl_recv<Msg>(ctl);  // B ready
  std::vector<uint8_t> buf(datagram, 0xA5);
  const auto t0 = Clock::now();
  while (seconds_since(t0) < seconds) {
    for (int i = 0; i < 64; ++i) {
      // One datagram per syscall; a full socket buffer (ENOBUFS/EAGAIN) is retried.
      raw_send(h.raw_fd, to_b, buf.data(), buf.size());
    }
  }
  ctl_send(ctl, m);  // stop
  const Msg r = ctl_recv<Msg>(ctl);
  require(r.bytes > 1 && r.last_ns > r.first_ns, "raw stream: B received nothing");
  return static_cast<double>(r.bytes - 1) / (static_cast<double>(r.last_ns - r.first_ns) * 1e-9);
}

// --shm's streaming limit: 4 KiB records through the bare ring for `seconds`, each copied in
// from the WRITE stream's source buffer and, by B, out into its target buffer (two copies, as
// a WRITE's payload takes); bytes per second B received.
double ring_stream(Host& h, int ctl, double seconds) {
  Msg m;
  m.phase = Phase::kRingStream;
  ctl_send(ctl, m);
  (void)ctl_recv<Msg>(ctl);  // B ready
  const size_t slots = h.bw_buf.size / kRawBwDatagram;
  uint64_t n = 0;
  const auto t0 = Clock::now();
  while (seconds_since(t0) < seconds) {
    for (int i = 0; i < 64; ++i, ++n) {
      const iovec iov{h.bw_buf.data + (n % slots) * kRawBwDatagram, kRawBwDatagram};
      const net::ShmRecord rec{};
      net::ShmProducer::Put p;
      while ((p = h.ring_tx->put(rec, {&iov, 1}, kRawBwDatagram)) == net::ShmProducer::Put::kFull)
        (void)h.ring_tx->publish();
      require(p == net::ShmProducer::Put::kOk, "ring stream: put");
    }
    (void)h.ring_tx->publish();
  }
  ctl_send(ctl, m);  // stop
  const Msg r = ctl_recv<Msg>(ctl);
  require(r.bytes > 1 && r.last_ns > r.first_ns, "ring stream: B received nothing");
  return static_cast<double>(r.bytes - 1) * kRawBwDatagram /
         (static_cast<double>(r.last_ns - r.first_ns) * 1e-9);
}

struct Stream {
  double msgs_per_s = 0;
  uint64_t messages = 0;
  bool checksum_ok = false;
};

// RDMA WRITEs of `size` bytes into the peer's slots, `window` outstanding, for `seconds`.
Stream rc_write_stream(Host& h, int ctl, Phase phase, const HostInfo& peer, uint32_t peer_rkey,
                       double seconds) {
  const bool bw = phase == Phase::kRcBw;
  provider::Qp* qp = bw ? h.bw : h.rate;
  provider::Cq* cq = bw ? h.cq_bw : h.cq_rate;
  PageBuffer& src = bw ? h.bw_buf : h.rate_buf;
  const provider::Mr* mr = bw ? h.bw_mr : h.rate_mr;
  const size_t size = bw ? kBwBytes : kRateBytes;
  const uint32_t window = bw ? kBwWindow : kRateWindow;
  const uint64_t remote = bw ? peer.bw_addr : peer.rate_addr;
  for (size_t i = 0; i < src.size; ++i) src.data[i] = static_cast<uint8_t>(i * 131 + 7 + (i >> 12));

  Msg m;
  m.phase = phase;
  ctl_send(ctl, m);
  (void)ctl_recv<Msg>(ctl);  // B ready
  uint64_t posted = 0, completed = 0, errors = 0;
  auto post = [&] {
    const uint32_t slot = static_cast<uint32_t>(posted % window);
    ibv_sge sge{reinterpret_cast<uintptr_t>(src.data + slot * size), static_cast<uint32_t>(size),
                mr->lkey()};
    ibv_send_wr wr{};
    wr.wr_id = posted;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote + slot * size;
    wr.wr.rdma.rkey = peer_rkey;
    ibv_send_wr* bad = nullptr;
    require(qp->post_send(&wr, &bad).ok(), "post_send WRITE");
    ++posted;
  };
  ibv_wc wc[kPollBatch];
  const auto t0 = Clock::now();
  bool posting = true;
  while (posting || completed < posted) {
    while (posting && posted - completed < window) post();
    const int n = cq->poll(kPollBatch, wc);
    for (int i = 0; i < n; ++i)
      if (wc[i].status != IBV_WC_SUCCESS) ++errors;
    completed += static_cast<uint64_t>(n);
    if (n == 0) h.rt->try_progress();
    // Every slot is written at least once, so the checksum covers the whole target buffer.
    if (posting && posted >= window && (completed & 63) == 0 && seconds_since(t0) >= seconds)
      posting = false;
  }
  const double elapsed = seconds_since(t0);
  require(errors == 0, "RC WRITE stream: a completion failed");
  ctl_send(ctl, m);  // done
  const Msg r = ctl_recv<Msg>(ctl);
  Stream s;
  s.messages = completed;
  s.msgs_per_s = static_cast<double>(completed) / elapsed;
  s.checksum_ok = r.checksum == fnv1a(src.data, src.size);
  return s;
}

// The copy limit for the bandwidth row: memcpy of 64 KiB messages, the stream's window of them
// (1 MiB) to a second buffer as large, for `seconds`; bytes per second.
double memcpy_rate(double seconds) {
  PageBuffer from(kBwWindow * kBwBytes), to(kBwWindow * kBwBytes);
  std::memset(from.data, 0x5A, from.size);
  uint64_t bytes = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  while ((elapsed = seconds_since(t0)) < seconds) {
    for (uint32_t i = 0; i < kBwWindow; ++i) {
      std::memcpy(to.data + i * kBwBytes, from.data + i * kBwBytes, kBwBytes);
      asm volatile("" : : "r"(to.data) : "memory");  // the copy is not optimised away
    }
    bytes += kBwWindow * kBwBytes;
  }
  return static_cast<double>(bytes) / elapsed;
}

int run_a(Host& h, int ctl, const HostInfo& peer, uint32_t rate_rkey, double seconds,
          uint32_t rounds, size_t tx_batch, uint64_t ack_delay_ns, bool gso, bool gro) {
  for (int s = 0; s < kRecvDepth; ++s) post_recv_slot(h, s);
  // Warm-up: every path once, untimed.
  (void)latency_rows(h, ctl, kLatBlock);

  const uint64_t turns0 = h.rt->engine_thread_turns(), wakeups0 = h.rt->eventfd_wakeups(),
                 inline0 = h.rt->inline_turns();
  const LatencyRows lat = latency_rows(h, ctl, rounds);
  const Latency& raw = lat.raw;
  const Latency& shaped = lat.shaped;
  const Latency& rc = lat.rc;
  const double per_round = 1.0 / rounds;
  const double lat_turns = static_cast<double>(h.rt->engine_thread_turns() - turns0) * per_round;
  const double lat_wakeups = static_cast<double>(h.rt->eventfd_wakeups() - wakeups0) * per_round;
  const double lat_inline = static_cast<double>(h.rt->inline_turns() - inline0) * per_round;
  const double raw_bw =
      raw_stream(h, ctl, Phase::kRawStream, kRawBwDatagram, seconds) * kRawBwDatagram;
  const Stream bw = rc_write_stream(h, ctl, Phase::kRcBw, peer, peer.rkey, seconds);
  const double rc_bw = bw.msgs_per_s * kBwBytes;
  const double copy_bw = memcpy_rate(std::min(seconds, 0.5));
  const double ring_bw = h.shm ? ring_stream(h, ctl, seconds) : 0;
  const double raw_rate = raw_stream(h, ctl, Phase::kRawRate, kRateBytes, seconds);
  const Stream rate = rc_write_stream(h, ctl, Phase::kRcRate, peer, rate_rkey, seconds);

  Msg end;
  end.phase = Phase::kEnd;
  ctl_send(ctl, end);
  const CountersMsg cb = ctl_recv<CountersMsg>(ctl);
  const CountersMsg ca = counters_of(h);

  std::printf("urdma loopback benchmark: two processes, 127.0.0.1 <-> 127.0.0.2, runtime %s "
              "over %s, engine tx_batch %zu ack_delay %.1f us, UDP GSO %s GRO %s\n",
              h.rt->engine_tid() != 0 ? "with engine threads" : "without engine threads",
              h.shm ? "shared memory (ShmPacketIo)" : "UdpSocketIo",
              tx_batch, static_cast<double>(ack_delay_ns) / 1000, gso ? "on" : "off",
              gro ? "on" : "off");
  std::printf("%-44s %14s %14s %8s %8s\n", "measurement", "RC", "raw UDP", "ratio", "target");
  std::printf("%-44s %11.2f us %11.2f us %8.2f %8s\n", "one-way latency 8 B, median (half RTT)",
              rc.median_us, raw.median_us, rc.median_us / raw.median_us, "<= 1.3");
  std::printf("%-44s %11.2f us %11.2f us %8.2f\n", "one-way latency 8 B, mean", rc.mean_us,
              raw.mean_us, rc.mean_us / raw.mean_us);
  std::printf("%-44s %11.2f us %11.2f us %8.2f\n", "one-way latency 8 B, 99th percentile",
              rc.p99_us, raw.p99_us, rc.p99_us / raw.p99_us);
  std::printf("%-44s %11.2f us %11.2f us %8.2f\n", "  raw UDP shaped as RC's datagrams, median",
              shaped.median_us, raw.median_us, shaped.median_us / raw.median_us);
  std::printf("%-44s %11.2f us %11.2f us %8.2f\n", "  the same with RC's least work, median",
              lat.bare.median_us, raw.median_us, lat.bare.median_us / raw.median_us);
  if (h.shm) {
    std::printf("%-44s %11.2f us %11.2f us %8.2f\n", "  bare shared-memory ring 8 B, median",
                lat.ring.median_us, raw.median_us, lat.ring.median_us / raw.median_us);
    std::printf("%-44s %11.2f us %11.2f us %8.2f\n", "  one cache line each way, median",
                lat.line.median_us, raw.median_us, lat.line.median_us / raw.median_us);
  }
  std::printf("%-44s %9.3f GB/s %9.3f GB/s %8.2f %8s\n",
              "bandwidth: WRITE 64 KiB x16 vs 4 KiB dgrams", rc_bw / 1e9, raw_bw / 1e9,
              rc_bw / raw_bw, ">= 1.0");
  std::printf("%-44s %9.3f GB/s %9.3f GB/s %8.2f\n", "  the same WRITEs vs memcpy of 64 KiB",
              rc_bw / 1e9, copy_bw / 1e9, rc_bw / copy_bw);
  if (h.shm)
    std::printf("%-44s %9.3f GB/s %9.3f GB/s %8.2f\n",
                "  the same WRITEs vs 4 KiB through the bare ring", rc_bw / 1e9, ring_bw / 1e9,
                rc_bw / ring_bw);
  std::printf("%-44s %9.3f M/s  %9.3f M/s  %8.2f\n", "message rate: WRITE 64 B x64 vs 64 B dgrams",
              rate.msgs_per_s / 1e6, raw_rate / 1e6, rate.msgs_per_s / raw_rate);
  std::printf("rounds %u per latency row; %.1f s per stream row; %" PRIu64 " + %" PRIu64
              " WRITEs completed; target checksums %s\n",
              rounds, seconds, bw.messages, rate.messages,
              bw.checksum_ok && rate.checksum_ok ? "match" : "DIFFER");
  std::printf(
      "RC latency median over the RC-shaped raw UDP ping-pong: %.2f (urdma's own code; "
      "the row above is what RC's datagrams cost the kernel)\n",
      rc.median_us / shaped.median_us);
  std::printf(
      "latency in %u blocks of %u rounds (raw, shaped, least work, RC in turn), median of the "
      "blocks' ratios: RC/raw %.2f, shaped/raw %.2f, RC/shaped %.2f\n",
      lat.blocks, kLatBlock, lat.rc_raw, lat.shaped_raw, lat.rc_shaped);
  std::printf(
      "RC's least work over shaped %.2f (the floor under an RC implementation's own code), "
      "RC over it %.2f (what urdma's structure adds)\n",
      lat.bare_shaped, lat.rc_bare);
  if (h.shm)
    std::printf("RC latency median over the bare ring ping-pong, median of the blocks' ratios: "
                "%.2f (the engine's cost above the ring it sends through)\n",
                lat.rc_ring);
  std::printf("RC latency rounds, A per round: %.2f engine-thread turns, %.2f doorbell wake-ups, "
              "%.2f inline turns\n",
              lat_turns, lat_wakeups, lat_inline);
  for (const auto& [name, c] : {std::pair{"A", ca}, std::pair{"B", cb}})
    std::printf("engine %s: sent %" PRIu64 " rcvd %" PRIu64 " retransmits %" PRIu64
                " seq-NAKs %" PRIu64 " dup-requests %" PRIu64 " drops %" PRIu64
                " tx-blocked %" PRIu64 "\n",
                name, c.sent_pkts, c.rcvd_pkts, c.retransmits, c.seq_naks, c.duplicate_request,
                c.drops, c.tx_blocked);
  return bw.checksum_ok && rate.checksum_ok ? 0 : 1;
}

// A fresh network namespace with its loopback up (root only).
bool enter_netns() {
  if (unshare(CLONE_NEWNET) != 0) return false;
  const int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) die("socket");
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (ioctl(s, SIOCGIFFLAGS, &ifr) != 0) die("SIOCGIFFLAGS lo");
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
  if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) die("SIOCSIFFLAGS lo");
  close(s);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2.0;
  uint32_t rounds = 20'000;
  bool netns = true;
  bool engine_thread = true;
  size_t tx_batch = 64;
  uint64_t ack_delay_ns = 50'000;
  bool gso = true;
  bool gro = true;
  bool shm = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = static_cast<uint32_t>(std::atoi(argv[++i]));
    } else if (a == "--tx-batch" && i + 1 < argc) {
      tx_batch = static_cast<size_t>(std::atoi(argv[++i]));
    } else if (a == "--ack-delay-us" && i + 1 < argc) {
      ack_delay_ns = static_cast<uint64_t>(std::atof(argv[++i]) * 1000);
    } else if (a == "--no-engine-thread") {
      engine_thread = false;
    } else if (a == "--no-netns") {
      netns = false;
    } else if (a == "--no-gso") {
      gso = false;
    } else if (a == "--no-gro") {
      gro = false;
    } else if (a == "--shm") {
      shm = true;
    } else {
      std::fprintf(stderr, "usage: %s [--seconds S] [--rounds N] [--tx-batch N] [--ack-delay-us U] [--no-engine-thread] [--no-netns] [--no-gso] [--no-gro] [--shm]\n", argv[0]);
      return 2;
    }
  }
  require(seconds > 0 && rounds > 0, "--seconds and --rounds must be positive");
  require(tx_batch >= 1 && tx_batch <= net::kMaxBatch, "--tx-batch must be 1..64");
  if (netns && geteuid() == 0 && !enter_netns())
    std::fprintf(stderr, "urdma_loopback_bench: unshare(CLONE_NEWNET) failed; current namespace\n");

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) die("socketpair");
  const net::Address a_addr = net::Address::from_v4(127, 0, 0, 1);
  const net::Address b_addr = net::Address::from_v4(127, 0, 0, 2);
  const ShmShared shared = shm ? make_shm_shared() : ShmShared{};
  const pid_t child = fork();
  if (child < 0) die("fork");
  const bool is_a = child != 0;
  const int ctl = is_a ? sv[0] : sv[1];
  close(is_a ? sv[1] : sv[0]);

  Host h;
  open_host(h, is_a ? a_addr : b_addr, is_a ? b_addr : a_addr, engine_thread, tx_batch,
            ack_delay_ns, gso, gro, shared, is_a ? 0 : 1);
  // Exchange QPNs and keys, then bring the QPs up towards the peer.
  ctl_send(ctl, info_of(h));
  ctl_send(ctl, h.rate_mr->rkey());
  const HostInfo peer = ctl_recv<HostInfo>(ctl);
  const uint32_t peer_rate_rkey = ctl_recv<uint32_t>(ctl);
  connect_host(h, peer, is_a);

  if (!is_a) {
    run_b(h, ctl);
    h.rt.reset();
    return 0;
  }
  const int rc = run_a(h, ctl, peer, peer_rate_rkey, seconds, rounds, tx_batch, ack_delay_ns, gso, gro);
  h.rt.reset();  // the engine thread stops before the buffers go
  int status = 0;
  waitpid(child, &status, 0);
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 3);
}
