// libFuzzer target for the engine's receive path (issue 3: "the engine never trusts anything an
// application or a peer wrote: a malformed packet is dropped and counted; nothing is ever
// written outside a registered region with the right access").
//
// THE WORLD (rebuilt for every input, so a run is deterministic up to the MR table's random
// keys): host B = one Device + Engine on an in-memory PacketIo (test::MemoryIo) and a VirtualClock,
// at 10.0.0.2. On it:
//  * an RC QP (path MTU 256, rq_psn kRcRqPsn, sq_psn kRcSqPsn) connected to the fictitious peer
//    10.0.0.1 / QPN 0x11, with receive WQEs of several SGE shapes and, on its send queue, a BIND
//    of a type 2B window, a 2-packet SEND, a WRITE, a 3-response READ, a CMP_SWP, a FETCH_ADD
//    and an inline SEND (all on the wire and waiting for the peer's ACKs / responses);
//  * a UC QP on an SRQ (rq_psn kUcRqPsn) and a UD QP (Q_Key kUdQkey) with its own receive queue;
//  * an arena of registered regions (remote-writable, remote-read-only, zero-based, at the top
//    of the IOVA space, at an unaligned host address, without remote rights, without any
//    access, the window's parent), every one between guard bytes that are not registered.
//
// THE INPUT is a sequence of datagrams, each a chunk:
//   mode(1) aux(1) extra(1) length(2, big-endian) bytes(length)
//   mode  bits 0-1  DestQP: 0 as is, 1 the RC QP, 2 the UC QP, 3 the UD QP
//         bits 2-3  PSN: 0 as is, 1 the responder's expected PSN, 2 the completer's oldest
//                   unacknowledged PSN, 3 expected − 1 (a duplicate)
//         bit 4     RETH / AtomicETH / IETH key and VA from the region table (aux), DETH Q_Key
//         bit 5     RETH DMA length clipped to the chosen region's end
//         bits 6-7  0, 1: sealed (correct ICRC) from the peer; 2: sealed from a stranger;
//                   3: delivered exactly as given, from the peer
//   aux   bits 0-3  region-table entry (12 regions, then the window; 15 also means: re-post no
//                   receive WQEs after this datagram); bits 4-7 the offset inside it, in 16ths
//   extra bits 0-5  log2 of the virtual nanoseconds to advance after the datagram (bit 6 on)
//         bit 7     IPv6 addresses instead of IPv4
// Each datagram goes through recv, poll(); then the clock advances (timers fire) and poll()
// runs again. Receive WQEs are re-posted as they are consumed, CQs drained.
//
// THE ORACLE, after every datagram (a failure prints why and aborts, which libFuzzer reports):
//  * every guard byte and every region nothing may write (remote-read-only, no remote rights,
//    no access, the window's parent outside the window, the requester's source) is intact;
//  * rcvd_pkts counted the datagram; a datagram the harness itself finds malformed (parse
//    error, ICRC, P_Key, unknown QPN, oversized) is counted under exactly that drop reason and
//    produces no packet and no completion;
//  * every datagram the engine sent parses, carries the ICRC of its flow (IPv4 ID 0, DF),
//    goes to the peer's address and QPN; a READ response's payload comes from remote-readable
//    memory only; sent_pkts counts them;
//  * every completion names one of our QPs, and a successful receive's byte_len fits the WQE.
#include <algorithm>
#include <array>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "net/clock.h"
#include "net/packet_io.h"
#include "provider/device.h"
#include "support/datagram.h"
#include "support/memory_host.h"
#include "support/memory_io.h"
#include "support/qp_setup.h"
#include "wire/grh.h"
#include "wire/icrc.h"
#include "wire/packet.h"
#include "wire/psn.h"

namespace {

using namespace urdma;

[[noreturn]] void fail(const char* fmt, ...) {
  std::fprintf(stderr, "engine_fuzz: INVARIANT BROKEN: ");
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "\n");
  std::abort();
}
#define REQUIRE(cond, ...)          \
  do {                              \
    if (!(cond)) fail(__VA_ARGS__); \
  } while (0)

const net::Address kHostB = net::Address::from_v4(10, 0, 0, 2);
const net::Address kPeer = net::Address::from_v4(10, 0, 0, 1);
const net::Address kStranger = net::Address::from_v4(10, 0, 0, 9);
// IPv6 forms (fd00::1 / fd00::2): a connected QP's peer is the IPv4 one, so these reach only UD.
constexpr net::Address::Bytes kPeer6Bytes = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
constexpr net::Address::Bytes kHostB6Bytes = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
constexpr uint16_t kPeerPort = 0xC011;
constexpr uint32_t kPeerQpn = 0x11;
constexpr uint32_t kRcSqPsn = 0x100;
constexpr uint32_t kRcRqPsn = 0x200;
constexpr uint32_t kUcRqPsn = 0x300;
constexpr uint32_t kUdQkey = 0x11111111;
constexpr ibv_mtu kPathMtu = IBV_MTU_256;
constexpr size_t kChunkHeaderBytes = 5;
constexpr size_t kMaxChunks = 64;         // bounded work per input
constexpr unsigned kMaxAdvanceLog2 = 40;  // ~18 virtual minutes
constexpr uint32_t kRqDepth = 8;          // receive WQEs kept posted per queue
constexpr int kUdCqEntries = 4;           // < kRqDepth: an error flush of the UD QP overruns it
constexpr size_t kGuardBytes = 64;
constexpr uint8_t kGuardByte = 0xA5;

