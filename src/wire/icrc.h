// The RoCEv2 Invariant CRC (ICRC): compute, store, verify.
//
// IBA Vol. 1 7.8.1 (C7-47, C7-48) defines the ICRC as a CRC-32 over every field that does not
// change end to end; the RoCEv2 annex (IBA Annex A17, building on A16 RoCE) maps that onto
// IP/UDP. The CRC (crc32.h, the Ethernet/zlib polynomial) runs over, in order:
//   8 bytes of 0xFF          the absent LRH, masked;
//   the IP header            IPv4: TOS (DSCP+ECN), TTL, header checksum set to ones;
//                            IPv6: traffic class, flow label, hop limit set to ones;
//   the UDP header           checksum set to ones;
//   the BTH                  byte 4 (FECN, BECN, resv6) set to ones;
//   everything after the BTH up to, not including, the 4-byte ICRC itself.
// The IPv4 identification and flags/fragment-offset fields are NOT masked: the ICRC covers them.
// On the wire the ICRC is the CRC value least significant byte first (Linux rxe stores the u32
// in host order on little-endian machines; scapy's roce.py packs it "<I"). Linux rxe_icrc.c and
// scapy/contrib/roce.py implement the same rule; the tests check ours against both.
//
// Every function here takes the UDP payload: BTH ... ICRC, whose last kIcrcBytes are the ICRC
// slot (excluded from the CRC). IP total length / payload length and UDP length are derived
// from its size exactly as the kernel will set them.
//
// THE IPv4 ID PROBLEM. A receiver on a UDP socket sees addresses, ports and length, never the
// IPv4 identification or flags. urdma itself sends from unconnected sockets with
// IP_MTU_DISCOVER=IP_PMTUDISC_DO, for which Linux emits DF set and ID 0 (ip_select_ident_segs()),
// so its packets verify at {ID 0, DF}: the exact 2^-32 check — all but the segments of a UDP GSO
// send, whose IDs are 1, 2, ... (ipv4_id_icrc_delta below). Linux rxe sends DF with non-zero,
// incrementing IDs from a hashed generator. verify_icrc_ipv4() therefore tries {ID 0, DF} and
// otherwise SOLVES for the (ID, DF) that would make the received ICRC correct — the CRC is
// affine in those bits, so this is one GF(2) multiplication — and accepts when one exists.
// COST OF THAT: a corrupted packet is then accepted with probability 2^-16 x (number of DF
// values tried) instead of 2^-32: 2^-16 with Ipv4DfSearch::kSetOnly, 2^-15 with kSetOrClear.
// It also gives up CRC-32's guarantee of catching every single-bit error, at a few positions:
// with kSetOrClear a flip of UDP-payload byte 173 bit 3 or byte 1834 bit 6 (bit 0 = LSB) is
// always "explained" by another ID with DF clear; with kSetOnly the first such position is
// byte 26744, beyond any RoCE MTU. Every Linux RoCEv2 sender sets DF (rxe's prepare4()
// hard-codes IP_DF; urdma's sockets use IP_PMTUDISC_DO), so kSetOnly is the recommended search.
// The result names the ID it recovered so a caller can tighten the check further (demand ID 0
// from urdma peers, or an ID near the sender's recent ones).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "wire/headers.h"

