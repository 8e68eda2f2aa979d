#include "base/check.h"

#include <cstdio>
#include <cstdlib>

namespace urdma::base {

void check_failed(const char* what, const char* file, int line, const char* function) {
  std::fprintf(stderr, "%s:%d: %s: check failed: %s\n", file, line, function, what);
  std::abort();
}

}  // namespace urdma::base