// ---- the regions of the arena ----------------------------------------------------------------
enum class Writable : uint8_t {
  kYes,        // the peer or the engine may legitimately write it
  kNo,         // nothing may ever write it
  kOnlyWindow  // only the bound window's range [kWindowOffset, +kWindowBytes)
};
struct RegionSpec {
  const char* name;
  size_t bytes;
  int access;
  enum { kIovaIsAddr, kIovaTop, kIovaFixed } iova_mode;
  uint64_t fixed_iova;
  bool unaligned_host;  // placed at an odd host address
  Writable writable;
};
constexpr int kLW = IBV_ACCESS_LOCAL_WRITE;
constexpr int kAllRemote =
    kLW | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
enum Region : size_t {
  kA,
  kB,
  kZ,
  kTop,
  kRo,
  kUnal,
  kNoRemote,
  kNoAccess,
  kRecv,
  kLocal,
  kSrc,
  kMwParent,
  kRegionCount
};
constexpr std::array<RegionSpec, kRegionCount> kRegions = {{
    {"A (all remote rights)", 4096, kAllRemote, RegionSpec::kIovaIsAddr, 0, false, Writable::kYes},
    {"B (small, all rights)", 64, kAllRemote, RegionSpec::kIovaIsAddr, 0, false, Writable::kYes},
    {"Z (zero based)", 512, kAllRemote | IBV_ACCESS_ZERO_BASED, RegionSpec::kIovaIsAddr, 0, false,
     Writable::kYes},
    {"TOP (iova at 2^64 - size)", 256, kAllRemote, RegionSpec::kIovaTop, 0, false, Writable::kYes},
    {"RO (remote read only)", 512, IBV_ACCESS_REMOTE_READ, RegionSpec::kIovaIsAddr, 0, false,
     Writable::kNo},
    {"UNAL (unaligned host address)", 64, kAllRemote, RegionSpec::kIovaFixed, 0x10000, true,
     Writable::kYes},
    {"NOREMOTE (local write only)", 256, kLW, RegionSpec::kIovaIsAddr, 0, false, Writable::kNo},
    {"NOACCESS (no rights)", 256, 0, RegionSpec::kIovaIsAddr, 0, false, Writable::kNo},
    {"RECV (receive buffers)", 32 * 640 + 1100, kLW, RegionSpec::kIovaIsAddr, 0, false,
     Writable::kYes},
    {"LOCAL (READ / atomic results)", 2048, kLW, RegionSpec::kIovaIsAddr, 0, false, Writable::kYes},
    {"SRC (requester source)", 1024, 0, RegionSpec::kIovaIsAddr, 0, false, Writable::kNo},
    {"MWPARENT (window parent)", 1024, kLW | IBV_ACCESS_MW_BIND, RegionSpec::kIovaIsAddr, 0, false,
     Writable::kOnlyWindow},
}};
constexpr size_t kRecvSlotBytes = 640;
constexpr size_t kWindowOffset = 256;
constexpr size_t kWindowBytes = 512;
constexpr int kWindowAccess =
    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

using test::v4_of;

uint8_t region_pattern(size_t region, size_t i) {
  return static_cast<uint8_t>((i * 131 + region * 29 + (i >> 8)) & 0xFF);
}

// wr_id of a receive WQE: its total SGE length in the low 32 bits, a queue tag above.
constexpr uint64_t recv_wr_id(uint32_t tag, uint32_t total) {
  return (uint64_t{tag} << 32) | total;
}

// ---- the world -------------------------------------------------------------------------------
class World {
 public:
  World() : host_(device_config(), engine::EngineConfig{}, 1024) {
    // Every datagram is checked as it is sent (check_sent), not kept.
    io_.set_recording(false);
    io_.on_send = [this](const net::TxDatagram& d, std::span<const uint8_t> bytes) {
      check_sent(d, bytes);
    };
    ud_cq_ = dev_.create_cq(kUdCqEntries).value();
    build_arena();
    ibv_srq_attr sa = {};
    sa.max_wr = 32;
    sa.max_sge = 4;
    srq_ = dev_.create_srq(pd_, sa).value();
    rc_ = make_qp(IBV_QPT_RC, nullptr, kRcRqPsn);
    uc_ = make_qp(IBV_QPT_UC, srq_, kUcRqPsn);
    ud_ = make_qp(IBV_QPT_UD, nullptr, 0);
    mw_ = dev_.alloc_mw(pd_, IBV_MW_TYPE_2).value();
    top_up_receives();
    post_requests();
    engine_.poll();
    REQUIRE(mw_->bound(), "the window bind did not execute");
    check_world("setup");
    settle();
  }

  void run_chunk(uint8_t mode, uint8_t aux, uint8_t extra, std::span<const uint8_t> data);
  void finish() {
    starve_ = false;
    settle();
    check_world("end of input");
    if (verbose_) print_counters();
  }

 private:
  static provider::DeviceConfig device_config();
  void build_arena();
  provider::Qp* make_qp(ibv_qp_type type, provider::Srq* srq, uint32_t rq_psn);
  void post_requests();
  // The next receive WQE of an RC-like queue (tag 1: the RC QP's, 2: the SRQ's), its SGEs in
  // `s`; post_recv_rc_like posts it to a QP or an SRQ. (One function taking both, one of them
  // null, tripped gcc 12 -O3's -Werror=nonnull in the branch not taken.)
  ibv_recv_wr rc_like_recv(uint32_t tag, std::array<ibv_sge, 2>& s);
  template <class Queue>
  void post_recv_rc_like(Queue* queue, uint32_t tag) {
    std::array<ibv_sge, 2> s{};
    ibv_recv_wr wr = rc_like_recv(tag, s);
    ibv_recv_wr* bad = nullptr;
    const auto st = queue->post_recv(&wr, &bad);
    REQUIRE(st.ok(), "post_recv tag %u: errno %d", tag, st.error());
  }
  void post_recv_ud();
  void top_up_receives();
  void settle();
  void drain_cq();
  void drain_one(provider::Cq* cq);
  void check_world(const char* when);
  void print_counters() const;
  void check_sent(const net::TxDatagram& d, std::span<const uint8_t> bytes);
  uint32_t qpn_for(unsigned sel) const;
  void patch(std::vector<uint8_t>& bytes, uint8_t mode, uint8_t aux);
  struct Key {
    uint32_t rkey;
    uint64_t iova;
    uint64_t bytes;
  };
  Key key_for(unsigned index) const;

