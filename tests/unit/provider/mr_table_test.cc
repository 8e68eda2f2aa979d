// MR table: registration rules, THE access check (bounds, PD, access), key unpredictability.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <unordered_set>
#include <vector>

#include "provider/device.h"
#include "provider_test_util.h"

namespace urdma::provider::testing {
namespace {

constexpr int kLw = IBV_ACCESS_LOCAL_WRITE;
constexpr int kRw = IBV_ACCESS_REMOTE_WRITE;
constexpr int kRr = IBV_ACCESS_REMOTE_READ;
constexpr int kRa = IBV_ACCESS_REMOTE_ATOMIC;
constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

class MrTest : public ProviderTest {
 protected:
  Mr* reg(int access, uint64_t iova, uint64_t length = 4096) {
    Result<Mr*> mr = dev_.reg_mr(pd(), buf_.data(), length, iova, access);
    EXPECT_TRUE(mr.ok()) << mr.error();
    return mr.ok() ? mr.value() : nullptr;
  }
  uint64_t addr() { return reinterpret_cast<uintptr_t>(buf_.data()); }
  MrTable& table() { return dev_.mr_table(); }

  std::vector<uint8_t> buf_ = std::vector<uint8_t>(8192);
};

TEST_F(MrTest, LkeyEqualsRkeyAndTheHandleFindsTheRegion) {
  Mr* mr = reg(kLw | kRr, addr());
  EXPECT_EQ(mr->lkey(), mr->rkey());
  EXPECT_NE(mr->lkey() >> 8, 0u);
  EXPECT_NE(mr->handle(), 0u);
  EXPECT_EQ(table().mr_by_handle(mr->handle()), mr);
  const MemRef ref = table().lookup_local(mr->lkey(), pd(), kLw, addr() + 10, 100);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref.addr, buf_.data() + 10);
}

TEST_F(MrTest, AccessFlagRulesOfIbvRegMr) {
  struct Case {
    int access;
    int err;
  };
  const Case kCases[] = {
      {0, 0},
      {kLw, 0},
      {kRr, 0},
      {kRw, EINVAL},  // ibv_reg_mr(3): REMOTE_WRITE needs LOCAL_WRITE
      {kRa, EINVAL},  // ... and so does REMOTE_ATOMIC
      {kRw | kRa | kRr, EINVAL},
      {kLw | kRw | kRa | kRr | IBV_ACCESS_MW_BIND, 0},
      {kLw | IBV_ACCESS_ON_DEMAND, 0},
      {kLw | IBV_ACCESS_HUGETLB, 0},
      {kLw | IBV_ACCESS_RELAXED_ORDERING, 0},  // optional range: ignored
      {kLw | (1 << 8), EOPNOTSUPP},            // FLUSH_GLOBAL: no FLUSH support
      {kLw | (1 << 15), EINVAL},               // unknown mandatory bit
  };
  for (const Case& c : kCases) {
    Result<Mr*> mr = dev_.reg_mr(pd(), buf_.data(), 64, addr(), c.access);
    EXPECT_EQ(mr.error(), c.err) << "access " << std::hex << c.access;
    if (mr.ok()) {
      EXPECT_EQ(mr.value()->access() & IBV_ACCESS_RELAXED_ORDERING, 0);
      EXPECT_EQ(dev_.dereg_mr(mr.value()), kOk);
    }
  }
  EXPECT_EQ(dev_.reg_mr(nullptr, buf_.data(), 64, addr(), kLw).error(), EINVAL);
}

TEST_F(MrTest, RangesThatWrapAreRefused) {
  EXPECT_EQ(dev_.reg_mr(pd(), buf_.data(), 4096, kMax - 100, kLw).error(), EINVAL);
  EXPECT_EQ(dev_.reg_mr(pd(), reinterpret_cast<void*>(kMax - 10), 64, 0, kLw).error(), EINVAL);
  // Ending exactly at 2^64 does not wrap.
  EXPECT_TRUE(dev_.reg_mr(pd(), buf_.data(), 4096, kMax - 4095, kLw).ok());
}

TEST_F(MrTest, BoundsAreExactAndOverflowSafe) {
  const uint64_t base = 0x10000;  // an IOVA unrelated to the host address
  Mr* mr = reg(kLw | kRr | kRw, base, 4096);
  struct Case {
    uint64_t iova, length;
    bool ok;
  };
  const Case kCases[] = {
      {base, 4096, true},       // the whole region
      {base, 4097, false},      // one byte past the end
      {base + 4095, 1, true},   // last byte
      {base + 4096, 1, false},  // first byte after
      {base + 4096, 0, true},   // empty at the end
      {base - 1, 1, false},     // byte before
      {base - 1, 2, false},     // straddles the start
      {base + 1, kMax, false},  // iova + length wraps
      {kMax, 2, false},         // wraps from the top
      {base + 100, kMax - 50, false},
      {0, base + 10, false},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << std::hex << c.iova << "+" << c.length);
    const MemRef local = table().lookup_local(mr->lkey(), pd(), 0, c.iova, c.length);
    const MemRef remote = table().lookup_remote(mr->rkey(), pd(), 0, kRr, c.iova, c.length);
    EXPECT_EQ(local.ok(), c.ok);
    EXPECT_EQ(remote.ok(), c.ok);
    if (c.ok) {
      EXPECT_EQ(local.addr, buf_.data() + (c.iova - base));  // IOVA ≠ address
    } else {
      EXPECT_EQ(local.error, MemError::kOutOfBounds);
      EXPECT_EQ(remote.error, MemError::kOutOfBounds);
    }
  }
}

