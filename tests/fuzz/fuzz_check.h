// What the fuzz targets share: REQUIRE, an invariant that must hold whatever the input (a broken
// one aborts, which libFuzzer records as a crash, and names the target and the invariant);
// open_fds, for the targets that check they leak no descriptor; and Input, the fuzzer's bytes
// read front to back as the choices a target makes.
#pragma once

#include <dirent.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

namespace urdma::fuzz {

// Prints "<target>: INVARIANT BROKEN: <what>" (the target named by its source file, `file`
// without folder and ".cc") and aborts.
[[noreturn]] inline void invariant_broken(std::string_view file, const std::string& what) {
  file = file.substr(file.rfind('/') + 1);
  if (file.ends_with(".cc")) file.remove_suffix(3);
  std::fprintf(stderr, "%.*s: INVARIANT BROKEN: %s\n", static_cast<int>(file.size()), file.data(),
               what.c_str());
  std::abort();
}

// How many file descriptors this process has open (what a target compares before and after a
// run to find a leak).
inline size_t open_fds() {
  size_t n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return 0;
  while (const dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the directory's own
}

// Reads the input front to back; past its end every read is 0.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t u16() {
    const uint16_t lo = u8();
    return static_cast<uint16_t>(lo | u8() << 8);
  }
  uint32_t u32() {
    const uint32_t lo = u16();
    return lo | uint32_t{u16()} << 16;
  }
  uint64_t u64() {
    const uint64_t lo = u32();
    return lo | uint64_t{u32()} << 32;
  }
  // Up to `want` bytes, fewer where the input ends.
  std::span<const uint8_t> bytes(size_t want) {
    const size_t n = std::min(want, size_ - std::min(pos_, size_));
    const std::span<const uint8_t> s(data_ + pos_, n);
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace urdma::fuzz

#define REQUIRE(cond, what)                                         \
  do {                                                              \
    if (!(cond)) ::urdma::fuzz::invariant_broken(__FILE__, (what)); \
  } while (0)
