// Slot sockets: the fixed SO_REUSEPORT group of UDP sockets bound to the RoCEv2 port, and the
// classic-BPF program that steers each datagram to one of them by its BTH DestQP.
//
// The QPN -> slot mapping (the one definition; the BPF program and steer() implement it):
//
//   range(qpn) = (qpn & 0xFFFFFF) >> kSlotShift        -- 4096 ranges of 4096 QPNs each
//   slot(qpn)  = range(qpn) % slot_count
//
//  * Range 0 (QPN 0..4095: QP0, QP1) steers to slot 0, the daemon's own; so does every range
//    that is a multiple of slot_count. Slot 0 is never handed to a client.
//  * A client of slot s gets one range r with r % slot_count == s, r != 0: QPNs
//    [r << kSlotShift, (r + 1) << kSlotShift). The "generation" r / slot_count advances each
//    time slot s is handed out again, so a freed QPN range returns only after the slot has
//    cycled through all its ranges (the quarantine; see slot_table.h).
//  * A datagram shorter than 8 bytes (no DestQP) goes to slot 0.
//  * An unknown QPN goes to whichever slot its range names: the daemon drains free slots and
//    a client's engine drops QPNs it does not own.
//
// The BPF program sees the UDP payload at offset 0 (the kernel pulls the UDP header before
// running it), so DestQP is the big-endian 24 bits at payload bytes 5-7. The index it returns is
// an index into the group's socket array in bind order; the kernel moves the last socket into a
// hole when one closes, so the group's every socket stays open as long as any slot is in use: the
// keeper holds them all (supervisor.h).
#pragma once

#include <linux/filter.h>

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "daemon/unique_fd.h"
#include "net/address.h"
#include "wire/headers.h"
#include "wire/icrc.h"

namespace urdma::daemon {

inline constexpr unsigned kSlotShift = 12;
inline constexpr uint32_t kQpnsPerRange = 1u << kSlotShift;
inline constexpr uint32_t kRangeCount = (wire::kQpnMask + 1) >> kSlotShift;
// Slot counts a group may have: slot 0 plus at least one client slot; at most 128 sockets.
inline constexpr unsigned kMinSlots = 2;
inline constexpr unsigned kMaxSlots = 128;
inline constexpr unsigned kDefaultSlots = 64;
// The BTH bytes the program reads: DestQP is bytes 5-7 (wire/headers.h); it loads the 32-bit
// word at 4 and masks off byte 4 (FECN/BECN).
inline constexpr uint32_t kDestQpWordOffset = 4;
inline constexpr uint32_t kMinSteeredBytes = 8;

constexpr uint32_t range_of_qpn(uint32_t qpn) {
  return (qpn & wire::kQpnMask) >> kSlotShift;
}
constexpr unsigned slot_of_range(uint32_t range, unsigned slot_count) {
  return range % slot_count;
}
constexpr unsigned slot_of_qpn(uint32_t qpn, unsigned slot_count) {
  return slot_of_range(range_of_qpn(qpn), slot_count);
}
constexpr uint32_t first_qpn_of_range(uint32_t range) {
  return range << kSlotShift;
}

// What the BPF program computes for a UDP payload (for tests and diagnostics).
unsigned steer(std::span<const uint8_t> udp_payload, unsigned slot_count);

// The classic-BPF program for SO_ATTACH_REUSEPORT_CBPF.
std::vector<sock_filter> steering_program(unsigned slot_count);

// The group: socket i is the one the program's index i selects.
struct SlotGroup {
  std::vector<UniqueFd> sockets;
  uint16_t port = 0;
  // AF_INET6 (dual-stack [::], IPv4 delivered as mapped addresses) or AF_INET (IPv6 unavailable).
  int family = 0;
};

struct SlotGroupOptions {
  unsigned slot_count = kDefaultSlots;
  // 0 = an ephemeral port (tests): the first socket picks it, the others join it.
  uint16_t port = wire::kRoceV2UdpPort;
  // Bind to [::] with IPV6_V6ONLY=0 if the host has IPv6, else 0.0.0.0. Tests may force IPv4.
  bool allow_ipv6 = true;
  // Refuse a port something is bound to already (EADDRNOTAVAIL). Tests turn it off to make an
  // earlier group that verify_steering must catch.
  bool require_free_port = true;
};

// Creates, binds and steers the group. Returns 0, or an errno with the reason in *error:
// EADDRNOTAVAIL when the port is bound already (require_free_port), EADDRINUSE when another
// socket without our uid or SO_REUSEPORT gets there first, EINVAL for a bad slot count.
int open_slot_group(const SlotGroupOptions& options, SlotGroup* group, std::string* error);

// Checks, with one probe datagram per slot over loopback, that socket i of the group receives
// what the program steers to index i. This fails when sockets from an earlier group still sit in
// the kernel's group (a previous urdmad's sockets held open by running processes: binding joins
// their group and shifts every index). Returns false with the reason in *error; true also when
// loopback is unusable or no probe came back at all (*skipped set): nothing was proved then.
// Takes at most ~200 ms.
bool verify_steering(const SlotGroup& group, std::string* error, bool* skipped);

// Who holds a socket bound to UDP `port` in this namespace (/proc/net/udp and udp6), if anyone.
std::optional<uid_t> udp_port_owner(uint16_t port);

}  // namespace urdma::daemon
