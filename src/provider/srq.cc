// Shared receive queue; see srq.h.
#include "provider/srq.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "provider/cq.h"
#include "provider/doorbell.h"
#include "provider/limits.h"
#include "provider/engine_turn.h"

namespace urdma::provider {

Status check_srq_init_attr(const ibv_srq_attr& attr) {
  // rxe_srq_chk_init: sizes within the device's, limit not above the size.
  if (attr.max_wr == 0 || attr.max_wr > kLimits.max_srq_wr) return Status(EINVAL);
  if (attr.max_sge > kLimits.max_srq_sge) return Status(EINVAL);
  if (attr.srq_limit > attr.max_wr) return Status(EINVAL);
  return kOk;
}

Status check_srq_tm_attr(const SrqTmAttr& attr) {
  if (attr.cq == nullptr) return Status(EINVAL);
  if (attr.max_num_tags == 0 || attr.max_num_tags > kTmMaxNumTags) return Status(EINVAL);
  if (attr.max_ops == 0 || attr.max_ops > kTmMaxOps) return Status(EINVAL);
  return kOk;
}

Srq::Srq(uint32_t handle, Pd* pd, const ibv_srq_attr& attr, AsyncEventQueue* events,
         Doorbell* doorbell, std::shared_ptr<QueueAllocator> allocator, Xrcd* xrcd, Cq* cq,
         std::optional<SrqTmAttr> tm)
    : handle_(handle),
      pd_(pd),
      events_(events),
      doorbell_(doorbell),
      allocator_(std::move(allocator)),
      xrcd_(xrcd),
      cq_(cq),
      queue_(std::make_unique<RecvQueue>(attr.max_wr, attr.max_sge, QueueBuffer::kSrq,
                                         allocator_)),
      limit_(attr.srq_limit),
      tm_(tm) {
  if (tm_) {
    slots_.resize(tm_->max_num_tags);
    for (uint32_t h = 0; h < tm_->max_num_tags; ++h) free_handles_.push_back(h);
    ops_.reserve(tm_->max_ops);
    running_ops_.reserve(tm_->max_ops);
  }
}

Status Srq::post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  Status status;
  bool posted = false;
  {
    std::lock_guard lock(post_mutex_);
    for (; wr != nullptr; wr = wr->next) {
      status = queue_->post(*wr);
      if (!status.ok()) break;
      posted = true;
    }
  }
  if (!status.ok() && bad_wr != nullptr) *bad_wr = wr;
  if (posted && doorbell_ != nullptr) doorbell_->ring_srq(*this);
  return status;
}

Status Srq::modify(const ibv_srq_attr& attr, int mask) {
  if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return Status(EINVAL);
  std::scoped_lock lock(post_mutex_, take_mutex_);
  uint32_t max_wr = queue_->max_wr();
  if (mask & IBV_SRQ_MAX_WR) {
    if (attr.max_wr == 0 || attr.max_wr > kLimits.max_srq_wr) return Status(EINVAL);
    if (attr.max_wr < queue_->size()) return Status(EINVAL);
    max_wr = ring_capacity_for(attr.max_wr);
  }
  if ((mask & IBV_SRQ_LIMIT) && attr.srq_limit > max_wr) return Status(EINVAL);
  if ((mask & IBV_SRQ_MAX_WR) && !(mask & IBV_SRQ_LIMIT) && limit_ > max_wr) return Status(EINVAL);
  if (mask & IBV_SRQ_MAX_WR) {
    std::unique_ptr<RecvQueue> queue;
    try {
      queue = std::make_unique<RecvQueue>(attr.max_wr, queue_->max_sge(), QueueBuffer::kSrq,
                                          allocator_);
    } catch (const std::bad_alloc&) {
      return Status(ENOMEM);
    }
    RecvWork work;
    while (queue_->take(work)) {
      ibv_recv_wr wr = {.wr_id = work.wr_id,
                        .next = nullptr,
                        .sg_list = work.sge.data(),
                        .num_sge = static_cast<int>(work.num_sge)};
      const Status s = queue->post(wr);
      assert(s.ok());
      (void)s;
    }
    queue_ = std::move(queue);
  }
  if (mask & IBV_SRQ_LIMIT) limit_ = attr.srq_limit;
  return kOk;
}

