// CM time values: every CM timeout on the wire is 4.096 µs × 2^value (IBA 12.7, REQ field
// details), and the numbers Linux rdma_cm puts in them.
#pragma once

#include <algorithm>
#include <cstdint>

#include "wire/cm.h"

namespace urdma::cm {

// Linux cm.c cm_convert_to_ms: the approximation of 4.096 µs × 2^t used for every CM timer,
// 2^(t-8) ms (4.096 µs × 2^8 ≈ 1.05 ms), at least 1 ms. Using the same arithmetic keeps our
// retransmissions on the same schedule as Linux's (the captures show it).
constexpr uint64_t cm_timeout_ms(uint8_t iba_time) {
  return uint64_t{1} << std::max(int{iba_time} - 8, 0);
}
constexpr uint64_t cm_timeout_ns(uint8_t iba_time) {
  return cm_timeout_ms(iba_time) * 1'000'000;
}
static_assert(cm_timeout_ms(20) == 4096 && cm_timeout_ms(8) == 1 && cm_timeout_ms(0) == 1);

// Linux cma.c: CMA_CM_RESPONSE_TIMEOUT, CMA_MAX_CM_RETRIES, the MRA service timeout of
// CMA_CM_MRA_SETTING (sent "delayed": only when a duplicate shows the peer is waiting), and
// CMA_IBOE_PACKET_LIFETIME — 18 in Debian 12's kernel 6.1: its REQs carry local ACK timeout
// 19 = packet lifetime + 1 (cm.c cm_ack_timeout with rxe's ack delay 15), and its REQ
// retransmission comes 2 × 2^(18-8) + 2^(20-8) = 6144 ms after the first send
// (tests/data/rxe-guest-to-host.pcap: 6239 ms, the rest is its scheduler).
inline constexpr uint8_t kCmaCmResponseTimeout = 20;
inline constexpr uint8_t kCmaMaxCmRetries = 15;
inline constexpr uint8_t kCmaMraServiceTimeout = 24;
inline constexpr uint8_t kCmaIboePacketLifetime = 18;

// The largest value the 5-bit timeout fields hold.
inline constexpr uint8_t kCmMaxTimeoutValue = 31;

// The smallest timeout value whose wait covers `ms` as Linux reckons it (cm_timeout_ms), for an
// MRA's Service Timeout; at most kCmMaxTimeoutValue.
constexpr uint8_t cm_timeout_covering_ms(uint64_t ms) {
  uint8_t t = 8;
  while (t < kCmMaxTimeoutValue && cm_timeout_ms(t) < ms) ++t;
  return t;
}
static_assert(cm_timeout_covering_ms(1000) == 18 && cm_timeout_covering_ms(1024) == 18 &&
              cm_timeout_covering_ms(1025) == 19 && cm_timeout_covering_ms(0) == 8);

// Linux cm.c cm_ack_timeout: the QP's local ACK timeout from the CA's ACK delay and the path's
// packet lifetime (IBA 12.7.34: 2 × packet lifetime + target ACK delay, in 2^t terms).
constexpr uint8_t cm_ack_timeout(uint8_t ca_ack_delay, uint8_t packet_life_time) {
  int ack_timeout = packet_life_time + 1;
  if (ack_timeout >= ca_ack_delay)
    ack_timeout += (ca_ack_delay >= ack_timeout - 1) ? 1 : 0;
  else
    ack_timeout = ca_ack_delay + ((ack_timeout >= ca_ack_delay - 1) ? 1 : 0);
  return static_cast<uint8_t>(std::min(int{kCmMaxTimeoutValue}, ack_timeout));
}
static_assert(cm_ack_timeout(15, kCmaIboePacketLifetime) == 19);  // the captures' REQs

// How long a request for a service ID that is bound but not listened on yet waits for the
// listen (Manager::claim). A server's scheduler delay under load is tens of milliseconds; the
// requester's own response timeout is seconds (rdma_cm: 2^(20-8) ms).
inline constexpr uint64_t kListenWaitMs = 1000;

}  // namespace urdma::cm
