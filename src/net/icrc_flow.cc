#include "net/icrc_flow.h"

#include <algorithm>

namespace urdma::net {
namespace {

bool sizable(size_t n) {
  return n >= wire::kIcrcMinUdpPayloadBytes && n <= wire::kIcrcMaxUdpPayloadBytes;
}

wire::IcrcIpv4Flow ipv4_flow(const Endpoint& src, const Endpoint& dst) {
  wire::IcrcIpv4Flow f;
  const auto s = src.address.v4_bytes();
  const auto d = dst.address.v4_bytes();
  std::copy(s.begin(), s.end(), f.src_addr.begin());
  std::copy(d.begin(), d.end(), f.dst_addr.begin());
  f.udp_src_port = src.port;
  f.udp_dst_port = dst.port;
  return f;
}

wire::IcrcIpv6 ipv6_headers(const Endpoint& src, const Endpoint& dst) {
  wire::IcrcIpv6 h;
  h.src_addr = src.address.bytes();
  h.dst_addr = dst.address.bytes();
  h.udp_src_port = src.port;
  h.udp_dst_port = dst.port;
  return h;
}

}  // namespace

std::optional<uint32_t> icrc_for(const Endpoint& src, const Endpoint& dst,
                                 std::span<const std::span<const uint8_t>> pieces) {
  if (src.address.is_v4() && dst.address.is_v4())
    return wire::compute_icrc_gather(wire::IcrcIpv4{.flow = ipv4_flow(src, dst)}, pieces);
  if (!src.address.is_v4() && !dst.address.is_v4())
    return wire::compute_icrc_gather(ipv6_headers(src, dst), pieces);
  return std::nullopt;
}

bool seal_icrc(std::span<uint8_t> udp_payload, const Endpoint& src, const Endpoint& dst) {
  if (!sizable(udp_payload.size())) return false;
  const std::span<const uint8_t> covered = udp_payload.first(udp_payload.size() - wire::kIcrcBytes);
  const std::optional<uint32_t> icrc = icrc_for(src, dst, {&covered, 1});
  if (!icrc) return false;
  wire::store_icrc(udp_payload, *icrc);
  return true;
}

bool icrc_ok(std::span<const uint8_t> udp_payload, const Endpoint& src, const Endpoint& dst,
             wire::Ipv4DfSearch df_search) {
  if (!sizable(udp_payload.size())) return false;
  if (src.address.is_v4() && dst.address.is_v4())
    return wire::verify_icrc_ipv4(ipv4_flow(src, dst), udp_payload, df_search).ok;
  if (!src.address.is_v4() && !dst.address.is_v4())
    return wire::verify_icrc_ipv6(ipv6_headers(src, dst), udp_payload);
  return false;
}

wire::Ipv4IcrcMatch ipv4_icrc_match(std::span<const uint8_t> udp_payload, const Endpoint& src,
                                    const Endpoint& dst, wire::Ipv4DfSearch df_search) {
  if (!sizable(udp_payload.size()) || !src.address.is_v4() || !dst.address.is_v4()) return {};
  return wire::verify_icrc_ipv4(ipv4_flow(src, dst), udp_payload, df_search);
}

bool icrc_exact(std::span<const uint8_t> udp_payload, const Endpoint& src, const Endpoint& dst) {
  if (!sizable(udp_payload.size())) return false;
  if (src.address.is_v4() && dst.address.is_v4())
    return wire::compute_icrc(wire::IcrcIpv4{.flow = ipv4_flow(src, dst)}, udp_payload) ==
           wire::icrc_of(udp_payload);
  if (!src.address.is_v4() && !dst.address.is_v4())
    return wire::verify_icrc_ipv6(ipv6_headers(src, dst), udp_payload);
  return false;
}

}  // namespace urdma::net
