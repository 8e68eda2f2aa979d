// Invariant checks that stay on in every build type (RelWithDebInfo defines NDEBUG, so <cassert>
// would vanish exactly where the simulation tests run). A failed check prints where and why, then
// aborts: a broken invariant is a bug, never a condition to recover from.
#pragma once

#include <source_location>

namespace urdma::net {

[[noreturn]] void check_failed(const char* what, const std::source_location& where);

constexpr void check(bool ok, const char* what,
                     const std::source_location& where = std::source_location::current()) {
  if (!ok) [[unlikely]]
    check_failed(what, where);
}

}  // namespace urdma::net
