// A table of slots that grows in chunks and never moves a slot: the storage behind MrTable,
// whose lookups hand out Mr*/Mw* that must stay valid while the table grows.
//
// Design: chunks of kChunk default-constructed slots, made on demand, so a device that
// reports rxe's limits (524287 MRs) costs memory for the slots a process used, not for the
// limit. Slot i lives in chunk i / kChunk for the table's lifetime. Not synchronised: the
// owner's lock covers growth (exclusive) and lookups (shared).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace urdma::provider {

template <class T>
class SlotChunks {
 public:
  static constexpr uint32_t kChunk = 4096;

  uint32_t size() const { return size_; }

  // Slot i; i < size().
  T& operator[](uint32_t i) const { return chunks_[i / kChunk][i % kChunk]; }

  // Adds min(kChunk, limit - size()) slots at the end; returns how many (0 at the limit).
  // Throws std::bad_alloc, leaving the table as it was.
  uint32_t grow(uint32_t limit) {
    if (size_ >= limit) return 0;
    const uint32_t n = limit - size_ < kChunk ? limit - size_ : kChunk;
    chunks_.reserve(chunks_.size() + 1);
    chunks_.push_back(std::make_unique<T[]>(kChunk));
    size_ += n;
    return n;
  }

 private:
  std::vector<std::unique_ptr<T[]>> chunks_;
  uint32_t size_ = 0;
};

}  // namespace urdma::provider
