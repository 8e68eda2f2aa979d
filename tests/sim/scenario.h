// The simulation's scenario: everything one seed will do, decided before anything runs.
//
// A Scenario is an abstract, fully deterministic description of a simulated cluster and its
// workload — hosts, memory regions (by index, never by address or key), QPs and their
// attributes, and every send and receive work request with the virtual time at which the
// application posts it. It is a pure function of (ScenarioConfig, seed): the runner builds the
// cluster from it (cluster.h) and the checker (checker.h) derives every expected completion and
// every expected byte of memory from it, so neither depends on the other's bookkeeping.
//
// Memory layout (per host): source regions (never written by anyone: data for SEND/WRITE
// gathers and the targets of peers' RDMA READs), target regions (every WRITE destination, READ
// result, receive buffer and atomic result is a fresh bump-allocated range, separated by
// untouched gaps), and one atomic region of 8-byte counters shared by every QP that talks to the
// host. Each region is surrounded by guard bytes outside the registration.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/fault_model.h"
#include "support/sim_network.h"

namespace urdma::sim {

// Every operation the generator can emit (IBV_WR_* plus the receive side).
enum class Op : uint8_t {
  kSend,
  kSendImm,
  kSendInv,
  kWrite,
  kWriteImm,
  kRead,
  kCmpSwp,
  kFetchAdd,
  kLocalInv,
  kBindMw,
};
inline constexpr size_t kOpCount = 10;

struct OpInfo {
  const char* name;    // command-line name (--ops)
  ibv_wr_opcode wr;    // what is posted
  ibv_wc_opcode wc;    // the send completion's opcode
  bool rc, uc, ud;     // valid on this QP type
  bool consumes_recv;  // uses a receive WQE at the responder
  bool remote;         // addresses remote memory (RETH / AtomicETH)
  bool atomic;
  bool local;  // no packet (LOCAL_INV, BIND_MW)
};
const OpInfo& op_info(Op op);
std::optional<Op> parse_op(std::string_view name);

// Which operations a run uses. Default: every operation the generator knows.
using OpSet = std::array<bool, kOpCount>;
OpSet all_ops();
// "send,write,read" (comma separated names, or "all"); nullopt on an unknown name.
std::optional<OpSet> parse_ops(std::string_view list);
std::string to_string(const OpSet& ops);

// An error the generator injects on purpose, so that error statuses are judged too. Each names
// what a correct device does (IBA chapter 9/10 and Linux rxe); fault_outcome() spells it out.
enum class Fault : uint8_t {
  kNone,
  kBadRkey,        // RDMA WRITE with an rkey no region has
  kOutOfRange,     // RDMA READ running past the end of the remote region
  kNoAccess,       // RDMA WRITE into a region registered without REMOTE_WRITE
  kStaleWindow,    // RDMA WRITE through a memory window after its LOCAL_INV
  kShortRecv,      // SEND longer than the receive buffer it lands in
  kRnr,            // SEND for which no receive is ever posted, rnr_retry finite
  kBadInvalidate,  // SEND_WITH_INV of an rkey that is no bound window (an MR's rkey)
  kUnboundInv,     // LOCAL_INV of a window that was never bound (MW misuse, local)
  kDeadPeer,       // the first packet WR of a QP whose peer QP was moved to ERR at t=0
  kUdTooLong,      // UD SEND longer than every receive buffer of its destination
  kNoRdAtomic,     // the first READ/ATOMIC to a responder whose max_dest_rd_atomic is 0
};
inline constexpr size_t kFaultCount = 12;
const char* fault_name(Fault f);

struct FaultOutcome {
  ibv_wc_status requester = IBV_WC_SUCCESS;  // the faulted send's completion status
  // The receive the faulted message consumes at the responder (nullopt: none is consumed).
  std::optional<ibv_wc_status> receive;
  bool responder_err = false;  // the responder QP enters ERR (IBA 10.3.1.6, responder class)
};
FaultOutcome fault_outcome(Fault f);

// A network partition in the run: host 0 is cut from every other host during
// [start_ns, start_ns + duration_ns).
struct PartitionSpec {
  uint64_t start_ns = 0;
  uint64_t duration_ns = 0;
};

// The network faults: the rates given to SimOptions (the one-way delay is net::kSimDelayNs unless
// set) and the partitions (the checker needs them to know what to expect).
struct FaultProfile : net::FaultRates {
  FaultProfile() {
    delay_min_ns = net::kSimDelayNs;
    delay_max_ns = net::kSimDelayNs;
  }

