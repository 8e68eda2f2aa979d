// The 40-byte Global Route Header (IBA 8.3) as UD receive buffers carry it, its RoCEv2 IPv4
// form, and IPv4-mapped GIDs.
//
// On RoCEv2 the GRH is the IPv6 header (same layout: IPVer, TClass, FlowLabel, PayLen, NxtHdr,
// HopLmt, SGID, DGID). For an IPv4 RoCEv2 packet the verbs convention (Linux rxe's
// `union rdma_network_hdr`, rdma-core's `ibv_init_ah_from_wc`) places the 20-byte IPv4 header in
// the LAST 20 bytes of the 40-byte GRH area and zeroes the first 20. A reader tells the two
// forms apart the way rdma-core's get_grh_header_version does: IPVer nibble != 6 and byte 20
// holds IPv4 version 4 → IPv4; IPVer == 6 → IPv6 unless bytes 20..39 are an IHL-5 IPv4 header
// with a correct header checksum.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "wire/byte_order.h"
#include "wire/headers.h"

namespace urdma::wire {

// A 128-bit GID, network byte order (IBA 4.1.1): on RoCE an IPv6 address, or an IPv4 address
// in IPv4-mapped form ::ffff:a.b.c.d (RFC 4291 2.5.5.2).
using Gid = std::array<uint8_t, 16>;
inline constexpr size_t kGidSize = 16;

template <WireByte Byte>
class BasicGrh {
  URDMA_WIRE_VIEW(BasicGrh, 40)
  URDMA_WIRE_FIELD(ip_ver, 0, 4, 28, 4)
  URDMA_WIRE_FIELD(tclass, 0, 4, 20, 8)
  URDMA_WIRE_FIELD(flow_label, 0, 4, 0, 20)
  URDMA_WIRE_FIELD(paylen, 4, 2, 0, 16)
  URDMA_WIRE_FIELD(next_hdr, 6, 1, 0, 8)
  URDMA_WIRE_FIELD(hop_limit, 7, 1, 0, 8)
  static constexpr size_t kSgidOffset = 8;
  static constexpr size_t kDgidOffset = 24;
  static_assert(kDgidOffset + kGidSize == kSize);

  Gid sgid() const { return load_gid(kSgidOffset); }
  Gid dgid() const { return load_gid(kDgidOffset); }
  void set_sgid(const Gid& g) const requires(!std::is_const_v<Byte>) {
    std::copy(g.begin(), g.end(), p_ + kSgidOffset);
  }
  void set_dgid(const Gid& g) const requires(!std::is_const_v<Byte>) {
    std::copy(g.begin(), g.end(), p_ + kDgidOffset);
  }

