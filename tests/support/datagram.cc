// ICRC by flow; see datagram.h.
#include "support/datagram.h"

#include <algorithm>

#include "wire/icrc.h"

namespace urdma::test {
namespace {

bool sizable(size_t n) {
  return n >= wire::kIcrcMinUdpPayloadBytes && n <= wire::kIcrcMaxUdpPayloadBytes;
}

wire::IcrcIpv4 ipv4_headers(const net::Endpoint& src, const net::Endpoint& dst) {
  wire::IcrcIpv4 h;  // ID 0, DF set
  h.flow.src_addr = v4_of(src.address);
  h.flow.dst_addr = v4_of(dst.address);
  h.flow.udp_src_port = src.port;
  h.flow.udp_dst_port = dst.port;
  return h;
}

wire::IcrcIpv6 ipv6_headers(const net::Endpoint& src, const net::Endpoint& dst) {
  wire::IcrcIpv6 h;
  h.src_addr = src.address.bytes();
  h.dst_addr = dst.address.bytes();
  h.udp_src_port = src.port;
  h.udp_dst_port = dst.port;
  return h;
}

}  // namespace

std::array<uint8_t, 4> v4_of(const net::Address& a) {
  std::array<uint8_t, 4> out{};
  const auto b = a.v4_bytes();
  std::copy(b.begin(), b.end(), out.begin());
  return out;
}

void seal_icrc(std::span<uint8_t> udp_payload, const net::Endpoint& src, const net::Endpoint& dst) {
  if (!sizable(udp_payload.size())) return;
  if (src.address.is_v4() && dst.address.is_v4())
    wire::seal_icrc(ipv4_headers(src, dst), udp_payload);
  else if (!src.address.is_v4() && !dst.address.is_v4())
    wire::seal_icrc(ipv6_headers(src, dst), udp_payload);
}

bool icrc_ok(std::span<const uint8_t> udp_payload, const net::Endpoint& src,
             const net::Endpoint& dst) {
  if (!sizable(udp_payload.size())) return false;
  if (src.address.is_v4() && dst.address.is_v4())
    return wire::compute_icrc(ipv4_headers(src, dst), udp_payload) == wire::icrc_of(udp_payload);
  if (!src.address.is_v4() && !dst.address.is_v4())
    return wire::verify_icrc_ipv6(ipv6_headers(src, dst), udp_payload);
  return false;
}

}  // namespace urdma::test
