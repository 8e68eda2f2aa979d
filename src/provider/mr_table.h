// Memory regions, memory windows and THE access check.
//
// Design
// * Keys: one key space for MRs and MWs, key = (tag << 8) | key byte (IBA 10.6.3.1 leaves the
//   split to the CA; rxe splits at the same bit). The tag, the upper 24 bits, is drawn
//   uniformly at random for every registration and window allocation, never 0 and never the
//   tag of another live MR or MW; for an MW it is the window's identity, since ibv_inc_rkey(3)
//   and a type 2 bind change only the key byte (o10-37, IBA 10.6.7). The key byte is random and
//   never the slot's previous byte. So a peer guessing a key faces 24 unpredictable bits plus
//   the byte, not an index below the table's size. A stale key of a deregistered region never
//   names the slot's next occupant (another byte), and names a later region elsewhere only if
//   that one drew the same tag (probability 2^-24 per registration) and byte. lkey == rkey, as
//   on rxe.
// * Handles (ibv_mr.handle, ibv_mw.handle) are dense slot indices, MRs 1..max_mr and MWs after
//   them, the lowest never-used first and then the last freed; they never travel on the wire.
//   The slots live in chunks that never move (SlotChunks), so an Mr*/Mw* stays valid for the
//   table's lifetime while it grows.
// * Key index: from a tag to the handle, open addressing with linear probing, the home slot the
//   tag's low bits (tags are uniform: no hash is needed), load factor at most 1/4 (the index
//   doubles when a tag would pass it), deletion by backward shift (no tombstones). A lookup
//   reads 8-byte entries before the object itself, on average 1.17 for a live key and 1.39 for
//   a miss at load 1/4 (1.5 and 2.5 at 1/2): a number of probes that varies is a mispredicted
//   branch. The index takes 32 to 64 bytes per live key, no more than an Mr.
// * Random bits (KeySource): from getrandom(2) on a real device; from a seeded std::mt19937_64
//   only when DeviceConfig::key_seed asks for a replayable simulation.
// * Memory is the application's own (the engine runs in its process), so registration pins
//   nothing; ON_DEMAND is accepted as is, and an MR is (host address, IOVA, length, access).
// * Implicit ODP (ibv_reg_mr(3): address 0, length SIZE_MAX, IBV_ACCESS_ON_DEMAND) registers
//   the whole address space, so a peer may name an address the process has not mapped. Every
//   access granted through such an MR is first faulted in by the kernel as the access needs it
//   (madvise MADV_POPULATE_READ / MADV_POPULATE_WRITE over its pages, what the engine's access
//   would do next anyway): a page that is not mapped, or not with that right, refuses it
//   (MemError::kUnmapped: a remote access error or a local protection error, as a device's
//   failed page fault), where the engine's own access would have been SIGSEGV. Other MRs never
//   pay for it. Without ON_DEMAND the whole address space is EINVAL (ib_umem_get: its
//   page-aligned end wraps; mlx5 and rxe refuse it the same way). A kernel without
//   MADV_POPULATE_* (before 5.14) gets no implicit MRs (EINVAL) and the device does not offer
//   them (implicit_odp_supported).
// * lookup_local / lookup_remote are what the engine calls on every access. They return the
//   host pointer or the precise reason for refusal (MemError), which the engine maps to a
//   completion status or NAK (IBA 9.7.5.2.8 / 10.6.7). Bounds arithmetic never overflows.
// * Memory windows: type 1 (bound with ibv_bind_mw, which posts a bind WQE) and type 2B
//   (bound by a BIND_MW WR to one QP, invalidated by LOCAL_INV or a remote SEND_WITH_INV).
//   The bind itself executes on the engine thread in send-queue order (bind_mw_st), as rxe's
//   requester does, so the rules of IBA 10.6.7.2 are checked there.
// * Locking: one reader-writer lock that prefers writers (TableLock). Lookups (engine thread,
//   frequent) share it; reg/rereg/dereg/alloc/dealloc/next_mw_rkey (application threads) and
//   bind/invalidate (engine thread) take it exclusively; they alone draw random bits and change
//   the key index. An engine turn's lookups share one hold (TurnHold): the first takes it, the
//   turn's end gives it back, and so does a change the turn makes itself. A waiting writer goes
//   before the next turn's lookups, never after every turn to come.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <array>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include <infiniband/verbs.h>

#include "provider/limits.h"
#include "provider/pd.h"
#include "provider/slot_chunks.h"
#include "provider/status.h"