 private:
  Gid load_gid(size_t offset) const {
    Gid g;
    std::copy(p_ + offset, p_ + offset + kGidSize, g.begin());
    return g;
  }
};
using Grh = BasicGrh<uint8_t>;
using GrhView = BasicGrh<const uint8_t>;
static_assert(Grh::kSize == 40);

// IBA 8.3.1: NxtHdr value announcing a BTH (IANA-assigned 0x1B).
inline constexpr uint8_t kGrhNextHdrBth = 0x1B;
// IPv4 protocol / IPv6 next header for UDP (RoCEv2 carries the BTH in UDP).
inline constexpr uint8_t kIpProtoUdp = 17;

// ---------------------------------------------------------------------------------------------
// The fixed 20-byte IPv4 header (RFC 791), as RoCEv2 sends it (IHL 5, no options).
template <WireByte Byte>
class BasicIpv4Header {
  URDMA_WIRE_VIEW(BasicIpv4Header, 20)
  URDMA_WIRE_FIELD(version, 0, 1, 4, 4)
  URDMA_WIRE_FIELD(ihl, 0, 1, 0, 4)
  URDMA_WIRE_FIELD(tos, 1, 1, 0, 8)  // DSCP(7:2) ECN(1:0)
  URDMA_WIRE_FIELD(total_length, 2, 2, 0, 16)
  URDMA_WIRE_FIELD(id, 4, 2, 0, 16)
  URDMA_WIRE_FIELD(flags, 6, 2, 13, 3)
  URDMA_WIRE_FIELD(frag_offset, 6, 2, 0, 13)
  URDMA_WIRE_FIELD(ttl, 8, 1, 0, 8)
  URDMA_WIRE_FIELD(protocol, 9, 1, 0, 8)
  URDMA_WIRE_FIELD(checksum, 10, 2, 0, 16)
  URDMA_WIRE_FIELD(saddr, 12, 4, 0, 32)  // host-order value of the address (a.b.c.d = 0xaabbccdd)
  URDMA_WIRE_FIELD(daddr, 16, 4, 0, 32)
  static_assert(daddr_field::kEnd == kSize);
};
using Ipv4Header = BasicIpv4Header<uint8_t>;
using Ipv4HeaderView = BasicIpv4Header<const uint8_t>;
static_assert(Ipv4Header::kSize == 20);

inline constexpr uint8_t kIpv4FlagDontFragment = 0x2;  // in the 3-bit flags field

// RFC 1071 Internet checksum of an IPv4 header (checksum field taken as stored: a header with
// a correct checksum sums to 0; pass a header whose checksum field is 0 to compute one).
inline constexpr uint16_t ipv4_header_checksum(std::span<const uint8_t, 20> hdr) {
  uint32_t sum = 0;
  for (size_t i = 0; i < hdr.size(); i += 2) sum += load_be16(hdr.data() + i);
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

// Offset of the IPv4 header inside the 40-byte GRH area (rdma_network_hdr.roce4grh).
inline constexpr size_t kGrhIpv4Offset = Grh::kSize - Ipv4Header::kSize;

// Which network header a 40-byte UD GRH area holds: 4, 6, or 0 when it is neither
// (rdma-core get_grh_header_version, which fails with EPROTONOSUPPORT there).
inline constexpr int grh_ip_version(std::span<const uint8_t, 40> area) {
  const uint8_t* ip4 = area.data() + kGrhIpv4Offset;
  const bool ip4_version = (ip4[0] >> 4) == 4;
  if ((area[0] >> 4) != 6) return ip4_version ? 4 : 0;
  if ((ip4[0] & 0x0F) != 5) return 6;  // RoCEv2 IPv4 headers have IHL 5
  return ip4_version && ipv4_header_checksum(std::span<const uint8_t, 20>(ip4, 20)) == 0 ? 4 : 6;
}

// Fills the GRH area of a UD receive buffer with the IPv4 form: 20 zero bytes, then `ip4`.
inline void write_ipv4_grh(std::span<uint8_t, 40> area, std::span<const uint8_t, 20> ip4) {
  std::fill(area.begin(), area.begin() + kGrhIpv4Offset, uint8_t{0});
  std::copy(ip4.begin(), ip4.end(), area.begin() + kGrhIpv4Offset);
}

// ---------------------------------------------------------------------------------------------
// IPv4-mapped GIDs. `addr` is the host-order value of a.b.c.d (0xaabbccdd).
inline constexpr Gid ipv4_mapped_gid(uint32_t addr) {
  Gid g{};
  g[10] = 0xFF;
  g[11] = 0xFF;
  store_be32(g.data() + 12, addr);
  return g;
}
inline constexpr bool is_ipv4_mapped(const Gid& g) {
  for (size_t i = 0; i < 10; ++i)
    if (g[i] != 0) return false;
  return g[10] == 0xFF && g[11] == 0xFF;
}
// The IPv4 address of an IPv4-mapped GID (meaningful only when is_ipv4_mapped).
inline constexpr uint32_t gid_ipv4(const Gid& g) {
  return load_be32(g.data() + 12);
}

}  // namespace urdma::wire
