// Device memory: allocation against the device's budget, the copies' bounds and 4-byte rule,
// zero-based MRs over a DM that the MR table's access check resolves into the DM's bytes, and
// a DM held by its MRs.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "provider/device.h"
#include "provider_test_util.h"

namespace urdma::provider::testing {
namespace {

constexpr int kZb = IBV_ACCESS_ZERO_BASED;
constexpr int kLw = IBV_ACCESS_LOCAL_WRITE;
constexpr int kRw = IBV_ACCESS_REMOTE_WRITE;
constexpr int kRr = IBV_ACCESS_REMOTE_READ;

class DmTest : public ProviderTest {
 protected:
  Dm* alloc(uint64_t length, uint32_t log_align = 0) {
    Result<Dm*> dm = dev_.alloc_dm(length, log_align);
    EXPECT_TRUE(dm.ok()) << dm.error();
    return dm.ok() ? dm.value() : nullptr;
  }
};

TEST_F(DmTest, AllocationsAreBoundedByTheDeviceBudget) {
  EXPECT_EQ(dev_.alloc_dm(0, 0).error(), EINVAL);
  EXPECT_EQ(dev_.alloc_dm(kMaxDmBytes + 1, 0).error(), EINVAL);
  EXPECT_EQ(dev_.alloc_dm(64, kDmMaxLogAlign + 1).error(), EINVAL);
  Dm* half = alloc(kMaxDmBytes / 2);
  Dm* quarter = alloc(kMaxDmBytes / 4);
  EXPECT_EQ(dev_.dm_bytes_in_use(), kMaxDmBytes / 2 + kMaxDmBytes / 4);
  // What is left is a quarter: one byte more does not fit.
  EXPECT_EQ(dev_.alloc_dm(kMaxDmBytes / 4 + 1, 0).error(), ENOMEM);
  Dm* rest = alloc(kMaxDmBytes / 4);
  EXPECT_EQ(dev_.alloc_dm(4, 0).error(), ENOMEM);
  ASSERT_TRUE(dev_.free_dm(half).ok());
  EXPECT_EQ(dev_.dm_bytes_in_use(), kMaxDmBytes / 2);
  Dm* again = alloc(kMaxDmBytes / 2);
  for (Dm* dm : {quarter, rest, again}) EXPECT_TRUE(dev_.free_dm(dm).ok());
  EXPECT_EQ(dev_.dm_bytes_in_use(), 0u);
}

TEST_F(DmTest, MemoryIsZeroedAndAlignedAsAsked) {
  for (uint32_t log_align = 0; log_align <= kDmMaxLogAlign; ++log_align) {
    Dm* dm = alloc(100, log_align);
    ASSERT_NE(dm, nullptr);
    const uintptr_t align = uintptr_t{1} << std::max(log_align, kDmMinLogAlign);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(dm->host()) % align, 0u) << log_align;
    std::array<uint8_t, 100> out;
    out.fill(0xee);
    ASSERT_TRUE(dm->copy_from(out.data(), 0, out.size()).ok());
    for (uint8_t b : out) EXPECT_EQ(b, 0);
    EXPECT_TRUE(dev_.free_dm(dm).ok());
  }
}

TEST_F(DmTest, CopiesRoundTripAndRefuseWhatMlx5Refuses) {
  Dm* dm = alloc(100);
  std::vector<uint8_t> in(96);
  std::iota(in.begin(), in.end(), 1);
  ASSERT_TRUE(dm->copy_to(4, in.data(), in.size()).ok());
  std::vector<uint8_t> out(100, 0xee);
  ASSERT_TRUE(dm->copy_from(out.data(), 0, out.size()).ok());
  EXPECT_EQ(out[0], 0);
  EXPECT_TRUE(std::equal(in.begin(), in.end(), out.begin() + 4));
  // Outside the DM: EFAULT, whatever the alignment; inside but not in 4-byte words: EINVAL.
  const uint64_t kHuge = std::numeric_limits<uint64_t>::max() - 3;
  struct Case {
    uint64_t offset, length;
    int err;
  };
  for (const Case c : {Case{3, 4, EINVAL}, Case{4, 3, EINVAL}, Case{104, 4, EFAULT},
                       Case{0, 104, EFAULT}, Case{kHuge, 8, EFAULT}}) {
    std::vector<uint8_t> buf(c.length > 4096 ? 0 : c.length);
    EXPECT_EQ(dm->copy_to(c.offset, buf.data(), c.length).error(), c.err)
        << c.offset << "+" << c.length;
    EXPECT_EQ(dm->copy_from(buf.data(), c.offset, c.length).error(), c.err)
        << c.offset << "+" << c.length;
  }
  // A refused copy wrote nothing.
  ASSERT_TRUE(dm->copy_from(out.data(), 0, out.size()).ok());
  EXPECT_TRUE(std::equal(in.begin(), in.end(), out.begin() + 4));
  // The last word, and nothing at the very end.
  EXPECT_TRUE(dm->copy_to(96, in.data(), 4).ok());
  EXPECT_TRUE(dm->copy_from(out.data(), 100, 0).ok());
}

TEST_F(DmTest, AZeroBasedMrReachesTheDmsBytes) {
  Dm* dm = alloc(256);
  std::array<uint8_t, 256> pattern;
  std::iota(pattern.begin(), pattern.end(), 0);
  ASSERT_TRUE(dm->copy_to(0, pattern.data(), pattern.size()).ok());
  // The MR covers DM bytes [64, 192): MR offset 0 is DM byte 64.
  Result<Mr*> r = dev_.reg_dm_mr(pd(), dm, 64, 128, kZb | kLw | kRw | kRr);
  ASSERT_TRUE(r.ok()) << r.error();
  Mr* mr = r.value();
  EXPECT_EQ(mr->iova(), 0u);
  EXPECT_EQ(mr->length(), 128u);
  EXPECT_EQ(mr->dm_handle(), dm->handle());
  const MrTable& t = dev_.mr_table();
  MemRef local = t.lookup_local(mr->lkey(), pd(), kLw, 10, 20);
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(*local.addr, 74);
  MemRef remote = t.lookup_remote(mr->rkey(), pd(), 0, kRw, 0, 128);
  ASSERT_TRUE(remote.ok());
  remote.addr[127] = 0xab;  // what a peer's WRITE would do
  uint8_t word[4];
  ASSERT_TRUE(dm->copy_from(word, 188, 4).ok());
  EXPECT_EQ(word[3], 0xab);
  // Zero based: the region ends at 128, and the DM bytes around it are out of reach.
  EXPECT_EQ(t.lookup_remote(mr->rkey(), pd(), 0, kRw, 1, 128).error, MemError::kOutOfBounds);
  EXPECT_EQ(t.lookup_local(mr->lkey(), pd(), 0, 128, 1).error, MemError::kOutOfBounds);
  // Its translation is the DM's: no rereg (the kernel's rule).
  EXPECT_EQ(dev_.rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 0, kZb | kLw)
                .error(),
            EINVAL);
  EXPECT_TRUE(dev_.dereg_mr(mr).ok());
}