namespace urdma::provider {

// Access flags an MR accepts (bits 0..7 of ibv_access_flags).
inline constexpr int kMrAccessKnown = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                      IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
                                      IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB;
// Access flags an MW bind may grant (IBA 10.6.7.2: remote rights only, plus zero-based).
inline constexpr int kMwAccessKnown = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                      IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ZERO_BASED;
// Access flags a bind accepts: the above, and LOCAL_WRITE, which rdma-core's own tests pass
// (tests/test_mr.py) and rxe and mlx5 accept; a window has no lkey, so it grants nothing.
inline constexpr int kMwBindAccessAccepted = kMwAccessKnown | IBV_ACCESS_LOCAL_WRITE;
inline constexpr int kRemoteAccess =
    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// Why an access was refused. The engine maps these: on the requester's local SGEs every
// failure is IBV_WC_LOC_PROT_ERR; on the responder every failure is a NAK Remote Access Error
// (IBA 9.7.5.2.8, C9-94) and the requester completes with IBV_WC_REM_ACCESS_ERR.
enum class MemError : uint8_t {
  kGranted,
  kBadKey,        // no MR/MW with this key (index free, key byte stale, MW key used as lkey)
  kWrongPd,       // region's PD differs from the QP's
  kAccessDenied,  // a required access right is missing
  kOutOfBounds,   // [iova, iova+length) not inside the region
  kInvalidated,   // MW not bound (invalidated or never bound)
  kWrongQp,       // type 2B MW bound to another QP (IBA 10.6.7.2.2)
  kUnmapped,      // implicit ODP: the pages are not mapped with the right (a failed page fault)
};
const char* mem_error_name(MemError e);

struct MemRef {
  uint8_t* addr = nullptr;  // host address of iova; valid only when error == kOk
  MemError error = MemError::kBadKey;
  bool ok() const { return error == MemError::kGranted; }
};

class MrTable;

// A reader-writer lock that prefers writers (glibc's PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP):
// a writer waits for the readers it found, and readers that come after it wait for it. Not
// recursive: a thread must not take it shared twice (a waiting writer would block the second).
class TableLock {
 public:
  TableLock();
  ~TableLock();
  TableLock(const TableLock&) = delete;
  TableLock& operator=(const TableLock&) = delete;
  void lock();
  void unlock();
  void lock_shared();
  void unlock_shared();

 private:
  pthread_rwlock_t rw_;
};

// One cache line (64 bytes, aligned): the access check of a lookup reads one line of its region.
class alignas(64) Mr {
 public:
  uint32_t handle() const { return index_; }  // goes into ibv_mr.handle
  uint32_t lkey() const { return key_; }
  uint32_t rkey() const { return key_; }
  Pd* pd() const { return pd_; }
  void* addr() const { return addr_; }
  uint64_t iova() const { return iova_; }
  uint64_t length() const { return length_; }
  int access() const { return access_; }
  uint32_t bound_mw_count() const { return bound_mws_; }
  bool implicit() const { return implicit_; }
  // An MR over device memory (ibv_reg_dm_mr) names its DM's handle.
  std::optional<uint32_t> dm_handle() const {
    return on_dm_ ? std::optional<uint32_t>(dm_handle_) : std::nullopt;
  }

  void* user_context = nullptr;  // the verbs layer's ibv_mr

 private:
  friend class MrTable;
  uint32_t index_ = 0;
  uint32_t key_ = 0;
  bool live_ = false;
  uint8_t last_key_byte_ = 0;
  bool on_dm_ = false;
  bool implicit_ = false;  // the whole address space: every access probed (above)
  uint32_t dm_handle_ = 0;
  Pd* pd_ = nullptr;
  uint8_t* addr_ = nullptr;
  uint64_t iova_ = 0;
  uint64_t length_ = 0;
  int access_ = 0;
  uint32_t bound_mws_ = 0;
};
static_assert(sizeof(Mr) == 64, "an Mr is one cache line");

class Mw {
 public:
  uint32_t handle() const { return index_; }  // goes into ibv_mw.handle
  uint32_t rkey() const { return key_; }
  Pd* pd() const { return pd_; }
  ibv_mw_type type() const { return type_; }
  bool bound() const { return bound_; }
  uint64_t iova() const { return iova_; }
  uint64_t length() const { return length_; }
  int access() const { return access_; }
  uint32_t bound_qp_num() const { return qp_num_; }

  void* user_context = nullptr;  // the verbs layer's ibv_mw