  uint8_t* region_addr(size_t r) const { return arena_.get() + region_offset_[r]; }
  // Datagrams the engine has sent, as the I/O counted them.
  uint64_t io_sent() const { return io_.counters().tx_datagrams; }

  // Host B: device, engine, the in-memory wire, the clock; a PD and the RC/UC QPs' CQ.
  test::MemoryHost host_;
  net::VirtualClock& clock_ = host_.clock;
  test::MemoryIo& io_ = host_.io;
  provider::Device& dev_ = host_.dev;
  engine::Engine& engine_ = host_.engine;
  provider::Pd* const pd_ = host_.pd;
  provider::Cq* const cq_ = host_.cq;
  provider::Cq* ud_cq_ = nullptr;  // small: a flush of the UD QP's receive queue overruns it
  provider::Srq* srq_ = nullptr;
  provider::Qp* rc_ = nullptr;
  provider::Qp* uc_ = nullptr;
  provider::Qp* ud_ = nullptr;
  provider::Mw* mw_ = nullptr;
  std::unique_ptr<uint8_t[]> arena_;
  size_t arena_bytes_ = 0;
  std::array<size_t, kRegionCount> region_offset_{};
  std::array<provider::Mr*, kRegionCount> mr_{};
  std::vector<std::pair<size_t, size_t>> guards_;  // (offset, length)
  std::vector<uint8_t> window_after_invalidate_;   // the window's bytes when it was invalidated
  std::array<uint32_t, 4> recv_seq_{};             // per receive queue tag (1 RC, 2 SRQ, 3 UD)
  // ENGINE_FUZZ_VERBOSE=1: completions and counters on stderr (to see what a seed reaches).
  const bool verbose_ = std::getenv("ENGINE_FUZZ_VERBOSE") != nullptr;
  // Every request must leave a trace (a counter, a packet, a completion or a state change).
  // ENGINE_FUZZ_LAX_ACCOUNTING=1 turns that check off, to hunt for other things.
  const bool strict_accounting_ = std::getenv("ENGINE_FUZZ_LAX_ACCOUNTING") == nullptr;
  bool starve_ = false;  // this chunk: no receive WQEs re-posted (RNR, UD/UC drops)
};

provider::DeviceConfig World::device_config() {
  return test::device_config(nullptr, kHostB, IBV_MTU_1024);  // active MTU: the UD QP's
}

void World::build_arena() {
  // guard | region | guard | region | ... | guard; regions 8-byte aligned (+1 if unaligned).
  size_t at = 0;
  for (size_t r = 0; r < kRegionCount; ++r) {
    guards_.push_back({at, kGuardBytes});
    at += kGuardBytes;
    if (kRegions[r].unaligned_host) {
      guards_.push_back({at, 1});
      at += 1;
    }
    region_offset_[r] = at;
    at += kRegions[r].bytes;
    const size_t aligned = (at + 7) & ~size_t{7};
    guards_.push_back({at, aligned - at});
    at = aligned;
  }
  guards_.push_back({at, kGuardBytes});
  at += kGuardBytes;
  arena_bytes_ = at;
  arena_ = std::make_unique<uint8_t[]>(arena_bytes_);
  for (const auto& [off, len] : guards_) std::memset(arena_.get() + off, kGuardByte, len);
  for (size_t r = 0; r < kRegionCount; ++r) {
    uint8_t* p = region_addr(r);
    for (size_t i = 0; i < kRegions[r].bytes; ++i) p[i] = region_pattern(r, i);
    uint64_t iova = reinterpret_cast<uint64_t>(p);
    if (kRegions[r].iova_mode == RegionSpec::kIovaTop) iova = 0 - uint64_t{kRegions[r].bytes};
    if (kRegions[r].iova_mode == RegionSpec::kIovaFixed) iova = kRegions[r].fixed_iova;
    auto mr = dev_.reg_mr(pd_, p, kRegions[r].bytes, iova, kRegions[r].access);
    REQUIRE(mr.ok(), "reg_mr %s: errno %d", kRegions[r].name, mr.error());
    mr_[r] = mr.value();
  }
}

provider::Qp* World::make_qp(ibv_qp_type type, provider::Srq* srq, uint32_t rq_psn) {
  provider::QpInitAttr init;
  init.qp_type = type;
  init.pd = pd_;
  init.send_cq = type == IBV_QPT_UD ? ud_cq_ : cq_;
  init.recv_cq = type == IBV_QPT_UD ? ud_cq_ : cq_;
  init.srq = srq;
  init.cap = {16, 16, 4, 4, 64};
  auto r = dev_.create_qp(init);
  REQUIRE(r.ok(), "create_qp: errno %d", r.error());
  provider::Qp* qp = r.value();
  test::QpParams p;
  p.type = type;
  p.mtu = kPathMtu;
  p.sq_psn = kRcSqPsn;
  p.rq_psn = rq_psn;
  p.timeout = 10;
  p.retry_cnt = 3;
  p.rnr_retry = 3;
  p.min_rnr_timer = 1;
  p.max_rd_atomic = 4;
  p.max_dest_rd_atomic = 4;
  p.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  p.qkey = kUdQkey;
  const test::BringUp up = test::bring_up(*qp, p, kPeer, kPeerQpn);
  REQUIRE(up.ok(), "modify qp type %d to %d: errno %d", type, up.failed_to, up.status.error());
  return qp;
}

