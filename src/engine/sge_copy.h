// Walking scatter/gather lists, with the MR table's access check on every SGE (IBA 10.6.3.x /
// 10.6.7: the L_Key, the PD and the access rights are checked for each local access). Each SGE
// is checked whole before any byte of it is touched, so the pointer arithmetic inside it can
// never leave the registered range.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>

#include <infiniband/verbs.h>

#include "provider/mr_table.h"

namespace urdma::engine {

enum class SgeDirection : uint8_t {
  kFromSges,  // gather: the device reads the memory (no access right needed beyond the L_Key)
  kToSges,    // scatter: the device writes the memory (IBV_ACCESS_LOCAL_WRITE, IBA 10.6.3.1)
};

// Calls fn(uint8_t* host_addr, uint64_t n) for each contiguous piece of bytes
// [offset, offset + length) of the SGE list's concatenation, in order, after the SGE holding
// the piece passed its access check. False when an SGE touched fails its check or the list is
// too short; pieces before it were already handed to fn (the caller fails the whole WQE).
template <typename Fn>
bool for_each_sge_piece(const provider::MrTable& mrs, const provider::Pd* pd,
                        std::span<const ibv_sge> sges, uint64_t offset, uint64_t length,
                        SgeDirection dir, Fn&& fn) {
  const int access = dir == SgeDirection::kToSges ? IBV_ACCESS_LOCAL_WRITE : 0;
  uint64_t done = 0;
  for (const ibv_sge& sge : sges) {
    if (done == length) break;
    if (offset >= sge.length) {
      offset -= sge.length;
      continue;
    }
    const provider::MemRef ref = mrs.lookup_local(sge.lkey, pd, access, sge.addr, sge.length);
    if (!ref.ok()) return false;
    const uint64_t n = std::min<uint64_t>(sge.length - offset, length - done);
    fn(ref.addr + offset, n);
    done += n;
    offset = 0;
  }
  return done == length;
}

// Copies bytes [offset, offset + data.size()) of the SGE list's concatenation to or from
// `data`, with for_each_sge_piece's checks and result.
inline bool copy_sges(const provider::MrTable& mrs, const provider::Pd* pd,
                      std::span<const ibv_sge> sges, uint64_t offset, std::span<uint8_t> data,
                      SgeDirection dir) {
  uint8_t* cursor = data.data();
  return for_each_sge_piece(mrs, pd, sges, offset, data.size(), dir, [&](uint8_t* mem, uint64_t n) {
    if (dir == SgeDirection::kToSges)
      std::memcpy(mem, cursor, n);
    else
      std::memcpy(cursor, mem, n);
    cursor += n;
  });
}

}  // namespace urdma::engine
