// What urdmad itself says on QP1, where a kernel CM would answer for the host:
//  * a REQ for a service ID nobody listens on gets REJ "invalid service ID" (IBA 12.6.7.2,
//    reason 8; Linux cm_match_req → cm_issue_rej), a SIDR_REQ gets SIDR_REP "service ID not
//    supported" (status 1; Linux cm_sidr_req_handler) — at once, instead of the client
//    retrying until it gives up;
//  * a DREQ for a communication ID no process holds gets a DREP (Linux cm_issue_drep), so the
//    peer of a process that died finishes its disconnect;
//  * when a process dies, every connection it had established gets a DREQ, so its peers see
//    DISCONNECTED (the kernel sends DREQ for each connected cm_id of a dying process).
//
// The daemon learns the connections from the CM MADs it routes to each slot (it never sees what
// a process sends): the passive side from REQ (the peer's comm ID and QPN) then RTU (its own comm
// ID), the active side from REP (both comm IDs and the peer's QPN); DREQ, DREP and REJ end them.
// What it cannot see: a passive side that became established without an RTU (the RTU lost and
// the first data packet taking its place, IBA 12.9.6 COMM_EST) is not known, so its peer gets no
// DREQ. The DREQs are repeated until their DREP comes (Releases), a few times at most.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "net/address.h"
#include "wire/mad.h"

namespace urdma::daemon {

using CmMad = std::array<uint8_t, wire::kMadSize>;

// The answer to a REQ or SIDR_REQ nobody listens for (REJ reason 8, Message REJected REQ,
// Local Comm ID 0, Remote Comm ID = the REQ's, the REQ's transaction ID; or SIDR_REP status 1
// with the request's ID, service ID and transaction ID). nullopt for any other message or a MAD
// that is not a CM message.
std::optional<CmMad> no_listener_reply(std::span<const uint8_t> mad);

// The DREP answering a DREQ for a connection nobody holds (comm IDs swapped, transaction ID
// echoed); nullopt for anything but a DREQ.
std::optional<CmMad> orphan_drep(std::span<const uint8_t> mad);

// One established connection of a process, as its peer names it.
struct PeerConn {
  uint32_t local_comm_id = 0;   // the process's
  uint32_t remote_comm_id = 0;  // the peer's
  uint32_t remote_qpn = 0;      // the peer's QP (a DREQ names it: IBA 12.6.10)
  net::Address local;           // the address the peer sent to
  net::Address peer;
  friend bool operator==(const PeerConn&, const PeerConn&) = default;
};

// The DREQ that releases `c` on behalf of its dead process.
CmMad build_dreq(const PeerConn& c, uint64_t transaction_id);

// A GMP as a UD SEND Only to QP1: BTH (P_Key 0xFFFF, DestQP 1, `psn`), DETH (Q_Key 0x80010000,
// SrcQP 1), the MAD, the ICRC sealed for the UDP flow from `src` to `dst` (DF set, IP ID 0: what
// the kernel sends from an unconnected socket). Returns the datagram's length; `buf` holds
// kGmpDatagramSize bytes.
inline constexpr size_t kGmpDatagramSize = 12 + 8 + wire::kMadSize + 4;
size_t build_gmp(std::span<uint8_t, kGmpDatagramSize> buf, std::span<const uint8_t> mad,
                 uint32_t psn, const net::Address& src, uint16_t src_port, const net::Address& dst,
                 uint16_t dst_port);

// Whether a datagram's ICRC holds for the flow it came on (from `src` to `dst`): the daemon
// answers only what a host's CM would have received (processes check their own MADs).
bool icrc_ok(std::span<const uint8_t> datagram, const net::Endpoint& src, const net::Endpoint& dst);

// Per slot, the connections learnt from the MADs routed to it.
class ConnTable {
 public:
  // Bounds per slot: connections (a process's whole CM) and REQs awaiting their RTU (the
  // oldest is forgotten: a REQ the process rejected never sees one).
  static constexpr size_t kMaxConns = 65536;
  static constexpr size_t kMaxPendingReqs = 4096;

  // A CM MAD from `peer` to `local`, routed to `slot`'s process.
  void observe(unsigned slot, const net::Address& peer, const net::Address& local,
               std::span<const uint8_t> mad);
  // The slot's process is gone: its established connections, and the slot forgotten.
  std::vector<PeerConn> reclaim(unsigned slot);
  size_t established(unsigned slot) const;

 private:
  // A REQ the slot's process received, by the peer's address and comm ID.
  using PendingKey = std::pair<net::Address::Bytes, uint32_t>;
  struct Pending {
    uint32_t remote_qpn = 0;
    uint64_t order = 0;  // arrival, to forget the oldest
  };
  struct Slot {
    std::map<uint32_t, PeerConn> conns;  // by local comm ID
    std::map<PendingKey, Pending> pending;
  };
  void establish(Slot& s, const PeerConn& c);
  void forget(unsigned slot, uint32_t local_comm_id, uint32_t remote_comm_id);

  std::map<unsigned, Slot> slots_;
  uint64_t order_ = 0;
};

// The DREQs sent for a dead process's connections, repeated until their DREP comes or the
// retries run out (as a CM retransmits its DREQ: IBA 12.9.7; the peer answers a repeated DREQ
// with another DREP). The DREPs are the daemon's: they are not forwarded to whichever process
// holds the slot by then.
class Releases {
 public:
  static constexpr int64_t kTimeoutMs = 1000;
  static constexpr int kRetries = 3;
  static constexpr size_t kMax = 65536;  // beyond: sent once, not tracked

  struct Dreq {
    PeerConn conn;
    uint64_t transaction_id = 0;
  };
  // Tracks `d`, sent now (`now_ms`).
  void sent(const Dreq& d, int64_t now_ms);
  // A DREP from `peer`: true when it answers one of ours (then forgotten).
  bool take_drep(const net::Address& peer, std::span<const uint8_t> mad);
  // The DREQs to send again at `now_ms`; those out of retries are forgotten.
  std::vector<Dreq> due(int64_t now_ms);
  // When due() next has something; nullopt when nothing is tracked.
  std::optional<int64_t> next_deadline_ms() const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    Dreq dreq;
    int64_t deadline_ms = 0;
    int retries_left = 0;
  };
  std::map<uint32_t, Entry> entries_;  // by the dead process's comm ID
};

}  // namespace urdma::daemon