 private:
  friend class MrTable;
  uint32_t index_ = 0;
  uint32_t key_ = 0;
  bool live_ = false;
  uint8_t last_key_byte_ = 0;
  Pd* pd_ = nullptr;
  ibv_mw_type type_ = IBV_MW_TYPE_1;
  // Binding (valid when bound_).
  bool bound_ = false;
  uint32_t mr_index_ = 0;
  uint8_t* host_ = nullptr;  // host address of the window's first byte
  bool implicit_ = false;    // bound to an implicit ODP MR: accesses are probed
  uint64_t iova_ = 0;        // address of the first byte as the peer names it (0 if zero based)
  uint64_t length_ = 0;
  int access_ = 0;
  uint32_t qp_num_ = 0;  // type 2B: the QP it is bound to
};

// A bind as the engine executes it, from a BIND_MW SendWqe (type 1 via ibv_bind_mw, or a
// type 2B BIND_MW WR).
struct MwBindOp {
  uint32_t mw_handle = 0;
  uint32_t new_rkey = 0;   // only the key byte is taken (the tag is the MW's)
  uint32_t mr_handle = 0;  // 0: no MR (type 1 unbind)
  uint64_t addr = 0;
  uint64_t length = 0;
  int access = 0;
};

// The random bits behind MR and MW keys.
//
// Without a seed (every real device) the bytes come from getrandom(2), the kernel's CSPRNG,
// kPoolBytes at a time. Every key a peer sees is output of this source, and a key is what it
// needs to reach the application's memory: a seeded PRNG such as std::mt19937_64 is a linear
// map of its state, so enough observed outputs give that state and with it every later key,
// whereas nothing a peer observes of the kernel's generator predicts its next bytes. A forked
// child drops the bytes buffered before the fork (the pid changed), so parent and child never
// hand out the same bits.
// With a seed (DeviceConfig::key_seed: a deterministic simulation) the bytes come from a
// std::mt19937_64 seeded with it, each draw's 8 bytes least significant first: the same seed
// gives the same bytes in any process on any host, so a replay repeats its keys bit for bit.
// Not synchronised: the owner's lock covers every draw.
class KeySource {
 public:
  static constexpr size_t kPoolBytes = 256;  // getrandom(2) never returns less for this size

  explicit KeySource(std::optional<uint64_t> seed);

  // Fills `out` with random bytes.
  void fill(std::span<uint8_t> out);

 private:
  void refill();

  std::optional<std::mt19937_64> replay_;  // only with a seed
  std::array<uint8_t, kPoolBytes> pool_{};
  size_t used_ = kPoolBytes;  // bytes of pool_ already handed out
  pid_t pid_ = 0;             // the process pool_ was filled in (unseeded)
};

class MrTable {
 public:
  // `key_seed`: seeds the key bits (a simulation's replay); nullopt = getrandom(2).
  MrTable(uint32_t max_mr, uint32_t max_mw, std::optional<uint64_t> key_seed = std::nullopt);
  MrTable(const MrTable&) = delete;
  MrTable& operator=(const MrTable&) = delete;

  // ibv_reg_mr / ibv_reg_mr_iova2 (ibv_reg_mr passes iova == addr). EINVAL for bad access
  // combinations or wrapping ranges, EOPNOTSUPP for FLUSH access, ENOMEM when full.
  // `dm_handle`: the region lies in that device memory (ibv_reg_dm_mr; Device checks it).
  Result<Mr*> reg(Pd* pd, void* addr, uint64_t length, uint64_t iova, int access,
                  std::optional<uint32_t> dm_handle = std::nullopt);
  // ibv_rereg_mr: `flags` are IBV_REREG_MR_CHANGE_*; fields not selected are kept. The keys
  // are kept. EBUSY when translation or PD would change under bound MWs; EINVAL for an MR
  // over device memory (the kernel's rule: its translation is the DM's).
  Status rereg(Mr* mr, int flags, Pd* pd, void* addr, uint64_t length, uint64_t iova, int access);
  // ibv_dereg_mr: EINVAL while memory windows are bound to it (IBA 10.6.7.2.6, as rxe).
  Status dereg(Mr* mr);
  Mr* mr_by_handle(uint32_t handle) const;
  // ibv_advise_mr(3)'s checks of its scatter list, and each SGE's host bytes into `out`: an
  // lkey of a live MR (ENOENT), registered with ON_DEMAND (EINVAL), in `pd` (EPERM), with
  // LOCAL_WRITE when `write` (EPERM), the range inside it (EFAULT).
  Status advise_ranges(const Pd* pd, bool write, std::span<const ibv_sge> sges,
                       std::vector<std::span<uint8_t>>* out) const;

  // ibv_alloc_mw / ibv_dealloc_mw. Dealloc of a bound window unbinds it.
  Result<Mw*> alloc_mw(Pd* pd, ibv_mw_type type);
  Status dealloc_mw(Mw* mw);
  Mw* mw_by_handle(uint32_t handle) const;
  // The rkey a type 1 bind through ibv_bind_mw will give `mw`: same tag, a fresh random
  // key byte. The table changes only when the engine executes the bind.
  uint32_t next_mw_rkey(const Mw* mw);

  // ---- engine thread ----
  // Held by Engine::poll for its turn: the lookups this thread makes on `table` meanwhile share
  // one hold of its lock, taken by the first of them and given back at the end, or before a
  // change this thread makes (bind, invalidate). A hold for another table (a turn of another
  // engine around this one) is given back first and taken again by its next lookup.
  class TurnHold {
   public:
    explicit TurnHold(const MrTable& table);
    ~TurnHold();
    TurnHold(const TurnHold&) = delete;
    TurnHold& operator=(const TurnHold&) = delete;

