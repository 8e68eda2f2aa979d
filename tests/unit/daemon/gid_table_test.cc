#include "daemon/gid_table.h"

#include <gtest/gtest.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>

#include <cstring>

namespace urdma::daemon {
namespace {

GidEntry entry(uint32_t ifindex, const char* addr) {
  const auto a = net::Address::parse(addr);
  EXPECT_TRUE(a) << addr;
  return GidEntry{.gid = *a,
                  .ifindex = ifindex,
                  .family = static_cast<uint8_t>(a->is_v4() ? AF_INET : AF_INET6)};
}

TEST(GidTable, IndicesAreStableAndHolesAreReused) {
  GidTable t;
  EXPECT_TRUE(t.add(entry(1, "127.0.0.1")));
  EXPECT_TRUE(t.add(entry(1, "::1")));
  EXPECT_TRUE(t.add(entry(2, "10.0.0.1")));
  EXPECT_FALSE(t.add(entry(2, "10.0.0.1"))) << "unchanged";
  EXPECT_TRUE(t.remove(1, *net::Address::parse("::1")));
  EXPECT_FALSE(t.remove(1, *net::Address::parse("::1")));
  auto e = t.entries();
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].index, 0u);
  EXPECT_EQ(e[1].index, 2u) << "10.0.0.1 keeps its index";
  EXPECT_TRUE(t.add(entry(3, "fd00::5")));
  e = t.entries();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[1].index, 1u) << "a new address takes the lowest free index";
  EXPECT_EQ(e[1].gid, *net::Address::parse("fd00::5"));
}

TEST(GidTable, IsBounded) {
  GidTable t;
  for (unsigned i = 0; i < kMaxGids; ++i)
    ASSERT_TRUE(t.add(GidEntry{.gid = net::Address::from_v4(0x0a000000 + i), .ifindex = 1}));
  EXPECT_FALSE(t.add(GidEntry{.gid = net::Address::from_v4(0x0b000000), .ifindex = 1}));
  EXPECT_EQ(t.size(), kMaxGids);
}

TEST(GidTable, ResyncSweepsWhatTheDumpDidNotReport) {
  GidTable t;
  t.add(entry(1, "127.0.0.1"));
  t.add(entry(2, "10.0.0.1"));
  t.mark_all_stale();
  t.add(entry(2, "10.0.0.1"));
  t.sweep_stale();
  const auto e = t.entries();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].gid, net::Address::from_v4(10, 0, 0, 1));
  EXPECT_EQ(e[0].index, 1u);
}

// Appends one RTM_NEWADDR/RTM_DELADDR as the kernel writes it.
void append_ifaddr(std::vector<uint8_t>* buf, uint16_t type, uint8_t family, uint32_t ifindex,
                   std::span<const uint8_t> addr, uint16_t addr_attr, uint32_t flags = 0) {
  const size_t start = buf->size();
  const size_t attr_len = RTA_LENGTH(addr.size());
  const size_t flags_len = RTA_LENGTH(sizeof(uint32_t));
  const size_t len = NLMSG_LENGTH(sizeof(ifaddrmsg)) + RTA_ALIGN(attr_len) + RTA_ALIGN(flags_len);
  buf->resize(start + NLMSG_ALIGN(len));
  uint8_t* p = buf->data() + start;
  nlmsghdr h{};
  h.nlmsg_len = static_cast<uint32_t>(len);
  h.nlmsg_type = type;
  std::memcpy(p, &h, sizeof h);
  ifaddrmsg ifa{};
  ifa.ifa_family = family;
  ifa.ifa_prefixlen = family == AF_INET ? 24 : 64;
  ifa.ifa_index = ifindex;
  std::memcpy(p + NLMSG_HDRLEN, &ifa, sizeof ifa);
  size_t off = NLMSG_LENGTH(sizeof(ifaddrmsg));
  rtattr rta{static_cast<uint16_t>(attr_len), addr_attr};
  std::memcpy(p + off, &rta, sizeof rta);
  std::memcpy(p + off + RTA_LENGTH(0), addr.data(), addr.size());
  off += RTA_ALIGN(attr_len);
  rta = rtattr{static_cast<uint16_t>(flags_len), IFA_FLAGS};
  std::memcpy(p + off, &rta, sizeof rta);
  std::memcpy(p + off + RTA_LENGTH(0), &flags, sizeof flags);
}

TEST(GidTable, AppliesNetlinkAddressMessages) {
  std::vector<uint8_t> buf;
  const uint8_t v4[4] = {10, 1, 2, 3};
  const auto v6 = net::Address::parse("fd00::7")->bytes();
  append_ifaddr(&buf, RTM_NEWADDR, AF_INET, 4, v4, IFA_LOCAL);
  append_ifaddr(&buf, RTM_NEWADDR, AF_INET6, 4, v6, IFA_ADDRESS);
  append_ifaddr(&buf, RTM_NEWADDR, AF_INET6, 5, v6, IFA_ADDRESS, IFA_F_TENTATIVE);
  GidTable t;
  bool changed = false;
  EXPECT_FALSE(apply_netlink_addr_messages(buf, &t, &changed));
  EXPECT_TRUE(changed);
  auto e = t.entries();
  ASSERT_EQ(e.size(), 2u) << "a tentative address is not usable yet";
  EXPECT_EQ(e[0].gid, net::Address::from_v4(10, 1, 2, 3));
  EXPECT_EQ(e[0].ifindex, 4u);
  EXPECT_EQ(e[0].prefix_len, 24);
  EXPECT_EQ(e[1].gid, *net::Address::parse("fd00::7"));

  buf.clear();
  append_ifaddr(&buf, RTM_DELADDR, AF_INET, 4, v4, IFA_LOCAL);
  nlmsghdr done{};
  done.nlmsg_len = NLMSG_LENGTH(sizeof(int));
  done.nlmsg_type = NLMSG_DONE;
  const size_t at = buf.size();
  buf.resize(at + NLMSG_ALIGN(done.nlmsg_len));
  std::memcpy(buf.data() + at, &done, sizeof done);
  changed = false;
  EXPECT_TRUE(apply_netlink_addr_messages(buf, &t, &changed));
  EXPECT_TRUE(changed);
  e = t.entries();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].index, 1u);

  // Truncated and garbage buffers are skipped without reading past them.
  for (size_t cut = 0; cut < buf.size(); ++cut)
    apply_netlink_addr_messages(std::span(buf).first(cut), &t, &changed);
  std::vector<uint8_t> garbage(64, 0xFF);
  apply_netlink_addr_messages(garbage, &t, &changed);
}

TEST(AddressMonitor, DumpsThisNamespacesAddresses) {
  AddressMonitor m;
  std::string error;
  ASSERT_TRUE(m.open(&error)) << error;
  GidTable t;
  // The dump answer is queued by the time sendto returns; read it.
  for (int i = 0; i < 10 && t.size() == 0; ++i) {
    ASSERT_TRUE(m.handle_readable(&t, &error)) << error;
    if (t.size() == 0) usleep(10000);
  }
  bool loopback = false;
  for (const auto& g : t.entries()) loopback |= g.gid.is_loopback();
  EXPECT_TRUE(loopback) << "127.0.0.1 or ::1 is in the table";
}

}  // namespace
}  // namespace urdma::daemon
