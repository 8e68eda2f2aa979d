// The property checker: given a scenario and what one run of it produced, lists every property
// the run violated.
//
// It sees only what an application could see — the completions it polled (with the virtual
// time it polled them), when it posted each WR, and the final bytes of every buffer including
// the guard bytes around them — plus the QP numbers and window rkeys the provider assigned, and
// the network's trace: every datagram's transport header (decoded by the runner from the bytes,
// not by the engine) and the times its intact copies arrived. Its expectations come from the
// scenario alone (scenario.h), so it can be tested on hand-made histories (checker_test.cc).
//
// Properties (each Violation names one):
//   progress      the run finished: every posted signaled WR completed before the deadline
//   exactly-once  every posted signaled WR (and every WR that completed in error, and every
//                 posted receive after the final drain) has exactly one completion; no
//                 completion for an unknown or unposted WR; no success for an unsignaled WR
//   order         per QP, send completions come in posting order; an RC receive queue's
//                 completions (messages, a fault's error, flushes) in posting order
//   status        per QP, every WR succeeds until the QP's error; then every later WR flushes
//                 (WR_FLUSH_ERR), in order. The error WR must be one of:
//                  * an injected fault (Scenario Fault) with exactly fault_outcome()'s status;
//                  * RETRY_EXC_ERR or RNR_RETRY_EXC_ERR that the trace shows was earned (below);
//                 a QP may flush without an error of its own only when it is dead, the responder
//                 of a fault that moves the responder to ERR, or at the final drain (partition,
//                 or an unsignaled tail still retrying towards a failed peer). On a lossy network
//                 WRs still unacknowledged when the error struck may flush just before it. A
//                 fault's receive completes with its predicted status (LOC_LEN_ERR for a short
//                 buffer, REM_INV_REQ_ERR for a bad SEND_WITH_INV) in receive order; a faulted
//                 WR never succeeds silently; once the requester saw a responder-class fault,
//                 nothing the responder posts later succeeds and none of its receives does.
//   fields        opcode, byte_len, imm_data, qp_num, src_qp (UD), wc_flags, invalidated rkey
//   delivery      what the receives got matches what was sent: RC exactly, in order, nothing
//                 missing; UC/UD a subsequence per sender (loss) or any sent message
//                 (reorder/duplicates), everything when the network is clean, and at least as
//                 many as the trace shows whole messages delivered while receives were posted
//   data          every byte of every buffer equals its expected final value (WRITE, READ and
//                 receive targets, the 40-byte GRH of UD receives: ud_grh()), or for an
//                 operation that failed, its old or new value; a failure blanks only buffers
//                 of the QP pair it happened on
//   guard         nothing changed outside the ranges WRs may touch: guard bytes around each
//                 registration, gaps between buffers, source regions, unused counters, the
//                 targets of faulted WRs
//   atomic        FETCH_ADD: sorted by result the successful adds are a linearization whose
//                 every jump (and the final value) is an exact sum of distinct adds whose
//                 outcome is unknown; CMP_SWP results follow the counter's unique chain of
//                 values; per QP in posting order; and in real time — an atomic that completed
//                 before another was posted comes before it
//   ack-psn       no positive ACK to an RC QP carries a PSN of one of its READ requests (any
//                 response PSN of it) or ATOMIC requests: those end only with their response
//                 (IBA 9.7.5.1.2), and a requester such as rxe takes such an ACK as the READ's
//                 completion, without its data
//   retry-bound   with a partition longer than the retry budget, each RC QP with work pending
//                 across it fails with RETRY_EXC_ERR within
//                 timeout * (retry_cnt + 1) + slack of the partition (or of the post)
//
// RETRY_EXC_ERR is earned (retry_evidence) when, for some PSN p of the QP's requests, the trace
// holds at least retry_cnt + 1 tries of p (transmissions of a request with PSN p, or of an RDMA
// READ request whose response range covers p; a resend that follows an RNR NAK of p is no try;
// a network copy of a PSN-sequence NAK of p counts as one more), and no response acknowledging
// p (an ACK with PSN p for a SEND/WRITE, a READ response or ATOMIC ACK with PSN p) reached the
// QP intact between the first of the last retry_cnt tries and the failure. Why it is sound: the
// budget is reset by progress only; after the last progress (when p became the oldest
// unacknowledged PSN) every one of the retry_cnt retries resent p, so the last retry_cnt tries
// follow it, and a response acknowledging p delivered after them would have been progress.
// With retry_cnt 0 the window starts at the later of the last try and the last response to an
// older PSN (the last progress was one of them). And unless a PSN-sequence NAK of p (a retry
// that does not wait) reached the QP, the failure comes at least retry_cnt + 1 local ACK
// timeouts after p's first try: every timer runs a full timeout from a send or progress no
// earlier than that try, each after the previous retry. Why it is tight: a failure without
// retry_cnt+1 tries of one PSN, or while that PSN was being acknowledged, is reported — with or
// without a partition, and whether or not the QP's path crosses one. RNR_RETRY_EXC_ERR is earned
// (rnr_evidence) when rnr_retry < 7 and rnr_retry + 1 RNR NAKs of one PSN reached the QP by the
// failure.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sim/scenario.h"