  std::vector<PartitionSpec> partitions;
  // Not an option: the checker sets it when the run's network dropped datagrams for a full
  // queue (a receiver's queue overflowing, as a socket buffer does under a UC/UD flood, which
  // has no flow control). Such a drop loses a message just as injected loss does.
  bool queue_overflow = false;

  bool any_partition() const { return !partitions.empty(); }
  // Can a datagram be lost (so UC/UD messages may vanish)?
  bool lossy() const { return loss_ppm || corrupt_ppm || any_partition() || queue_overflow; }
  // Can datagrams arrive out of order or twice?
  bool reorders() const { return reorder_ppm || duplicate_ppm || delay_min_ns != delay_max_ns; }
  bool clean() const { return !lossy() && !reorders(); }
};

struct ScenarioConfig {
  uint32_t hosts = 2;
  // Connected pairs (two QPs each) and UD QPs per host.
  uint32_t rc_pairs = 3;
  uint32_t uc_pairs = 1;
  uint32_t ud_per_host = 1;
  // Send work requests per QP: uniform in [wrs_min, wrs_max].
  uint32_t wrs_min = 4;
  uint32_t wrs_max = 14;
  uint64_t max_size_bytes = 64 * 1024;
  // Every target range of the seed together (WRITE destinations, READ results, receive
  // buffers); sizes shrink once it is used up. Keeps a seed's memory bounded.
  uint64_t memory_budget_bytes = 24u << 20;
  OpSet ops = all_ops();
  // Percent of RC receive queues (own RQ or SRQ) whose receives are partly posted late (RNR).
  uint32_t late_recv_percent = 25;
  // Sends are posted at random times in [0, post_window_ns].
  uint64_t post_window_ns = 300'000;
  // Local ACK timeout exponent range (4.096 us * 2^timeout) and retry_cnt range for RC QPs.
  uint8_t timeout_min = 8;
  uint8_t timeout_max = 11;
  uint8_t retry_cnt_min = 7;
  uint8_t retry_cnt_max = 7;
  // rnr_retry range for RC QPs (7 = retry forever).
  uint8_t rnr_retry_min = 7;
  uint8_t rnr_retry_max = 7;
  // Percent of RC pairs (and of UD QPs) that get one injected error (Fault), chosen by the seed.
  uint32_t errors_percent = 0;
  FaultProfile faults;
};

inline constexpr uint32_t kNone = ~uint32_t{0};
// Guard bytes before and after every region, outside its registration.
inline constexpr uint64_t kGuardBytes = 256;
inline constexpr uint32_t kMaxSge = 6;            // SGEs per generated WR
inline constexpr uint32_t kMaxInlineBytes = 256;  // QP max_inline_data requested
inline constexpr uint64_t kUdMaxPayloadBytes = 1024;
inline constexpr uint64_t kGrhBytes = 40;        // UD receive buffers start with the GRH
inline constexpr uint32_t kCountersPerKind = 4;  // per host: FETCH_ADD and CMP_SWP counters
inline constexpr uint32_t kQkey = 0x1bad'cafe;   // every UD QP's Q_Key (high bit clear)

struct RegionSpec {
  enum class Kind : uint8_t { kSource, kTarget, kAtomic, kWindow };
  uint32_t host = 0;
  Kind kind = Kind::kSource;
  uint64_t size = 0;
  uint64_t iova = 0;  // registered with ibv_reg_mr_iova2: IOVA differs from the host address
  int access = 0;
};

struct QpSpec {
  uint32_t host = 0;
  ibv_qp_type type = IBV_QPT_RC;
  uint32_t peer = kNone;  // RC/UC: the connected QP
  bool use_srq = false;   // receives come from the host's SRQ
  bool sq_sig_all = false;
  ibv_mtu mtu = IBV_MTU_1024;
  uint8_t timeout = 10;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 1;
  uint8_t max_rd_atomic = 1;
  uint8_t max_dest_rd_atomic = 1;
  uint32_t sq_psn = 0;  // the peer's rq_psn
  // The application moves this QP to ERR at t=0, before anything is posted (a peer that never
  // answers: Fault::kDeadPeer on the other QP of the pair).
  bool dead = false;
};

// One local scatter/gather element: `length` bytes at `offset` in region `region`.
struct Sge {
  uint32_t region = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
};

struct SendSpec {
  uint32_t qp = 0;
  Op op = Op::kSend;
  bool signaled = true;  // IBV_SEND_SIGNALED (or the QP's sq_sig_all)
  bool fence = false;
  bool solicited = false;
  bool inline_data = false;
  std::vector<Sge> sges;
  // WRITE / READ / atomics: the remote range. For WRITE and READ through a memory window,
  // `window` names it and the rkey is the window's.
  uint32_t remote_region = kNone;
  uint64_t remote_offset = 0;
  uint32_t window = kNone;
  uint32_t imm = 0;  // *_WITH_IMM: as posted (network byte order)
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  uint32_t ud_dest = kNone;  // UD: destination QP
  // BIND_MW binds `window` over [remote_offset, +bind_length) of remote_region (a local
  // region here); LOCAL_INV / SEND_WITH_INV invalidate `window`.
  uint64_t bind_length = 0;
  uint64_t post_ns = 0;
  // Posted only once send `after` has completed successfully (kNone: no dependency).
  uint32_t after = kNone;
  // An injected error (kNone for the ordinary, well-formed WRs).
  Fault fault = Fault::kNone;

