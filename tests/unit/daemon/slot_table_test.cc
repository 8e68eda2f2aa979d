#include "daemon/slot_table.h"

#include <gtest/gtest.h>

#include <set>

#include "daemon/steering.h"

namespace urdma::daemon {
namespace {

TEST(SlotTable, LeasesEveryClientSlotOnceThenIsFull) {
  SlotTable t(8);
  std::set<unsigned> seen;
  for (unsigned i = 0; i < 7; ++i) {
    const auto l = t.acquire();
    ASSERT_TRUE(l);
    EXPECT_NE(l->slot, 0u) << "slot 0 is the daemon's";
    EXPECT_TRUE(seen.insert(l->slot).second);
    EXPECT_EQ(l->qpn_count, kQpnsPerRange);
    EXPECT_EQ(l->generation, 0u);
    // Every QPN of the range steers to the slot, and none is QP0/QP1.
    EXPECT_EQ(slot_of_qpn(l->qpn_base, 8), l->slot);
    EXPECT_EQ(slot_of_qpn(l->qpn_base + l->qpn_count - 1, 8), l->slot);
    EXPECT_GT(l->qpn_base, 1u);
  }
  EXPECT_FALSE(t.acquire());
  EXPECT_EQ(t.free_count(), 0u);
}

TEST(SlotTable, FreedSlotGoesToTheBackAndComesBackWithANewRange) {
  SlotTable t(4);
  const auto a = t.acquire();
  const auto b = t.acquire();
  ASSERT_TRUE(a && b);
  t.release(a->slot);
  // Slot 3 was never leased: it goes before the just-freed slot.
  const auto c = t.acquire();
  ASSERT_TRUE(c);
  EXPECT_NE(c->slot, a->slot);
  const auto d = t.acquire();
  ASSERT_TRUE(d);
  EXPECT_EQ(d->slot, a->slot);
  EXPECT_NE(d->qpn_base, a->qpn_base) << "a freed QPN range is quarantined";
  EXPECT_EQ(d->generation, 1u);
  EXPECT_EQ(slot_of_qpn(d->qpn_base, 4), a->slot);
}

TEST(SlotTable, RangeComesBackOnlyAfterAFullCycle) {
  constexpr unsigned n = 64;
  SlotTable t(n);
  // Lease everything but one slot, then churn that slot.
  for (unsigned i = 0; i < n - 2; ++i) ASSERT_TRUE(t.acquire());
  const auto first = t.acquire();
  ASSERT_TRUE(first);
  std::set<uint32_t> bases{first->qpn_base};
  unsigned slot = first->slot;
  t.release(slot);
  const unsigned generations = kRangeCount / n;
  for (unsigned g = 1; g < generations; ++g) {
    const auto l = t.acquire();
    ASSERT_TRUE(l);
    ASSERT_EQ(l->slot, slot);
    EXPECT_TRUE(bases.insert(l->qpn_base).second) << "range reused after " << g << " leases";
    EXPECT_LE(l->qpn_base + l->qpn_count - 1, wire::kQpnMask);
    t.release(slot);
  }
  const auto wrapped = t.acquire();
  ASSERT_TRUE(wrapped);
  EXPECT_EQ(wrapped->qpn_base, first->qpn_base) << "after the full cycle, generation 0 again";
}

TEST(SlotTable, AdoptTakesASurvivorsSlotAndRangeBack) {
  SlotTable t(8);
  // Slot 3 comes back in its third generation (range 3 + 2 * 8).
  EXPECT_FALSE(t.adopt(0, 8)) << "slot 0 is the daemon's";
  EXPECT_FALSE(t.adopt(3, 0)) << "range 0 is QP0/QP1";
  EXPECT_FALSE(t.adopt(3, 4)) << "range 4 steers to slot 4";
  EXPECT_FALSE(t.adopt(8, 8)) << "no slot 8";
  EXPECT_FALSE(t.adopt(3, kRangeCount + 3)) << "beyond the QPN space";
  ASSERT_TRUE(t.adopt(3, 19));
  EXPECT_TRUE(t.leased(3));
  EXPECT_FALSE(t.adopt(3, 19)) << "leased already";
  EXPECT_EQ(t.free_count(), 6u);
  // The others lease as before, never slot 3.
  for (int i = 0; i < 6; ++i) {
    const auto l = t.acquire();
    ASSERT_TRUE(l);
    EXPECT_NE(l->slot, 3u);
  }
  EXPECT_FALSE(t.acquire());
  // Released, it moves on from the adopted range.
  t.release(3);
  const auto l = t.acquire();
  ASSERT_TRUE(l);
  EXPECT_EQ(l->slot, 3u);
  EXPECT_EQ(l->range, 27u);
}

TEST(SlotTable, ReleasingAFreeSlotIsABug) {
  SlotTable t(4);
  EXPECT_DEATH(t.release(1), "leased");
  EXPECT_DEATH(t.release(0), "leased");
}

}  // namespace
}  // namespace urdma::daemon