   private:
    const MrTable* outer_;
  };

  // Local access through an lkey (requester SGEs, responder receive SGEs). `access` is
  // IBV_ACCESS_LOCAL_WRITE when the device writes the memory, 0 when it only reads.
  MemRef lookup_local(uint32_t lkey, const Pd* pd, int access, uint64_t addr,
                      uint64_t length) const;
  // Remote access through an rkey (RETH / AtomicETH). `access` is REMOTE_READ, REMOTE_WRITE or
  // REMOTE_ATOMIC; `qp_num` is the local QP the request arrived on (type 2B windows).
  MemRef lookup_remote(uint32_t rkey, const Pd* pd, uint32_t qp_num, int access, uint64_t va,
                       uint64_t length) const;
  // Executes a bind for the QP (pd, qp_num). Any failure completes the WR with
  // IBV_WC_MW_BIND_ERR (IBA 10.6.7.2.x) and moves the QP to ERR; the errno says why.
  Status bind_mw_st(const Pd* qp_pd, uint32_t qp_num, const MwBindOp& op);
  // LOCAL_INV (remote=false) or SEND_WITH_INV arriving on QP qp_num (remote=true).
  // IBA 10.6.7.2.2 / o10-37.2.x: only a bound type 2 window whose rkey matches exactly, in the
  // QP's PD, and for a remote invalidate of a 2B window, bound to that QP. EINVAL otherwise.
  Status invalidate_st(uint32_t rkey, const Pd* qp_pd, uint32_t qp_num, bool remote);
  // Destroying a QP invalidates the type 2B windows bound to it, so that a later QP given the
  // same number cannot reach them (IBA 10.6.7.2.2 ties a 2B window to one QP).
  void unbind_qp_windows(uint32_t qp_num);

 private:
  // One entry of the key index: a live MR's or MW's tag and handle.
  struct KeyEntry {
    uint32_t tag = 0;  // 0: empty (no key has tag 0)
    uint32_t handle = 0;
  };
  static constexpr size_t kKeyIndexMin = 64;   // entries of the first key index
  static constexpr size_t kKeyIndexSlack = 4;  // entries per live tag, at least: load <= 1/4

  Mr* mr_slot(uint32_t index) const;
  Mw* mw_slot(uint32_t index) const;
  // The live MR's or MW's entry with this tag, or nullptr.
  const KeyEntry* find_tag(uint32_t tag) const;
  // Room in the key index for one more tag at load <= 1/4; false when memory ran out.
  bool reserve_tag();
  void insert_tag(uint32_t tag, uint32_t handle);
  void erase_tag(uint32_t tag);
  // A uniformly random tag, neither 0 nor a live object's.
  uint32_t fresh_tag();
  // A uniformly random key byte other than `previous`.
  uint8_t fresh_key_byte(uint8_t previous);
  uint32_t take_free(std::vector<uint32_t>& free_list);
  // Makes the next chunk of slots (indices from first_index + slots.size()) and puts them on
  // free_list, lowest index on top; false at the limit or when memory ran out.
  template <class Slot>
  bool grow(SlotChunks<Slot>& slots, uint32_t limit, uint32_t first_index,
            std::vector<uint32_t>& free_list);
  void unbind_locked(Mw& mw);

  const uint32_t max_mr_;
  const uint32_t max_mw_;
  class ReadGuard;
  class WriteGuard;
  mutable TableLock mutex_;
  SlotChunks<Mr> mrs_;              // index i at mrs_[i - 1]
  SlotChunks<Mw> mws_;              // index max_mr_ + 1 + j at mws_[j]
  std::vector<uint32_t> free_mrs_;  // a stack
  std::vector<uint32_t> free_mws_;
  std::vector<KeyEntry> key_index_;  // a power of two, >= kKeyIndexSlack * live_keys_
  uint32_t live_keys_ = 0;
  KeySource random_;
};

// Can this kernel fault a range in and say whether it is mapped (MADV_POPULATE_READ/WRITE,
// Linux 5.14)? Asked once. Implicit ODP needs it.
bool implicit_odp_supported();
// Are the pages of [addr, addr + length) mapped, readable and (if `write`) writable? Faults
// them in. True for length 0.
bool pages_accessible(const uint8_t* addr, uint64_t length, bool write);

// Overflow-safe: does [iova, iova + length) lie inside [base, base + size)?
inline constexpr bool range_inside(uint64_t iova, uint64_t length, uint64_t base, uint64_t size) {
  return iova >= base && length <= size && iova - base <= size - length;
}

}  // namespace urdma::provider
