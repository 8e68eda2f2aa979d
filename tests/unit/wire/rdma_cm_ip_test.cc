// Tests for src/wire/rdma_cm_ip.*: rdma_cm service IDs and the cma_hdr in REQ private data.
#include "wire/rdma_cm_ip.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

#include "wire/cm.h"

namespace urdma::wire {
namespace {

TEST(RdmaServiceId, Prefixes) {
  // rdma_cma.h values.
  EXPECT_EQ(kRdmaIbIpPsTcp, 0x0000000001060000ULL);
  EXPECT_EQ(kRdmaIbIpPsUdp, 0x0000000001110000ULL);
  EXPECT_EQ(kRdmaIbPsIb, 0x00000000013F0000ULL);
  EXPECT_EQ(static_cast<uint16_t>(RdmaPortSpace::kIpoib), 0x0002);
  EXPECT_EQ(rdma_service_id(RdmaPortSpace::kTcp, 7174), 0x0000000001061c06ULL);
  EXPECT_EQ(rdma_service_id(RdmaPortSpace::kUdp, 0xFFFF), 0x000000000111FFFFULL);
  EXPECT_EQ(rdma_service_id(RdmaPortSpace::kIb, 0), 0x00000000013F0000ULL);
  EXPECT_EQ(rdma_service_id(RdmaPortSpace::kIpoib, 1), 0x0000000000020001ULL);
}

TEST(RdmaServiceId, RoundTripEveryPortSpaceAndBoundaryPorts) {
  for (RdmaPortSpace ps :
       {RdmaPortSpace::kIpoib, RdmaPortSpace::kTcp, RdmaPortSpace::kUdp, RdmaPortSpace::kIb}) {
    for (uint16_t port : {uint16_t{0}, uint16_t{1}, uint16_t{7174}, uint16_t{0xFFFF}}) {
      const auto d = decode_rdma_service_id(rdma_service_id(ps, port));
      ASSERT_TRUE(d.has_value());
      EXPECT_EQ(d->port_space, ps);
      EXPECT_EQ(d->port, port);
    }
  }
}

TEST(RdmaServiceId, RejectsNonRdmaCmIds) {
  EXPECT_FALSE(decode_rdma_service_id(0x0000000001070000ULL));  // unknown port space
  EXPECT_FALSE(decode_rdma_service_id(0x0000000101061c06ULL));  // high bits set
  EXPECT_FALSE(decode_rdma_service_id(0x0200000000000001ULL));  // IB_CM_ASSIGN_SERVICE_ID range
  EXPECT_FALSE(decode_rdma_service_id(0));
  EXPECT_FALSE(decode_rdma_service_id(~uint64_t{0}));
}

// The header from rxe-to-rxe.pcap frame 1 (rping 10.99.0.3:44135 → 10.99.0.2), written by hand.
constexpr std::array<uint8_t, 36> kLinuxIpv4Hdr = {
    0x00, 0x40, 0xac, 0x67,                                                  // ver, IPV 4, port
    0,    0,    0,    0,    0, 0, 0, 0, 0, 0, 0, 0, 0x0a, 0x63, 0x00, 0x03,  // src 10.99.0.3
    0,    0,    0,    0,    0, 0, 0, 0, 0, 0, 0, 0, 0x0a, 0x63, 0x00, 0x02,  // dst 10.99.0.2
};

std::array<uint8_t, 16> v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  const std::array<uint8_t, 4> ip = {a, b, c, d};
  return ipv4_mapped(ip);
}

TEST(CmaHdr, FieldPositions) {
  std::array<uint8_t, 36> buf{};
  CmaHdr h(buf);
  h.set_cma_version(0xAB);
  h.set_ip_version(0xF);
  h.set_port(0x1234);
  EXPECT_EQ(buf[0], 0xAB);
  EXPECT_EQ(buf[1], 0xF0);  // IPV in the high nibble, the low nibble reserved
  EXPECT_EQ(buf[2], 0x12);
  EXPECT_EQ(buf[3], 0x34);
  EXPECT_EQ(CmaHdr::src_addr_offset, 4u);
  EXPECT_EQ(CmaHdr::dst_addr_offset, 20u);
  EXPECT_EQ(kCmaHdrSize, 36u);
}

TEST(CmaHdr, ParsesLinuxIpv4) {
  const CmaHdrParse p = parse_cma_hdr(kLinuxIpv4Hdr);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p.address.ip_version, 4);
  EXPECT_EQ(p.address.src_port, 0xac67);
  EXPECT_EQ(p.address.src_addr, v4(10, 99, 0, 3));
  EXPECT_EQ(p.address.dst_addr, v4(10, 99, 0, 2));
}

