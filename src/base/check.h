// Invariant checks that stay on in every build type, for every layer (src/base is below all of
// them). A failed check prints where and why, then
// aborts: a broken invariant is a bug, never a condition to recover from.
//
// The call site comes from __builtin_FILE/__builtin_LINE/__builtin_FUNCTION (gcc and clang)
// rather than std::source_location, which Debian 12's clang 14 cannot compile with libstdc++ 12
// (it needs __builtin_source_location, clang 15) — and the libFuzzer build uses clang 14.
#pragma once

namespace urdma::base {

[[noreturn]] void check_failed(const char* what, const char* file, int line, const char* function);

constexpr void check(bool ok, const char* what, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE(), const char* function = __builtin_FUNCTION()) {
  if (!ok) [[unlikely]]
    check_failed(what, file, line, function);
}

}  // namespace urdma::base