ibv_srq_attr Srq::query() const {
  std::scoped_lock lock(post_mutex_, take_mutex_);
  return {.max_wr = queue_->max_wr(), .max_sge = queue_->max_sge(), .srq_limit = limit_};
}

bool Srq::take_st(RecvWork& out) {
  URDMA_ASSERT_ENGINE_TURN();
  bool fire = false;
  {
    std::lock_guard lock(take_mutex_);
    if (!queue_->take(out)) return false;
    // IBA 10.2.9.2: the limit event fires when the WQE count drops below the armed limit.
    if (limit_ != 0 && queue_->size() < limit_) {
      limit_ = 0;
      fire = true;
    }
  }
  if (fire && events_ != nullptr) events_->push({.type = IBV_EVENT_SRQ_LIMIT_REACHED, .srq = this});
  return true;
}

uint32_t Srq::size() const {
  std::lock_guard lock(take_mutex_);
  return queue_->size();
}

// ---- tag matching ----

Status Srq::post_ops(ibv_ops_wr* wr, ibv_ops_wr** bad_wr) {
  if (!tm_) {
    if (bad_wr != nullptr) *bad_wr = wr;
    return Status(EOPNOTSUPP);
  }
  Status status;
  bool posted = false;
  {
    std::lock_guard lock(tm_mutex_);
    for (; wr != nullptr; wr = wr->next) {
      if (wr->flags & ~(IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC)) {
        status = Status(EINVAL);
        break;
      }
      if (ops_.size() >= tm_->max_ops) {
        status = Status(ENOMEM);
        break;
      }
      // The opcode as the caller stored it: any integer, read without assuming it is one of
      // the enumerators (an out-of-range enum load is undefined).
      std::underlying_type_t<ibv_ops_wr_opcode> raw_opcode;
      std::memcpy(&raw_opcode, &wr->opcode, sizeof raw_opcode);
      if (raw_opcode != IBV_WR_TAG_ADD && raw_opcode != IBV_WR_TAG_DEL &&
          raw_opcode != IBV_WR_TAG_SYNC) {
        status = Status(EINVAL);
        break;
      }
      PendingOp op{.wr_id = wr->wr_id,
                   .opcode = static_cast<ibv_ops_wr_opcode>(raw_opcode),
                   .flags = wr->flags,
                   .unexpected_cnt = wr->tm.unexpected_cnt,
                   .handle = 0};
      if (op.opcode == IBV_WR_TAG_ADD) {
        const auto& add = wr->tm.add;
        if (add.num_sge < 0 || static_cast<uint32_t>(add.num_sge) > kTmMaxSge ||
            (add.num_sge > 0 && add.sg_list == nullptr)) {
          status = Status(EINVAL);
          break;
        }
        if (free_handles_.empty()) {
          status = Status(ENOMEM);
          break;
        }
        op.handle = free_handles_.front();
        free_handles_.pop_front();
        TagSlot& slot = slots_[op.handle];
        slot = TagSlot{};
        slot.state = TagState::kPosted;
        slot.tag = add.tag;
        slot.mask = add.mask;
        slot.wr_id = add.recv_wr_id;
        slot.num_sge = static_cast<uint32_t>(add.num_sge);
        std::copy_n(add.sg_list, add.num_sge, slot.sge);
        wr->tm.handle = op.handle;
      } else if (op.opcode == IBV_WR_TAG_DEL) {
        // A handle whose tag was consumed meanwhile is the race ibv_post_srq_ops(3) reports in
        // the completion (IBV_WC_TM_ERR); one beyond the list is a bad argument.
        if (wr->tm.handle >= slots_.size()) {
          status = Status(EINVAL);
          break;
        }
        op.handle = wr->tm.handle;
      }
      ops_.push_back(op);
      posted = true;
    }
  }
  if (!status.ok() && bad_wr != nullptr) *bad_wr = wr;
  if (posted && doorbell_ != nullptr) doorbell_->srq_ops_posted(*this);
  return status;
}

void Srq::unlink(uint32_t handle) {
  TagSlot& s = slots_[handle];
  if (s.prev != kNone) slots_[s.prev].next = s.next; else list_head_ = s.next;
  if (s.next != kNone) slots_[s.next].prev = s.prev; else list_tail_ = s.prev;
  s.prev = s.next = kNone;
}

