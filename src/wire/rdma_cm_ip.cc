#include "wire/rdma_cm_ip.h"

#include <algorithm>
#include <cassert>
#include <iterator>

namespace urdma::wire {
namespace {

constexpr RdmaPortSpace kPortSpaces[] = {RdmaPortSpace::kIpoib, RdmaPortSpace::kTcp,
                                         RdmaPortSpace::kUdp, RdmaPortSpace::kIb};

constexpr std::string_view kCmaHdrErrorNames[] = {"ok", "too short", "bad cma_version",
                                                  "bad IP version"};
static_assert(std::size(kCmaHdrErrorNames) == static_cast<size_t>(CmaHdrError::kBadIpVersion) + 1);

// cma.c union cma_ip_addr: an IPv4 address is the last 4 bytes of the 16.
constexpr size_t kIpv4Offset = 12;

}  // namespace

std::optional<RdmaServiceId> decode_rdma_service_id(uint64_t service_id) {
  const uint64_t prefix = service_id & kRdmaIbIpPsMask;
  for (RdmaPortSpace ps : kPortSpaces) {
    if (prefix == rdma_service_id(ps, 0)) {
      return RdmaServiceId{ps, static_cast<uint16_t>(service_id & kRdmaIbIpPortMask)};
    }
  }
  return std::nullopt;
}

std::string_view cma_hdr_error_name(CmaHdrError e) {
  const auto i = static_cast<size_t>(e);
  assert(i < std::size(kCmaHdrErrorNames));
  return kCmaHdrErrorNames[i];
}

std::array<uint8_t, 16> ipv4_mapped(std::span<const uint8_t, 4> ipv4) {
  std::array<uint8_t, 16> a{};
  a[10] = 0xFF;
  a[11] = 0xFF;
  std::copy(ipv4.begin(), ipv4.end(), a.begin() + kIpv4Offset);
  return a;
}

CmaHdrParse parse_cma_hdr(std::span<const uint8_t> private_data) {
  if (private_data.size() < kCmaHdrSize) return {CmaHdrError::kTooShort, {}};
  const CmaHdrView h(private_data.first<kCmaHdrSize>());
  // cma.c cma_save_ip_info: a listener refuses any other header version.
  if (h.cma_version() != kCmaVersion) return {CmaHdrError::kBadVersion, {}};
  CmaAddress a;
  a.ip_version = h.ip_version();
  a.src_port = h.port();
  if (a.ip_version == kCmaIpVersion4) {
    // Linux reads only the last 4 bytes of each slot (ip4.addr) and ignores the pad.
    a.src_addr = ipv4_mapped(h.src_addr().template subspan<kIpv4Offset, 4>());
    a.dst_addr = ipv4_mapped(h.dst_addr().template subspan<kIpv4Offset, 4>());
  } else if (a.ip_version == kCmaIpVersion6) {
    std::copy(h.src_addr().begin(), h.src_addr().end(), a.src_addr.begin());
    std::copy(h.dst_addr().begin(), h.dst_addr().end(), a.dst_addr.begin());
  } else {
    return {CmaHdrError::kBadIpVersion, {}};
  }
  return {CmaHdrError::kOk, a};
}

void write_cma_hdr(std::span<uint8_t> private_data, const CmaAddress& address) {
  assert(private_data.size() >= kCmaHdrSize);
  assert(address.ip_version == kCmaIpVersion4 || address.ip_version == kCmaIpVersion6);
  const CmaHdr h(private_data.first<kCmaHdrSize>());
  std::fill(h.bytes().begin(), h.bytes().end(), uint8_t{0});
  h.set_cma_version(kCmaVersion);
  h.set_ip_version(address.ip_version);
  h.set_port(address.src_port);
  if (address.ip_version == kCmaIpVersion4) {
    std::copy_n(address.src_addr.begin() + kIpv4Offset, 4, h.src_addr().begin() + kIpv4Offset);
    std::copy_n(address.dst_addr.begin() + kIpv4Offset, 4, h.dst_addr().begin() + kIpv4Offset);
  } else {
    h.set_src_addr(address.src_addr);
    h.set_dst_addr(address.dst_addr);
  }
}

}  // namespace urdma::wire
