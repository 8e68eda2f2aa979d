// The engine's counters, named as Linux rxe's `rdma statistic` prints them
// (drivers/infiniband/sw/rxe/rxe_hw_counters.c), plus the drop counters of the receive pipeline.
//
// Every counter is a plain uint64_t written only by the engine thread; readers on other threads
// see a snapshot that may be slightly stale (the numbers are statistics, not synchronisation).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "wire/packet.h"

namespace urdma::engine {

struct EngineCounters {
  // ---- rxe names ----
  uint64_t sent_pkts = 0;               // datagrams handed to the PacketIo
  uint64_t rcvd_pkts = 0;               // datagrams taken from the PacketIo
  uint64_t duplicate_request = 0;       // responder: request PSN before the expected PSN
  uint64_t out_of_seq_request = 0;      // responder: request PSN after the expected PSN
  uint64_t rcvd_rnr_err = 0;            // requester: RNR NAKs received
  uint64_t send_rnr_err = 0;            // responder: RNR NAKs sent
  uint64_t rcvd_seq_err = 0;            // requester: PSN sequence error NAKs received
  uint64_t ack_deferred = 0;            // responder: requests not acknowledged at once (no AckReq)
  uint64_t retry_exceeded_err = 0;      // requester: retry_cnt exhausted
  uint64_t retry_rnr_exceeded_err = 0;  // requester: rnr_retry exhausted
  uint64_t completer_retry_err = 0;     // requester: retransmissions started (timeout or NAK)
  uint64_t send_err = 0;                // PacketIo refused a datagram (kRejected), dropped
  uint64_t tx_blocked = 0;              // kWouldBlock: kept in the transmit backlog, sent later
  uint64_t link_downed = 0;             // (no link state in user space; always 0)
  uint64_t rdma_sends = 0;              // request packets sent
  uint64_t rdma_recvs = 0;              // request packets accepted by the responder
  uint64_t duplicate_response = 0;      // requester: response for a PSN already completed
  uint64_t tx_payload_copies = 0;       // packets whose payload needed more than net::kMaxTxIov
                                        // iovecs, so it was copied instead of gathered
  uint64_t cqe_overflow = 0;            // completions lost to a full CQ (IBA 11.4.2.1)

  // ---- receive pipeline drops (IBA 9.6: invalid packets are silently discarded) ----
  std::array<uint64_t, wire::kParseErrorCount> drop_parse{};  // indexed by wire::ParseError
  uint64_t drop_truncated = 0;                                // larger than the receive buffer
  uint64_t drop_icrc = 0;          // ICRC mismatch (IBA 7.8.1, annex A17.4.3.1)
  uint64_t drop_pkey = 0;          // P_Key mismatch (IBA 9.6.1.1, 10.9.3)
  uint64_t drop_unknown_qpn = 0;   // no QP with that number, or QP in RESET/INIT
  uint64_t drop_address = 0;       // RC/UC: not from the connected peer's address (rxe check_addr)
  uint64_t drop_qp_type = 0;       // opcode of another transport than the QP's (IBA 9.6.1.2)
  uint64_t drop_qp_state = 0;      // the QP's state does not accept the packet
  uint64_t drop_qkey = 0;          // UD Q_Key mismatch (IBA 10.2.5, C10-15)
  uint64_t drop_no_recv_wqe = 0;   // UD/UC: no receive WQE posted
  uint64_t drop_bad_response = 0;  // completer: response that matches nothing outstanding
  uint64_t drop_uc_message = 0;    // UC: packets of a message abandoned after a gap or error
  uint64_t xrc_srq_invalid = 0;    // XRC target: a request whose XRCETH names no XRC SRQ of its
                                   // XRC domain (NAKed Invalid Request in sequence, else dropped)
  uint64_t drop_uc_invalid = 0;    // UC: a request a responder check other than the R_Key's
                                   // refused (RC would NAK it)
  uint64_t drop_uc_access = 0;     // UC: an RDMA WRITE the R_Key check refused (key, PD, right,
                                   // bounds, window state or QP; RC would NAK Remote Access
                                   // Error, IBA 9.7.5.2.8): where a peer guessing keys shows
  uint64_t drop_ud_length = 0;     // UD: payload longer than the path MTU
  uint64_t drop_request_queue_full = 0;  // RC: a request behind a READ response found
                                         // kMaxWaitingRequests already waiting (qp_context.h)
  uint64_t drop_ud_recv_length = 0;      // UD: datagram (+ 40-byte GRH) longer than the receive
                                     // WQE (IBA 11.4.2; the WQE is kept, SRQ: completed in error)
  // RC SENDs to a tag-matching SRQ whose TMH was cut short or named no known operation (not a
  // drop: the WQE completes in error and the requester gets an Invalid Request NAK).
  uint64_t tm_header_err = 0;
  uint64_t drop_mcast_invalid = 0;     // DestQP 0xFFFFFF but not a UD SEND to a multicast address
  uint64_t drop_mcast_unattached = 0;  // a multicast datagram for a group no QP here is attached
                                       // to (or none of whose QPs can receive it)

  uint64_t drops() const {
    uint64_t n = drop_truncated + drop_icrc + drop_pkey + drop_unknown_qpn + drop_address +
                 drop_qp_type + drop_qp_state + drop_qkey + drop_no_recv_wqe + drop_bad_response +
                 drop_uc_message + drop_uc_invalid + drop_uc_access + drop_ud_length +
                 drop_ud_recv_length + drop_request_queue_full + drop_mcast_invalid +
                 drop_mcast_unattached;
    for (uint64_t d : drop_parse) n += d;
    return n;
  }
};

}  // namespace urdma::engine
