// Shared receive queue; see srq.h.
#include "provider/srq.h"

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

Srq::Srq(uint32_t handle, Pd* pd, const ibv_srq_attr& attr, AsyncEventQueue* events,
         Doorbell* doorbell, std::shared_ptr<QueueAllocator> allocator, Xrcd* xrcd, Cq* cq)
    : handle_(handle),
      pd_(pd),
      events_(events),
      doorbell_(doorbell),
      allocator_(std::move(allocator)),
      xrcd_(xrcd),
      cq_(cq),
      queue_(std::make_unique<RecvQueue>(attr.max_wr, attr.max_sge, QueueBuffer::kSrq,
                                         allocator_)),
      limit_(attr.srq_limit) {}

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

}  // namespace urdma::provider