TEST(CmaHdr, WritesLinuxIpv4Bytes) {
  CmaAddress a;
  a.ip_version = 4;
  a.src_port = 0xac67;
  a.src_addr = v4(10, 99, 0, 3);
  a.dst_addr = v4(10, 99, 0, 2);
  std::vector<uint8_t> pd(92, 0xEE);
  write_cma_hdr(pd, a);
  EXPECT_TRUE(std::equal(kLinuxIpv4Hdr.begin(), kLinuxIpv4Hdr.end(), pd.begin()));
  EXPECT_EQ(pd[36], 0xEE);  // consumer private data after the header is untouched
}

TEST(CmaHdr, Ipv4IgnoresPadLikeLinux) {
  auto bytes = kLinuxIpv4Hdr;
  bytes[4 + 10] = 0xFF;  // a ::ffff: pad in the source slot
  bytes[4 + 11] = 0xFF;
  bytes[20] = 0x99;  // junk in the destination pad
  const CmaHdrParse p = parse_cma_hdr(bytes);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p.address.src_addr, v4(10, 99, 0, 3));
  EXPECT_EQ(p.address.dst_addr, v4(10, 99, 0, 2));
}

TEST(CmaHdr, Ipv6RoundTripBoundaries) {
  for (uint8_t fill : {uint8_t{0x00}, uint8_t{0xFF}}) {
    CmaAddress a;
    a.ip_version = 6;
    a.src_port = fill ? 0xFFFF : 0;
    a.src_addr.fill(fill);
    a.dst_addr.fill(static_cast<uint8_t>(~fill));
    a.src_addr[0] = 0xfe;
    a.src_addr[1] = 0x80;
    std::array<uint8_t, 36> buf{};
    write_cma_hdr(buf, a);
    EXPECT_EQ(buf[0], 0x00);
    EXPECT_EQ(buf[1], 0x60);
    EXPECT_TRUE(std::equal(a.src_addr.begin(), a.src_addr.end(), buf.begin() + 4));
    EXPECT_TRUE(std::equal(a.dst_addr.begin(), a.dst_addr.end(), buf.begin() + 20));
    const CmaHdrParse p = parse_cma_hdr(buf);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p.address, a);
  }
}

TEST(CmaHdr, Errors) {
  EXPECT_EQ(parse_cma_hdr(std::span<const uint8_t>(kLinuxIpv4Hdr).first(35)).error,
            CmaHdrError::kTooShort);
  EXPECT_EQ(parse_cma_hdr({}).error, CmaHdrError::kTooShort);
  auto bad = kLinuxIpv4Hdr;
  bad[0] = 0x10;  // major version 1
  EXPECT_EQ(parse_cma_hdr(bad).error, CmaHdrError::kBadVersion);
  for (uint8_t ipv : {0x00, 0x50, 0x70, 0xF0}) {
    bad = kLinuxIpv4Hdr;
    bad[1] = ipv;
    EXPECT_EQ(parse_cma_hdr(bad).error, CmaHdrError::kBadIpVersion) << int{ipv};
  }
  bad = kLinuxIpv4Hdr;
  bad[1] = 0x4F;  // reserved low nibble is ignored
  EXPECT_TRUE(parse_cma_hdr(bad).ok());
  EXPECT_EQ(cma_hdr_error_name(CmaHdrError::kBadIpVersion), "bad IP version");
}

// End to end: a REQ whose private data begins with the header, as rdma_connect builds it.
TEST(CmaHdr, InsideReqPrivateData) {
  std::array<uint8_t, kMadSize> m;
  const CmReq req = init_cm_message<CmReq>(m, 7);
  req.set_service_id(rdma_service_id(RdmaPortSpace::kTcp, 20079));
  CmaAddress a;
  a.src_port = 40000;
  a.src_addr = v4(192, 0, 2, 1);
  a.dst_addr = v4(192, 0, 2, 2);
  std::array<uint8_t, 56> consumer{};
  consumer.fill(0xC5);
  std::array<uint8_t, CmReq::kPrivateDataSize> pd{};
  write_cma_hdr(pd, a);
  std::copy(consumer.begin(), consumer.end(), pd.begin() + kCmaHdrSize);
  ASSERT_EQ(req.set_private_data(pd), MadError::kOk);

  const CmParse p = parse_cm(m);
  ASSERT_TRUE(p.ok());
  const auto view = std::get<CmReqView>(p.message.view);
  const auto sid = decode_rdma_service_id(view.service_id());
  ASSERT_TRUE(sid);
  EXPECT_EQ(sid->port, 20079);
  const CmaHdrParse h = parse_cma_hdr(view.private_data());
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h.address, a);
  EXPECT_EQ(view.private_data()[kCmaHdrSize], 0xC5);
}

}  // namespace
}  // namespace urdma::wire
