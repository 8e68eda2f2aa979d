// One status type for the whole provider core.
//
// Design: every provider operation that can fail returns a `Status` (an errno value, 0 = ok)
// or a `Result<T>` (a value or an errno). The errno is chosen to be exactly what rdma-core's
// rxe provider / the kernel rxe driver return for the same input, so the verbs ABI layer maps
// a Status onto the `ibv_*` return convention without translation: int verbs return
// `status.error()`, pointer verbs set `errno = status.error()` and return NULL.
#pragma once

#include <cassert>
#include <cerrno>
#include <optional>
#include <utility>

namespace urdma::provider {

class [[nodiscard]] Status {
 public:
  constexpr Status() = default;
  // `err` is a positive errno value (EINVAL, ENOMEM, ...); 0 means success.
  constexpr explicit Status(int err) : err_(err) { assert(err >= 0); }
  static constexpr Status Ok() { return Status(); }

  constexpr bool ok() const { return err_ == 0; }
  constexpr int error() const { return err_; }
  constexpr explicit operator bool() const { return ok(); }
  friend constexpr bool operator==(Status a, Status b) { return a.err_ == b.err_; }

 private:
  int err_ = 0;
};

inline constexpr Status kOk{};

// A value or an errno. `T` is normally a pointer to a provider object.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}                      // NOLINT: implicit by design
  Result(Status status) : status_(status) { assert(!status.ok()); }  // NOLINT

  bool ok() const { return status_.ok(); }
  Status status() const { return status_; }
  int error() const { return status_.error(); }
  T& value() {
    assert(ok());
    return *value_;
  }
  const T& value() const {
    assert(ok());
    return *value_;
  }
  T& operator*() { return value(); }
  T* operator->() { return &value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace urdma::provider