TEST_F(MrTest, RegionAtTheTopOfTheIovaSpace) {
  Mr* mr = reg(kLw | kRr, kMax - 4095, 4096);
  EXPECT_TRUE(table().lookup_remote(mr->rkey(), pd(), 0, kRr, kMax, 1).ok());
  EXPECT_EQ(table().lookup_remote(mr->rkey(), pd(), 0, kRr, kMax, 2).error, MemError::kOutOfBounds);
  EXPECT_EQ(table().lookup_remote(mr->rkey(), pd(), 0, kRr, kMax - 10, 20).error,
            MemError::kOutOfBounds);
}

TEST_F(MrTest, ZeroBasedRegionsStartAtIovaZero) {
  Mr* mr = reg(kLw | kRr | IBV_ACCESS_ZERO_BASED, addr());
  EXPECT_EQ(mr->iova(), 0u);
  const MemRef ref = table().lookup_remote(mr->rkey(), pd(), 0, kRr, 100, 8);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref.addr, buf_.data() + 100);
  EXPECT_FALSE(table().lookup_remote(mr->rkey(), pd(), 0, kRr, addr(), 8).ok());
}

TEST_F(MrTest, EachAccessRightIsChecked) {
  // (granted, required) → allowed?
  const int kRights[] = {kLw, kRr, kRw, kRa};
  for (int granted : kRights) {
    const int access = granted == kRw || granted == kRa ? (granted | kLw) : granted;
    Mr* mr = reg(access, addr());
    for (int required : {kRr, kRw, kRa}) {
      const MemRef r = table().lookup_remote(mr->rkey(), pd(), 0, required, addr(), 8);
      EXPECT_EQ(r.ok(), (access & required) != 0) << access << " needs " << required;
      if (!r.ok()) {
        EXPECT_EQ(r.error, MemError::kAccessDenied);
      }
    }
    // Local reads need no right; local writes need LOCAL_WRITE.
    EXPECT_TRUE(table().lookup_local(mr->lkey(), pd(), 0, addr(), 8).ok());
    EXPECT_EQ(table().lookup_local(mr->lkey(), pd(), kLw, addr(), 8).ok(), (access & kLw) != 0);
    EXPECT_EQ(dev_.dereg_mr(mr), kOk);
  }
}

