// See datagram.h.
#include "support/datagram.h"

#include <algorithm>

namespace urdma::test {

std::array<uint8_t, 4> v4_of(const net::Address& a) {
  std::array<uint8_t, 4> out{};
  const auto b = a.v4_bytes();
  std::copy(b.begin(), b.end(), out.begin());
  return out;
}

}  // namespace urdma::test
