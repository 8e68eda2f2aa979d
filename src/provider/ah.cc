// Address handles; see ah.h.
#include "provider/ah.h"

namespace urdma::provider {

bool gid_is_ipv4_mapped(const ibv_gid& gid) {
  // RFC 4291 2.5.5.2: 80 zero bits, 16 one bits, then the IPv4 address.
  for (int i = 0; i < 10; ++i)
    if (gid.raw[i] != 0) return false;
  return gid.raw[10] == 0xff && gid.raw[11] == 0xff;
}

}  // namespace urdma::provider
