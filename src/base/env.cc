#include "base/env.h"

#include <cerrno>
#include <cstdlib>

namespace urdma::base {

int env_number(const char* name, uint64_t lo, uint64_t hi, uint64_t* value, std::string* why) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (errno != 0 || *end != '\0' || v[0] == '-' || n < lo || n > hi) {
    *why = std::string(name) + "=" + v + " is not a number in " + std::to_string(lo) + ".." +
           std::to_string(hi);
    return EINVAL;
  }
  *value = n;
  return 0;
}

}  // namespace urdma::base