namespace urdma::wire {

inline constexpr size_t kIcrcBytes = 4;
// The smallest UDP payload that has an ICRC: a BTH and the ICRC.
inline constexpr size_t kIcrcMinUdpPayloadBytes = BthView::kSize + kIcrcBytes;
// The largest: what fits a maximal IPv4 datagram (65535 bytes less 20 of IP and 8 of UDP).
inline constexpr size_t kIcrcMaxUdpPayloadBytes = 65535 - 20 - 8;
// IANA-assigned UDP destination port of RoCEv2.
inline constexpr uint16_t kRoceV2UdpPort = 4791;

// Addresses (network byte order, as in the IP header) and UDP ports of an IPv4 datagram.
struct IcrcIpv4Flow {
  std::array<uint8_t, 4> src_addr{};
  std::array<uint8_t, 4> dst_addr{};
  uint16_t udp_src_port = 0;
  uint16_t udp_dst_port = kRoceV2UdpPort;
};

// Everything the ICRC covers in an IPv4 + UDP header that is not derived from the length.
// The defaults are what Linux puts on urdma's own datagrams (see above). Protocol is 17 (UDP),
// fragment offset 0, MF clear, no IP options.
struct IcrcIpv4 {
  IcrcIpv4Flow flow;
  uint16_t ip_id = 0;
  bool dont_fragment = true;
};

struct IcrcIpv6 {
  std::array<uint8_t, 16> src_addr{};
  std::array<uint8_t, 16> dst_addr{};
  uint16_t udp_src_port = 0;
  uint16_t udp_dst_port = kRoceV2UdpPort;
};

// The headers exactly as captured, for tools that check what a sender really sent: the whole
// IPv4 header (options included) or the IPv6 fixed header, and the UDP ports. The UDP length
// is derived from the payload; the UDP checksum is masked anyway.
struct IcrcRawHeaders {
  std::span<const uint8_t> ip_header;
  uint16_t udp_src_port = 0;
  uint16_t udp_dst_port = 0;
};

// The ICRC of `udp_payload` (BTH ... ICRC slot; the slot's contents are ignored).
// Precondition: kIcrcMinUdpPayloadBytes <= udp_payload.size() <= kIcrcMaxUdpPayloadBytes.
uint32_t compute_icrc(const IcrcIpv4& headers, std::span<const uint8_t> udp_payload);
uint32_t compute_icrc(const IcrcIpv6& headers, std::span<const uint8_t> udp_payload);
// nullopt when the header is not a well-formed IPv4 (IHL >= 5, size == 4 * IHL) or IPv6
// (40-byte) header, or the payload is too short or too long.
std::optional<uint32_t> compute_icrc(const IcrcRawHeaders& headers,
                                     std::span<const uint8_t> udp_payload);

// Gather form for zero-copy transmit (net/packet_io.h sends an iovec): the UDP payload WITHOUT
// its ICRC slot is the concatenation of `pieces` (e.g. the header buffer, then the payload SGEs
// and pad straight from registered memory); the ICRC that is to follow them is returned.
// Preconditions: pieces.front() holds at least the whole BTH; the total plus kIcrcBytes is
// within [kIcrcMinUdpPayloadBytes, kIcrcMaxUdpPayloadBytes].
uint32_t compute_icrc_gather(const IcrcIpv4& headers,
                             std::span<const std::span<const uint8_t>> pieces);
uint32_t compute_icrc_gather(const IcrcIpv6& headers,
                             std::span<const std::span<const uint8_t>> pieces);

// The ICRC trailer (last kIcrcBytes of the UDP payload), in wire order. Precondition for both:
// udp_payload.size() >= kIcrcBytes.
uint32_t icrc_of(std::span<const uint8_t> udp_payload);
void store_icrc(std::span<uint8_t> udp_payload, uint32_t icrc);

// Computes and stores the ICRC of a packet about to be sent.
inline void seal_icrc(const IcrcIpv4& headers, std::span<uint8_t> udp_payload) {
  store_icrc(udp_payload, compute_icrc(headers, udp_payload));
}
inline void seal_icrc(const IcrcIpv6& headers, std::span<uint8_t> udp_payload) {
  store_icrc(udp_payload, compute_icrc(headers, udp_payload));
}

// Segmentation offload (UDP GSO). A datagram sent with UDP_SEGMENT leaves as segments with the
// IPv4 IDs id, id + 1, ... (Linux's inet_gso_segment numbers them, in software before a device
// without UDP segmentation offload, and so does segmentation on receive): urdma's super-packets
// carry ID 0, so segment i carries ID i. This is what to XOR onto an ICRC computed for
// {ID 0, DF set} to get the ICRC of the same packet with `ip_id` (DF unchanged): the CRC is
// affine, so the change depends only on the ID and the UDP payload size (ICRC slot included).
// Cost: one GF(2) multiplication; the power of x it needs is cached per size (thread-local).
uint32_t ipv4_id_icrc_delta(uint16_t ip_id, size_t udp_payload_bytes);

// Verification of received packets. All return false (not ok) for payloads outside the
// precondition range above, never read outside `udp_payload`.
bool verify_icrc_ipv6(const IcrcIpv6& headers, std::span<const uint8_t> udp_payload);
bool verify_icrc_raw(const IcrcRawHeaders& headers, std::span<const uint8_t> udp_payload);

struct Ipv4IcrcMatch {
  bool ok = false;
  uint16_t ip_id = 0;          // the identification the ICRC was computed with, when ok
  bool dont_fragment = false;  // the DF flag it was computed with, when ok
};

// Which DF values verify_icrc_ipv4 may assume the sender used (see the top of this file).
enum class Ipv4DfSearch {
  kSetOnly,     // DF set, as every known RoCEv2 sender: false accepts 2^-16
  kSetOrClear,  // DF set or clear: false accepts 2^-15, two single-bit blind spots < 2 KiB
};

// For a UDP-socket receiver, which does not see the IPv4 ID or flags: accepts when some
// (ID, DF allowed by `df_search`) with fragment offset 0 and MF clear makes the ICRC correct,
// and says which. {ID 0, DF set} is checked first (exact, 2^-32); otherwise the ID is solved
// for (see the top of this file for what that costs in error detection).
// Cost: one ICRC over the packet plus, for a non-zero ID, one GF(2) solve (bench/crc_bench.cc
// measures it).
Ipv4IcrcMatch verify_icrc_ipv4(const IcrcIpv4Flow& flow, std::span<const uint8_t> udp_payload,
                               Ipv4DfSearch df_search);

// The solve alone: given the received ICRC and the ICRC computed for the same packet with
// {ID 0, DF set}, finds the (ID, DF) that explains the difference, if any. Exposed for the
// benchmark and the tests.
Ipv4IcrcMatch solve_ipv4_id(uint32_t received_icrc, uint32_t icrc_id0_df, size_t udp_payload_bytes,
                            Ipv4DfSearch df_search);

}  // namespace urdma::wire
