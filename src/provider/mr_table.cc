// MR/MW table and the access check; see mr_table.h for the design.
#include "provider/mr_table.h"

#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <mutex>
#include <new>
#include <utility>

#include "base/check.h"
#include "provider/engine_turn.h"

namespace urdma::provider {
namespace {

// The table whose lock this thread's engine turn holds shared (MrTable::TurnHold), if any, and
// whether the turn has taken the hold yet.
thread_local const MrTable* t_turn_table = nullptr;
thread_local bool t_turn_held = false;

// The host address `offset` bytes into a region starting at `base`. An implicit ODP MR starts at
// address 0 (base nullptr): the sum is taken on integers, where pointer arithmetic on a null
// pointer would be undefined.
uint8_t* at_offset(uint8_t* base, uint64_t offset) {
  return reinterpret_cast<uint8_t*>(reinterpret_cast<uintptr_t>(base) + offset);
}

// IB_UVERBS_ACCESS_FLUSH_GLOBAL / _PERSISTENT: the device implements no FLUSH operation.
constexpr int kAccessFlush = (1 << 8) | (1 << 9);
// IBV_ACCESS_OPTIONAL_RANGE: hints a device may ignore (ibv_reg_mr(3)).
constexpr int kAccessOptional = ((1 << 29) << 1) - (1 << 20);

// ibv_reg_mr(3) / IBA 10.6.3.2: remote write or atomic rights need local write.
bool remote_write_without_local(int access) {
  return (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0 &&
         (access & IBV_ACCESS_LOCAL_WRITE) == 0;
}

Status check_mr_access(int access) {
  access &= ~kAccessOptional;
  if (access & kAccessFlush) return Status(EOPNOTSUPP);
  if (access & ~kMrAccessKnown) return Status(EINVAL);
  if (remote_write_without_local(access)) return Status(EINVAL);
  return kOk;
}

// Does [start, start + length) run past the top of the 64-bit space? Ending exactly at 2^64
// is fine: the last byte is 2^64 - 1.
bool wraps(uint64_t start, uint64_t length) {
  return length != 0 && start > ~uint64_t{0} - (length - 1);
}

#ifndef MADV_POPULATE_READ
constexpr int MADV_POPULATE_READ = 22;  // Linux 5.14 (uapi asm-generic/mman-common.h)
constexpr int MADV_POPULATE_WRITE = 23;
#endif

uintptr_t page_bytes() {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// An implicit ODP MR: the whole address space (ibv_reg_mr(3): address 0, SIZE_MAX bytes).
bool whole_address_space(const void* addr, uint64_t length) {
  return addr == nullptr && length == ~uint64_t{0};
}

}  // namespace

TableLock::TableLock() {
  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&rw_, &attr);
  pthread_rwlockattr_destroy(&attr);
}

TableLock::~TableLock() { pthread_rwlock_destroy(&rw_); }

void TableLock::lock() {
  base::check(pthread_rwlock_wrlock(&rw_) == 0, "MR table lock: wrlock failed");
}
void TableLock::unlock() { pthread_rwlock_unlock(&rw_); }
void TableLock::lock_shared() {
  base::check(pthread_rwlock_rdlock(&rw_) == 0, "MR table lock: rdlock failed");
}
void TableLock::unlock_shared() { pthread_rwlock_unlock(&rw_); }

// Shared for one call, or the turn's hold (taken now if the turn has not yet).
class MrTable::ReadGuard {
 public:
  explicit ReadGuard(const MrTable& t) : t_(t), own_(t_turn_table != &t) {
    if (own_) {
      t.mutex_.lock_shared();
    } else if (!t_turn_held) {
      t.mutex_.lock_shared();
      t_turn_held = true;
    }
  }
  ~ReadGuard() {
    if (own_) t_.mutex_.unlock_shared();
  }
  ReadGuard(const ReadGuard&) = delete;
  ReadGuard& operator=(const ReadGuard&) = delete;

