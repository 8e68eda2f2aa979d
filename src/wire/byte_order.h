// Big-endian field access over byte buffers: the only place wire byte order lives.
//
// Wire headers are byte arrays. A field is described once, as a compile-time
// `BeField<Offset, Bytes, Shift, Bits>`: it occupies `Bits` bits, `Shift` bits above
// the least significant bit of the `Bytes`-byte big-endian word that starts at `Offset`.
// Header views (headers.h, mad.h) declare their fields with it and expose them through
// accessors named after the spec, so no other code ever shifts or swaps bytes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

namespace urdma::wire {

// Loads an unsigned big-endian integer of `n` bytes (1..8).
inline constexpr uint64_t load_be(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

// Stores the low `n` bytes of `v` big-endian.
inline constexpr void store_be(uint8_t* p, size_t n, uint64_t v) {
  for (size_t i = n; i-- > 0;) {
    p[i] = static_cast<uint8_t>(v);
    v >>= 8;
  }
}

inline constexpr uint16_t load_be16(const uint8_t* p) {
  return static_cast<uint16_t>(load_be(p, 2));
}
inline constexpr uint32_t load_be24(const uint8_t* p) {
  return static_cast<uint32_t>(load_be(p, 3));
}
inline constexpr uint32_t load_be32(const uint8_t* p) {
  return static_cast<uint32_t>(load_be(p, 4));
}
inline constexpr uint64_t load_be64(const uint8_t* p) {
  return load_be(p, 8);
}
inline constexpr void store_be16(uint8_t* p, uint16_t v) {
  store_be(p, 2, v);
}
inline constexpr void store_be24(uint8_t* p, uint32_t v) {
  store_be(p, 3, v);
}
inline constexpr void store_be32(uint8_t* p, uint32_t v) {
  store_be(p, 4, v);
}
inline constexpr void store_be64(uint8_t* p, uint64_t v) {
  store_be(p, 8, v);
}

// The smallest unsigned type that holds `Bits` bits (bool for single-bit flags).
template <unsigned Bits>
using FieldValue = std::conditional_t<
    Bits == 1, bool,
    std::conditional_t<Bits <= 8, uint8_t,
                       std::conditional_t<Bits <= 16, uint16_t,
                                          std::conditional_t<Bits <= 32, uint32_t, uint64_t>>>>;

// One wire field. `Bytes` is the width of the big-endian word holding it; `Shift` and `Bits`
// place it inside that word. A field that fills its word has Shift 0 and Bits == 8 * Bytes.
template <size_t Offset, size_t Bytes, unsigned Shift, unsigned Bits>
struct BeField {
  static_assert(Bytes >= 1 && Bytes <= 8);
  static_assert(Bits >= 1 && Shift + Bits <= 8 * Bytes);
  using Value = FieldValue<Bits>;
  static constexpr size_t kOffset = Offset;
  static constexpr size_t kEnd = Offset + Bytes;  // one past the last byte touched
  static constexpr uint64_t kMask = Bits == 64 ? ~uint64_t{0} : ((uint64_t{1} << Bits) - 1);

  static constexpr Value get(const uint8_t* base) {
    return static_cast<Value>((load_be(base + Offset, Bytes) >> Shift) & kMask);
  }
  static constexpr void set(uint8_t* base, uint64_t v) {
    if constexpr (Shift == 0 && Bits == 8 * Bytes) {
      store_be(base + Offset, Bytes, v);
    } else {
      uint64_t word = load_be(base + Offset, Bytes);
      word &= ~(kMask << Shift);
      word |= (v & kMask) << Shift;
      store_be(base + Offset, Bytes, word);
    }
  }
};

// A whole big-endian word: BeWord<Offset, Bytes>.
template <size_t Offset, size_t Bytes>
using BeWord = BeField<Offset, Bytes, 0, 8 * Bytes>;

// Header views are templated on the byte type so one definition serves both read-only
// (`const uint8_t`) and writable (`uint8_t`) buffers; setters exist only on the latter.
template <typename Byte>
concept WireByte = std::is_same_v<std::remove_const_t<Byte>, uint8_t>;

}  // namespace urdma::wire

// Declares the getter `name()` and, for writable views, the setter `set_name(v)` of one field
// inside a header view class that holds its buffer in `p_` (a `Byte*`). Example, BTH DestQP:
//   URDMA_WIRE_FIELD(dest_qp, 5, 3, 0, 24)
#define URDMA_WIRE_FIELD(name, offset, bytes, shift, bits)                                  \
  using name##_field = ::urdma::wire::BeField<offset, bytes, shift, bits>;                  \
  constexpr name##_field::Value name() const {                                              \
    return name##_field::get(p_);                                                           \
  }                                                                                         \
  constexpr void set_##name(name##_field::Value v) const requires(!std::is_const_v<Byte>) { \
    name##_field::set(p_, v);                                                               \
  }

// The common part of every header or MAD view: size, constructors, buffer pointer. A view is built
// from a pointer (the caller vouches for `kSize` bytes) or from a span of exactly `kSize` bytes; a
// writable view converts implicitly to the read-only view of the same layout.
#define URDMA_WIRE_VIEW(Class, SIZE)                                                             \
 public:                                                                                         \
  using byte_type = Byte;                                                                        \
  static constexpr size_t kSize = SIZE;                                                          \
  constexpr Class() = default;                                                                   \
  constexpr explicit Class(Byte* p) : p_(p) {}                                                   \
  constexpr explicit Class(std::span<Byte, kSize> s) : p_(s.data()) {}                           \
  template <::urdma::wire::WireByte Other>                                                       \
  requires(std::is_const_v<Byte> &&                                                              \
           std::is_same_v<Other, std::remove_const_t<Byte>>) constexpr Class(Class<Other> other) \
      : p_(other.data()) {}                                                                      \
  constexpr Byte* data() const {                                                                 \
    return p_;                                                                                   \
  }                                                                                              \
  constexpr std::span<Byte, kSize> bytes() const {                                               \
    return std::span<Byte, kSize>(p_, kSize);                                                    \
  }                                                                                              \
                                                                                                 \
 private:                                                                                        \
  Byte* p_ = nullptr;                                                                            \
                                                                                                 \
 public:

// A fixed-size byte-array field (GIDs, ARI, private data): `name()` returns a span over the
// bytes, `set_name(src)` (writable views only) copies `src`.
#define URDMA_WIRE_BYTES(name, OFFSET, SIZE)                    \
  static constexpr size_t name##_offset = OFFSET;               \
  static constexpr size_t name##_size = SIZE;                   \
  constexpr std::span<Byte, SIZE> name() const {                \
    return std::span<Byte, SIZE>(p_ + (OFFSET), SIZE);          \
  }                                                             \
  constexpr void set_##name(std::span<const uint8_t, SIZE> src) \
      const requires(!std::is_const_v<Byte>) {                  \
    std::copy(src.begin(), src.end(), p_ + (OFFSET));           \
  }