void World::post_requests() {
  const auto sge = [this](size_t region, size_t off, uint32_t len) {
    return ibv_sge{reinterpret_cast<uint64_t>(region_addr(region) + off), len, mr_[region]->lkey()};
  };
  const auto post = [this](ibv_send_wr wr) {
    ibv_send_wr* bad = nullptr;
    const auto st = rc_->post_send(&wr, &bad);
    REQUIRE(st.ok(), "post_send opcode %d: errno %d", wr.opcode, st.error());
  };
  ibv_mw verbs_mw = {};
  verbs_mw.handle = mw_->handle();
  ibv_mr verbs_mr = {};
  verbs_mr.handle = mr_[kMwParent]->handle();
  ibv_send_wr bind = {};
  bind.wr_id = 1;
  bind.opcode = IBV_WR_BIND_MW;
  bind.send_flags = IBV_SEND_SIGNALED;
  bind.bind_mw.mw = &verbs_mw;
  bind.bind_mw.rkey = (mw_->rkey() & ~0xFFu) | ((mw_->rkey() + 1) & 0xFFu);
  bind.bind_mw.bind_info.mr = &verbs_mr;
  bind.bind_mw.bind_info.addr = reinterpret_cast<uint64_t>(region_addr(kMwParent) + kWindowOffset);
  bind.bind_mw.bind_info.length = kWindowBytes;
  bind.bind_mw.bind_info.mw_access_flags = kWindowAccess;
  post(bind);

  // PSNs from kRcSqPsn (0x100), path MTU 256:
  //   SEND 300 bytes     0x100, 0x101
  //   WRITE 100 bytes    0x102
  //   READ 600 bytes     0x103 .. 0x105 (three responses)
  //   CMP_SWP            0x106
  //   FETCH_ADD          0x107
  //   SEND inline 16     0x108
  ibv_sge s1 = sge(kSrc, 0, 300);
  ibv_send_wr send = {};
  send.wr_id = 2;
  send.opcode = IBV_WR_SEND;
  send.sg_list = &s1;
  send.num_sge = 1;
  send.send_flags = IBV_SEND_SIGNALED;
  post(send);

  ibv_sge s2 = sge(kSrc, 300, 100);
  ibv_send_wr write = {};
  write.wr_id = 3;
  write.opcode = IBV_WR_RDMA_WRITE;
  write.sg_list = &s2;
  write.num_sge = 1;
  write.wr.rdma.remote_addr = 0x7000;
  write.wr.rdma.rkey = 0x1234;
  post(write);

  ibv_sge s3[2] = {sge(kLocal, 0, 400), sge(kLocal, 512, 200)};
  ibv_send_wr read = {};
  read.wr_id = 4;
  read.opcode = IBV_WR_RDMA_READ;
  read.sg_list = s3;
  read.num_sge = 2;
  read.send_flags = IBV_SEND_SIGNALED;
  read.wr.rdma.remote_addr = 0x8000;
  read.wr.rdma.rkey = 0x5678;
  post(read);

  ibv_sge s4 = sge(kLocal, 1024, 8);
  ibv_send_wr cas = {};
  cas.wr_id = 5;
  cas.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
  cas.sg_list = &s4;
  cas.num_sge = 1;
  cas.send_flags = IBV_SEND_SIGNALED;
  cas.wr.atomic.remote_addr = 0x9000;
  cas.wr.atomic.rkey = 0x9abc;
  cas.wr.atomic.compare_add = 1;
  cas.wr.atomic.swap = 2;
  post(cas);

  ibv_sge s5 = sge(kLocal, 1032, 8);
  ibv_send_wr fa = cas;
  fa.wr_id = 6;
  fa.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  fa.sg_list = &s5;
  fa.wr.atomic.remote_addr = 0x9008;
  post(fa);

  static const uint8_t kInline[16] = {'i', 'n', 'l', 'i', 'n', 'e'};
  ibv_sge s6 = {reinterpret_cast<uint64_t>(kInline), sizeof(kInline), 0};
  ibv_send_wr inl = {};
  inl.wr_id = 7;
  inl.opcode = IBV_WR_SEND;
  inl.sg_list = &s6;
  inl.num_sge = 1;
  inl.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  post(inl);
}

// RC / UC(SRQ) receive WQEs in four shapes, in this order (slot = 640 bytes of RECV, 16 slots
// for RC, 16 for the SRQ): 600 bytes in one SGE; 300 + 300 in two; 64 bytes then 64 bytes of
// the NOACCESS region (a longer SEND must fail with a protection error and leave NOACCESS
// untouched); 32 bytes only (a longer SEND is a length error).
ibv_recv_wr World::rc_like_recv(uint32_t tag, std::array<ibv_sge, 2>& s) {
  const uint32_t seq = recv_seq_[tag]++;
  const size_t slot = (tag == 1 ? 0 : 16) + seq % 16;
  uint8_t* base = region_addr(kRecv) + slot * kRecvSlotBytes;
  const uint32_t lk = mr_[kRecv]->lkey();
  int n = 1;
  switch (seq % 4) {
    case 0:
      s[0] = {reinterpret_cast<uint64_t>(base), 600, lk};
      break;
    case 1:
      s[0] = {reinterpret_cast<uint64_t>(base), 300, lk};
      s[1] = {reinterpret_cast<uint64_t>(base + 300), 300, lk};
      n = 2;
      break;
    case 2:
      s[0] = {reinterpret_cast<uint64_t>(base), 64, lk};
      s[1] = {reinterpret_cast<uint64_t>(region_addr(kNoAccess)), 64, mr_[kNoAccess]->lkey()};
      n = 2;
      break;
    default:
      s[0] = {reinterpret_cast<uint64_t>(base), 32, lk};
      break;
  }
  uint32_t total = 0;
  for (int i = 0; i < n; ++i) total += s[i].length;
  ibv_recv_wr wr = {};
  wr.wr_id = recv_wr_id(tag, total);
  wr.sg_list = s.data();
  wr.num_sge = n;
  return wr;
}