TEST_F(DmTest, RegistrationChecksOfTheKernelAndMlx5) {
  Dm* dm = alloc(100);
  struct Case {
    uint64_t offset, length;
    int access, err;
  };
  for (const Case c : {
           Case{0, 100, kLw, EINVAL},                              // not zero based
           Case{0, 100, kZb | kLw | IBV_ACCESS_MW_BIND, EINVAL},   // not for a DM MR
           Case{0, 100, kZb | kLw | IBV_ACCESS_ON_DEMAND, EINVAL},
           Case{0, 100, kZb | kRw, EINVAL},                        // remote write, no local
           Case{0, 104, kZb | kLw, EINVAL},                        // past the DM
           Case{8, 96, kZb | kLw, EINVAL},
           Case{std::numeric_limits<uint64_t>::max(), 2, kZb | kLw, EINVAL},
           Case{0, 0, kZb | kLw, 0},                               // rdma-core's tests do this
           Case{4, 96, kZb | kLw | kRw, 0},
       }) {
    Result<Mr*> r = dev_.reg_dm_mr(pd(), dm, c.offset, c.length, c.access);
    EXPECT_EQ(r.error(), c.err) << c.offset << "+" << c.length << " access " << c.access;
    if (r.ok()) {
      EXPECT_TRUE(dev_.dereg_mr(r.value()).ok());
    }
  }
  EXPECT_EQ(dm->users(), 0u);
}

TEST_F(DmTest, ADmWithMrsCannotBeFreed) {
  Dm* dm = alloc(64);
  Mr* a = dev_.reg_dm_mr(pd(), dm, 0, 32, kZb | kLw).value();
  Mr* b = dev_.reg_dm_mr(pd(), dm, 32, 32, kZb | kLw).value();
  EXPECT_EQ(dev_.free_dm(dm).error(), EBUSY);
  ASSERT_TRUE(dev_.dereg_mr(a).ok());
  EXPECT_EQ(dev_.free_dm(dm).error(), EBUSY);
  ASSERT_TRUE(dev_.dereg_mr(b).ok());
  EXPECT_TRUE(dev_.free_dm(dm).ok());
  EXPECT_EQ(dev_.dm_bytes_in_use(), 0u);
  // The PD counted the MRs too.
  EXPECT_TRUE(dev_.dealloc_pd(pd()).ok());
}

}  // namespace
}  // namespace urdma::provider::testing
