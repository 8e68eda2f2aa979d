// Copying between packets and scatter/gather lists, with the MR table's access check on every
// SGE (IBA 10.6.3.x / 10.6.7: the L_Key, the PD and the access rights are checked for each
// local access). Each SGE is checked whole before any byte of it is touched, so the pointer
// arithmetic inside it can never leave the registered range.
#pragma once

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

// Copies bytes [offset, offset + data.size()) of the SGE list's concatenation to or from
// `data`. False when an SGE touched fails its access check or the list is too short; bytes
// already copied stay copied (the caller fails the whole WQE).
inline bool copy_sges(const provider::MrTable& mrs, const provider::Pd* pd,
                      std::span<const ibv_sge> sges, uint64_t offset, std::span<uint8_t> data,
                      SgeDirection dir) {
  const int access = dir == SgeDirection::kToSges ? IBV_ACCESS_LOCAL_WRITE : 0;
  size_t done = 0;
  for (const ibv_sge& sge : sges) {
    if (done == data.size()) break;
    if (offset >= sge.length) {
      offset -= sge.length;
      continue;
    }
    const provider::MemRef ref = mrs.lookup_local(sge.lkey, pd, access, sge.addr, sge.length);
    if (!ref.ok()) return false;
    const uint64_t n = std::min<uint64_t>(sge.length - offset, data.size() - done);
    if (dir == SgeDirection::kToSges)
      std::memcpy(ref.addr + offset, data.data() + done, n);
    else
      std::memcpy(data.data() + done, ref.addr + offset, n);
    done += n;
    offset = 0;
  }
  return done == data.size();
}

}  // namespace urdma::engine