// UD receive WQEs (after the 32 RC/SRQ slots), in this order: GRH + 1024 in one SGE; a 40-byte
// GRH SGE then 256 bytes of NOACCESS (protection error); GRH + 16 (length error).
void World::post_recv_ud() {
  const uint32_t seq = recv_seq_[3]++;
  uint8_t* base = region_addr(kRecv) + 32 * kRecvSlotBytes;
  const uint32_t lk = mr_[kRecv]->lkey();
  std::array<ibv_sge, 2> s{};
  int n = 1;
  switch (seq % 3) {
    case 0:
      s[0] = {reinterpret_cast<uint64_t>(base), wire::Grh::kSize + 1024, lk};
      break;
    case 1:
      s[0] = {reinterpret_cast<uint64_t>(base), wire::Grh::kSize, lk};
      s[1] = {reinterpret_cast<uint64_t>(region_addr(kNoAccess)), 256, mr_[kNoAccess]->lkey()};
      n = 2;
      break;
    default:
      s[0] = {reinterpret_cast<uint64_t>(base), wire::Grh::kSize + 16, lk};
      break;
  }
  uint32_t total = 0;
  for (int i = 0; i < n; ++i) total += s[i].length;
  ibv_recv_wr wr = {};
  wr.wr_id = recv_wr_id(3, total);
  wr.sg_list = s.data();
  wr.num_sge = n;
  ibv_recv_wr* bad = nullptr;
  const auto st = ud_->post_recv(&wr, &bad);
  REQUIRE(st.ok(), "post_recv UD: errno %d", st.error());
}

void World::top_up_receives() {
  if (starve_) return;
  // A QP in ERR flushes what is posted; stop feeding it.
  if (rc_->state() != IBV_QPS_ERR)
    while (rc_->rq_size() < kRqDepth) post_recv_rc_like(rc_, 1);
  while (srq_->size() < kRqDepth) post_recv_rc_like(srq_, 2);
  if (ud_->state() != IBV_QPS_ERR)
    while (ud_->rq_size() < kRqDepth) post_recv_ud();
}

// Polls until a poll sends nothing: afterwards a poll without input or time does nothing.
void World::settle() {
  for (int i = 0; i < 64; ++i) {
    const uint64_t before = io_sent();
    engine_.poll();
    drain_cq();
    top_up_receives();
    if (io_sent() == before) {
      engine_.poll();  // what the top-up rang
      drain_cq();
      if (io_sent() == before) return;
    }
  }
  fail("the engine keeps sending without input or time");
}

void World::drain_cq() {
  for (provider::Cq* cq : {cq_, ud_cq_}) drain_one(cq);
}

void World::drain_one(provider::Cq* cq) {
  std::array<ibv_wc, 64> wcs;
  for (;;) {
    const int n = cq->poll(static_cast<int>(wcs.size()), wcs.data());
    REQUIRE(n >= 0, "cq poll returned %d", n);
    if (n == 0) break;
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = wcs[i];
      if (verbose_)
        std::fprintf(stderr, "  cqe qp 0x%x wr_id 0x%lx opcode %d status %s byte_len %u\n",
                     wc.qp_num, static_cast<unsigned long>(wc.wr_id), wc.opcode,
                     ibv_wc_status_str(wc.status), wc.byte_len);
      REQUIRE(
          wc.qp_num == rc_->qp_num() || wc.qp_num == uc_->qp_num() || wc.qp_num == ud_->qp_num(),
          "completion for unknown QP 0x%x", wc.qp_num);
      REQUIRE(wc.status <= IBV_WC_GENERAL_ERR, "completion status %d", wc.status);
      const bool recv = (wc.opcode & IBV_WC_RECV) != 0;
      if (recv && wc.status == IBV_WC_SUCCESS) {
        const uint32_t total = static_cast<uint32_t>(wc.wr_id);
        REQUIRE(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM || wc.byte_len <= total,
                "receive completion byte_len %u > WQE length %u (qp 0x%x)", wc.byte_len, total,
                wc.qp_num);
      }
    }
  }
}

