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
// The daemon learns a process's connections from the process itself (kConnUp when it becomes
// established, kConnDown when it ends: protocol.h), never from the MADs it routes, which a peer
// could forge: a REP with a good ICRC proves nothing about what the process started. The DREQs
// are bounded (kMaxConnsPerSlot per process), paced (Releases::kPerSecond, shared by every dead
// process) and repeated until their DREP comes, a few times at most.
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

// Per slot, the connections its process reported established.
class ConnTable {
 public:
  static constexpr size_t kMaxConnsPerSlot = 4096;

  // kConnUp from `slot`'s process: 0, or EINVAL (the local comm ID is not the slot's: its top
  // bits name the slot, comm_id_for_slot), ENOSPC (kMaxConnsPerSlot). The same local comm ID
  // again replaces the record.
  int add(unsigned slot, const PeerConn& c);
  // kConnDown: 0 or ENOENT.
  int remove(unsigned slot, uint32_t local_comm_id);
  // The slot's process is gone: its established connections, and the slot forgotten.
  std::vector<PeerConn> reclaim(unsigned slot);
  size_t established(unsigned slot) const;

 private:
  std::map<unsigned, std::map<uint32_t, PeerConn>> slots_;  // slot -> local comm ID -> conn
};

// The DREQs for dead processes' connections: sent at most kPerSecond (a burst of kBurst), and
// repeated until their DREP comes or the retries run out (as a CM retransmits its DREQ: IBA
// 12.9.7; the peer answers a repeated DREQ with another DREP). The DREPs are the daemon's: they
// are not forwarded to whichever process holds the slot by then.
class Releases {
 public:
  static constexpr int64_t kTimeoutMs = 1000;
  static constexpr int kRetries = 3;
  static constexpr size_t kMax = 65536;  // beyond: not sent (counted by the caller)
  static constexpr int64_t kPerSecond = 1000;
  static constexpr int64_t kBurst = 256;

  struct Dreq {
    PeerConn conn;
    uint64_t transaction_id = 0;
    int sends = 0;  // as due() returns it: how many times it is sent, this time included
  };
  // Queues `d` to be sent as soon as the pace allows; false when kMax are tracked already.
  bool add(const Dreq& d, int64_t now_ms);
  // A DREP from `peer`: true when it answers one of ours (then forgotten).
  bool take_drep(const net::Address& peer, std::span<const uint8_t> mad);
  // The DREQs to send at `now_ms` (first sends and repeats), within the pace; those out of
  // retries are forgotten.
  std::vector<Dreq> due(int64_t now_ms);
  // When due() next has something; nullopt when nothing is tracked.
  std::optional<int64_t> next_deadline_ms() const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    Dreq dreq;
    int64_t deadline_ms = 0;
    int sends_left = 0;
  };
  std::map<uint32_t, Entry> entries_;  // by the dead process's comm ID
  // The pace: a bucket of kBurst tokens refilled at kPerSecond.
  int64_t tokens_ = kBurst;
  int64_t refilled_ms_ = 0;
};

}  // namespace urdma::daemon
