// Address handles: GID → IPv4/IPv6, GRH fields, validation.
#include <gtest/gtest.h>

#include "provider/device.h"
#include "provider_test_util.h"

namespace urdma::provider::testing {
namespace {

class AhTest : public ProviderTest {};

TEST_F(AhTest, Ipv4MappedGidGivesAnIpv4Address) {
  const ibv_ah_attr attr = global_ah_attr(ipv4_gid(10, 1, 2, 3));
  Ah* ah = dev_.create_ah(pd(), attr).value();
  const AddressVector& av = ah->av();
  EXPECT_EQ(av.family, AddressVector::Family::kIpv4);
  EXPECT_EQ(av.dest_ip[0], 10);
  EXPECT_EQ(av.dest_ip[1], 1);
  EXPECT_EQ(av.dest_ip[2], 2);
  EXPECT_EQ(av.dest_ip[3], 3);
  EXPECT_EQ(av.flow_label, 0x12345u);
  EXPECT_EQ(av.hop_limit, 64);
  EXPECT_EQ(av.traffic_class, 0x28);
  EXPECT_EQ(av.sgid_index, 0);
  EXPECT_EQ(av.sl, 3);
  EXPECT_EQ(ah->pd(), pd());
}

TEST_F(AhTest, OtherGidsAreIpv6) {
  ibv_gid gid = {};
  const uint8_t kAddr[16] = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  std::memcpy(gid.raw, kAddr, 16);
  Ah* ah = dev_.create_ah(pd(), global_ah_attr(gid)).value();
  EXPECT_EQ(ah->av().family, AddressVector::Family::kIpv6);
  EXPECT_EQ(0, std::memcmp(ah->av().dest_ip.data(), kAddr, 16));
  // ::ffff:0:0/96 needs both 0xff bytes and the zero prefix.
  gid = ipv4_gid(1, 2, 3, 4);
  gid.raw[0] = 0xfe;
  EXPECT_FALSE(gid_is_ipv4_mapped(gid));
  gid = ipv4_gid(1, 2, 3, 4);
  gid.raw[10] = 0;
  EXPECT_FALSE(gid_is_ipv4_mapped(gid));
  EXPECT_TRUE(gid_is_ipv4_mapped(ipv4_gid(1, 2, 3, 4)));
}

TEST_F(AhTest, Validation) {
  ibv_ah_attr attr = global_ah_attr(ipv4_gid(10, 1, 2, 3));
  attr.is_global = 0;
  EXPECT_EQ(dev_.create_ah(pd(), attr).error(), EINVAL) << "RoCE needs a GRH";
  attr = global_ah_attr(ipv4_gid(10, 1, 2, 3));
  attr.port_num = 2;
  EXPECT_EQ(dev_.create_ah(pd(), attr).error(), EINVAL);
  attr = global_ah_attr(ipv4_gid(10, 1, 2, 3));
  attr.grh.sgid_index = 1;  // empty entry
  EXPECT_EQ(dev_.create_ah(pd(), attr).error(), EINVAL);
  attr.grh.sgid_index = 255;  // the highest index an AH can name: inside the table, empty
  static_assert(kLimits.gid_table_len > 255);
  EXPECT_EQ(dev_.create_ah(pd(), attr).error(), EINVAL);
  EXPECT_EQ(dev_.create_ah(nullptr, global_ah_attr(ipv4_gid(10, 1, 2, 3))).error(), EINVAL);
  // A GID added later makes its index usable.
  ASSERT_EQ(dev_.set_gid(1, ipv4_gid(192, 0, 2, 5)), kOk);
  attr = global_ah_attr(ipv4_gid(10, 1, 2, 3));
  attr.grh.sgid_index = 1;
  EXPECT_TRUE(dev_.create_ah(pd(), attr).ok());
}

// rxe and uverbs take any 32-bit flow label; only its 20 bits reach the wire (UCX passes ~0).
TEST_F(AhTest, FlowLabelBitsAbove20AreIgnored) {
  ibv_ah_attr attr = global_ah_attr(ipv4_gid(10, 1, 2, 3));
  attr.grh.flow_label = 0xffffffffu;
  Result<Ah*> ah = dev_.create_ah(pd(), attr);
  ASSERT_TRUE(ah.ok());
  EXPECT_EQ(ah.value()->av().flow_label, 0xfffffu);
  ASSERT_EQ(dev_.destroy_ah(ah.value()), kOk);
}

TEST_F(AhTest, PdWithAhCannotBeDeallocated) {
  Ah* ah = dev_.create_ah(pd(), global_ah_attr(ipv4_gid(10, 1, 2, 3))).value();
  EXPECT_EQ(dev_.dealloc_pd(pd()).error(), EBUSY);
  ASSERT_EQ(dev_.destroy_ah(ah), kOk);
  EXPECT_EQ(dev_.dealloc_pd(pd()), kOk);
  pd_ = nullptr;
}

TEST_F(AhTest, DeviceAndPortAttributes) {
  const ibv_device_attr& a = dev_.attr();
  EXPECT_EQ(a.atomic_cap, IBV_ATOMIC_GLOB);
  EXPECT_EQ(a.max_qp_wr, static_cast<int>(kLimits.max_qp_wr));
  EXPECT_EQ(a.phys_port_cnt, 1);
  EXPECT_TRUE(a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
  ibv_port_attr port = {};
  ASSERT_EQ(dev_.query_port(1, &port), kOk);
  EXPECT_EQ(port.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_EQ(port.active_mtu, IBV_MTU_4096);
  EXPECT_EQ(dev_.query_port(2, &port).error(), EINVAL);
  ibv_gid gid = {};
  ASSERT_EQ(dev_.query_gid(1, 0, &gid), kOk);
  EXPECT_EQ(gid.raw[15], 1);
  uint16_t pkey = 0;
  ASSERT_EQ(dev_.query_pkey(1, 0, &pkey), kOk);
  EXPECT_EQ(pkey, 0xffff);
  EXPECT_EQ(dev_.query_pkey(1, 1, &pkey).error(), EINVAL);
}

}  // namespace
}  // namespace urdma::provider::testing
