// The RoCEv2 ICRC of a datagram named by its two endpoints, as a PacketIo reports them: the one
// place that turns a pair of net::Endpoints into the ICRC's pseudo-header (IBA annex A17.4.3.1).
// IPv4 when both addresses are IPv4 (with the IPv4 header urdma's sockets send: ID 0, DF set),
// IPv6 when neither is; a pair of mixed families names no datagram, so it has no ICRC.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "net/address.h"
#include "wire/icrc.h"

namespace urdma::net {

// The ICRC of the UDP payload whose bytes before the ICRC slot are the concatenation of
// `pieces` (wire::compute_icrc_gather); nullopt for mixed families. Preconditions: pieces.front()
// holds the whole BTH; the total plus wire::kIcrcBytes is within kIcrcMinUdpPayloadBytes ..
// kIcrcMaxUdpPayloadBytes.
std::optional<uint32_t> icrc_for(const Endpoint& src, const Endpoint& dst,
                                 std::span<const std::span<const uint8_t>> pieces);

// Computes and stores the ICRC of `udp_payload`; false (nothing stored) for mixed families or a
// payload too short or too long to carry one.
bool seal_icrc(std::span<uint8_t> udp_payload, const Endpoint& src, const Endpoint& dst);

// True when the ICRC of `udp_payload` is right for the flow, as a receiver that does not see the
// IP header checks it: an IPv4 datagram with any IPv4 ID and the DF values `df_search` allows
// (wire::verify_icrc_ipv4), an IPv6 one exactly. False for mixed families or a payload too
// short or too long to carry an ICRC.
bool icrc_ok(std::span<const uint8_t> udp_payload, const Endpoint& src, const Endpoint& dst,
             wire::Ipv4DfSearch df_search);
// For an IPv4 datagram received on a socket: the (ID, DF) its ICRC was computed with, when some
// allowed by `df_search` makes it correct (wire::verify_icrc_ipv4); not ok otherwise, and for
// IPv6 or mixed families.
wire::Ipv4IcrcMatch ipv4_icrc_match(std::span<const uint8_t> udp_payload, const Endpoint& src,
                                    const Endpoint& dst, wire::Ipv4DfSearch df_search);

// The same with IPv4's header taken to be exactly the one urdma sends (ID 0, DF set): for
// checking urdma's own sender.
bool icrc_exact(std::span<const uint8_t> udp_payload, const Endpoint& src, const Endpoint& dst);

}  // namespace urdma::net
