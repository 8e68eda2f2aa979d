// Slot 0's datagrams: the CM MADs to QP1 (the GSI), routed to the process they belong to.
//
// Every RoCEv2 host has one QP1, and every datagram to QP1 steers to slot 0, the daemon's. The
// daemon reads them and forwards each to one process (the datagram unchanged, with its source
// and destination endpoints, so the process checks the ICRC and answers from its own slot):
//  * REQ and SIDR_REQ go to the process listening on their service ID (kListen);
//  * every other CM message names the receiver's communication ID (REP, RTU, MRA, REJ, DREQ,
//    DREP, LAP, APR: RemoteCommID; SIDR_REP: RequestID), and a process chooses its own IDs with
//    its slot number in the top 8 bits (comm_id_for_slot) — so the ID names the slot;
//  * except a REJ whose RemoteCommID is 0: an active side that gave up before it heard the
//    passive side's ID (REJ "timeout" when it destroys a connecting id, Linux cm_destroy_id)
//    names only its own, which the daemon learnt from the REQ it routed (RequesterTable).
// Anything else (not a UD SEND to QP1, not a CM MAD, ClassPortInfo, a slot nobody holds) is
// dropped and counted by reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <utility>

#include "net/address.h"

namespace urdma::daemon {

// A communication ID (or SIDR request ID) a process of slot `slot` uses: its slot in the top
// 8 bits, anything the process likes below.
inline constexpr unsigned kCommIdSlotShift = 24;
constexpr uint32_t comm_id_for_slot(unsigned slot, uint32_t low_bits) {
  return uint32_t{slot} << kCommIdSlotShift | (low_bits & ((1u << kCommIdSlotShift) - 1));
}
constexpr unsigned slot_of_comm_id(uint32_t comm_id) {
  return comm_id >> kCommIdSlotShift;
}

enum class MadDrop : uint8_t {
  kNone = 0,
  kNotRoce,        // parse_packet rejected it
  kNotQp1,         // an unknown QPN that steers to slot 0
  kNotUdSend,      // to QP1 but not a UD SEND Only
  kNotCm,          // not a well-formed CM MAD
  kClassPortInfo,  // not answered yet
  kNoListener,     // REQ / SIDR_REQ for a service nobody listens on
  kNoSlot,         // the ID names slot 0, a slot out of range, or one nobody holds
  kNoChannel,      // the slot's process opened no MAD channel
  kChannelFull,    // the channel's socket buffer is full (its process is not reading)
  kTruncated,      // larger than any MAD datagram
  kBadIcrc,        // its ICRC does not hold: checked before anything else
  kCount,
};
inline constexpr size_t kMadDropCount = static_cast<size_t>(MadDrop::kCount);
const char* mad_drop_name(MadDrop d);

struct MadRoute {
  enum class By : uint8_t { kDrop, kServiceId, kSlot, kRequester };
  By by = By::kDrop;
  MadDrop drop = MadDrop::kNone;  // for kDrop
  uint64_t service_id = 0;        // for kServiceId
  unsigned slot = 0;              // for kSlot (not yet checked against the table)
  // The sender's own communication ID: a REQ's (kServiceId, 0 for SIDR_REQ), or the REJ's that
  // goes by it (kRequester).
  uint32_t sender_comm_id = 0;
};

// Where one datagram of slot 0 goes, from its bytes alone (the ICRC is the receiver's to check).
MadRoute route_mad(std::span<const uint8_t> udp_payload);

// Which slot each recent REQ went to, by the requester's address and communication ID: where a
// REJ with RemoteCommID 0 from that requester goes. Bounded: the oldest entries go first. A
// REQ's life (its retries) is seconds; a requester that gives up only after kCapacity newer
// REQs came has its REJ dropped, and the passive side's own REP retries end the connection.
class RequesterTable {
 public:
  static constexpr size_t kCapacity = 4096;
  void remember(const net::Address& requester, uint32_t comm_id, unsigned slot);
  // The slot, taken out of the table (one REJ ends the request).
  std::optional<unsigned> take(const net::Address& requester, uint32_t comm_id);
  void forget_slot(unsigned slot);  // its process is gone: its requests with it
  size_t size() const { return slots_.size(); }

 private:
  using Key = std::pair<net::Address, uint32_t>;
  struct Entry {
    unsigned slot;
    uint64_t seq;  // which remember() made it
  };
  std::map<Key, Entry> slots_;
  // Oldest first, at most kCapacity: an entry names its key only while the seqs match (the key
  // may have been taken, or remembered again since).
  std::deque<std::pair<Key, uint64_t>> order_;
  uint64_t next_seq_ = 0;
};

}  // namespace urdma::daemon
