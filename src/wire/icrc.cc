#include "wire/icrc.h"

#include <algorithm>
#include <cassert>

#include "wire/byte_order.h"
#include "wire/crc32.h"
#include "wire/grh.h"

namespace urdma::wire {
namespace {

// IBA Annex A17 (RoCEv2): the LRH is absent on RoCEv2; 8 bytes of ones stand in for it
// (Linux rxe folds them into its seed 0xdebb20e3 = the CRC register after those 8 bytes).
constexpr size_t kMaskedLrhBytes = 8;
constexpr size_t kIpv4MaxHeaderBytes = 60;  // IHL is 4 bits, in 4-byte words
constexpr size_t kIpv4MinIhl = 5;
constexpr size_t kIpv6HeaderBytes = GrhView::kSize;  // the GRH is the IPv6 header on RoCEv2
constexpr uint8_t kIpv4Version = 4;
constexpr uint8_t kIpv6Version = 6;

// The UDP header (RFC 768), 8 bytes. (Kept private here until a UDP view lives in headers.h.)
template <WireByte Byte>
class BasicUdpHeader {
  URDMA_WIRE_VIEW(BasicUdpHeader, 8)
  URDMA_WIRE_FIELD(src_port, 0, 2, 0, 16)
  URDMA_WIRE_FIELD(dst_port, 2, 2, 0, 16)
  URDMA_WIRE_FIELD(length, 4, 2, 0, 16)
  URDMA_WIRE_FIELD(checksum, 6, 2, 0, 16)
  static_assert(checksum_field::kEnd == kSize);
};
using UdpHeader = BasicUdpHeader<uint8_t>;
static_assert(UdpHeader::kSize == 8);

// The masked headers the CRC starts with: LRH ones, IP, UDP, BTH.
constexpr size_t kMaxPseudoHeaderBytes =
    kMaskedLrhBytes + kIpv4MaxHeaderBytes + UdpHeader::kSize + BthView::kSize;
static_assert(kIpv6HeaderBytes <= kIpv4MaxHeaderBytes);

class PseudoHeader {
 public:
  PseudoHeader() { std::fill_n(bytes_.begin(), kMaskedLrhBytes, uint8_t{0xFF}); }

  // Appends `n` bytes (copied from `src` when given) and returns where they start.
  uint8_t* append(size_t n, const uint8_t* src = nullptr) {
    assert(size_ + n <= bytes_.size());
    uint8_t* p = bytes_.data() + size_;
    if (src != nullptr) std::copy_n(src, n, p);
    size_ += n;
    return p;
  }

  // Appends the UDP header with its checksum masked, then the masked BTH, and runs the CRC over
  // the whole packet: the UDP payload of `udp_payload_bytes` (ICRC slot included) is `first`
  // followed by `rest`, without the ICRC slot. `first` holds at least the BTH.
  uint32_t finish(uint16_t src_port, uint16_t dst_port, size_t udp_payload_bytes,
                  std::span<const uint8_t> first,
                  std::span<const std::span<const uint8_t>> rest = {}) {
    assert(first.size() >= BthView::kSize);
    UdpHeader udp(append(UdpHeader::kSize));
    udp.set_src_port(src_port);
    udp.set_dst_port(dst_port);
    udp.set_length(static_cast<uint16_t>(UdpHeader::kSize + udp_payload_bytes));
    udp.set_checksum(0xFFFF);  // masked

    Bth bth(append(BthView::kSize, first.data()));
    bth.set_fecn(true);  // byte 4 masked: FECN, BECN, resv6 (IB Resv8a; IBA 7.8.1)
    bth.set_becn(true);
    bth.set_resv6(0x3F);

    uint32_t crc = wire::crc32(0, {bytes_.data(), size_});
    crc = wire::crc32(crc, first.subspan(BthView::kSize));
    for (const std::span<const uint8_t> piece : rest) crc = wire::crc32(crc, piece);
    return crc;
  }

  // The contiguous case: `udp_payload` ends with the ICRC slot.
  uint32_t finish(uint16_t src_port, uint16_t dst_port, std::span<const uint8_t> udp_payload) {
    return finish(src_port, dst_port, udp_payload.size(),
                  udp_payload.first(udp_payload.size() - kIcrcBytes));
  }

