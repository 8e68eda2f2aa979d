// Work queue entries and the receive queue shared by QPs and SRQs.
//
// Design: a posted WR is copied, at post time, into a compact entry in a ring the engine
// consumes: `SendWqe` for the send queue, `RecvWqe` for receive queues. Variable-size parts
// (SGE lists, inline data) live in a per-slot side area of fixed size, so a ring entry is
// small and never points into application memory that the application may reuse after the
// post returns (inline data is copied; SGE lists are copied; AH contents are copied).
// Only what the posting thread knew at post time is here: the engine keeps every per-WQE
// execution state (PSNs, retry counts, bytes sent) in its own structures.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>

#include <infiniband/verbs.h>

#include "provider/ah.h"
#include "provider/limits.h"
#include "provider/mr_table.h"
#include "provider/queue_memory.h"
#include "provider/spsc_ring.h"
#include "provider/status.h"

namespace urdma::provider {

struct SendWqe {
  uint64_t wr_id;
  uint64_t length;  // message length: sum of SGE lengths, or the inline byte count
  ibv_wr_opcode opcode;
  uint32_t send_flags;       // IBV_SEND_* (INLINE is set iff the data was copied inline)
  uint32_t num_sge;          // SGEs in the side area (0 when inline)
  uint32_t slot;             // side-area index
  uint32_t imm_data;         // *_WITH_IMM: network byte order, as posted
  uint32_t invalidate_rkey;  // SEND_WITH_INV, LOCAL_INV
  // RDMA and atomics.
  uint64_t remote_addr;
  uint32_t rkey;
  uint64_t compare_add;  // also ATOMIC WRITE's 8 bytes, as posted, when sent inline
  uint64_t swap;
  // XRC_SEND: the XRC SRQ the message is for (the XRCETH).
  uint32_t xrc_remote_srqn;
  // UD.
  uint32_t remote_qpn;
  uint32_t remote_qkey;
  AddressVector av;
  // BIND_MW.
  MwBindOp bind;
};

// A receive WQE as the engine takes it: its own copy of the SGE list.
struct RecvWork {
  uint64_t wr_id = 0;
  uint32_t num_sge = 0;
  uint64_t length = 0;  // sum of SGE lengths
  std::array<ibv_sge, kLimits.max_sge> sge = {};
  std::span<const ibv_sge> sges() const { return {sge.data(), num_sge}; }
};

struct RecvWqe {
  uint64_t wr_id;
  uint32_t num_sge;
  uint32_t slot;
};

// Not thread-safe: the owner serialises producers (post mutex) and consumers (engine).
class RecvQueue {
 public:
  // The ring and its SGE area from `allocator` (null: malloc), as `type` (kRq or kSrq).
  RecvQueue(uint32_t max_wr, uint32_t max_sge, QueueBuffer type,
            const std::shared_ptr<QueueAllocator>& allocator)
      : ring_(max_wr, type, allocator),
        max_sge_(max_sge),
        sges_(make_queue_array<ibv_sge>(size_t{ring_.slots()} * (max_sge ? max_sge : 1), allocator,
                                        type)) {}

  uint32_t max_wr() const { return ring_.capacity(); }
  uint32_t max_sge() const { return max_sge_; }
  uint32_t size() const { return ring_.size(); }

  // Validates and appends one WR: EINVAL for too many SGEs, ENOMEM when full.
  Status post(const ibv_recv_wr& wr) {
    if (wr.num_sge < 0 || static_cast<uint32_t>(wr.num_sge) > max_sge_) return Status(EINVAL);
    RecvWqe* wqe = ring_.producer_slot();
    if (wqe == nullptr) return Status(ENOMEM);
    const uint32_t slot = ring_.producer_slot_index();
    wqe->wr_id = wr.wr_id;
    wqe->num_sge = static_cast<uint32_t>(wr.num_sge);
    wqe->slot = slot;
    for (int i = 0; i < wr.num_sge; ++i) sges_[size_t{slot} * max_sge_ + i] = wr.sg_list[i];
    ring_.publish();
    return kOk;
  }

  // Consumer: copies the oldest WQE out and releases it.
  bool take(RecvWork& out) {
    const RecvWqe* wqe = ring_.peek();
    if (wqe == nullptr) return false;
    out.wr_id = wqe->wr_id;
    out.num_sge = wqe->num_sge;
    out.length = 0;
    for (uint32_t i = 0; i < wqe->num_sge; ++i) {
      out.sge[i] = sges_[size_t{wqe->slot} * max_sge_ + i];
      out.length += out.sge[i].length;
    }
    ring_.pop();
    return true;
  }

  void clear() { ring_.clear(); }

  // Where the ring and the SGE area are (tests).
  const void* ring_data() const { return ring_.data(); }
  const void* sge_data() const { return sges_.get(); }

 private:
  SpscRing<RecvWqe> ring_;
  const uint32_t max_sge_;
  QueueArray<ibv_sge> sges_;
};

}  // namespace urdma::provider
