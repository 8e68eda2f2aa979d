// ICRC sealing and checking by flow, for code that builds datagrams by hand (tests, the fuzzer)
// or checks what an engine sent: the flow is the pair of endpoints a PacketIo reports, IPv4 or
// IPv6, and the IPv4 header is the one urdma sends (ID 0, DF set; docs/ARCHITECTURE.md).
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "net/address.h"

namespace urdma::test {

// The four address bytes of an IPv4 address, network order. Precondition: a.is_v4().
std::array<uint8_t, 4> v4_of(const net::Address& a);

// Computes and stores the ICRC of `udp_payload` sent from `src` to `dst`. Does nothing when
// the payload is too short or too long to carry one, or the two addresses are of different
// families (no such datagram exists).
void seal_icrc(std::span<uint8_t> udp_payload, const net::Endpoint& src, const net::Endpoint& dst);

// True when the ICRC of `udp_payload` is right for that flow with the IPv4 header urdma sends
// (ID 0, DF set) — exactly, without solving for an unknown IPv4 ID.
bool icrc_ok(std::span<const uint8_t> udp_payload, const net::Endpoint& src,
             const net::Endpoint& dst);

}  // namespace urdma::test
