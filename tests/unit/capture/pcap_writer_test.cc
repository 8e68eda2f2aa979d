// The pcap writer, read back through the capture reader (libpcap both ways): every datagram
// comes back with its addresses, ports, IP fields and payload, and valid IP and UDP checksums
// (checked by the one's-complement property: a header with its checksum sums to all ones).
#include "capture/pcap_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "capture/capture.h"

namespace urdma::capture {
namespace {

uint32_t ones_sum(const std::vector<uint8_t>& b, size_t from, size_t to, uint32_t sum = 0) {
  for (size_t i = from; i < to; i += 2) sum += uint32_t{b[i]} << 8 | (i + 1 < to ? b[i + 1] : 0);
  return sum;
}
uint16_t folded(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

struct Read {
  int ip_version;
  std::vector<uint8_t> ip, payload;
  uint16_t src_port, dst_port, udp_checksum;
  uint64_t timestamp_ns;
};

TEST(PcapWriterTest, WritesIpv4AndIpv6DatagramsThatReadBackWithValidChecksums) {
  const std::string path = ::testing::TempDir() + "pcap_writer_test.pcap";
  std::vector<uint8_t> small(61), big(4124);
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<uint8_t>(i * 3 + 1);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 5 + 2);
  IpUdpDatagram v4;
  v4.timestamp_ns = 1'700'000'000'123'456'000ull;
  v4.ip_version = 4;
  v4.src_address = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 1};
  v4.dst_address = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 2};
  v4.src_port = 0xC123;
  v4.dst_port = 4791;
  v4.traffic_class = 0x28;
  v4.hop_limit = 9;
  v4.ipv4_id = 0x1234;
  v4.payload = small;
  IpUdpDatagram v6 = v4;
  v6.ip_version = 6;
  v6.src_address = {0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  v6.dst_address = {0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
  v6.payload = big;
  {
    PcapWriter w;
    ASSERT_EQ(w.open(path), "");
    ASSERT_TRUE(w.write(v4));
    ASSERT_TRUE(w.write(v6));
    std::vector<uint8_t> too_big(70'000);
    IpUdpDatagram huge = v6;
    huge.payload = too_big;
    EXPECT_FALSE(w.write(huge));
    ASSERT_EQ(w.flush(), "");
  }
  std::vector<Read> got;
  ASSERT_EQ(for_each_udp(path,
                         [&](const UdpDatagram& d) {
                           got.push_back({d.ip_version,
                                          {d.ip_header.begin(), d.ip_header.end()},
                                          {d.payload.begin(), d.payload.end()},
                                          d.src_port,
                                          d.dst_port,
                                          d.udp_checksum,
                                          d.timestamp_ns});
                         }),
            "");
  unlink(path.c_str());
  ASSERT_EQ(got.size(), 2u);

  const Read& a = got[0];
  EXPECT_EQ(a.ip_version, 4);
  EXPECT_EQ(a.payload, small);
  EXPECT_EQ(a.src_port, 0xC123);
  EXPECT_EQ(a.dst_port, 4791);
  EXPECT_EQ(a.timestamp_ns, 1'700'000'000'123'456'000ull);
  ASSERT_EQ(a.ip.size(), 20u);
  EXPECT_EQ(a.ip[1], 0x28);                               // TOS
  EXPECT_EQ((a.ip[4] << 8 | a.ip[5]), 0x1234);            // ID
  EXPECT_EQ((a.ip[6] << 8 | a.ip[7]), 0x4000);            // DF, offset 0
  EXPECT_EQ(a.ip[8], 9);                                  // TTL
  EXPECT_EQ(a.ip[9], 17);                                 // UDP
  EXPECT_EQ(std::vector<uint8_t>(a.ip.begin() + 12, a.ip.end()),
            (std::vector<uint8_t>{10, 0, 0, 1, 10, 0, 0, 2}));
  EXPECT_EQ(folded(ones_sum(a.ip, 0, 20)), 0xFFFF) << "IPv4 header checksum";

  const Read& b = got[1];
  EXPECT_EQ(b.ip_version, 6);
  EXPECT_EQ(b.payload, big);
  ASSERT_EQ(b.ip.size(), 40u);
  EXPECT_EQ(b.ip[0] >> 4, 6);
  EXPECT_EQ(((b.ip[0] & 0xF) << 4 | b.ip[1] >> 4), 0x28);  // traffic class
  EXPECT_EQ(b.ip[6], 17);
  EXPECT_EQ(b.ip[7], 9);

  // UDP checksums: pseudo-header + UDP header (with the checksum) + payload sums to all ones.
  for (const Read* r : {&a, &b}) {
    const bool is4 = r->ip_version == 4;
    const size_t udp_len = 8 + r->payload.size();
    std::vector<uint8_t> udp = {static_cast<uint8_t>(r->src_port >> 8),
                                static_cast<uint8_t>(r->src_port),
                                static_cast<uint8_t>(r->dst_port >> 8),
                                static_cast<uint8_t>(r->dst_port),
                                static_cast<uint8_t>(udp_len >> 8),
                                static_cast<uint8_t>(udp_len),
                                static_cast<uint8_t>(r->udp_checksum >> 8),
                                static_cast<uint8_t>(r->udp_checksum)};
    udp.insert(udp.end(), r->payload.begin(), r->payload.end());
    uint32_t sum = is4 ? ones_sum(r->ip, 12, 20) : ones_sum(r->ip, 8, 40);
    sum += 17 + static_cast<uint32_t>(udp_len);
    EXPECT_NE(r->udp_checksum, 0);
    EXPECT_EQ(folded(ones_sum(udp, 0, udp.size(), sum)), 0xFFFF) << "IPv" << r->ip_version;
  }
}

TEST(PcapWriterTest, AFileThatCannotBeCreatedSaysWhy) {
  PcapWriter w;
  EXPECT_NE(w.open("/nonexistent-dir/x.pcap"), "");
  IpUdpDatagram d;
  EXPECT_FALSE(w.write(d));
}

}  // namespace
}  // namespace urdma::capture