  uint64_t length() const;
};

struct RecvSpec {
  uint32_t qp = kNone;        // own receive queue of this QP, or
  uint32_t srq_host = kNone;  // the SRQ of this host
  std::vector<Sge> sges;
  uint64_t post_ns = 0;
  uint64_t length() const;
};

// A type 2B memory window: allocated on `host`, bound by a BIND_MW send.
struct WindowSpec {
  uint32_t host = 0;
};

struct Scenario {
  uint64_t seed = 0;
  ScenarioConfig config;
  std::vector<RegionSpec> regions;
  std::vector<QpSpec> qps;
  std::vector<SendSpec> sends;  // per QP in posting order
  std::vector<RecvSpec> recvs;  // per queue in posting order
  std::vector<WindowSpec> windows;
  std::vector<bool> host_has_srq;
  // Per host, the atomic region's index.
  std::vector<uint32_t> atomic_region;

  // The region's initial bytes including guards: kGuardBytes + size + kGuardBytes.
  std::vector<uint8_t> initial_image(uint32_t region) const;
};

// wr_id encoding: the kind in the top byte, the index in the scenario below it.
inline constexpr uint64_t kWrIdSend = uint64_t{0x5e} << 56;
inline constexpr uint64_t kWrIdRecv = uint64_t{0x7e} << 56;
inline constexpr uint64_t kWrIdKindMask = uint64_t{0xff} << 56;

// Byte offset of counter `i` in an atomic region (FETCH_ADD counters first, then CMP_SWP).
inline constexpr uint64_t counter_offset(uint32_t i) {
  return uint64_t{i} * 8;
}
inline constexpr uint64_t kAtomicRegionBytes = 2 * kCountersPerKind * 8;

// The simulated hosts' addresses: host h is 10.0.0.(h + 1) (IPv4; GIDs are IPv4-mapped).
inline constexpr uint32_t host_ipv4(uint32_t h) {
  return (uint32_t{10} << 24) | (h + 1);
}
// The 40 bytes a correct device writes in front of a UD message received over IPv4 (RoCEv2;
// rdma-core's convention): 20 zero bytes, then the IPv4 header as the sender's kernel emits it
// (IHL 5, DF, ID 0, TTL 64, protocol UDP) — computed here from the RoCEv2 packet layout, not by
// the engine's code. `payload` is the message length, `imm` whether it carries immediate data.
std::array<uint8_t, kGrhBytes> ud_grh(uint32_t src_host, uint32_t dst_host, uint64_t payload,
                                      bool imm);

// The generator: a pure function of config and seed.
Scenario generate(const ScenarioConfig& config, uint64_t seed);

// Every QP, send and receive, one per line (for replaying a failure by hand).
std::string dump(const Scenario& s);

// A one-line summary ("2 hosts, 8 QPs (RC 6 UC 2 UD 2), 97 sends, 61 recvs, 1.2 MiB").
std::string summary(const Scenario& s);

}  // namespace urdma::sim