void World::check_world(const char* when) {
  for (const auto& [off, len] : guards_) {
    for (size_t i = 0; i < len; ++i) {
      REQUIRE(arena_[off + i] == kGuardByte,
              "%s: guard byte at arena offset %zu (guard %zu+%zu) overwritten with 0x%02x", when,
              off + i, off, len, arena_[off + i]);
    }
  }
  for (size_t r = 0; r < kRegionCount; ++r) {
    if (kRegions[r].writable == Writable::kYes) continue;
    const uint8_t* p = region_addr(r);
    for (size_t i = 0; i < kRegions[r].bytes; ++i) {
      const bool in_window = i >= kWindowOffset && i < kWindowOffset + kWindowBytes;
      if (kRegions[r].writable == Writable::kOnlyWindow && in_window) {
        // Once invalidated (SEND with Invalidate), the window is closed for good.
        if (mw_->bound()) continue;
        if (window_after_invalidate_.empty())
          window_after_invalidate_.assign(p + kWindowOffset, p + kWindowOffset + kWindowBytes);
        REQUIRE(p[i] == window_after_invalidate_[i - kWindowOffset],
                "%s: window byte %zu written after the window was invalidated", when,
                i - kWindowOffset);
        continue;
      }
      REQUIRE(p[i] == region_pattern(r, i), "%s: region %s byte %zu overwritten (0x%02x)", when,
              kRegions[r].name, i, p[i]);
    }
  }
  const engine::EngineCounters& c = engine_.counters();
  REQUIRE(c.sent_pkts == io_sent(), "%s: sent_pkts %lu but the I/O saw %lu", when,
          static_cast<unsigned long>(c.sent_pkts), static_cast<unsigned long>(io_sent()));
  REQUIRE(c.send_err == 0, "%s: send_err %lu", when, static_cast<unsigned long>(c.send_err));
  // More than net::kMaxTxIov iovecs (or an oversized datagram) is rejected by the I/O.
  REQUIRE(io_.counters().tx_rejected == 0, "%s: the I/O rejected %lu datagrams", when,
          static_cast<unsigned long>(io_.counters().tx_rejected));
}

void World::check_sent(const net::TxDatagram& d, std::span<const uint8_t> bytes) {
  REQUIRE(!d.iov.empty(), "send with no iovecs");
  REQUIRE(bytes.size() <= engine::kMaxPacketBytes, "sent %zu bytes", bytes.size());
  const wire::ParseResult r = wire::parse_packet(bytes);
  REQUIRE(r.ok(), "sent a packet that does not parse: %s", wire::parse_error_name(r.error()));
  REQUIRE(d.src == kHostB && d.dst.address == kPeer && d.dst.port == net::kRoceV2UdpPort,
          "sent opcode 0x%02x to an unexpected flow", r->opcode());
  // Only a QP that is not in ERR sends (IBA 10.3.1.7: a QP in Error sends nothing).
  for (const provider::Qp* qp : {rc_, uc_, ud_}) {
    if (qp != nullptr && d.src_port == engine::roce_src_port(qp->qp_num()))
      REQUIRE(qp->state() != IBV_QPS_ERR && qp->state() != IBV_QPS_RESET,
              "QP 0x%x sent opcode 0x%02x in state %d", qp->qp_num(), r->opcode(), qp->state());
  }
  REQUIRE(r->bth().dest_qp() == kPeerQpn, "sent opcode 0x%02x to QPN 0x%x", r->opcode(),
          r->bth().dest_qp());
  wire::IcrcIpv4 h;
  h.flow.src_addr = v4_of(d.src);
  h.flow.dst_addr = v4_of(d.dst.address);
  h.flow.udp_src_port = d.src_port;
  h.flow.udp_dst_port = net::kRoceV2UdpPort;
  REQUIRE(wire::compute_icrc(h, bytes) == wire::icrc_of(bytes),
          "sent opcode 0x%02x with a wrong ICRC", r->opcode());
  // A READ response's payload is gathered from registered memory the peer may read.
  if (r->info().is(wire::kReadResponse) && d.iov.size() > 2) {
    for (size_t i = 1; i + 1 < d.iov.size(); ++i) {
      const auto* p = static_cast<const uint8_t*>(d.iov[i].iov_base);
      const size_t n = d.iov[i].iov_len;
      bool ok = false;
      for (size_t reg = 0; reg < kRegionCount && !ok; ++reg) {
        const uint8_t* base = region_addr(reg);
        const size_t len = kRegions[reg].bytes;
        if (p < base || p + n > base + len) continue;
        if (kRegions[reg].access & IBV_ACCESS_REMOTE_READ) ok = true;
        if (reg == kMwParent && p >= base + kWindowOffset &&
            p + n <= base + kWindowOffset + kWindowBytes)
          ok = true;
      }
      REQUIRE(ok, "READ response payload (%zu bytes) from memory the peer may not read", n);
    }
  }
}

void World::print_counters() const {
  const engine::EngineCounters& c = engine_.counters();
  std::fprintf(stderr,
               "  rcvd %lu sent %lu rdma_recvs %lu dup_req %lu oos_req %lu rnr_sent %lu "
               "rnr_rcvd %lu seq_nak_rcvd %lu retry_exc %lu retries %lu dup_resp %lu drops %lu "
               "(icrc %lu pkey %lu qpn %lu addr %lu type %lu state %lu qkey %lu norecv %lu "
               "badresp %lu uc %lu uc_invalid %lu ud_len %lu trunc %lu)\n",
               c.rcvd_pkts, c.sent_pkts, c.rdma_recvs, c.duplicate_request, c.out_of_seq_request,
               c.send_rnr_err, c.rcvd_rnr_err, c.rcvd_seq_err, c.retry_exceeded_err,
               c.completer_retry_err, c.duplicate_response, c.drops(), c.drop_icrc, c.drop_pkey,
               c.drop_unknown_qpn, c.drop_address, c.drop_qp_type, c.drop_qp_state, c.drop_qkey,
               c.drop_no_recv_wqe, c.drop_bad_response, c.drop_uc_message, c.drop_uc_invalid,
               c.drop_ud_length, c.drop_truncated);
  std::fprintf(stderr, "  states rc %d uc %d ud %d, window %s\n", rc_->state(), uc_->state(),
               ud_->state(), mw_->bound() ? "bound" : "invalidated");
}

uint32_t World::qpn_for(unsigned sel) const {
  switch (sel) {
    case 1:
      return rc_->qp_num();
    case 2:
      return uc_->qp_num();
    default:
      return ud_->qp_num();
  }
}

