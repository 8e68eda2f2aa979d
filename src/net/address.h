// IP addresses and UDP endpoints as the engine sees them.
//
// An Address is always 16 bytes: an IPv6 address, or an IPv4 address in its IPv4-mapped form
// ::ffff:a.b.c.d (RFC 4291 2.5.5.2). That is also exactly how RoCEv2 writes an IPv4 address into a
// GID (IBA Annex A17, RoCEv2), so a GID and an Address convert by copying 16 bytes.
#pragma once

#include <sys/socket.h>

#include <array>
#include <bit>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "base/check.h"

namespace urdma::net {

class Address {
 public:
  static constexpr size_t kSize = 16;
  using Bytes = std::array<uint8_t, kSize>;

  // The unspecified address "::".
  constexpr Address() = default;
  explicit constexpr Address(const Bytes& b) : bytes_(b) {}

  static constexpr Address from_v6(std::span<const uint8_t, kSize> b) {
    Bytes out{};
    for (size_t i = 0; i < kSize; ++i) out[i] = b[i];
    return Address(out);
  }
  // `host_order` as in 0x7f000001 for 127.0.0.1.
  static constexpr Address from_v4(uint32_t host_order) {
    Bytes out{};
    out[10] = 0xff;
    out[11] = 0xff;
    for (size_t i = 0; i < 4; ++i) out[12 + i] = static_cast<uint8_t>(host_order >> (24 - 8 * i));
    return Address(out);
  }
  static constexpr Address from_v4(std::span<const uint8_t, 4> b) {
    return from_v4(uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | b[3]);
  }
  static constexpr Address from_v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
    return from_v4(uint32_t{a} << 24 | uint32_t{b} << 16 | uint32_t{c} << 8 | d);
  }

  // Dotted IPv4 ("10.0.0.1") or any RFC 4291 IPv6 text ("fe80::1", "::ffff:10.0.0.1").
  // Anything else (brackets, zone ids, spaces, prefixes) is rejected.
  static std::optional<Address> parse(std::string_view text);

  // IPv4 and IPv4-mapped IPv6 are the same thing here.
  // Three word compares: every packet's ICRC asks it of both its addresses.
  constexpr bool is_v4() const {
    using Words = std::array<uint32_t, 4>;
    constexpr Words mapped = std::bit_cast<Words>(Bytes{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff});
    const Words w = std::bit_cast<Words>(bytes_);
    return w[0] == mapped[0] && w[1] == mapped[1] && w[2] == mapped[2];
  }
  // The IPv4 address in host order; only for is_v4().
  uint32_t v4() const;
  constexpr bool is_unspecified() const { return *this == Address(); }
  // 127.0.0.0/8 or ::1.
  constexpr bool is_loopback() const {
    if (is_v4()) return bytes_[12] == 127;
    Bytes one{};
    one[15] = 1;
    return bytes_ == one;
  }

  // 224.0.0.0/4 (RFC 5771) or ff00::/8 (RFC 4291 2.7): a RoCEv2 multicast GID.
  constexpr bool is_multicast() const {
    return is_v4() ? (bytes_[12] & 0xf0) == 0xe0 : bytes_[0] == 0xff;
  }

  constexpr const Bytes& bytes() const { return bytes_; }
  // The 4 address bytes of an IPv4 address (network order); only for is_v4().
  std::span<const uint8_t, 4> v4_bytes() const {
    base::check(is_v4(), "v4_bytes() of an IPv6 address");
    return std::span<const uint8_t, 4>(bytes_.data() + 12, 4);
  }

  // IPv4 dotted quad for is_v4(), otherwise RFC 5952 text ("fe80::1").
  std::string to_string() const;

  friend constexpr auto operator<=>(const Address&, const Address&) = default;
  // Two 8-byte words: the engine compares a datagram's source with its QP's peer for every
  // packet, and the defaulted comparison is a call to memcmp.
  friend constexpr bool operator==(const Address& a, const Address& b) {
    using Words = std::array<uint64_t, 2>;
    const Words x = std::bit_cast<Words>(a.bytes_), y = std::bit_cast<Words>(b.bytes_);
    return x[0] == y[0] && x[1] == y[1];
  }

 private:
  Bytes bytes_{};
};

std::ostream& operator<<(std::ostream& os, const Address& a);

struct Endpoint {
  Address address;
  uint16_t port = 0;

  // "10.0.0.1:4791" or "[fe80::1]:4791".
  static std::optional<Endpoint> parse(std::string_view text);
  std::string to_string() const;

  // Converts to a sockaddr for a socket of the given family: AF_INET needs is_v4(); AF_INET6
  // takes both (IPv4 as mapped). Returns the sockaddr length, or 0 if the family cannot carry it.
  socklen_t to_sockaddr(int family, sockaddr_storage& out) const;
  // From AF_INET / AF_INET6 sockaddrs; anything else (or too short) is nullopt.
  static std::optional<Endpoint> from_sockaddr(const sockaddr* sa, socklen_t len);

  friend constexpr auto operator<=>(const Endpoint&, const Endpoint&) = default;
};

std::ostream& operator<<(std::ostream& os, const Endpoint& e);

}  // namespace urdma::net

template <>
struct std::hash<urdma::net::Address> {
  size_t operator()(const urdma::net::Address& a) const noexcept;
};
template <>
struct std::hash<urdma::net::Endpoint> {
  size_t operator()(const urdma::net::Endpoint& e) const noexcept;
};
