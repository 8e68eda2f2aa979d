// The property checker: given a scenario and what one run of it produced, lists every property
// the run violated.
//
// It sees only what an application could see — the completions it polled (with the virtual
// time it polled them), when it posted each WR, and the final bytes of every buffer including
// the guard bytes around them — plus the QP numbers and window rkeys the provider assigned. Its
// expectations come from the scenario alone (scenario.h), so it can be tested on hand-made
// histories (checker_test.cc) long before an engine exists.
//
// Properties (each Violation names one):
//   progress      the run finished: every posted signaled WR completed before the deadline
//   exactly-once  every posted signaled WR (and every WR that completed in error, and every
//                 posted receive after the final drain) has exactly one completion; no
//                 completion for an unknown or unposted WR; no success for an unsignaled WR
//   order         per QP, send completions come in posting order; RC receives in posting order
//   status        no failure without a partition; with one, only RETRY_EXC_ERR (RC) and, after
//                 the first error of a QP, only WR_FLUSH_ERR for every later WR
//   fields        opcode, byte_len, imm_data, qp_num, src_qp (UD), wc_flags, invalidated rkey
//   delivery      what the receives got matches what was sent: RC exactly, in order, nothing
//                 missing; UC/UD a subsequence (loss) or any sent message (reorder/duplicates),
//                 everything when the network is clean
//   data          every byte of every buffer equals its expected final value (WRITE, READ and
//                 receive targets), or for an operation that failed, its old or new value
//   guard         nothing changed outside the ranges WRs may touch: guard bytes around each
//                 registration, gaps between buffers, source regions, unused counters
//   atomic        FETCH_ADD results are a permutation of the prefix sums of a per-QP ordered
//                 linearization, CMP_SWP results follow the counter's unique chain of values,
//                 and each counter's final value is the end of that history
//   retry-bound   with a partition longer than the retry budget, each RC QP with work pending
//                 across it fails with RETRY_EXC_ERR within
//                 timeout * (retry_cnt + 1) + slack of the partition (or of the post)
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
