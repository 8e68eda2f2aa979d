#include "daemon/slot_table.h"

#include <algorithm>

#include "base/check.h"
#include "daemon/steering.h"

namespace urdma::daemon {

SlotTable::SlotTable(unsigned slot_count)
    : slot_count_(slot_count), next_range_(slot_count), leased_(slot_count, false) {
  base::check(slot_count >= kMinSlots && slot_count <= kMaxSlots, "slot count in range");
  for (unsigned s = 1; s < slot_count; ++s) {
    free_.push_back(s);
    next_range_[s] = s;
  }
}

std::optional<Lease> SlotTable::acquire() {
  if (free_.empty()) return std::nullopt;
  const unsigned s = free_.front();
  free_.pop_front();
  base::check(!leased_[s], "a free slot is not leased");
  leased_[s] = true;
  const uint32_t range = next_range_[s];
  base::check(range != 0 && slot_of_range(range, slot_count_) == s, "range steers to its slot");
  return Lease{.slot = s,
               .range = range,
               .generation = range / slot_count_,
               .qpn_base = first_qpn_of_range(range),
               .qpn_count = kQpnsPerRange};
}

void SlotTable::release(unsigned slot) {
  base::check(slot > 0 && slot < slot_count_ && leased_[slot], "release of a leased slot");
  leased_[slot] = false;
  uint32_t next = next_range_[slot] + slot_count_;
  if (next >= kRangeCount) next = slot;  // wrap to generation 0
  next_range_[slot] = next;
  free_.push_back(slot);
}

bool SlotTable::adopt(unsigned slot, uint32_t range) {
  if (slot == 0 || slot >= slot_count_ || leased_[slot]) return false;
  if (range == 0 || range >= kRangeCount || slot_of_range(range, slot_count_) != slot) return false;
  std::erase(free_, slot);
  leased_[slot] = true;
  next_range_[slot] = range;
  return true;
}

}  // namespace urdma::daemon
