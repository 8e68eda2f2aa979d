// The rdma_cm IP addressing that rides inside IB CM messages (IBA Vol. 1 Annex A11 "RDMA IP CM
// Service", as Linux drivers/infiniband/core/cma.c implements it).
//
// 1. Service ID. An rdma_cm listener on IP port P in port space PS is reached by the service ID
//    (PS << 16) | P (cma.c cma_get_service_id); rdma_cma.h names the prefixes
//    RDMA_IB_IP_PS_TCP 0x0000000001060000, RDMA_IB_IP_PS_UDP 0x0000000001110000 and
//    RDMA_IB_PS_IB 0x00000000013F0000 under RDMA_IB_IP_PS_MASK 0xFFFFFFFFFFFF0000.
// 2. The 36-byte cma_hdr at the start of the REQ and SIDR_REQ private data (cma.c struct
//    cma_hdr; Annex A11 "IP addressing CM REQ message private data format"):
//      byte 0      cma_version (MajV 7:4, MinV 3:0) = 0x00
//      byte 1      IPV (7:4) = 4 or 6, reserved (3:0)
//      bytes 2-3   source port (the active side's IP port)
//      bytes 4-19  source IP address, bytes 20-35 destination IP address; an IPv4 address
//                  sits in the last 4 bytes of its 16 (the first 12 are zero)
//    The destination port is not in it: it is the low 16 bits of the service ID.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "wire/byte_order.h"
#include "wire/mad.h"

namespace urdma::wire {

// rdma_cma.h enum rdma_port_space.
enum class RdmaPortSpace : uint16_t {
  kIpoib = 0x0002,
  kTcp = 0x0106,
  kUdp = 0x0111,
  kIb = 0x013F,
};

// rdma_cma.h RDMA_IB_IP_* service ID layout.
inline constexpr uint64_t kRdmaIbIpPsMask = 0xFFFFFFFFFFFF0000ULL;
inline constexpr uint64_t kRdmaIbIpPortMask = 0x000000000000FFFFULL;
inline constexpr uint64_t kRdmaIbIpPsTcp = 0x0000000001060000ULL;
inline constexpr uint64_t kRdmaIbIpPsUdp = 0x0000000001110000ULL;
inline constexpr uint64_t kRdmaIbPsIb = 0x00000000013F0000ULL;

// cma.c cma_get_service_id: (port space << 16) + port.
constexpr uint64_t rdma_service_id(RdmaPortSpace ps, uint16_t port) {
  return (uint64_t{static_cast<uint16_t>(ps)} << 16) | port;
}
static_assert(rdma_service_id(RdmaPortSpace::kTcp, 0) == kRdmaIbIpPsTcp);
static_assert(rdma_service_id(RdmaPortSpace::kUdp, 0) == kRdmaIbIpPsUdp);
static_assert(rdma_service_id(RdmaPortSpace::kIb, 0) == kRdmaIbPsIb);

struct RdmaServiceId {
  RdmaPortSpace port_space;
  uint16_t port;
  friend bool operator==(const RdmaServiceId&, const RdmaServiceId&) = default;
};
// The port space and port of an rdma_cm service ID; nullopt when the high 48 bits are not one
// of the four port-space prefixes (a native IB service ID).
std::optional<RdmaServiceId> decode_rdma_service_id(uint64_t service_id);

// cma.c CMA_VERSION and the IPV values of the cma_hdr.
inline constexpr uint8_t kCmaVersion = 0x00;
inline constexpr uint8_t kCmaIpVersion4 = 4;
inline constexpr uint8_t kCmaIpVersion6 = 6;

template <WireByte Byte>
class BasicCmaHdr {
  URDMA_WIRE_VIEW(BasicCmaHdr, 36)
  URDMA_WIRE_FIELD(cma_version, 0, 1, 0, 8)
  URDMA_WIRE_FIELD(ip_version, 1, 1, 4, 4)
  URDMA_WIRE_FIELD(port, 2, 2, 0, 16)
  URDMA_WIRE_BYTES(src_addr, 4, 16)
  URDMA_WIRE_BYTES(dst_addr, 20, 16)
};
using CmaHdr = BasicCmaHdr<uint8_t>;
using CmaHdrView = BasicCmaHdr<const uint8_t>;
inline constexpr size_t kCmaHdrSize = CmaHdr::kSize;
static_assert(kCmaHdrSize == 36);
static_assert(CmaHdr::dst_addr_offset + CmaHdr::dst_addr_size == kCmaHdrSize);

enum class CmaHdrError : uint8_t {
  kOk = 0,
  kTooShort,      // private data shorter than the 36-byte header
  kBadVersion,    // cma_version != 0 (cma.c cma_save_ip_info: -EINVAL)
  kBadIpVersion,  // IPV neither 4 nor 6 (cma.c: -EAFNOSUPPORT)
};
std::string_view cma_hdr_error_name(CmaHdrError e);

// The addressing the cma_hdr carries, in a form independent of the wire: addresses are 16 bytes,
// IPv4 ones as ::ffff:a.b.c.d (the IPv4-mapped form RoCE GIDs use too).
struct CmaAddress {
  uint8_t ip_version = kCmaIpVersion4;  // 4 or 6
  uint16_t src_port = 0;                // the active side's port (the passive side's is in the SID)
  std::array<uint8_t, 16> src_addr{};
  std::array<uint8_t, 16> dst_addr{};
  friend bool operator==(const CmaAddress&, const CmaAddress&) = default;
};

// The 16-byte IPv4-mapped form of an IPv4 address given as 4 network-order bytes.
std::array<uint8_t, 16> ipv4_mapped(std::span<const uint8_t, 4> ipv4);

struct CmaHdrParse {
  CmaHdrError error = CmaHdrError::kOk;
  CmaAddress address;
  constexpr bool ok() const { return error == CmaHdrError::kOk; }
};
// Reads the cma_hdr at the start of REQ / SIDR_REQ private data.
CmaHdrParse parse_cma_hdr(std::span<const uint8_t> private_data);

// Writes the cma_hdr for `address` into the first 36 bytes of `private_data` (Linux's layout:
// an IPv4 address in the last 4 bytes of its slot, the 12 before it zero). `address` must have
// IP version 4 (with IPv4-mapped addresses) or 6, and `private_data` room for the header.
void write_cma_hdr(std::span<uint8_t> private_data, const CmaAddress& address);

}  // namespace urdma::wire