TEST_F(MrTest, WrongPdAndBadKeys) {
  Mr* mr = reg(kLw | kRr, addr());
  Pd* other = dev_.alloc_pd().value();
  EXPECT_EQ(table().lookup_local(mr->lkey(), other, 0, addr(), 8).error, MemError::kWrongPd);
  EXPECT_EQ(table().lookup_remote(mr->rkey(), other, 0, kRr, addr(), 8).error, MemError::kWrongPd);
  // Same slot, other key byte; slot 0; out-of-range index.
  EXPECT_EQ(table().lookup_local(mr->lkey() ^ 0x01, pd(), 0, addr(), 8).error, MemError::kBadKey);
  EXPECT_EQ(table().lookup_local(0, pd(), 0, addr(), 8).error, MemError::kBadKey);
  EXPECT_EQ(table().lookup_remote(0xffffff00, pd(), 0, kRr, addr(), 8).error, MemError::kBadKey);
  // A deregistered key no longer works.
  const uint32_t key = mr->rkey();
  ASSERT_EQ(dev_.dereg_mr(mr), kOk);
  EXPECT_EQ(table().lookup_remote(key, pd(), 0, kRr, addr(), 8).error, MemError::kBadKey);
  EXPECT_EQ(dev_.dereg_mr(mr).error(), EINVAL);
}

TEST_F(MrTest, RkeysAreNotSequentialAndAReusedSlotGetsANewKey) {
  std::vector<uint32_t> keys;
  for (int i = 0; i < 32; ++i) keys.push_back(reg(kLw, addr())->rkey());
  std::set<int64_t> steps;
  for (size_t i = 1; i < keys.size(); ++i) steps.insert(int64_t{keys[i]} - int64_t{keys[i - 1]});
  EXPECT_GT(steps.size(), 1u) << "keys form an arithmetic sequence";
  EXPECT_EQ(std::set<uint32_t>(keys.begin(), keys.end()).size(), keys.size());

  // Churn: whenever a slot is reused its key byte differs from the slot's previous key.
  std::map<uint32_t, uint32_t> last_key;
  int reused = 0;
  for (int i = 0; i < 20000; ++i) {
    Mr* mr = reg(kLw, addr());
    auto [it, fresh] = last_key.try_emplace(mr->handle(), mr->rkey());
    if (!fresh) {
      EXPECT_NE(it->second, mr->rkey());
      it->second = mr->rkey();
      ++reused;
    }
    ASSERT_EQ(dev_.dereg_mr(mr), kOk);
  }
  EXPECT_GT(reused, 0);
}

TEST_F(MrTest, KeysDifferAcrossDevices) {
  Device other(test_config());
  Pd* other_pd = other.alloc_pd().value();
  std::vector<uint32_t> a, b;
  for (int i = 0; i < 8; ++i) {
    a.push_back(reg(kLw, addr())->rkey());
    b.push_back(other.reg_mr(other_pd, buf_.data(), 64, addr(), kLw).value()->rkey());
  }
  EXPECT_NE(a, b);
}

// DeviceConfig::key_seed (the simulation's replay): the same seed gives the same MR and MW
// keys, in any process; another seed gives others.
TEST_F(MrTest, KeySeedMakesKeysReproducible) {
  const auto keys = [&](uint64_t seed) {
    DeviceConfig cfg = test_config();
    cfg.key_seed = seed;
    Device d(cfg);
    Pd* p = d.alloc_pd().value();
    std::vector<uint32_t> out;
    for (int i = 0; i < 8; ++i) {
      Mr* mr = d.reg_mr(p, buf_.data(), 64, addr(), kLw).value();
      out.push_back(mr->rkey());
      if (i % 2) {
        EXPECT_EQ(d.dereg_mr(mr), kOk);  // reused slots draw fresh key bytes too
      }
    }
    Mw* mw = d.alloc_mw(p, IBV_MW_TYPE_2).value();
    out.push_back(mw->rkey());
    out.push_back(d.mr_table().next_mw_rkey(mw));
    return out;
  };
  EXPECT_EQ(keys(7), keys(7));
  EXPECT_NE(keys(7), keys(8));
}