 private:
  const MrTable& t_;
  const bool own_;
};

// Exclusive for one call; a turn that holds the lock shared gives its hold back first.
class MrTable::WriteGuard {
 public:
  explicit WriteGuard(const MrTable& t) : t_(t) {
    if (t_turn_table == &t && t_turn_held) {
      t.mutex_.unlock_shared();
      t_turn_held = false;
    }
    t.mutex_.lock();
  }
  ~WriteGuard() { t_.mutex_.unlock(); }
  WriteGuard(const WriteGuard&) = delete;
  WriteGuard& operator=(const WriteGuard&) = delete;

 private:
  const MrTable& t_;
};

MrTable::TurnHold::TurnHold(const MrTable& table) : outer_(t_turn_table) {
  if (outer_ == &table) return;  // a turn inside this table's turn: its hold serves both
  if (outer_ != nullptr && t_turn_held) outer_->mutex_.unlock_shared();
  t_turn_table = &table;
  t_turn_held = false;
}

MrTable::TurnHold::~TurnHold() {
  const MrTable* const mine = t_turn_table;
  if (outer_ == mine) return;
  if (t_turn_held) mine->mutex_.unlock_shared();
  // The outer turn's hold, given back above, is taken again by its next lookup.
  t_turn_table = outer_;
  t_turn_held = false;
}

bool pages_accessible(const uint8_t* addr, uint64_t length, bool write) {
  if (length == 0) return true;
  const uintptr_t first = reinterpret_cast<uintptr_t>(addr) & ~(page_bytes() - 1);
  // The range never ends past 2^64 - 1 (range_inside); madvise rounds the length up to pages
  // and refuses (EINVAL) a range whose rounded end wraps, as no page there can be mapped.
  const uint64_t span = reinterpret_cast<uintptr_t>(addr) - first + length;
  for (;;) {
    // ENOMEM: a page is not mapped; EFAULT/EINVAL: not with that right (PROT_NONE, read-only
    // for a write, a mapping that cannot fault) or not at all; EINTR: asked again.
    if (madvise(reinterpret_cast<void*>(first), span,
                write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0)
      return true;
    if (errno != EINTR) return false;
  }
}

bool implicit_odp_supported() {
  static const bool supported = [] {
    // A byte of our own data is mapped and writable: only an unknown advice fails here.
    static uint8_t probe[1];
    return pages_accessible(probe, 1, true);
  }();
  return supported;
}

const char* mem_error_name(MemError e) {
  static constexpr const char* kNames[] = {
      "ok",          "bad key",  "wrong PD", "access denied", "out of bounds",
      "invalidated", "wrong QP", "unmapped"};
  return kNames[static_cast<size_t>(e)];
}

KeySource::KeySource(std::optional<uint64_t> seed) {
  if (seed) {
    std::seed_seq seq{static_cast<uint32_t>(*seed), static_cast<uint32_t>(*seed >> 32)};
    replay_.emplace(seq);
  }
}

void KeySource::refill() {
  if (replay_) {
    for (size_t i = 0; i < kPoolBytes; i += 8) {
      const uint64_t v = (*replay_)();
      for (size_t b = 0; b < 8; ++b) pool_[i + b] = static_cast<uint8_t>(v >> (8 * b));
    }
  } else {
    // Up to 256 bytes, getrandom(2) returns all of them once the kernel's pool is initialised;
    // before that it may block, and a signal may interrupt it: then it is asked again.
    size_t got = 0;
    while (got < kPoolBytes) {
      const ssize_t n = getrandom(pool_.data() + got, kPoolBytes - got, 0);
      if (n < 0) {
        base::check(errno == EINTR, "getrandom(2) failed: no random bits for memory keys");
        continue;
      }
      got += static_cast<size_t>(n);
    }
    pid_ = getpid();
  }
  used_ = 0;
}

void KeySource::fill(std::span<uint8_t> out) {
  // Bytes buffered before a fork(2) are the parent's too: the child draws its own.
  if (!replay_ && used_ < kPoolBytes && getpid() != pid_) used_ = kPoolBytes;
  for (uint8_t& b : out) {
    if (used_ == kPoolBytes) refill();
    b = pool_[used_++];
  }
}

MrTable::MrTable(uint32_t max_mr, uint32_t max_mw, std::optional<uint64_t> key_seed)
    : max_mr_(max_mr), max_mw_(max_mw), key_index_(kKeyIndexMin), random_(key_seed) {
  // Every live MR and MW needs its own non-zero tag.
  assert(uint64_t{max_mr} + max_mw < (uint64_t{1} << (32 - kKeyBits)) - 1);
}

template <class Slot>
bool MrTable::grow(SlotChunks<Slot>& slots, uint32_t limit, uint32_t first_index,
                   std::vector<uint32_t>& free_list) {
  const uint32_t old_size = slots.size();
  try {
    free_list.reserve(free_list.size() + SlotChunks<Slot>::kChunk);
    if (slots.grow(limit) == 0) return false;
  } catch (const std::bad_alloc&) {
    return false;
  }
  // A random "previous" key byte per slot, so that the slot's first key byte is uniform too.
  std::array<uint8_t, SlotChunks<Slot>::kChunk> previous;
  random_.fill(std::span(previous).first(slots.size() - old_size));
  for (uint32_t i = slots.size(); i-- > old_size;) {
    Slot& slot = slots[i];
    slot.index_ = first_index + i;
    slot.last_key_byte_ = previous[i - old_size];
    free_list.push_back(slot.index_);
  }
  return true;
}

// mr_slot, mw_slot and find_tag are inline: every lookup runs them.
inline Mr* MrTable::mr_slot(uint32_t index) const {
  if (index == 0 || index > mrs_.size()) return nullptr;
  return &mrs_[index - 1];
}

inline Mw* MrTable::mw_slot(uint32_t index) const {
  if (index <= max_mr_ || index - max_mr_ - 1 >= mws_.size()) return nullptr;
  return &mws_[index - max_mr_ - 1];
}

inline const MrTable::KeyEntry* MrTable::find_tag(uint32_t tag) const {
  // The load factor is at most 1/4, so the probe meets an empty entry. Tag 0 is never stored:
  // it stops at the first empty entry like any absent tag.
  const size_t mask = key_index_.size() - 1;
  for (size_t i = tag & mask;; i = (i + 1) & mask) {
    const KeyEntry& e = key_index_[i];
    if (e.tag == 0) return nullptr;
    if (e.tag == tag) return &e;
  }
}

bool MrTable::reserve_tag() {
  if (kKeyIndexSlack * (size_t{live_keys_} + 1) <= key_index_.size()) return true;
  std::vector<KeyEntry> bigger;
  try {
    bigger.resize(2 * key_index_.size());
  } catch (const std::bad_alloc&) {
    return false;
  }
  const std::vector<KeyEntry> old = std::exchange(key_index_, std::move(bigger));
  live_keys_ = 0;
  for (const KeyEntry& e : old) {
    if (e.tag != 0) insert_tag(e.tag, e.handle);
  }
  return true;
}

void MrTable::insert_tag(uint32_t tag, uint32_t handle) {
  assert(tag != 0 && kKeyIndexSlack * (size_t{live_keys_} + 1) <= key_index_.size());
  const size_t mask = key_index_.size() - 1;
  size_t i = tag & mask;
  while (key_index_[i].tag != 0) i = (i + 1) & mask;
  key_index_[i] = {tag, handle};
  ++live_keys_;
}

void MrTable::erase_tag(uint32_t tag) {
  const size_t mask = key_index_.size() - 1;
  size_t hole = tag & mask;
  while (key_index_[hole].tag != tag) {
    assert(key_index_[hole].tag != 0);
    hole = (hole + 1) & mask;
  }
  // Backward shift: each later entry of the probe run whose home slot lies cyclically at or
  // before the hole moves into it, so every entry stays reachable from its home without
  // tombstones.
  for (size_t i = (hole + 1) & mask; key_index_[i].tag != 0; i = (i + 1) & mask) {
    const size_t home = key_index_[i].tag & mask;
    if (((i - home) & mask) >= ((i - hole) & mask)) {
      key_index_[hole] = key_index_[i];
      hole = i;
    }
  }
  key_index_[hole] = {};
  --live_keys_;
}

uint32_t MrTable::fresh_tag() {
  // IBA 10.6.3.1 leaves the key's layout to the CA: 24 uniformly random bits, redrawn when 0
  // or a live object's. At most 2^20 of the 2^24 tags are live, so a draw is kept with
  // probability at least 15/16; 64 draws all refused would be a broken generator.
  for (int draws = 0; draws < 64; ++draws) {
    std::array<uint8_t, 3> b;
    random_.fill(b);
    const uint32_t tag = uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16;
    if (tag != 0 && find_tag(tag) == nullptr) return tag;
  }
  base::check(false, "no free memory key tag in 64 random draws");
  return 0;
}

uint8_t MrTable::fresh_key_byte(uint8_t previous) {
  // Uniform over the 255 bytes other than the previous one, so a slot's old key never names its
  // new occupant.
  for (int draws = 0; draws < 64; ++draws) {
    uint8_t b;
    random_.fill(std::span(&b, 1));
    if (b != previous) return b;
  }
  base::check(false, "the same key byte in 64 random draws");
  return 0;
}

uint32_t MrTable::take_free(std::vector<uint32_t>& free_list) {
  assert(!free_list.empty());
  const uint32_t index = free_list.back();
  free_list.pop_back();
  return index;
}

Result<Mr*> MrTable::reg(Pd* pd, void* addr, uint64_t length, uint64_t iova, int access,
                         std::optional<uint32_t> dm_handle) {
  if (pd == nullptr) return Status(EINVAL);
  if (Status s = check_mr_access(access); !s.ok()) return s;
  if (length > kLimits.max_mr_size_bytes) return Status(EINVAL);
  // The whole address space: implicit ODP only, at IOVA 0 (mlx5's create_user_odp_mr); without
  // ON_DEMAND ib_umem_get refuses it (its page-aligned end wraps).
  const bool implicit = whole_address_space(addr, length);
  if (implicit && ((access & IBV_ACCESS_ON_DEMAND) == 0 ||
                   (iova != 0 && (access & IBV_ACCESS_ZERO_BASED) == 0) || dm_handle.has_value() ||
                   !implicit_odp_supported()))
    return Status(EINVAL);
  // The host range and the IOVA range must not wrap (ib_umem_get's overflow check).
  if (wraps(reinterpret_cast<uintptr_t>(addr), length)) return Status(EINVAL);
  if (access & IBV_ACCESS_ZERO_BASED) iova = 0;
  if (wraps(iova, length)) return Status(EINVAL);

  const WriteGuard lock(*this);
  if (free_mrs_.empty() && !grow(mrs_, max_mr_, 1, free_mrs_)) return Status(ENOMEM);
  if (!reserve_tag()) return Status(ENOMEM);
  Mr& mr = mrs_[take_free(free_mrs_) - 1];
  assert(!mr.live_);
  const uint32_t tag = fresh_tag();
  insert_tag(tag, mr.index_);
  mr.last_key_byte_ = fresh_key_byte(mr.last_key_byte_);
  mr.key_ = (tag << kKeyBits) | mr.last_key_byte_;
  mr.live_ = true;
  mr.pd_ = pd;
  mr.addr_ = static_cast<uint8_t*>(addr);
  mr.iova_ = iova;
  mr.length_ = length;
  mr.access_ = access & ~kAccessOptional;
  mr.bound_mws_ = 0;
  mr.on_dm_ = dm_handle.has_value();
  mr.implicit_ = implicit;
  mr.dm_handle_ = dm_handle.value_or(0);
  mr.user_context = nullptr;
  pd->add_user();
  return &mr;
}

Status MrTable::rereg(Mr* mr, int flags, Pd* pd, void* addr, uint64_t length, uint64_t iova,
                      int access) {
  if (mr == nullptr) return Status(EINVAL);
  // ibv_rereg_mr(3): flags must be a non-empty subset of IBV_REREG_MR_FLAGS_SUPPORTED.
  if (flags == 0 || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED)) return Status(EINVAL);
  const bool new_translation = flags & IBV_REREG_MR_CHANGE_TRANSLATION;
  const bool new_pd = flags & IBV_REREG_MR_CHANGE_PD;
  const bool new_access = flags & IBV_REREG_MR_CHANGE_ACCESS;
  if (new_pd && pd == nullptr) return Status(EINVAL);

  const WriteGuard lock(*this);
  if (!mr->live_ || mr->on_dm_) return Status(EINVAL);
  const int next_access = new_access ? (access & ~kAccessOptional) : mr->access_;
  if (new_access) {
    if (Status s = check_mr_access(access); !s.ok()) return s;
  }
  uint8_t* next_addr = new_translation ? static_cast<uint8_t*>(addr) : mr->addr_;
  uint64_t next_length = new_translation ? length : mr->length_;
  uint64_t next_iova = new_translation ? iova : mr->iova_;
  if ((next_access & IBV_ACCESS_ZERO_BASED) != 0) next_iova = 0;
  if (new_translation &&
      (wraps(reinterpret_cast<uintptr_t>(next_addr), next_length) || wraps(next_iova, next_length)))
    return Status(EINVAL);
  // Windows bound to the region name its memory and PD: they must be invalidated first.
  if (mr->bound_mws_ != 0 && (new_translation || new_pd || new_access)) return Status(EBUSY);

  if (new_pd && pd != mr->pd_) {
    mr->pd_->remove_user();
    pd->add_user();
    mr->pd_ = pd;
  }
  const bool next_implicit = whole_address_space(next_addr, next_length);
  if (next_implicit && ((next_access & IBV_ACCESS_ON_DEMAND) == 0 || next_iova != 0 ||
                        !implicit_odp_supported()))
    return Status(EINVAL);
  mr->implicit_ = next_implicit;
  mr->addr_ = next_addr;
  mr->length_ = next_length;
  mr->iova_ = next_iova;
  mr->access_ = next_access;
  return kOk;
}

Status MrTable::dereg(Mr* mr) {
  if (mr == nullptr) return Status(EINVAL);
  const WriteGuard lock(*this);
  if (!mr->live_) return Status(EINVAL);
  // IBA 10.6.7.2.6; rxe_dereg_mr returns EINVAL while windows are bound.
  if (mr->bound_mws_ != 0) return Status(EINVAL);
  erase_tag(mr->key_ >> kKeyBits);
  mr->live_ = false;
  mr->pd_->remove_user();
  mr->pd_ = nullptr;
  mr->key_ = 0;
  free_mrs_.push_back(mr->index_);
  return kOk;
}

Mr* MrTable::mr_by_handle(uint32_t handle) const {
  const ReadGuard lock(*this);
  Mr* mr = mr_slot(handle);
  return mr != nullptr && mr->live_ ? mr : nullptr;
}

Status MrTable::advise_ranges(const Pd* pd, bool write, std::span<const ibv_sge> sges,
                              std::vector<std::span<uint8_t>>* out) const {
  const ReadGuard lock(*this);
  for (const ibv_sge& sge : sges) {
    const KeyEntry* entry = find_tag(sge.lkey >> kKeyBits);
    const Mr* mr = entry != nullptr ? mr_slot(entry->handle) : nullptr;
    if (mr == nullptr || mr->key_ != sge.lkey) return Status(ENOENT);
    if ((mr->access_ & IBV_ACCESS_ON_DEMAND) == 0) return Status(EINVAL);
    if (mr->pd_ != pd) return Status(EPERM);
    if (write && (mr->access_ & IBV_ACCESS_LOCAL_WRITE) == 0) return Status(EPERM);
    if (!range_inside(sge.addr, sge.length, mr->iova_, mr->length_)) return Status(EFAULT);
    out->emplace_back(at_offset(mr->addr_, sge.addr - mr->iova_), sge.length);
  }
  return kOk;
}

Result<Mw*> MrTable::alloc_mw(Pd* pd, ibv_mw_type type) {
  if (pd == nullptr) return Status(EINVAL);
  if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) return Status(EINVAL);
  const WriteGuard lock(*this);
  if (free_mws_.empty() && !grow(mws_, max_mw_, max_mr_ + 1, free_mws_)) return Status(ENOMEM);
  if (!reserve_tag()) return Status(ENOMEM);
  Mw& mw = mws_[take_free(free_mws_) - max_mr_ - 1];
  assert(!mw.live_);
  // IBA 10.6.7 / o10-37: the tag is the window's for its lifetime; binds change the key byte.
  const uint32_t tag = fresh_tag();
  insert_tag(tag, mw.index_);
  mw.last_key_byte_ = fresh_key_byte(mw.last_key_byte_);
  mw.key_ = (tag << kKeyBits) | mw.last_key_byte_;
  mw.live_ = true;
  mw.pd_ = pd;
  mw.type_ = type;
  mw.bound_ = false;
  mw.user_context = nullptr;
  pd->add_user();
  return &mw;
}

void MrTable::unbind_locked(Mw& mw) {
  if (!mw.bound_) return;
  Mr* mr = mr_slot(mw.mr_index_);
  assert(mr != nullptr && mr->bound_mws_ > 0);
  --mr->bound_mws_;
  mw.bound_ = false;
  mw.host_ = nullptr;
  mw.implicit_ = false;
  mw.iova_ = 0;
  mw.length_ = 0;
  mw.access_ = 0;
  mw.qp_num_ = 0;
}

Status MrTable::dealloc_mw(Mw* mw) {
  if (mw == nullptr) return Status(EINVAL);
  const WriteGuard lock(*this);
  if (!mw->live_) return Status(EINVAL);
  unbind_locked(*mw);
  erase_tag(mw->key_ >> kKeyBits);
  mw->live_ = false;
  mw->key_ = 0;
  mw->pd_->remove_user();
  mw->pd_ = nullptr;
  free_mws_.push_back(mw->index_);
  return kOk;
}

Mw* MrTable::mw_by_handle(uint32_t handle) const {
  const ReadGuard lock(*this);
  Mw* mw = mw_slot(handle);
  return mw != nullptr && mw->live_ ? mw : nullptr;
}

uint32_t MrTable::next_mw_rkey(const Mw* mw) {
  const WriteGuard lock(*this);
  // ibv_inc_rkey(3) and IBA 10.6.7: a new key byte under the window's tag.
  return (mw->key_ & ~kKeyByteMask) | fresh_key_byte(static_cast<uint8_t>(mw->key_));
}

MemRef MrTable::lookup_local(uint32_t lkey, const Pd* pd, int access, uint64_t addr,
                             uint64_t length) const {
  const ReadGuard lock(*this);
  const KeyEntry* entry = find_tag(lkey >> kKeyBits);
  if (entry == nullptr) return {nullptr, MemError::kBadKey};
  // An lkey only ever names an MR: MWs have no lkey (IBA 10.6.7).
  const Mr* mr = mr_slot(entry->handle);
  if (mr == nullptr || mr->key_ != lkey) return {nullptr, MemError::kBadKey};
  if (mr->pd_ != pd) return {nullptr, MemError::kWrongPd};
  if ((mr->access_ & access) != access) return {nullptr, MemError::kAccessDenied};
  if (!range_inside(addr, length, mr->iova_, mr->length_)) return {nullptr, MemError::kOutOfBounds};
  uint8_t* host = at_offset(mr->addr_, addr - mr->iova_);
  if (mr->implicit_ && !pages_accessible(host, length, (access & IBV_ACCESS_LOCAL_WRITE) != 0))
    return {nullptr, MemError::kUnmapped};
  return {host, MemError::kGranted};
}

MemRef MrTable::lookup_remote(uint32_t rkey, const Pd* pd, uint32_t qp_num, int access, uint64_t va,
                              uint64_t length) const {
  const ReadGuard lock(*this);
  const KeyEntry* entry = find_tag(rkey >> kKeyBits);
  if (entry == nullptr) return {nullptr, MemError::kBadKey};
  // IBA 10.6.3.1 / C9-94: R_Key must name a valid region in the QP's PD with the right rights.
  if (const Mr* mr = mr_slot(entry->handle)) {
    if (mr->key_ != rkey) return {nullptr, MemError::kBadKey};
    if (mr->pd_ != pd) return {nullptr, MemError::kWrongPd};
    if ((mr->access_ & access) != access) return {nullptr, MemError::kAccessDenied};
    if (!range_inside(va, length, mr->iova_, mr->length_)) return {nullptr, MemError::kOutOfBounds};
    uint8_t* host = at_offset(mr->addr_, va - mr->iova_);
    // A peer's READ only reads; WRITE and ATOMIC write.
    if (mr->implicit_ && !pages_accessible(host, length, access != IBV_ACCESS_REMOTE_READ))
      return {nullptr, MemError::kUnmapped};
    return {host, MemError::kGranted};
  }
  const Mw* mw = mw_slot(entry->handle);
  assert(mw != nullptr && mw->live_);
  if (mw->key_ != rkey) return {nullptr, MemError::kBadKey};
  if (!mw->bound_) return {nullptr, MemError::kInvalidated};
  if (mw->pd_ != pd) return {nullptr, MemError::kWrongPd};
  // IBA 10.6.7.2.2: a type 2B window is accessible only through the QP it is bound to.
  if (mw->type_ == IBV_MW_TYPE_2 && mw->qp_num_ != qp_num) return {nullptr, MemError::kWrongQp};
  if ((mw->access_ & access) != access) return {nullptr, MemError::kAccessDenied};
  if (!range_inside(va, length, mw->iova_, mw->length_)) return {nullptr, MemError::kOutOfBounds};
  uint8_t* host = at_offset(mw->host_, va - mw->iova_);
  if (mw->implicit_ && !pages_accessible(host, length, access != IBV_ACCESS_REMOTE_READ))
    return {nullptr, MemError::kUnmapped};
  return {host, MemError::kGranted};
}

Status MrTable::bind_mw_st(const Pd* qp_pd, uint32_t qp_num, const MwBindOp& op) {
  URDMA_ASSERT_ENGINE_TURN();
  const WriteGuard lock(*this);
  Mw* mw = mw_slot(op.mw_handle);
  if (mw == nullptr || !mw->live_) return Status(EINVAL);
  // IBA 10.6.7.2 (C10-72 for type 2, o10-36.2.x for type 1): the QP and MW share a PD.
  if (mw->pd_ != qp_pd) return Status(EINVAL);
  if (mw->type_ == IBV_MW_TYPE_2) {
    // o10-37.2.30: a type 2 window must be free (invalidated) to be bound again.
    if (mw->bound_) return Status(EINVAL);
    // o10-37.2.40: type 2 needs an MR and a non-zero length.
    if (op.mr_handle == 0 || op.length == 0) return Status(EINVAL);
  } else {
    // Type 1 windows cannot be zero based (ibv_bind_mw(3)).
    if (op.access & IBV_ACCESS_ZERO_BASED) return Status(EINVAL);
  }
  if (op.access & ~kMwBindAccessAccepted) return Status(EINVAL);

  // A type 1 bind of length 0 unbinds the window, whatever MR it names (rxe_bind_mw: no MR
  // without a length); type 2 was refused above.
  Mr* mr = nullptr;
  if (op.length != 0) {
    mr = mr_slot(op.mr_handle);
    if (mr == nullptr || !mr->live_) return Status(EINVAL);
    // C10-74: the MR and the window share a PD.
    if (mr->pd_ != mw->pd_) return Status(EACCES);
    // C10-73: the MR allows binding.
    if ((mr->access_ & IBV_ACCESS_MW_BIND) == 0) return Status(EACCES);
    // C10-75: remote write/atomic through the window needs local write on the MR.
    if (remote_write_without_local(op.access | (mr->access_ & IBV_ACCESS_LOCAL_WRITE)))
      return Status(EACCES);
    // C10-76: the window lies inside the MR.
    if (!range_inside(op.addr, op.length, mr->iova_, mr->length_)) return Status(EINVAL);
  }

  unbind_locked(*mw);  // type 1: a rebind replaces the previous binding
  // o10-37 / IBA 10.6.7: a bind changes the key byte only; the tag stays the window's.
  mw->last_key_byte_ = static_cast<uint8_t>(op.new_rkey);
  mw->key_ = (mw->key_ & ~kKeyByteMask) | mw->last_key_byte_;
  if (mr == nullptr) return kOk;  // type 1 zero-length bind: unbound, new key
  ++mr->bound_mws_;
  mw->bound_ = true;
  mw->mr_index_ = mr->index_;
  mw->host_ = at_offset(mr->addr_, op.addr - mr->iova_);
  mw->implicit_ = mr->implicit_;
  mw->iova_ = (op.access & IBV_ACCESS_ZERO_BASED) ? 0 : op.addr;
  mw->length_ = op.length;
  mw->access_ = op.access & kRemoteAccess;
  mw->qp_num_ = mw->type_ == IBV_MW_TYPE_2 ? qp_num : 0;
  return kOk;
}

Status MrTable::invalidate_st(uint32_t rkey, const Pd* qp_pd, uint32_t qp_num, bool remote) {
  URDMA_ASSERT_ENGINE_TURN();
  const WriteGuard lock(*this);
  const KeyEntry* entry = find_tag(rkey >> kKeyBits);
  Mw* mw = entry != nullptr ? mw_slot(entry->handle) : nullptr;
  // MRs of this device are never invalidated by WR: only fast-register MRs could be, and the
  // device has none (rxe refuses LOCAL_INV on user MRs the same way).
  if (mw == nullptr || !mw->live_ || mw->key_ != rkey) return Status(EINVAL);
  // o10-37.2.x: type 1 windows are not invalidated by WRs.
  if (mw->type_ != IBV_MW_TYPE_2) return Status(EINVAL);
  if (!mw->bound_) return Status(EINVAL);
  if (mw->pd_ != qp_pd) return Status(EINVAL);
  // IBA 10.6.7.2.2: a remote invalidate must arrive on the QP the 2B window is bound to.
  if (remote && mw->qp_num_ != qp_num) return Status(EINVAL);
  unbind_locked(*mw);
  return kOk;
}

void MrTable::unbind_qp_windows(uint32_t qp_num) {
  const WriteGuard lock(*this);
  for (uint32_t i = 0; i < mws_.size(); ++i) {
    Mw& mw = mws_[i];
    if (mw.live_ && mw.bound_ && mw.type_ == IBV_MW_TYPE_2 && mw.qp_num_ == qp_num)
      unbind_locked(mw);
  }
}

}  // namespace urdma::provider
