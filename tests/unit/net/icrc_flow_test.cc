// net/icrc_flow.h against the wire layer's ICRC with the pseudo-header written out by hand.
#include "net/icrc_flow.h"

#include <gtest/gtest.h>

#include <vector>

#include "wire/icrc.h"

namespace urdma::net {
namespace {

// A 64-byte UDP payload: a BTH-sized start, some payload, the ICRC slot.
std::vector<uint8_t> payload() {
  std::vector<uint8_t> p(64);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(i * 7 + 1);
  return p;
}

TEST(IcrcFlow, Ipv4SealsWhatTheWireLayerComputesForThatPseudoHeader) {
  const Endpoint src{Address::from_v4(10, 1, 2, 3), 49152};
  const Endpoint dst{Address::from_v4(10, 1, 2, 4), 4791};
  auto p = payload();
  ASSERT_TRUE(seal_icrc(p, src, dst));
  const wire::IcrcIpv4 h{.flow = {.src_addr = {10, 1, 2, 3}, .dst_addr = {10, 1, 2, 4},
                                  .udp_src_port = 49152, .udp_dst_port = 4791}};
  EXPECT_EQ(wire::icrc_of(p), wire::compute_icrc(h, p));
  EXPECT_TRUE(icrc_exact(p, src, dst));
  EXPECT_TRUE(icrc_ok(p, src, dst, wire::Ipv4DfSearch::kSetOnly));
  EXPECT_FALSE(icrc_exact(p, dst, src)) << "the reverse flow";
  EXPECT_FALSE(icrc_exact(p, {src.address, 49153}, dst)) << "another source port";
  p[20] ^= 1;
  EXPECT_FALSE(icrc_exact(p, src, dst));
  EXPECT_FALSE(icrc_ok(p, src, dst, wire::Ipv4DfSearch::kSetOnly));
}

TEST(IcrcFlow, Ipv6SealsWhatTheWireLayerComputesForThatPseudoHeader) {
  const auto a = Endpoint::parse("[fd00::1]:50000");
  const auto b = Endpoint::parse("[fd00::2]:4791");
  ASSERT_TRUE(a && b);
  auto p = payload();
  ASSERT_TRUE(seal_icrc(p, *a, *b));
  wire::IcrcIpv6 h;
  h.src_addr = a->address.bytes();
  h.dst_addr = b->address.bytes();
  h.udp_src_port = 50000;
  h.udp_dst_port = 4791;
  EXPECT_EQ(wire::icrc_of(p), wire::compute_icrc(h, p));
  EXPECT_TRUE(icrc_ok(p, *a, *b, wire::Ipv4DfSearch::kSetOnly));
  EXPECT_FALSE(icrc_ok(p, *b, *a, wire::Ipv4DfSearch::kSetOnly));
}

TEST(IcrcFlow, GatheredPiecesGiveTheSameIcrcAsTheWholePayload) {
  const Endpoint src{Address::from_v4(127, 0, 0, 1), 1234};
  const Endpoint dst{Address::from_v4(127, 0, 0, 1), 4791};
  auto p = payload();
  ASSERT_TRUE(seal_icrc(p, src, dst));
  const std::span<const uint8_t> all(p);
  const std::span<const uint8_t> pieces[] = {all.first(20), all.subspan(20, 40 - wire::kIcrcBytes),
                                             all.subspan(60 - wire::kIcrcBytes, wire::kIcrcBytes)};
  EXPECT_EQ(icrc_for(src, dst, pieces), wire::icrc_of(p));
}

TEST(IcrcFlow, MixedFamiliesAndBadSizesHaveNoIcrc) {
  const Endpoint v4{Address::from_v4(10, 0, 0, 1), 4791};
  const auto v6 = Endpoint::parse("[fd00::1]:4791");
  ASSERT_TRUE(v6);
  auto p = payload();
  const auto before = p;
  EXPECT_FALSE(seal_icrc(p, v4, *v6));
  EXPECT_EQ(p, before) << "nothing stored";
  EXPECT_FALSE(icrc_ok(p, v4, *v6, wire::Ipv4DfSearch::kSetOrClear));
  EXPECT_FALSE(icrc_exact(p, *v6, v4));
  std::vector<uint8_t> tiny(wire::kIcrcMinUdpPayloadBytes - 1);
  EXPECT_FALSE(seal_icrc(tiny, v4, v4));
  EXPECT_FALSE(icrc_exact(tiny, v4, v4));
}

}  // namespace
}  // namespace urdma::net
