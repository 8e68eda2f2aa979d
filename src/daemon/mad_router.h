// Slot 0's datagrams: the CM MADs to QP1 (the GSI), routed to the process they belong to.
//
// Every RoCEv2 host has one QP1, and every datagram to QP1 steers to slot 0, the daemon's. The
// daemon reads them and forwards each to one process (the datagram unchanged, with its source
// and destination endpoints, so the process checks the ICRC and answers from its own slot):
//  * REQ and SIDR_REQ go to the process listening on their service ID (kListen);
//  * every other CM message names the receiver's communication ID (REP, RTU, MRA, REJ, DREQ,
//    DREP, LAP, APR: RemoteCommID; SIDR_REP: RequestID), and a process chooses its own IDs with
//    its slot number in the top 8 bits (comm_id_for_slot) — so the ID names the slot.
// Anything else (not a UD SEND to QP1, not a CM MAD, ClassPortInfo, a slot nobody holds) is
// dropped and counted by reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

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
  kCount,
};
inline constexpr size_t kMadDropCount = static_cast<size_t>(MadDrop::kCount);
const char* mad_drop_name(MadDrop d);

struct MadRoute {
  enum class By : uint8_t { kDrop, kServiceId, kSlot };
  By by = By::kDrop;
  MadDrop drop = MadDrop::kNone;  // for kDrop
  uint64_t service_id = 0;        // for kServiceId
  unsigned slot = 0;              // for kSlot (not yet checked against the table)
};

// Where one datagram of slot 0 goes, from its bytes alone (the ICRC is the receiver's to check).
MadRoute route_mad(std::span<const uint8_t> udp_payload);

}  // namespace urdma::daemon
