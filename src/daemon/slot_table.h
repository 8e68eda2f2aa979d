// Which client slots are leased, and which QPN range each lease gets.
//
// Slot 0 is the daemon's (QP0/QP1, unknown QPNs) and is never leased. Free slots wait in a FIFO:
// a released slot goes to the back, so the slot freed longest ago is leased first. Each slot
// walks through its own QPN ranges (range = slot + generation * slot_count, see steering.h):
// a lease takes the slot's next range and a release advances it. A QPN range therefore comes
// back only after its slot has been leased kRangeCount / slot_count times more — stale packets
// and CM messages for a dead process's QPNs never reach a new owner that uses the same numbers.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace urdma::daemon {

struct Lease {
  unsigned slot = 0;
  uint32_t range = 0;
  uint32_t generation = 0;  // range / slot_count
  uint32_t qpn_base = 0;
  uint32_t qpn_count = 0;
};

class SlotTable {
 public:
  explicit SlotTable(unsigned slot_count);

  // nullopt when every client slot is leased.
  std::optional<Lease> acquire();
  // `slot` must be leased.
  void release(unsigned slot);
  // Takeover (protocol.h): marks `slot` leased with the QPN range an earlier daemon gave it.
  // False if the slot is leased already, or the range is 0 or does not steer to the slot.
  bool adopt(unsigned slot, uint32_t range);

  bool leased(unsigned slot) const { return leased_.at(slot); }
  unsigned slot_count() const { return slot_count_; }
  unsigned free_count() const { return static_cast<unsigned>(free_.size()); }

 private:
  unsigned slot_count_;
  std::deque<unsigned> free_;
  std::vector<uint32_t> next_range_;
  std::vector<bool> leased_;
};

}  // namespace urdma::daemon