World::Key World::key_for(unsigned index) const {
  // 12 regions, then the window.
  const unsigned i = index % (kRegionCount + 1);
  if (i == kRegionCount) return {mw_->rkey(), mw_->iova(), mw_->length()};
  return {mr_[i]->rkey(), mr_[i]->iova(), mr_[i]->length()};
}

void World::patch(std::vector<uint8_t>& bytes, uint8_t mode, uint8_t aux) {
  const wire::ParseResult parsed = wire::parse_packet(bytes);
  if (!parsed.ok()) return;
  const wire::PacketHeaders h(&parsed->info(), bytes.data());
  const unsigned qp_sel = mode & 3;
  if (qp_sel != 0) h.bth().set_dest_qp(qpn_for(qp_sel));
  const unsigned psn_sel = (mode >> 2) & 3;
  if (psn_sel != 0) {
    const engine::QpContext* ctx = engine_.context(h.bth().dest_qp());
    if (ctx != nullptr) {
      uint32_t psn = ctx->resp.epsn;
      if (psn_sel == 2) psn = ctx->comp.psn;
      if (psn_sel == 3) psn = wire::psn_sub(ctx->resp.epsn, 1);
      h.bth().set_psn(psn);
    }
  }
  if (mode & 0x10) {
    const Key k = key_for(aux & 0x0F);
    const uint64_t off = (k.bytes * (aux >> 4)) / 16;
    if (auto reth = h.reth()) {
      reth->set_rkey(k.rkey);
      reth->set_va(k.iova + off);
      if ((mode & 0x20) && reth->dma_length() > k.bytes - off)
        reth->set_dma_length(static_cast<uint32_t>(k.bytes - off));
    }
    if (auto a = h.atomic_eth()) {
      a->set_rkey(k.rkey);
      a->set_va((k.iova + off) & ~uint64_t{7});
    }
    if (auto ieth = h.ieth()) ieth->set_rkey(k.rkey);
    if (auto deth = h.deth()) deth->set_qkey(kUdQkey);
  }
}

