#include "net/address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <ostream>

#include "base/check.h"

namespace urdma::net {

std::optional<Address> Address::parse(std::string_view text) {
  // inet_pton wants a NUL-terminated string; the longest valid text is INET6_ADDRSTRLEN - 1.
  if (text.empty() || text.size() >= INET6_ADDRSTRLEN) return std::nullopt;
  char buf[INET6_ADDRSTRLEN] = {};
  std::memcpy(buf, text.data(), text.size());
  uint8_t v4[4];
  if (inet_pton(AF_INET, buf, v4) == 1) return from_v4(std::span<const uint8_t, 4>(v4));
  Bytes v6{};
  if (inet_pton(AF_INET6, buf, v6.data()) == 1) return Address(v6);
  return std::nullopt;
}

uint32_t Address::v4() const {
  base::check(is_v4(), "v4() of an IPv6 address");
  return uint32_t{bytes_[12]} << 24 | uint32_t{bytes_[13]} << 16 | uint32_t{bytes_[14]} << 8 |
         bytes_[15];
}

std::string Address::to_string() const {
  char buf[INET6_ADDRSTRLEN] = {};
  const char* s = is_v4() ? inet_ntop(AF_INET, bytes_.data() + 12, buf, sizeof buf)
                          : inet_ntop(AF_INET6, bytes_.data(), buf, sizeof buf);
  base::check(s != nullptr, "inet_ntop failed");  // only on a too-small buffer
  return buf;
}

std::ostream& operator<<(std::ostream& os, const Address& a) {
  return os << a.to_string();
}

std::optional<Endpoint> Endpoint::parse(std::string_view text) {
  std::string_view host;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find("]:");
    if (close == std::string_view::npos) return std::nullopt;
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return std::nullopt;
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  auto addr = Address::parse(host);
  // Unbracketed text must be IPv4: "::1:4791" is ambiguous.
  if (!addr || (text.front() != '[' && host.find(':') != std::string_view::npos))
    return std::nullopt;
  if (port.empty() || port.size() > 5) return std::nullopt;
  uint32_t p = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return std::nullopt;
    p = p * 10 + static_cast<uint32_t>(c - '0');
  }
  if (p > 0xffff) return std::nullopt;
  return Endpoint{*addr, static_cast<uint16_t>(p)};
}

std::string Endpoint::to_string() const {
  if (address.is_v4()) return address.to_string() + ":" + std::to_string(port);
  return "[" + address.to_string() + "]:" + std::to_string(port);
}

std::ostream& operator<<(std::ostream& os, const Endpoint& e) {
  return os << e.to_string();
}

socklen_t Endpoint::to_sockaddr(int family, sockaddr_storage& out) const {
  std::memset(&out, 0, sizeof out);
  if (family == AF_INET) {
    if (!address.is_v4()) return 0;
    auto* sin = reinterpret_cast<sockaddr_in*>(&out);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    std::memcpy(&sin->sin_addr, address.bytes().data() + 12, 4);
    return sizeof(sockaddr_in);
  }
  if (family == AF_INET6) {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&out);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(port);
    std::memcpy(&sin6->sin6_addr, address.bytes().data(), Address::kSize);
    return sizeof(sockaddr_in6);
  }
  return 0;
}

std::optional<Endpoint> Endpoint::from_sockaddr(const sockaddr* sa, socklen_t len) {
  if (sa == nullptr || len < static_cast<socklen_t>(sizeof(sa_family_t))) return std::nullopt;
  if (sa->sa_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    sockaddr_in sin;
    std::memcpy(&sin, sa, sizeof sin);
    uint8_t b[4];
    std::memcpy(b, &sin.sin_addr, 4);
    return Endpoint{Address::from_v4(std::span<const uint8_t, 4>(b)), ntohs(sin.sin_port)};
  }
  if (sa->sa_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    sockaddr_in6 sin6;
    std::memcpy(&sin6, sa, sizeof sin6);
    Address::Bytes b{};
    std::memcpy(b.data(), &sin6.sin6_addr, Address::kSize);
    return Endpoint{Address(b), ntohs(sin6.sin6_port)};
  }
  return std::nullopt;
}

}  // namespace urdma::net

namespace {
// splitmix64's finalizer: a good 64-bit mixer, so hashed addresses spread in unordered maps.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
  z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
  return z ^ (z >> 31);
}
uint64_t hash_address(const urdma::net::Address& a) {
  uint64_t hi = 0;
  uint64_t lo = 0;
  std::memcpy(&hi, a.bytes().data(), 8);
  std::memcpy(&lo, a.bytes().data() + 8, 8);
  return mix64(hi ^ mix64(lo));
}
}  // namespace

size_t std::hash<urdma::net::Address>::operator()(const urdma::net::Address& a) const noexcept {
  return hash_address(a);
}
size_t std::hash<urdma::net::Endpoint>::operator()(const urdma::net::Endpoint& e) const noexcept {
  return mix64(hash_address(e.address) ^ e.port);
}