void Srq::run_ops_st() {
  URDMA_ASSERT_ENGINE_TURN();
  if (!tm_) return;
  running_ops_.clear();
  std::unique_lock lock(tm_mutex_);
  running_ops_.swap(ops_);
  for (const PendingOp& op : running_ops_) {
    // The count this operation says software has handled (IBV_OPS_TM_SYNC), else the one the
    // last synchronizing operation gave.
    if (op.flags & IBV_OPS_TM_SYNC) sw_unexpected_ = op.unexpected_cnt;
    const bool in_sync = sw_unexpected_ == hw_unexpected_;
    ibv_wc wc = {};
    wc.wr_id = op.wr_id;
    wc.status = IBV_WC_SUCCESS;
    switch (op.opcode) {
      case IBV_WR_TAG_ADD: {
        wc.opcode = IBV_WC_TM_ADD;
        TagSlot& s = slots_[op.handle];
        s.state = TagState::kListed;
        // Documentation/tag_matching.md: once a message was unexpected, tags that software added
        // without having seen it must not match until the two synchronize.
        s.enabled = in_sync;
        s.prev = list_tail_;
        s.next = kNone;
        if (list_tail_ != kNone) slots_[list_tail_].next = op.handle; else list_head_ = op.handle;
        list_tail_ = op.handle;
        break;
      }
      case IBV_WR_TAG_DEL: {
        wc.opcode = IBV_WC_TM_DEL;
        TagSlot& s = slots_[op.handle];
        if (s.state == TagState::kListed) {
          unlink(op.handle);
          s.state = TagState::kFree;
          free_handles_.push_back(op.handle);
        } else {
          wc.status = IBV_WC_TM_ERR;  // consumed by a message (or already deleted)
        }
        break;
      }
      default:
        wc.opcode = IBV_WC_TM_SYNC;
        break;
    }
    // In sync again: every tag still listed was added before, or with, what software has
    // seen, so it may match.
    if (in_sync) {
      for (uint32_t h = list_head_; h != kNone; h = slots_[h].next) slots_[h].enabled = true;
    } else {
      wc.wc_flags |= IBV_WC_TM_SYNC_REQ;
    }
    if ((op.flags & IBV_OPS_SIGNALED) || wc.status != IBV_WC_SUCCESS) {
      lock.unlock();
      (void)tm_->cq->push_st(wc, false);  // an overflow is the CQ's own error
      lock.lock();
    }
  }
}

std::optional<TagMatch> Srq::match_st(uint64_t tag) {
  URDMA_ASSERT_ENGINE_TURN();
  if (!tm_) return std::nullopt;
  std::lock_guard lock(tm_mutex_);
  for (uint32_t h = list_head_; h != kNone; h = slots_[h].next) {
    TagSlot& s = slots_[h];
    if (!s.enabled || (tag & s.mask) != (s.tag & s.mask)) continue;
    unlink(h);
    s.state = TagState::kConsumed;
    TagMatch m;
    m.handle = h;
    m.wr_id = s.wr_id;
    m.buffer.wr_id = s.wr_id;
    m.buffer.num_sge = s.num_sge;
    for (uint32_t i = 0; i < s.num_sge; ++i) {
      m.buffer.sge[i] = s.sge[i];
      m.buffer.length += s.sge[i].length;
    }
    return m;
  }
  return std::nullopt;
}

void Srq::release_tag_st(uint32_t handle) {
  URDMA_ASSERT_ENGINE_TURN();
  std::lock_guard lock(tm_mutex_);
  if (handle >= slots_.size() || slots_[handle].state != TagState::kConsumed) return;
  slots_[handle].state = TagState::kFree;
  free_handles_.push_back(handle);
}

bool Srq::count_unexpected_st() {
  URDMA_ASSERT_ENGINE_TURN();
  std::lock_guard lock(tm_mutex_);
  ++hw_unexpected_;
  return hw_unexpected_ - sw_unexpected_ > kTmMaxSyncDiff;
}

uint32_t Srq::unexpected_count() const {
  std::lock_guard lock(tm_mutex_);
  return hw_unexpected_;
}

}  // namespace urdma::provider
