// For code that builds datagrams by hand (tests, the fuzzer) or checks what an engine sent: the
// ICRC by flow comes from net/icrc_flow.h (net::seal_icrc, net::icrc_exact: the IPv4 header
// urdma sends, ID 0 and DF set), included here; v4_of gives an IPv4 address's bytes.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "net/address.h"
#include "net/icrc_flow.h"

namespace urdma::test {

// The four address bytes of an IPv4 address, network order. Precondition: a.is_v4().
std::array<uint8_t, 4> v4_of(const net::Address& a);

}  // namespace urdma::test
