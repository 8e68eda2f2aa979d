// The slots' multicast bookkeeping (daemon/mcast_members.h) and its records (protocol.h): what
// a process may ask (its own QPNs, multicast addresses, bounded), when urdmad joins and leaves.
#include "daemon/mcast_members.h"

#include <gtest/gtest.h>

#include "daemon/protocol.h"

namespace urdma::daemon {
namespace {

const net::Address kGroup = net::Address::from_v4(230, 1, 2, 3);
constexpr uint32_t kBase = 0x5000, kCount = 0x1000;

TEST(McastMembers, FirstAttachJoinsAndLastDetachLeaves) {
  McastMembers m;
  auto c = m.attach(5, kBase, kCount, kBase + 1, kGroup);
  EXPECT_EQ(c.err, 0);
  EXPECT_TRUE(c.first);
  m.set_interfaces(5, kGroup, {3, 4});
  c = m.attach(5, kBase, kCount, kBase + 2, kGroup);
  EXPECT_EQ(c.err, 0);
  EXPECT_FALSE(c.first);
  c = m.attach(5, kBase, kCount, kBase + 2, kGroup);  // again: nothing changes
  EXPECT_EQ(c.err, 0);
  EXPECT_FALSE(c.first);
  EXPECT_EQ(m.attachments(5), 2u);
  EXPECT_EQ(m.interfaces(5, kGroup), (std::vector<uint32_t>{3, 4}));
  c = m.detach(5, kBase + 1, kGroup);
  EXPECT_EQ(c.err, 0);
  EXPECT_FALSE(c.last);
  c = m.detach(5, kBase + 2, kGroup);
  EXPECT_EQ(c.err, 0);
  EXPECT_TRUE(c.last);
  EXPECT_EQ(m.groups(5), 0u);
  EXPECT_EQ(m.detach(5, kBase + 2, kGroup).err, ENOENT);
}

TEST(McastMembers, OnlyTheSlotsQpnsAndMulticastAddresses) {
  McastMembers m;
  EXPECT_EQ(m.attach(5, kBase, kCount, kBase - 1, kGroup).err, EINVAL);
  EXPECT_EQ(m.attach(5, kBase, kCount, kBase + kCount, kGroup).err, EINVAL);
  EXPECT_EQ(m.attach(5, kBase, kCount, kBase, net::Address::from_v4(10, 0, 0, 1)).err, EINVAL);
  EXPECT_EQ(m.attach(5, kBase, kCount, kBase, net::Address::from_v4(239, 255, 255, 255)).err, 0);
  net::Address::Bytes v6{};
  v6[0] = 0xff;
  v6[1] = 0x02;
  v6[15] = 7;
  EXPECT_EQ(m.attach(5, kBase, kCount, kBase, net::Address(v6)).err, 0);
  v6[0] = 0xfe;  // fe02::7: not multicast
  EXPECT_EQ(m.attach(5, kBase, kCount, kBase, net::Address(v6)).err, EINVAL);
  // Another slot's groups are its own.
  EXPECT_EQ(m.detach(6, kBase, net::Address::from_v4(239, 255, 255, 255)).err, ENOENT);
}

TEST(McastMembers, GroupsAndAttachmentsPerSlotAreBounded) {
  McastMembers m;
  for (size_t i = 0; i < kMaxMcastGroupsPerSlot; ++i) {
    const net::Address g =
        net::Address::from_v4(230, 0, static_cast<uint8_t>(i >> 8), static_cast<uint8_t>(i));
    ASSERT_EQ(m.attach(1, kBase, kCount, kBase, g).err, 0);
  }
  EXPECT_EQ(m.attach(1, kBase, kCount, kBase, net::Address::from_v4(231, 0, 0, 1)).err, ENOSPC);
  // More QPs in the groups it has, up to the attachment bound.
  size_t n = m.attachments(1);
  for (uint32_t q = kBase + 1; n < kMaxMcastAttachPerSlot; ++q)
    for (size_t i = 0; i < kMaxMcastGroupsPerSlot && n < kMaxMcastAttachPerSlot; ++i, ++n)
      ASSERT_EQ(m.attach(1, kBase, kCount, q,
                         net::Address::from_v4(230, 0, static_cast<uint8_t>(i >> 8),
                                               static_cast<uint8_t>(i)))
                    .err,
                0);
  EXPECT_EQ(m.attach(1, kBase, kCount, kBase + kCount - 1, net::Address::from_v4(230, 0, 0, 0)).err,
            ENOSPC);
  // Another slot is not affected.
  EXPECT_EQ(m.attach(2, kBase, kCount, kBase, kGroup).err, 0);
}

TEST(McastMembers, ReclaimReturnsEveryGroupWithItsInterfaces) {
  McastMembers m;
  ASSERT_EQ(m.attach(3, kBase, kCount, kBase, kGroup).err, 0);
  m.set_interfaces(3, kGroup, {7});
  const net::Address other = net::Address::from_v4(230, 9, 9, 9);
  ASSERT_EQ(m.attach(3, kBase, kCount, kBase + 1, other).err, 0);
  m.set_interfaces(3, other, {7, 8});
  auto left = m.reclaim(3);
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(m.groups(3), 0u);
  EXPECT_EQ(m.attachments(3), 0u);
  EXPECT_TRUE(m.reclaim(3).empty());
  // The next holder of the slot starts with nothing: its first attach joins again.
  EXPECT_TRUE(m.attach(3, kBase, kCount, kBase, kGroup).first);
}

TEST(Protocol, McastRecordsRoundTripAndRefuseWrongSizes) {
  const auto rec = encode_mcast(MsgType::kMcastAttach, 0x5001, kGroup);
  MsgHeader h;
  ASSERT_EQ(decode_header(rec, &h), 0);
  EXPECT_EQ(h.type, static_cast<uint16_t>(MsgType::kMcastAttach));
  McastBody body;
  ASSERT_EQ(decode_request_body(rec, &body), 0);
  EXPECT_EQ(body.qpn, 0x5001u);
  EXPECT_EQ(net::Address(std::to_array(body.group)), kGroup);
  auto shorter = rec;
  shorter.pop_back();
  const uint32_t size = static_cast<uint32_t>(shorter.size());
  std::memcpy(shorter.data() + 8, &size, sizeof size);
  EXPECT_EQ(decode_request_body(shorter, &body), EPROTO);
  EXPECT_EQ(decode_request_body(encode_request(MsgType::kMcastDetach), &body), EPROTO);
}

}  // namespace
}  // namespace urdma::daemon
