// Writing UDP datagrams into a pcap file (libpcap), each under the IPv4 or IPv6 and UDP header
// it crossed the network with: what `urdma capture` records. The link type is raw IP
// (LINKTYPE_RAW), so one file holds both families and every reader — tshark, Wireshark,
// tcpdump, `urdma decode` (capture.h) — sees the IP header the ICRC covers.
#pragma once

#include <pcap/pcap.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>

namespace urdma::capture {

struct IpUdpDatagram {
  uint64_t timestamp_ns = 0;  // since the epoch
  int ip_version = 4;         // 4 or 6
  // IPv6 addresses, or IPv4 in the last 4 bytes (an IPv4-mapped address).
  std::array<uint8_t, 16> src_address{};
  std::array<uint8_t, 16> dst_address{};
  uint16_t src_port = 0;
  uint16_t dst_port = 0;
  uint8_t traffic_class = 0;  // IPv4 TOS / IPv6 traffic class
  uint8_t hop_limit = 64;     // IPv4 TTL / IPv6 hop limit
  uint16_t ipv4_id = 0;
  bool dont_fragment = true;  // IPv4
  std::span<const uint8_t> payload;  // the UDP payload
};

class PcapWriter {
 public:
  PcapWriter() = default;
  ~PcapWriter();
  PcapWriter(const PcapWriter&) = delete;
  PcapWriter& operator=(const PcapWriter&) = delete;

  // Creates (or truncates) `path`: an empty string, or why it could not.
  std::string open(const std::string& path);
  // Appends one datagram, its IP and UDP checksums computed. False when it cannot be one (a
  // payload longer than a UDP datagram holds).
  bool write(const IpUdpDatagram& d);
  // What was written reaches the file (a reader may look now). An empty string, or the error.
  std::string flush();
  void close();

 private:
  pcap_t* dead_ = nullptr;
  pcap_dumper_t* dumper_ = nullptr;
};

}  // namespace urdma::capture