// 10,000 regions live at once: every tag (a key's upper 24 bits) is non-zero and unlike every
// other live one, the tags spread over the whole 24-bit space (expect_uniform_tags, which a
// slot-index key fails), every key is found as lkey and as rkey, and each key is refused as
// kBadKey once its region is deregistered.
TEST_F(MrTest, ManyLiveRegionsHaveDistinctUniformTags) {
  std::vector<Mr*> mrs;
  std::vector<uint32_t> keys;
  std::unordered_set<uint32_t> tags;
  for (int i = 0; i < 10'000; ++i) {
    Mr* mr = reg(kLw | kRr, addr(), 64);
    ASSERT_NE(mr, nullptr);
    const uint32_t tag = mr->rkey() >> 8;
    EXPECT_NE(tag, 0u);
    EXPECT_TRUE(tags.insert(tag).second) << "tag " << std::hex << tag << " is live twice";
    mrs.push_back(mr);
    keys.push_back(mr->rkey());
  }
  expect_uniform_tags(keys);
  for (Mr* mr : mrs) {
    const MemRef local = table().lookup_local(mr->lkey(), pd(), kLw, addr() + 8, 8);
    ASSERT_TRUE(local.ok()) << mem_error_name(local.error);
    EXPECT_EQ(local.addr, buf_.data() + 8);
    EXPECT_TRUE(table().lookup_remote(mr->rkey(), pd(), 0, kRr, addr(), 64).ok());
  }
  for (Mr* mr : mrs) {
    const uint32_t key = mr->rkey();
    ASSERT_EQ(dev_.dereg_mr(mr), kOk);
    EXPECT_EQ(table().lookup_remote(key, pd(), 0, kRr, addr(), 8).error, MemError::kBadKey);
    EXPECT_EQ(table().lookup_local(key, pd(), 0, addr(), 8).error, MemError::kBadKey);
  }
}

// 10,000 registrations with deregistrations between them (up to 500 live): each new tag is
// non-zero and unlike every live one, a key is refused as kBadKey as soon as its region is
// deregistered, every live key is found, and over the run the keys spread like uniform draws —
// a reused slot gets a new random tag, not one tied to the slot.
TEST_F(MrTest, ChurnKeepsTagsDistinctAndUniform) {
  std::mt19937 pick(1);
  std::vector<Mr*> live;
  std::unordered_set<uint32_t> live_tags;
  std::vector<uint32_t> keys;
  for (int i = 0; i < 10'000; ++i) {
    while (live.size() >= 500 || (!live.empty() && pick() % 2 == 0)) {
      const size_t j = pick() % live.size();
      const uint32_t key = live[j]->rkey();
      ASSERT_EQ(dev_.dereg_mr(live[j]), kOk);
      live_tags.erase(key >> 8);
      live[j] = live.back();
      live.pop_back();
      EXPECT_EQ(table().lookup_remote(key, pd(), 0, kRr, addr(), 8).error, MemError::kBadKey);
    }
    Mr* mr = reg(kLw | kRr, addr(), 64);
    ASSERT_NE(mr, nullptr);
    const uint32_t tag = mr->rkey() >> 8;
    EXPECT_NE(tag, 0u);
    EXPECT_TRUE(live_tags.insert(tag).second) << "tag " << std::hex << tag << " is live twice";
    live.push_back(mr);
    keys.push_back(mr->rkey());
  }
  for (Mr* mr : live) {
    EXPECT_TRUE(table().lookup_local(mr->lkey(), pd(), kLw, addr(), 64).ok());
    EXPECT_TRUE(table().lookup_remote(mr->rkey(), pd(), 0, kRr, addr(), 64).ok());
  }
  expect_uniform_tags(keys);
}

// A seeded table (the simulation's key_seed) gives the same keys, bit for bit, through the same
// registrations, deregistrations and window operations; another seed gives others, and so do
// two unseeded tables (getrandom(2)).
// An engine turn's lookups share one hold of the table's lock (MrTable::TurnHold). A change
// made on the turn's own thread gives the hold back first instead of waiting for itself, and
// the lookups after it take it again and see the change.
TEST_F(MrTest, ATurnsOwnChangeDoesNotWaitForItsHold) {
  Mr* mr = reg(kLw | kRw, addr());
  {
    const MrTable::TurnHold hold(table());
    EXPECT_TRUE(table().lookup_remote(mr->rkey(), pd(), 1, kRw, addr(), 64).ok());
    Result<Mw*> mw = table().alloc_mw(pd(), IBV_MW_TYPE_2);  // exclusive, on this thread
    ASSERT_TRUE(mw.ok());
    EXPECT_EQ(table().mw_by_handle(mw.value()->handle()), mw.value());
    EXPECT_TRUE(table().lookup_local(mr->lkey(), pd(), kLw, addr(), 64).ok());
    EXPECT_EQ(table().dealloc_mw(mw.value()), kOk);
  }
  EXPECT_EQ(table().dereg(mr), kOk);  // the hold ended with the turn
}

