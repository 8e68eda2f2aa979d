#include "capture/capture.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace urdma::capture {
namespace {

const std::string kRxeToRxe = std::string(URDMA_REFERENCE_DIR) + "/rxe-to-rxe.pcap";
const std::string kGuestToHost = std::string(URDMA_REFERENCE_DIR) + "/rxe-guest-to-host.pcap";

// A datagram with its bytes copied out (the spans of UdpDatagram live only during the callback).
struct Owned : UdpDatagram {
  std::vector<uint8_t> ip, data;
};

std::vector<Owned> read_all(const std::string& path) {
  std::vector<Owned> out;
  const std::string err = for_each_udp(path, [&](const UdpDatagram& d) {
    Owned o;
    static_cast<UdpDatagram&>(o) = d;
    o.ip.assign(d.ip_header.begin(), d.ip_header.end());
    o.data.assign(d.payload.begin(), d.payload.end());
    o.ip_header = o.ip;
    o.payload = o.data;
    out.push_back(std::move(o));
  });
  EXPECT_EQ(err, "");
  return out;
}

// Frame numbers, sizes and ports as `tshark -r rxe-to-rxe.pcap` prints them.
TEST(CaptureTest, ReadsEveryRoceDatagramOfTheReference) {
  const auto all = read_all(kRxeToRxe);
  ASSERT_EQ(all.size(), 71u);
  for (const auto& d : all) {
    EXPECT_EQ(d.dst_port, 4791);
    EXPECT_EQ(d.ip_version, 4);
    EXPECT_EQ(d.ip_header.size(), 20u);
    EXPECT_EQ(d.udp_checksum, 0);  // Linux sends no UDP checksum
    EXPECT_FALSE(d.truncated);
  }
  // Frame 1 is a 322-byte CM REQ: 14 Ethernet + 20 IP + 8 UDP + 280 (BTH 12, DETH 8, MAD 256, ICRC
  // 4).
  EXPECT_EQ(all[0].index, 1u);
  EXPECT_EQ(all[0].data.size(), 280u);
  // Frame 5 is a 62-byte ACK: BTH 12 + AETH 4 + ICRC 4.
  EXPECT_EQ(all[4].data.size(), 20u);
  EXPECT_EQ(all[4].data[0], 0x11);  // RC Acknowledge
  // 10.99.0.3 → 10.99.0.2 for the REQ.
  EXPECT_EQ(all[0].ip[12], 10);
  EXPECT_EQ(all[0].ip[15], 3);
  EXPECT_EQ(all[0].ip[19], 2);
  EXPECT_LT(all[0].timestamp_ns, all[70].timestamp_ns);
}

TEST(CaptureTest, SecondReference) {
  EXPECT_EQ(read_all(kGuestToHost).size(), 29u);
}

TEST(CaptureTest, MissingFileIsAnError) {
  const std::string err = for_each_udp("/nonexistent/x.pcap", [](const UdpDatagram&) {});
  EXPECT_NE(err, "");
}

TEST(CaptureTest, GarbageFileIsAnError) {
  const std::string path = ::testing::TempDir() + "/garbage.pcap";
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  fputs("this is not a capture file at all", f);
  fclose(f);
  EXPECT_NE(for_each_udp(path, [](const UdpDatagram&) {}), "");
}

}  // namespace
}  // namespace urdma::capture
