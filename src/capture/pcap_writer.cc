#include "capture/pcap_writer.h"

#include <cstring>
#include <vector>

namespace urdma::capture {
namespace {

constexpr size_t kIpv4HeaderBytes = 20;
constexpr size_t kIpv6HeaderBytes = 40;
constexpr size_t kUdpHeaderBytes = 8;
constexpr uint8_t kProtocolUdp = 17;

void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}

// The Internet checksum's running sum (RFC 1071) over bytes taken as big-endian 16-bit words.
uint32_t sum16(std::span<const uint8_t> bytes, uint32_t sum = 0) {
  size_t i = 0;
  for (; i + 1 < bytes.size(); i += 2) sum += uint32_t{bytes[i]} << 8 | bytes[i + 1];
  if (i < bytes.size()) sum += uint32_t{bytes[i]} << 8;
  return sum;
}

uint16_t fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

}  // namespace

PcapWriter::~PcapWriter() {
  close();
}

std::string PcapWriter::open(const std::string& path) {
  close();
  dead_ = pcap_open_dead(DLT_RAW, 65535);
  if (dead_ == nullptr) return "pcap_open_dead failed";
  dumper_ = pcap_dump_open(dead_, path.c_str());
  if (dumper_ == nullptr) {
    std::string why = pcap_geterr(dead_);
    close();
    return why;
  }
  return {};
}

bool PcapWriter::write(const IpUdpDatagram& d) {
  if (dumper_ == nullptr) return false;
  const bool v4 = d.ip_version == 4;
  const size_t ip_bytes = v4 ? kIpv4HeaderBytes : kIpv6HeaderBytes;
  const size_t udp_length = kUdpHeaderBytes + d.payload.size();
  if (udp_length > 0xFFFF || (v4 && ip_bytes + udp_length > 0xFFFF)) return false;
  std::vector<uint8_t> packet(ip_bytes + udp_length);
  uint8_t* ip = packet.data();
  uint8_t* udp = ip + ip_bytes;
  const std::span<const uint8_t> src =
      v4 ? std::span<const uint8_t>(d.src_address).last(4) : std::span<const uint8_t>(d.src_address);
  const std::span<const uint8_t> dst =
      v4 ? std::span<const uint8_t>(d.dst_address).last(4) : std::span<const uint8_t>(d.dst_address);
  uint32_t pseudo = sum16(src);
  pseudo = sum16(dst, pseudo);
  pseudo += kProtocolUdp + static_cast<uint32_t>(udp_length);
  if (v4) {
    ip[0] = 0x45;
    ip[1] = d.traffic_class;
    put16(ip + 2, static_cast<uint16_t>(packet.size()));
    put16(ip + 4, d.ipv4_id);
    put16(ip + 6, d.dont_fragment ? 0x4000 : 0);
    ip[8] = d.hop_limit;
    ip[9] = kProtocolUdp;
    std::memcpy(ip + 12, src.data(), 4);
    std::memcpy(ip + 16, dst.data(), 4);
    put16(ip + 10, fold(sum16({ip, kIpv4HeaderBytes})));
  } else {
    ip[0] = static_cast<uint8_t>(0x60 | d.traffic_class >> 4);
    ip[1] = static_cast<uint8_t>(d.traffic_class << 4);
    put16(ip + 4, static_cast<uint16_t>(udp_length));
    ip[6] = kProtocolUdp;
    ip[7] = d.hop_limit;
    std::memcpy(ip + 8, src.data(), 16);
    std::memcpy(ip + 24, dst.data(), 16);
  }
  put16(udp, d.src_port);
  put16(udp + 2, d.dst_port);
  put16(udp + 4, static_cast<uint16_t>(udp_length));
  if (!d.payload.empty()) std::memcpy(udp + kUdpHeaderBytes, d.payload.data(), d.payload.size());
  uint16_t check = fold(sum16({udp, udp_length}, pseudo));
  if (check == 0) check = 0xFFFF;  // RFC 768: a computed 0 is sent as all ones
  put16(udp + 6, check);

  pcap_pkthdr h{};
  h.ts.tv_sec = static_cast<time_t>(d.timestamp_ns / 1'000'000'000);
  h.ts.tv_usec = static_cast<suseconds_t>(d.timestamp_ns % 1'000'000'000 / 1000);
  h.caplen = h.len = static_cast<bpf_u_int32>(packet.size());
  pcap_dump(reinterpret_cast<u_char*>(dumper_), &h, packet.data());
  return true;
}

std::string PcapWriter::flush() {
  if (dumper_ == nullptr) return "not open";
  return pcap_dump_flush(dumper_) == 0 ? std::string() : "write failed";
}

void PcapWriter::close() {
  if (dumper_ != nullptr) pcap_dump_close(dumper_);
  if (dead_ != nullptr) pcap_close(dead_);
  dumper_ = nullptr;
  dead_ = nullptr;
}

}  // namespace urdma::capture