// A registration on another thread waits for the running turn's hold (one hold for all of the
// turn's lookups), and a lookup that comes after the waiting registration waits for it: the
// lock prefers writers, so turns that follow each other cannot keep a registration out.
TEST_F(MrTest, ARegistrationWaitsForTheRunningTurnAndGoesBeforeLaterLookups) {
  Mr* mr = reg(kLw | kRw, addr());
  std::atomic<bool> holding{false}, release{false}, registered{false}, looked_up{false};
  std::thread turn([&] {
    const MrTable::TurnHold hold(table());
    EXPECT_TRUE(table().lookup_remote(mr->rkey(), pd(), 1, kRw, addr(), 64).ok());
    holding = true;
    while (!release) std::this_thread::yield();
  });
  while (!holding) std::this_thread::yield();
  std::vector<uint8_t> other(4096);
  std::thread writer([&] {
    EXPECT_TRUE(dev_.reg_mr(pd(), other.data(), other.size(), 0, kLw).ok());
    registered = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::thread later([&] {
    EXPECT_TRUE(table().lookup_local(mr->lkey(), pd(), kLw, addr(), 64).ok());
    looked_up = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(registered) << "a registration went through a turn's hold";
  EXPECT_FALSE(looked_up) << "a lookup went past a waiting registration";
  release = true;
  turn.join();
  writer.join();
  later.join();
  EXPECT_TRUE(registered);
  EXPECT_TRUE(looked_up);
}

TEST(MrTableKeys, SeededTablesRepeatTheirKeysUnseededOnesDoNot) {
  const auto keys = [](std::optional<uint64_t> seed) {
    MrTable t(kLimits.max_mr, kLimits.max_mw, seed);
    Pd pd(1);
    std::vector<uint8_t> buf(64);
    std::mt19937 script(3);  // the same operations for every table
    std::vector<Mr*> mrs;
    std::vector<uint32_t> out;
    for (int i = 0; i < 10'000; ++i) {
      if (!mrs.empty() && script() % 3 == 0) {
        const size_t j = script() % mrs.size();
        EXPECT_EQ(t.dereg(mrs[j]), kOk);
        mrs[j] = mrs.back();
        mrs.pop_back();
      }
      Mr* mr = t.reg(&pd, buf.data(), buf.size(), 0, kLw).value();
      mrs.push_back(mr);
      out.push_back(mr->rkey());
      if (i % 100 == 0) {
        Mw* mw = t.alloc_mw(&pd, IBV_MW_TYPE_1).value();
        out.push_back(mw->rkey());
        out.push_back(t.next_mw_rkey(mw));
        EXPECT_EQ(t.dealloc_mw(mw), kOk);
      }
    }
    for (Mr* mr : mrs) EXPECT_EQ(t.dereg(mr), kOk);
    return out;
  };
  EXPECT_EQ(keys(7), keys(7));
  EXPECT_NE(keys(7), keys(8));
  EXPECT_NE(keys(std::nullopt), keys(std::nullopt));
}

// The unseeded source buffers bytes from getrandom(2); a forked child must not hand out the
// bytes its parent buffered before the fork (both would then issue the same keys).
TEST(MrTableKeys, AForkedChildDrawsBytesOfItsOwn) {
  KeySource source(std::nullopt);
  std::array<uint8_t, 16> before;
  source.fill(before);  // the rest of the buffer is now the parent's next bytes
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::array<uint8_t, 16> drawn;
    source.fill(drawn);
    _exit(write(fds[1], drawn.data(), drawn.size()) == static_cast<ssize_t>(drawn.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::array<uint8_t, 16> parent;
  source.fill(parent);
  std::array<uint8_t, 16> from_child{};
  EXPECT_EQ(read(fds[0], from_child.data(), from_child.size()),
            static_cast<ssize_t>(from_child.size()));
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_NE(parent, from_child);
}

// With a seed the source's bytes are a function of the seed alone.
TEST(MrTableKeys, ASeededSourceRepeatsItsBytes) {
  const auto bytes = [](std::optional<uint64_t> seed) {
    KeySource source(seed);
    std::vector<uint8_t> out(1000);
    source.fill(out);
    return out;
  };
  EXPECT_EQ(bytes(5), bytes(5));
  EXPECT_NE(bytes(5), bytes(6));
  EXPECT_NE(bytes(std::nullopt), bytes(std::nullopt));
}

TEST_F(MrTest, TheTableIsBounded) {
  std::vector<Mr*> mrs;
  for (uint32_t i = 0; i < kLimits.max_mr; ++i) mrs.push_back(reg(kLw, addr(), 8));
  EXPECT_EQ(dev_.reg_mr(pd(), buf_.data(), 8, addr(), kLw).error(), ENOMEM);
  ASSERT_EQ(dev_.dereg_mr(mrs.back()), kOk);
  EXPECT_TRUE(dev_.reg_mr(pd(), buf_.data(), 8, addr(), kLw).ok());
}

// Implicit ODP: the whole address space registers only with ON_DEMAND, and every access
// through it is checked against the process's mappings (a failed page fault), so a peer's
// address the process has not mapped, or mapped without the right, is refused instead of
// crashing the engine. An ordinary MR is never probed.
TEST_F(MrTest, ImplicitOdpRefusesPagesTheProcessHasNotMapped) {
  ASSERT_TRUE(implicit_odp_supported()) << "Linux >= 5.14 has MADV_POPULATE_READ/WRITE";
  EXPECT_EQ(dev_.reg_mr(pd(), nullptr, kMax, 0, kLw | kRw).error(), EINVAL);  // not ON_DEMAND
  EXPECT_EQ(dev_.reg_mr(pd(), nullptr, kMax, 4096, kLw | IBV_ACCESS_ON_DEMAND).error(), EINVAL);
  Result<Mr*> r = dev_.reg_mr(pd(), nullptr, kMax, 0,
                              kLw | kRw | kRr | kRa | IBV_ACCESS_ON_DEMAND | IBV_ACCESS_MW_BIND);
  ASSERT_TRUE(r.ok()) << r.error();
  Mr* all = r.value();
  EXPECT_TRUE(all->implicit());
  const long page = sysconf(_SC_PAGESIZE);
  auto* rw = static_cast<uint8_t*>(
      mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(rw, MAP_FAILED);
  uint8_t* ro = rw + page;
  uint8_t* none = rw + 2 * page;
  uint8_t* gone = rw + 3 * page;
  ASSERT_EQ(mprotect(ro, page, PROT_READ), 0);
  ASSERT_EQ(mprotect(none, page, PROT_NONE), 0);
  ASSERT_EQ(munmap(gone, page), 0);
  auto va = [](const uint8_t* p) { return reinterpret_cast<uintptr_t>(p); };
  const MrTable& t = table();
  const uint32_t key = all->rkey();
  // Mapped with the right: granted, at the address named.
  MemRef ok = t.lookup_remote(key, pd(), 0, kRw, va(rw) + 8, 100);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.addr, rw + 8);
  EXPECT_TRUE(t.lookup_remote(key, pd(), 0, kRa, va(rw), 8).ok());
  EXPECT_TRUE(t.lookup_remote(key, pd(), 0, kRr, va(ro), 64).ok());
  EXPECT_TRUE(t.lookup_local(key, pd(), 0, va(ro), 64).ok());
  // A read-only page is not written, a PROT_NONE page not read, an unmapped one not touched;
  // a range that runs from a good page into a bad one is refused whole.
  EXPECT_EQ(t.lookup_remote(key, pd(), 0, kRw, va(ro), 8).error, MemError::kUnmapped);
  EXPECT_EQ(t.lookup_remote(key, pd(), 0, kRa, va(ro), 8).error, MemError::kUnmapped);
  EXPECT_EQ(t.lookup_local(key, pd(), kLw, va(ro), 8).error, MemError::kUnmapped);
  EXPECT_EQ(t.lookup_remote(key, pd(), 0, kRr, va(none), 8).error, MemError::kUnmapped);
  EXPECT_EQ(t.lookup_remote(key, pd(), 0, kRr, va(gone), 8).error, MemError::kUnmapped);
  EXPECT_EQ(t.lookup_remote(key, pd(), 0, kRw, va(rw) + page - 4, 8).error, MemError::kUnmapped);
  EXPECT_EQ(t.lookup_remote(key, pd(), 0, kRr, 0, 8).error, MemError::kUnmapped);
  EXPECT_EQ(t.lookup_remote(key, pd(), 0, kRr, kMax - 8, 8).error, MemError::kUnmapped);
  // A window bound over the implicit MR is checked the same way.
  Result<Mw*> w = dev_.alloc_mw(pd(), IBV_MW_TYPE_1);
  ASSERT_TRUE(w.ok());
  MwBindOp bind{w.value()->handle(), 0x11, all->handle(), va(rw), 3 * uint64_t(page), kRr | kRw};
  ASSERT_TRUE(table().bind_mw_st(pd(), 0, bind).ok());
  const uint32_t wkey = w.value()->rkey();
  EXPECT_TRUE(t.lookup_remote(wkey, pd(), 0, kRw, va(rw), 8).ok());
  EXPECT_EQ(t.lookup_remote(wkey, pd(), 0, kRw, va(ro), 8).error, MemError::kUnmapped);
  EXPECT_EQ(t.lookup_remote(wkey, pd(), 0, kRr, va(none), 8).error, MemError::kUnmapped);
  ASSERT_TRUE(dev_.dealloc_mw(w.value()).ok());
  // An ordinary MR over the same pages is not probed: its pages are the application's word.
  Mr* plain = dev_.reg_mr(pd(), ro, page, va(ro), kLw | kRw).value();
  EXPECT_FALSE(plain->implicit());
  EXPECT_TRUE(t.lookup_remote(plain->rkey(), pd(), 0, kRw, va(ro), 8).ok());
  EXPECT_TRUE(dev_.dereg_mr(plain).ok());
  EXPECT_TRUE(dev_.dereg_mr(all).ok());
  ASSERT_EQ(munmap(rw, 3 * page), 0);
}

TEST_F(MrTest, Rereg) {
  Mr* mr = reg(kLw, addr(), 4096);
  const uint32_t key = mr->rkey();
  EXPECT_EQ(dev_.rereg_mr(mr, 0, nullptr, nullptr, 0, 0, 0).error(), EINVAL);
  EXPECT_EQ(dev_.rereg_mr(mr, 1 << 3, nullptr, nullptr, 0, 0, 0).error(), EINVAL);
  // Access: remote read added.
  EXPECT_FALSE(table().lookup_remote(key, pd(), 0, kRr, addr(), 8).ok());
  ASSERT_EQ(dev_.rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 0, kLw | kRr), kOk);
  EXPECT_TRUE(table().lookup_remote(key, pd(), 0, kRr, addr(), 8).ok());
  EXPECT_EQ(dev_.rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 0, kRw).error(),
            EINVAL);
  // Translation: the second half of the buffer at a new IOVA.
  ASSERT_EQ(dev_.rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, buf_.data() + 4096, 4096,
                          0x5000, 0),
            kOk);
  const MemRef ref = table().lookup_remote(key, pd(), 0, kRr, 0x5000, 4096);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref.addr, buf_.data() + 4096);
  EXPECT_EQ(mr->rkey(), key) << "rereg keeps the keys";
  // PD.
  Pd* other = dev_.alloc_pd().value();
  ASSERT_EQ(dev_.rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, other, nullptr, 0, 0, 0), kOk);
  EXPECT_EQ(table().lookup_remote(key, pd(), 0, kRr, 0x5000, 8).error, MemError::kWrongPd);
  EXPECT_TRUE(table().lookup_remote(key, other, 0, kRr, 0x5000, 8).ok());
  EXPECT_EQ(dev_.dealloc_pd(other).error(), EBUSY);
  EXPECT_EQ(dev_.dealloc_pd(pd()), kOk) << "the MR moved away from the first PD";
  pd_ = nullptr;
}

TEST_F(MrTest, PdWithRegionsCannotBeDeallocated) {
  Mr* mr = reg(kLw, addr());
  EXPECT_EQ(dev_.dealloc_pd(pd()).error(), EBUSY);
  ASSERT_EQ(dev_.dereg_mr(mr), kOk);
  EXPECT_EQ(dev_.dealloc_pd(pd()), kOk);
  pd_ = nullptr;
}

}  // namespace
}  // namespace urdma::provider::testing