void World::run_chunk(uint8_t mode, uint8_t aux, uint8_t extra, std::span<const uint8_t> data) {
  std::vector<uint8_t> bytes(data.begin(), data.end());
  starve_ = (aux & 0x0F) == 0x0F;
  const unsigned source = mode >> 6;
  const bool v6 = (extra & 0x80) != 0;
  if (source != 3) patch(bytes, mode, aux);

  struct {
    std::vector<uint8_t> bytes;
    net::Endpoint src;
    net::Endpoint dst;
  } in;
  in.src.port = kPeerPort;
  in.dst.port = net::kRoceV2UdpPort;
  if (v6) {
    in.src.address = net::Address(kPeer6Bytes);
    in.dst.address = net::Address(kHostB6Bytes);
    if (source == 2) in.src.address = net::Address::from_v4(0, 0, 0, 0);  // "::ffff:0.0.0.0"
  } else {
    in.src.address = source == 2 ? kStranger : kPeer;
    in.dst.address = kHostB;
  }
  if (source != 3 && bytes.size() >= wire::kIcrcMinUdpPayloadBytes &&
      bytes.size() <= wire::kIcrcMaxUdpPayloadBytes) {
    if (in.src.address.is_v4() && in.dst.address.is_v4()) {
      wire::IcrcIpv4 h;
      h.flow.src_addr = v4_of(in.src.address);
      h.flow.dst_addr = v4_of(in.dst.address);
      h.flow.udp_src_port = in.src.port;
      h.flow.udp_dst_port = in.dst.port;
      wire::seal_icrc(h, bytes);
    } else {
      wire::IcrcIpv6 h;
      h.src_addr = in.src.address.bytes();
      h.dst_addr = in.dst.address.bytes();
      h.udp_src_port = in.src.port;
      h.udp_dst_port = in.dst.port;
      wire::seal_icrc(h, bytes);
    }
  }

  // What the harness itself concludes about the datagram: the early drops.
  enum class Early { kNone, kTruncated, kParse, kIcrc, kPkey, kMulticast, kUnknownQpn };
  Early early = Early::kNone;
  wire::ParseError perr = wire::ParseError::kNone;
  bool request = false;  // a request opcode, sent to one of our QPs
  if (bytes.size() > engine::kRxBufferBytes) {
    early = Early::kTruncated;
  } else {
    const wire::ParseResult p = wire::parse_packet(bytes);
    if (!p.ok()) {
      early = Early::kParse;
      perr = p.error();
    } else {
      bool icrc_ok = false;
      if (in.src.address.is_v4() && in.dst.address.is_v4()) {
        wire::IcrcIpv4Flow flow;
        flow.src_addr = v4_of(in.src.address);
        flow.dst_addr = v4_of(in.dst.address);
        flow.udp_src_port = in.src.port;
        flow.udp_dst_port = in.dst.port;
        icrc_ok = wire::verify_icrc_ipv4(flow, bytes, wire::Ipv4DfSearch::kSetOnly).ok;
      } else if (!in.src.address.is_v4() && !in.dst.address.is_v4()) {
        wire::IcrcIpv6 h;
        h.src_addr = in.src.address.bytes();
        h.dst_addr = in.dst.address.bytes();
        h.udp_src_port = in.src.port;
        h.udp_dst_port = in.dst.port;
        icrc_ok = wire::verify_icrc_ipv6(h, bytes);
      }
      const uint32_t qpn = p->bth().dest_qp();
      request = p->info().is(wire::kRequest);
      if (!icrc_ok) {
        early = Early::kIcrc;
      } else if ((p->bth().pkey() & 0x7FFF) != 0x7FFF) {
        early = Early::kPkey;
      } else if (p->info().transport != wire::Transport::kCnp && qpn == provider::kMulticastQpn) {
        early = Early::kMulticast;  // no QP here is attached to a group
      } else if (p->info().transport != wire::Transport::kCnp && qpn != rc_->qp_num() &&
                 qpn != uc_->qp_num() && qpn != ud_->qp_num()) {
        early = Early::kUnknownQpn;
      }
    }
  }

  const engine::EngineCounters before = engine_.counters();
  const uint64_t sent_before = io_sent();
  const uint32_t cq_before = cq_->size() + ud_cq_->size();
  const std::array<ibv_qp_state, 3> states_before = {rc_->state(), uc_->state(), ud_->state()};
  if (verbose_)
    std::fprintf(stderr, "chunk mode 0x%02x aux 0x%02x extra 0x%02x: %zu bytes, opcode 0x%02x\n",
                 mode, aux, extra, bytes.size(), bytes.empty() ? 0 : bytes[0]);
  const uint8_t in_copy_opcode = bytes.empty() ? 0 : bytes[0];
  const uint32_t in_copy_qpn =
      bytes.size() >= 8 ? (uint32_t{bytes[5]} << 16 | uint32_t{bytes[6]} << 8 | bytes[7]) : 0;
  in.bytes = std::move(bytes);
  io_.deliver(in.bytes, in.src, in.dst);
  engine_.poll();
  const engine::EngineCounters& after = engine_.counters();
  REQUIRE(after.rcvd_pkts == before.rcvd_pkts + 1, "rcvd_pkts did not count the datagram");
  REQUIRE(after.drops() <= before.drops() + 1, "one datagram counted as %lu drops",
          static_cast<unsigned long>(after.drops() - before.drops()));
  REQUIRE(after.rdma_recvs <= before.rdma_recvs + 1, "one datagram counted as %lu requests",
          static_cast<unsigned long>(after.rdma_recvs - before.rdma_recvs));
  const auto quiet = [&](const char* why) {
    REQUIRE(io_sent() == sent_before, "a datagram dropped for %s made the engine send", why);
    REQUIRE(cq_->size() + ud_cq_->size() == cq_before,
            "a datagram dropped for %s made a completion", why);
    REQUIRE(after.drops() == before.drops() + 1, "a datagram dropped for %s: %lu drops counted",
            why, static_cast<unsigned long>(after.drops() - before.drops()));
  };
  switch (early) {
    case Early::kTruncated:
      REQUIRE(after.drop_truncated == before.drop_truncated + 1, "oversized not counted");
      quiet("size");
      break;
    case Early::kParse: {
      const size_t e = static_cast<size_t>(perr);
      REQUIRE(after.drop_parse[e] == before.drop_parse[e] + 1,
              "malformed datagram (%s) not counted under its reason", wire::parse_error_name(perr));
      quiet("a parse error");
      break;
    }
    case Early::kIcrc:
      REQUIRE(after.drop_icrc == before.drop_icrc + 1, "bad ICRC not counted");
      quiet("its ICRC");
      break;
    case Early::kPkey:
      REQUIRE(after.drop_pkey == before.drop_pkey + 1, "bad P_Key not counted");
      quiet("its P_Key");
      break;
    case Early::kMulticast:
      REQUIRE(after.drop_mcast_invalid + after.drop_mcast_unattached ==
                  before.drop_mcast_invalid + before.drop_mcast_unattached + 1,
              "multicast datagram for no attached QP not counted");
      quiet("the multicast QPN");
      break;
    case Early::kUnknownQpn:
      REQUIRE(after.drop_unknown_qpn == before.drop_unknown_qpn + 1, "unknown QPN not counted");
      quiet("its QPN");
      break;
    case Early::kNone:
      REQUIRE(after.drop_truncated == before.drop_truncated &&
                  after.drop_icrc == before.drop_icrc && after.drop_pkey == before.drop_pkey &&
                  after.drop_unknown_qpn == before.drop_unknown_qpn &&
                  after.drop_parse == before.drop_parse,
              "a well-formed datagram to one of our QPs was dropped as malformed");
      if (request && strict_accounting_) {
        // Every request leaves a trace: a counter, a packet, a completion or a state change.
        engine::EngineCounters expect = before;
        ++expect.rcvd_pkts;
        const std::array<ibv_qp_state, 3> states = {rc_->state(), uc_->state(), ud_->state()};
        REQUIRE(std::memcmp(&expect, &after, sizeof(expect)) != 0 || io_sent() != sent_before ||
                    cq_->size() + ud_cq_->size() != cq_before || states != states_before,
                "request opcode 0x%02x to QP 0x%x vanished: not counted, no packet, no "
                "completion, no state change",
                in_copy_opcode, in_copy_qpn);
      }
      break;
  }
  check_world("after a datagram");
  drain_cq();
  top_up_receives();

  if (extra & 0x40) {
    const unsigned lg = std::min<unsigned>(extra & 0x3F, kMaxAdvanceLog2);
    clock_.advance(uint64_t{1} << lg);
    engine_.poll();
    check_world("after the clock advanced");
  }
  settle();
  check_world("after settling");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World world;
  size_t at = 0;
  for (size_t chunks = 0; chunks < kMaxChunks && at + kChunkHeaderBytes <= size; ++chunks) {
    const uint8_t mode = data[at];
    const uint8_t aux = data[at + 1];
    const uint8_t extra = data[at + 2];
    const size_t want = size_t{data[at + 3]} << 8 | data[at + 4];
    at += kChunkHeaderBytes;
    const size_t len = std::min(want, size - at);
    world.run_chunk(mode, aux, extra, {data + at, len});
    at += len;
  }
  world.finish();
  return 0;
}