namespace urdma::sim {

struct ObservedCompletion {
  uint64_t time_ns = 0;  // virtual time at which the application polled it
  uint32_t host = 0;
  bool recv_cq = false;  // polled from the host's receive CQ (else its send CQ)
  ibv_wc wc = {};
};

// One datagram as the simulated network carried it: cluster.cc records it from the network's
// trace events (net::SimEvent) and decodes the transport header from the datagram's bytes with
// its own few lines (decode_datagram below), never through the engine's parser. It is the
// checker's evidence of what the network did to each QP's packets.
struct TracedDatagram {
  uint32_t src_host = 0;
  uint32_t dst_host = 0;
  uint64_t sent_ns = 0;
  uint8_t opcode = 0;       // BTH opcode
  uint32_t dest_qpn = 0;    // BTH destination QP
  uint32_t psn = 0;         // BTH PSN
  bool has_aeth = false;    // ACK, ATOMIC ACK, READ response First/Last/Only
  uint8_t syndrome = 0;     // AETH syndrome: ACK, RNR NAK or NAK and its code
  uint32_t dma_length = 0;  // RETH DMA length of an RDMA READ request (its responses' span)
  uint32_t ud_payload = 0;  // UD SEND: the message's length (BTH pad count applied)
  // Virtual times at which an intact copy became readable at dst_host. Copies the network
  // corrupted are left out (the receiver's ICRC check drops them), as are lost ones.
  std::vector<uint64_t> delivered_ns;
};
// Decodes BTH (IBA 9.2) and, where the opcode carries one, the AETH (IBA 9.3.5) of a RoCEv2
// UDP payload into `out`'s header fields; false when it is too short to hold them.
bool decode_datagram(const uint8_t* udp_payload, size_t length, TracedDatagram& out);

struct RunRecord {
  // Scenario QP index → the QPN the provider assigned.
  std::vector<uint32_t> qp_num;
  // Per send / receive of the scenario: when it was posted (nullopt: never, e.g. its
  // dependency failed).
  std::vector<std::optional<uint64_t>> send_posted_ns;
  std::vector<std::optional<uint64_t>> recv_posted_ns;
  // Per window: the rkey each BIND_MW gave it (0 when never bound).
  std::vector<uint32_t> window_rkey;
  // Every completion, in the order polled (the final drain's flushes included).
  std::vector<ObservedCompletion> completions;
  // Per region: final bytes, kGuardBytes + size + kGuardBytes (as Scenario::initial_image).
  std::vector<std::vector<uint8_t>> memory;
  // The run reached its end (all posted signaled WRs completed) before the virtual deadline.
  bool finished = false;
  std::string stall;  // why not, when !finished
  // Virtual time at which the final drain (every QP moved to ERR) began.
  uint64_t drain_ns = 0;
  // Every datagram the network accepted, in send order (empty for the oracle's run).
  std::vector<TracedDatagram> datagrams;
  // Datagrams the network dropped because a queue was full (net::SimEventKind::kDropRxFull,
  // kDropQueueFull): from the network's trace, so the checker knows a "clean" profile lost some.
  uint64_t overflow_drops = 0;
};

struct Violation {
  std::string property;
  std::string detail;
};

std::vector<Violation> check(const Scenario& scenario, const RunRecord& run);

// The local ACK timeout (IBA 9.7.6.1.3: 4.096 us * 2^timeout; 0 = infinite).
inline constexpr uint64_t kAckTimeoutBaseNs = 4096;
inline constexpr uint64_t ack_timeout_ns(uint8_t timeout) {
  return timeout == 0 ? ~uint64_t{0} : kAckTimeoutBaseNs << timeout;
}
// The longest an RC requester may take to give up after its peer vanished: every try
// (retry_cnt + 1 of them) waits one timeout, plus one more timeout of slack for a timer armed
// just before the cut and the path's delays.
uint64_t retry_bound_ns(const QpSpec& qp, const FaultProfile& faults);

}  // namespace urdma::sim