 private:
  std::array<uint8_t, kMaxPseudoHeaderBytes> bytes_{};
  size_t size_ = kMaskedLrhBytes;
};

bool payload_size_ok(size_t n) {
  return n >= kIcrcMinUdpPayloadBytes && n <= kIcrcMaxUdpPayloadBytes;
}

void mask_ipv4(Ipv4Header ip) {
  ip.set_tos(0xFF);  // DSCP + ECN
  ip.set_ttl(0xFF);
  ip.set_checksum(0xFFFF);
}

void mask_ipv6(Grh ip) {
  ip.set_tclass(0xFF);
  ip.set_flow_label(0xFFFFF);
  ip.set_hop_limit(0xFF);
}

// Where the unknown IPv4 bytes sit in the CRC'd message: identification (2 bytes) and the byte
// holding the flags and the top of the fragment offset.
constexpr size_t kIpv4IdOffset = kMaskedLrhBytes + Ipv4HeaderView::id_field::kOffset;
constexpr size_t kUnknownBytes = 3;
static_assert(Ipv4HeaderView::id_field::kEnd == Ipv4HeaderView::flags_field::kOffset);
// The flags byte's DF bit (the 3-bit flags field sits at the top of a 16-bit word).
constexpr uint8_t kDfBitInFlagsByte = kIpv4FlagDontFragment << 5;
static_assert(kDfBitInFlagsByte == 0x40);

}  // namespace

namespace {

void append_ipv4(PseudoHeader& ph, const IcrcIpv4& headers, size_t udp_payload_bytes) {
  Ipv4Header ip(ph.append(Ipv4Header::kSize));
  ip.set_version(kIpv4Version);
  ip.set_ihl(kIpv4MinIhl);
  ip.set_total_length(
      static_cast<uint16_t>(Ipv4Header::kSize + UdpHeader::kSize + udp_payload_bytes));
  ip.set_id(headers.ip_id);
  ip.set_flags(headers.dont_fragment ? kIpv4FlagDontFragment : 0);
  ip.set_frag_offset(0);
  ip.set_protocol(kIpProtoUdp);
  ip.set_saddr(load_be32(headers.flow.src_addr.data()));
  ip.set_daddr(load_be32(headers.flow.dst_addr.data()));
  mask_ipv4(ip);
}

void append_ipv6(PseudoHeader& ph, const IcrcIpv6& headers, size_t udp_payload_bytes) {
  Grh ip(ph.append(Grh::kSize));
  ip.set_ip_ver(kIpv6Version);
  ip.set_paylen(static_cast<uint16_t>(UdpHeader::kSize + udp_payload_bytes));
  ip.set_next_hdr(kIpProtoUdp);
  ip.set_sgid(headers.src_addr);
  ip.set_dgid(headers.dst_addr);
  mask_ipv6(ip);
}

// UDP payload size (ICRC slot included) of a gather list that excludes the slot.
size_t gathered_udp_payload_bytes(std::span<const std::span<const uint8_t>> pieces) {
  size_t n = kIcrcBytes;
  for (const std::span<const uint8_t> piece : pieces) n += piece.size();
  return n;
}

}  // namespace

uint32_t compute_icrc(const IcrcIpv4& headers, std::span<const uint8_t> udp_payload) {
  assert(payload_size_ok(udp_payload.size()));
  PseudoHeader ph;
  append_ipv4(ph, headers, udp_payload.size());
  return ph.finish(headers.flow.udp_src_port, headers.flow.udp_dst_port, udp_payload);
}

uint32_t compute_icrc(const IcrcIpv6& headers, std::span<const uint8_t> udp_payload) {
  assert(payload_size_ok(udp_payload.size()));
  PseudoHeader ph;
  append_ipv6(ph, headers, udp_payload.size());
  return ph.finish(headers.udp_src_port, headers.udp_dst_port, udp_payload);
}

uint32_t compute_icrc_gather(const IcrcIpv4& headers,
                             std::span<const std::span<const uint8_t>> pieces) {
  const size_t udp_payload_bytes = gathered_udp_payload_bytes(pieces);
  assert(payload_size_ok(udp_payload_bytes) && !pieces.empty());
  PseudoHeader ph;
  append_ipv4(ph, headers, udp_payload_bytes);
  return ph.finish(headers.flow.udp_src_port, headers.flow.udp_dst_port, udp_payload_bytes,
                   pieces.front(), pieces.subspan(1));
}

uint32_t compute_icrc_gather(const IcrcIpv6& headers,
                             std::span<const std::span<const uint8_t>> pieces) {
  const size_t udp_payload_bytes = gathered_udp_payload_bytes(pieces);
  assert(payload_size_ok(udp_payload_bytes) && !pieces.empty());
  PseudoHeader ph;
  append_ipv6(ph, headers, udp_payload_bytes);
  return ph.finish(headers.udp_src_port, headers.udp_dst_port, udp_payload_bytes, pieces.front(),
                   pieces.subspan(1));
}

std::optional<uint32_t> compute_icrc(const IcrcRawHeaders& headers,
                                     std::span<const uint8_t> udp_payload) {
  const std::span<const uint8_t> hdr = headers.ip_header;
  if (!payload_size_ok(udp_payload.size()) || hdr.empty()) return std::nullopt;
  PseudoHeader ph;
  const uint8_t version = hdr[0] >> 4;
  if (version == kIpv4Version) {
    const size_t ihl_bytes = size_t{4} * (hdr[0] & 0x0F);
    if (ihl_bytes < Ipv4Header::kSize || hdr.size() != ihl_bytes) return std::nullopt;
    mask_ipv4(Ipv4Header(ph.append(hdr.size(), hdr.data())));  // options included, unmasked
  } else if (version == kIpv6Version) {
    if (hdr.size() != kIpv6HeaderBytes) return std::nullopt;
    mask_ipv6(Grh(ph.append(hdr.size(), hdr.data())));
  } else {
    return std::nullopt;
  }
  return ph.finish(headers.udp_src_port, headers.udp_dst_port, udp_payload);
}

// The ICRC goes on the wire least significant byte first (see icrc.h): the byte-swapped
// big-endian word.
uint32_t icrc_of(std::span<const uint8_t> udp_payload) {
  assert(udp_payload.size() >= kIcrcBytes);
  return __builtin_bswap32(load_be32(udp_payload.data() + udp_payload.size() - kIcrcBytes));
}

void store_icrc(std::span<uint8_t> udp_payload, uint32_t icrc) {
  assert(udp_payload.size() >= kIcrcBytes);
  store_be32(udp_payload.data() + udp_payload.size() - kIcrcBytes, __builtin_bswap32(icrc));
}

bool verify_icrc_ipv6(const IcrcIpv6& headers, std::span<const uint8_t> udp_payload) {
  return payload_size_ok(udp_payload.size()) &&
         compute_icrc(headers, udp_payload) == icrc_of(udp_payload);
}

bool verify_icrc_raw(const IcrcRawHeaders& headers, std::span<const uint8_t> udp_payload) {
  const std::optional<uint32_t> icrc = compute_icrc(headers, udp_payload);
  return icrc.has_value() && *icrc == icrc_of(udp_payload);
}

Ipv4IcrcMatch verify_icrc_ipv4(const IcrcIpv4Flow& flow, std::span<const uint8_t> udp_payload,
                               Ipv4DfSearch df_search) {
  if (!payload_size_ok(udp_payload.size())) return {};
  const uint32_t expected = compute_icrc(IcrcIpv4{.flow = flow}, udp_payload);
  const uint32_t received = icrc_of(udp_payload);
  if (received == expected) return {.ok = true, .ip_id = 0, .dont_fragment = true};
  return solve_ipv4_id(received, expected, udp_payload.size(), df_search);
}

namespace {

// x^(±(8 * bytes_after + 32)) mod P depends only on the packet length. Computing it costs
// O(log n) carry-less multiplications;
// packet lengths repeat (MTU-sized data, ACKs), so each thread keeps the last few in a small
// direct-mapped cache (one per direction), which makes the solve, and the ID change, one lookup
// and one multiplication.
template <uint32_t (*kPower)(uint64_t)>
uint32_t shift_by_length(size_t udp_payload_bytes, uint64_t bytes_after) {
  struct Entry {
    size_t udp_payload_bytes = 0;  // 0: empty (below kIcrcMinUdpPayloadBytes)
    uint32_t shift = 0;
  };
  constexpr size_t kEntries = 16;  // a power of two
  thread_local std::array<Entry, kEntries> cache{};
  Entry& e = cache[(udp_payload_bytes ^ (udp_payload_bytes >> 4)) & (kEntries - 1)];
  if (e.udp_payload_bytes != udp_payload_bytes) {
    e = {udp_payload_bytes, kPower(8 * bytes_after + 32)};
  }
  return e.shift;
}

// Bytes of the ICRC message after the 3 bytes (ID, flags) that solve_ipv4_id solves for.
uint64_t bytes_after_id(size_t udp_payload_bytes) {
  const uint64_t message_bytes =
      kMaskedLrhBytes + Ipv4Header::kSize + UdpHeader::kSize + udp_payload_bytes - kIcrcBytes;
  return message_bytes - (kIpv4IdOffset + kUnknownBytes);
}

}  // namespace

// The forward direction of solve_ipv4_id below: U holds the ID's two bytes (flags unchanged), and
// the ICRC changes by U(x) * x^(8m + 32) mod P.
uint32_t ipv4_id_icrc_delta(uint16_t ip_id, size_t udp_payload_bytes) {
  if (ip_id == 0 || !payload_size_ok(udp_payload_bytes)) return 0;
  const uint32_t u = uint32_t{static_cast<uint8_t>(ip_id >> 8)} << 8 |
                     uint32_t{static_cast<uint8_t>(ip_id)} << 16;
  return gf2_mul_mod_p_fast(
      u, shift_by_length<gf2_x_pow_mod_p>(udp_payload_bytes, bytes_after_id(udp_payload_bytes)));
}

// The ICRC message is M = [LRH ones | IPv4 | UDP | BTH | rest], n = udp_payload_bytes + 32 bytes.
// Let U be the 3 bytes (ID high, ID low, flags byte) XOR their value in the {ID 0, DF} message,
// followed by m = n - (kIpv4IdOffset + 3) bytes. CRC-32 is affine, so (crc32.h)
//   received ^ icrc_id0_df = U(x) * x^(8m + 32) mod P,
// hence U(x) = (received ^ icrc_id0_df) * x^-(8m + 32) mod P: one multiplication by a power of
// x^-1, computed in O(log n) from a table of x^-(2^i) and cached per length. This is the Gaussian
// elimination of the 17 unknown bits done in closed form: the map U -> U * x^k is invertible, so
// the solution is unique, and it is acceptable iff U fits in 3 bytes (degree < 24) and its flags
// byte differs from DF-set at most in the DF bit, and only when `df_search` allows DF clear (MF,
// the reserved bit and the fragment offset stay 0). In zlib's reflected representation (bit 31 =
// x^0) the 3 bytes u0 u1 u2 of U are bits 8..31 of the word, u0 lowest: byte j's bit b has degree 8
// * (2 - j) + 7 - b.
Ipv4IcrcMatch solve_ipv4_id(uint32_t received_icrc, uint32_t icrc_id0_df, size_t udp_payload_bytes,
                            Ipv4DfSearch df_search) {
  if (!payload_size_ok(udp_payload_bytes)) return {};
  const uint64_t bytes_after = bytes_after_id(udp_payload_bytes);
  const uint32_t u =
      gf2_mul_mod_p_fast(received_icrc ^ icrc_id0_df,
                         shift_by_length<gf2_x_inv_pow_mod_p>(udp_payload_bytes, bytes_after));
  if ((u & 0xFF) != 0) return {};  // degree >= 24: no 3-byte change explains it
  const uint8_t id_high = static_cast<uint8_t>(u >> 8);
  const uint8_t id_low = static_cast<uint8_t>(u >> 16);
  const uint8_t flags_change = static_cast<uint8_t>(u >> 24);
  const bool df_clear_allowed = df_search == Ipv4DfSearch::kSetOrClear;
  if (flags_change != 0 && !(df_clear_allowed && flags_change == kDfBitInFlagsByte)) return {};
  return {.ok = true,
          .ip_id = static_cast<uint16_t>(id_high << 8 | id_low),
          .dont_fragment = flags_change == 0};
}

}  // namespace urdma::wire
