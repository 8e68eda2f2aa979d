// Reading RoCEv2 datagrams out of pcap / pcapng capture files (libpcap).
//
// The capture layer strips the link layer (Ethernet with optional VLAN tags, Linux cooked
// SLL/SLL2, raw IP, loopback/null) and the IPv4/IPv6 and UDP headers, and hands each UDP
// datagram to the caller with the IP header it arrived under, so that the ICRC can be checked
// against the exact header the sender's kernel emitted. It knows nothing of RoCE beyond that.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

namespace urdma::capture {

struct UdpDatagram {
  uint64_t index = 0;                  // 1-based frame number in the file, as tshark numbers frames
  uint64_t timestamp_ns = 0;           // capture time since the epoch
  int ip_version = 0;                  // 4 or 6
  std::span<const uint8_t> ip_header;  // the whole IPv4 (with options) or IPv6 fixed header
  uint16_t src_port = 0;
  uint16_t dst_port = 0;
  uint16_t udp_checksum = 0;
  std::span<const uint8_t> payload;  // UDP payload, clipped to what was captured
  bool truncated = false;            // capture snap length cut the datagram short
};

// Calls `fn` for every UDP datagram in the file, in file order. The spans in the datagram are
// valid only during that call. IPv4 fragments other than the first, and frames that are not UDP
// over IP, are skipped silently. Returns an empty string on success, otherwise the reason the
// file could not be read.
std::string for_each_udp(const std::string& path,
                         const std::function<void(const UdpDatagram&)>& fn);

}  // namespace urdma::capture
