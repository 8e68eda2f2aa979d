// pcap/pcapng → UDP datagrams. libpcap reads both file formats (pcap_open_offline).
#include "capture/capture.h"

#include <pcap/pcap.h>

#include <memory>

namespace urdma::capture {
namespace {

constexpr uint16_t kEtherTypeIpv4 = 0x0800;
constexpr uint16_t kEtherTypeIpv6 = 0x86DD;
constexpr uint16_t kEtherTypeVlan = 0x8100;  // IEEE 802.1Q
constexpr uint16_t kEtherTypeQinQ = 0x88A8;  // IEEE 802.1ad
constexpr uint8_t kIpProtoUdp = 17;
constexpr size_t kEthernetHeaderBytes = 14;
constexpr size_t kVlanTagBytes = 4;
constexpr size_t kSllHeaderBytes = 16;   // Linux cooked capture v1
constexpr size_t kSll2HeaderBytes = 20;  // Linux cooked capture v2
constexpr size_t kNullHeaderBytes = 4;   // BSD loopback: address family word
constexpr size_t kIpv4MinHeaderBytes = 20;
constexpr size_t kIpv6HeaderBytes = 40;
constexpr size_t kUdpHeaderBytes = 8;

uint16_t be16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] << 8 | p[1]);
}

// The network-layer bytes of one frame, or an empty span when the frame carries no IP.
std::span<const uint8_t> strip_link_layer(int dlt, std::span<const uint8_t> frame) {
  size_t off = 0;
  uint16_t ethertype = 0;
  switch (dlt) {
    case DLT_EN10MB:
      if (frame.size() < kEthernetHeaderBytes) return {};
      ethertype = be16(&frame[12]);
      off = kEthernetHeaderBytes;
      while ((ethertype == kEtherTypeVlan || ethertype == kEtherTypeQinQ) &&
             frame.size() >= off + kVlanTagBytes) {
        ethertype = be16(&frame[off + 2]);
        off += kVlanTagBytes;
      }
      break;
    case DLT_LINUX_SLL:
      if (frame.size() < kSllHeaderBytes) return {};
      ethertype = be16(&frame[14]);
      off = kSllHeaderBytes;
      break;
    case DLT_LINUX_SLL2:
      if (frame.size() < kSll2HeaderBytes) return {};
      ethertype = be16(&frame[0]);
      off = kSll2HeaderBytes;
      break;
    case DLT_NULL:
    case DLT_LOOP:
      if (frame.size() < kNullHeaderBytes) return {};
      off = kNullHeaderBytes;
      break;
    case DLT_RAW:
    case DLT_IPV4:
    case DLT_IPV6:
      break;
    default:
      return {};
  }
  if (ethertype != 0 && ethertype != kEtherTypeIpv4 && ethertype != kEtherTypeIpv6) return {};
  return frame.subspan(off);
}

// Fills `d` from an IP packet; false when it is not the first fragment of a UDP datagram.
bool parse_ip_udp(std::span<const uint8_t> ip, UdpDatagram& d) {
  if (ip.empty()) return false;
  d.ip_version = ip[0] >> 4;
  size_t ip_header_bytes = 0;
  size_t ip_total_bytes = 0;  // as the header claims
  if (d.ip_version == 4) {
    if (ip.size() < kIpv4MinHeaderBytes) return false;
    ip_header_bytes = size_t{ip[0] & 0x0Fu} * 4;
    if (ip_header_bytes < kIpv4MinHeaderBytes || ip.size() < ip_header_bytes) return false;
    if (ip[9] != kIpProtoUdp) return false;
    const uint16_t frag = be16(&ip[6]);
    if ((frag & 0x1FFF) != 0) return false;  // not the first fragment
    ip_total_bytes = be16(&ip[2]);
  } else if (d.ip_version == 6) {
    // Extension headers are not followed: RoCEv2 puts UDP right after the fixed header.
    if (ip.size() < kIpv6HeaderBytes || ip[6] != kIpProtoUdp) return false;
    ip_header_bytes = kIpv6HeaderBytes;
    ip_total_bytes = kIpv6HeaderBytes + be16(&ip[4]);
  } else {
    return false;
  }
  d.ip_header = ip.first(ip_header_bytes);
  std::span<const uint8_t> rest = ip.subspan(ip_header_bytes);
  if (rest.size() < kUdpHeaderBytes) return false;
  d.src_port = be16(&rest[0]);
  d.dst_port = be16(&rest[2]);
  const size_t udp_len = be16(&rest[4]);
  d.udp_checksum = be16(&rest[6]);
  // The datagram is what the UDP length says, but no more than what the IP header carries
  // and what was captured (frames may carry Ethernet padding after the IP packet).
  size_t want = udp_len >= kUdpHeaderBytes ? udp_len - kUdpHeaderBytes : 0;
  if (ip_total_bytes >= ip_header_bytes + kUdpHeaderBytes) {
    want = std::min(want, ip_total_bytes - ip_header_bytes - kUdpHeaderBytes);
  }
  const size_t have = rest.size() - kUdpHeaderBytes;
  d.truncated = have < want;
  d.payload = rest.subspan(kUdpHeaderBytes, std::min(want, have));
  return true;
}

struct PcapCloser {
  void operator()(pcap_t* p) const { pcap_close(p); }
};

}  // namespace

std::string for_each_udp(const std::string& path,
                         const std::function<void(const UdpDatagram&)>& fn) {
  char err[PCAP_ERRBUF_SIZE] = {};
  std::unique_ptr<pcap_t, PcapCloser> pcap(
      pcap_open_offline_with_tstamp_precision(path.c_str(), PCAP_TSTAMP_PRECISION_NANO, err));
  if (!pcap) return err;
  const int dlt = pcap_datalink(pcap.get());
  pcap_pkthdr* hdr = nullptr;
  const u_char* data = nullptr;
  uint64_t index = 0;
  for (;;) {
    const int rc = pcap_next_ex(pcap.get(), &hdr, &data);
    if (rc == PCAP_ERROR_BREAK) break;  // end of file
    if (rc != 1) return pcap_geterr(pcap.get());
    ++index;
    UdpDatagram d;
    d.index = index;
    d.timestamp_ns = uint64_t(hdr->ts.tv_sec) * 1'000'000'000 + uint64_t(hdr->ts.tv_usec);
    const std::span<const uint8_t> frame(data, hdr->caplen);
    if (parse_ip_udp(strip_link_layer(dlt, frame), d)) fn(d);
  }
  return {};
}

}  // namespace urdma::capture
