#include "net/address.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <sstream>
#include <unordered_set>

namespace urdma::net {
namespace {

TEST(AddressTest, ParsesAndFormatsIpv4) {
  auto a = Address::parse("192.168.1.20");
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->is_v4());
  EXPECT_EQ(a->v4(), 0xc0a80114u);
  EXPECT_EQ(a->to_string(), "192.168.1.20");
  EXPECT_EQ(*a, Address::from_v4(192, 168, 1, 20));
  EXPECT_EQ(*a, Address::from_v4(0xc0a80114u));
  // Stored as the IPv4-mapped IPv6 address, the same bytes as a RoCEv2 IPv4 GID.
  const Address::Bytes mapped = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 20};
  EXPECT_EQ(a->bytes(), mapped);
  EXPECT_EQ(a->v4_bytes()[0], 192);
  EXPECT_EQ(a->v4_bytes()[3], 20);
}

TEST(AddressTest, ParsesAndFormatsIpv6) {
  auto a = Address::parse("FE80:0:0:0:0:0:0:1");
  ASSERT_TRUE(a);
  EXPECT_FALSE(a->is_v4());
  EXPECT_EQ(a->to_string(), "fe80::1");  // RFC 5952 canonical text
  EXPECT_EQ(a->bytes()[0], 0xfe);
  EXPECT_EQ(a->bytes()[1], 0x80);
  EXPECT_EQ(a->bytes()[15], 1);
  auto b = Address::parse("2001:db8::a:b:0:0");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->to_string(), "2001:db8::a:b:0:0");
  EXPECT_EQ(Address::parse("::")->to_string(), "::");
  EXPECT_TRUE(Address::parse("::")->is_unspecified());
}

TEST(AddressTest, Ipv4MappedIsIpv4) {
  auto mapped = Address::parse("::ffff:10.0.0.1");
  ASSERT_TRUE(mapped);
  EXPECT_TRUE(mapped->is_v4());
  EXPECT_EQ(*mapped, *Address::parse("10.0.0.1"));
  EXPECT_EQ(mapped->to_string(), "10.0.0.1");
  // Not mapped: IPv4-compatible (deprecated) and the NAT64 prefix stay IPv6.
  EXPECT_FALSE(Address::parse("::10.0.0.1")->is_v4());
  EXPECT_FALSE(Address::parse("64:ff9b::10.0.0.1")->is_v4());
  EXPECT_FALSE(Address::parse("::fffe:10.0.0.1")->is_v4());
}

TEST(AddressTest, RejectsMalformedText) {
  for (const char* bad : {"", "1.2.3", "1.2.3.4.5", "256.1.1.1", " 1.2.3.4", "1.2.3.4 ", "[::1]",
                          "fe80::1%eth0", "::1/128", "1:2:3:4:5:6:7:8:9", "gg::1", "0x7f.1.1.1",
                          "1.2.3.4:4791", "0000:0000:0000:0000:0000:0000:0000:0000:0000:0000"}) {
    EXPECT_FALSE(Address::parse(bad)) << bad;
  }
}

TEST(AddressTest, Loopback) {
  EXPECT_TRUE(Address::parse("127.0.0.1")->is_loopback());
  EXPECT_TRUE(Address::parse("127.9.8.7")->is_loopback());
  EXPECT_TRUE(Address::parse("::1")->is_loopback());
  EXPECT_FALSE(Address::parse("10.0.0.1")->is_loopback());
  EXPECT_FALSE(Address::parse("::2")->is_loopback());
}

TEST(AddressTest, OrdersAndHashesByBytes) {
  const Address a = Address::from_v4(10, 0, 0, 1);
  const Address b = Address::from_v4(10, 0, 0, 2);
  const Address c = *Address::parse("fe80::1");
  EXPECT_LT(a, b);
  EXPECT_LT(Address(), a);
  EXPECT_LT(b, c);  // ::ffff:... sorts before fe80::
  std::unordered_set<Address> set{a, b, c, a};
  EXPECT_EQ(set.size(), 3u);
  EXPECT_TRUE(set.contains(*Address::parse("::ffff:10.0.0.2")));
  EXPECT_NE(std::hash<Address>{}(a), std::hash<Address>{}(b));
  std::ostringstream os;
  os << a;
  EXPECT_EQ(os.str(), "10.0.0.1");
}

TEST(EndpointTest, ParsesAndFormats) {
  auto e = Endpoint::parse("10.1.2.3:4791");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->address, Address::from_v4(10, 1, 2, 3));
  EXPECT_EQ(e->port, 4791);
  EXPECT_EQ(e->to_string(), "10.1.2.3:4791");
  auto v6 = Endpoint::parse("[fe80::1]:65535");
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->port, 65535);
  EXPECT_EQ(v6->to_string(), "[fe80::1]:65535");
  EXPECT_EQ(Endpoint::parse("[::ffff:1.2.3.4]:1")->to_string(), "1.2.3.4:1");
  for (const char* bad : {"10.1.2.3", "10.1.2.3:", "10.1.2.3:65536", "10.1.2.3:-1", "::1:4791",
                          "[::1]4791", "[::1]:", "10.1.2.3:47a1", "10.1.2.3:123456"}) {
    EXPECT_FALSE(Endpoint::parse(bad)) << bad;
  }
  std::unordered_set<Endpoint> set{*e, Endpoint{e->address, 4792}, *e};
  EXPECT_EQ(set.size(), 2u);
  EXPECT_LT(*e, (Endpoint{e->address, 4792}));
}

TEST(EndpointTest, SockaddrRoundTrip) {
  const Endpoint v4{Address::from_v4(127, 0, 0, 1), 4791};
  sockaddr_storage ss;
  socklen_t len = v4.to_sockaddr(AF_INET, ss);
  ASSERT_EQ(len, sizeof(sockaddr_in));
  const auto* sin = reinterpret_cast<const sockaddr_in*>(&ss);
  EXPECT_EQ(sin->sin_family, AF_INET);
  EXPECT_EQ(ntohs(sin->sin_port), 4791);
  EXPECT_EQ(ntohl(sin->sin_addr.s_addr), 0x7f000001u);
  EXPECT_EQ(Endpoint::from_sockaddr(reinterpret_cast<const sockaddr*>(&ss), len), v4);

  // On an AF_INET6 socket an IPv4 peer is written IPv4-mapped, and reads back as the same Endpoint.
  len = v4.to_sockaddr(AF_INET6, ss);
  ASSERT_EQ(len, sizeof(sockaddr_in6));
  EXPECT_EQ(Endpoint::from_sockaddr(reinterpret_cast<const sockaddr*>(&ss), len), v4);

  const Endpoint v6{*Address::parse("2001:db8::7"), 1};
  EXPECT_EQ(v6.to_sockaddr(AF_INET, ss), 0u);  // an AF_INET socket cannot reach IPv6
  len = v6.to_sockaddr(AF_INET6, ss);
  EXPECT_EQ(Endpoint::from_sockaddr(reinterpret_cast<const sockaddr*>(&ss), len), v6);
  EXPECT_FALSE(Endpoint::from_sockaddr(reinterpret_cast<const sockaddr*>(&ss), 4));
  EXPECT_FALSE(Endpoint::from_sockaddr(nullptr, 0));
}

}  // namespace
}  // namespace urdma::net
