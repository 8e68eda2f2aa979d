// Completion queue; see cq.h.
#include "provider/cq.h"

#include <algorithm>
#include <new>
#include <utility>

#include "provider/completion_clock.h"
#include "provider/limits.h"
#include "provider/engine_turn.h"

namespace urdma::provider {

Cq::Cq(uint32_t handle, uint32_t cqe, AsyncEventQueue* events, CqOptions options)
    : handle_(handle),
      events_(events),
      options_(std::move(options)),
      ring_(std::make_unique<SpscRing<Completion>>(cqe, QueueBuffer::kCq, options_.allocator)) {}

Cq::~Cq() {
  if (options_.armed_count != nullptr && armed())
    options_.armed_count->fetch_sub(1, std::memory_order_seq_cst);
}

uint32_t Cq::cqe() const {
  std::lock_guard lock(producer_mutex_);
  return ring_->capacity();
}

uint32_t Cq::size() const {
  std::lock_guard lock(producer_mutex_);
  return ring_->size();
}

const void* Cq::ring_data() const {
  std::lock_guard lock(producer_mutex_);
  return ring_->data();
}

int Cq::poll(int max_entries, ibv_wc* out) {
  std::lock_guard lock(poll_mutex_);
  int n = 0;
  while (n < max_entries) {
    const Completion* c = ring_->peek();
    if (c == nullptr) break;
    out[n] = c->wc;
    scrub_tm_info(out[n++]);
    ring_->pop();
  }
  return n;
}

int Cq::poll(int max_entries, Completion* out) {
  std::lock_guard lock(poll_mutex_);
  int n = 0;
  while (n < max_entries) {
    const Completion* c = ring_->peek();
    if (c == nullptr) break;
    out[n++] = *c;
    ring_->pop();
  }
  return n;
}

void Cq::req_notify(bool solicited_only) {
  // An existing "next completion" arming is not narrowed by a later solicited-only request
  // (IBA 11.4.2.2: the CQ fires on the least restrictive pending request).
  //
  // Always a successful read-modify-write of arm_ (a CAS that writes, even the same value):
  // push_st reads arm_ with a read-modify-write too, after its ring write, so the two RMWs are
  // ordered in arm_'s modification order. Either the producer's comes later and sees the
  // arming (it notifies), or it comes first and this RMW reads from it (acquire), so the
  // caller's next poll() sees the completion. Without that, a completion pushed just as the CQ
  // is armed could be neither polled nor notified (ibv_req_notify_cq(3): arm, then poll to
  // catch what arrived before the arming).
  uint8_t cur = arm_.load(std::memory_order_relaxed);
  for (;;) {
    const uint8_t want = (!solicited_only || cur == kArmedNext) ? kArmedNext : kArmedSolicited;
    if (arm_.compare_exchange_weak(cur, want, std::memory_order_acq_rel, std::memory_order_relaxed))
      break;
  }
  if (cur == kDisarmed && options_.armed_count != nullptr)
    options_.armed_count->fetch_add(1, std::memory_order_seq_cst);
}

void Cq::set_notify(std::function<void(Cq&)> notify) {
  std::lock_guard lock(notify_mutex_);
  notify_ = std::move(notify);
}

Status Cq::resize(uint32_t cqe) {
  if (cqe == 0 || cqe > kLimits.max_cqe) return Status(EINVAL);
  std::scoped_lock lock(producer_mutex_, poll_mutex_);
  const uint32_t present = ring_->size();
  if (cqe < present) return Status(EINVAL);
  std::unique_ptr<SpscRing<Completion>> ring;
  try {
    ring = std::make_unique<SpscRing<Completion>>(cqe, QueueBuffer::kCq, options_.allocator);
  } catch (const std::bad_alloc&) {
    return Status(ENOMEM);
  }
  for (const Completion* c; (c = ring_->peek()) != nullptr; ring_->pop()) {
    const bool pushed = ring->push(*c);
    assert(pushed);
    (void)pushed;
  }
  ring_ = std::move(ring);
  return kOk;
}

uint32_t Cq::discard_qp(uint32_t qp_num) {
  std::scoped_lock lock(producer_mutex_, poll_mutex_);
  return ring_->remove_if([qp_num](const Completion& c) { return c.wc.qp_num == qp_num; });
}

bool Cq::push_st(const ibv_wc& wc, bool solicited) {
  URDMA_ASSERT_ENGINE_TURN();
  Completion c{.wc = wc, .completion_ts = 0, .wallclock_ns = 0};
  if (options_.completion_timestamp) c.completion_ts = completion_clock_ns();
  if (options_.wallclock_timestamp) c.wallclock_ns = wallclock_ns();
  {
    std::lock_guard lock(producer_mutex_);
    if (!ring_->push(c)) {
      // IBA 11.4.2.1: CQ overrun is an affiliated asynchronous error of the CQ.
      if (!error_.exchange(true, std::memory_order_acq_rel) && events_ != nullptr)
        events_->push({.type = IBV_EVENT_CQ_ERR, .cq = this});
      return false;
    }
  }
  // IBA 11.4.2.2: solicited-only arming fires on solicited and on unsuccessful completions.
  const bool matches_solicited = solicited || wc.status != IBV_WC_SUCCESS;
  // A read-modify-write, not a load: ordered after the ring write against req_notify's RMW
  // (see there).
  uint8_t arm = arm_.fetch_add(0, std::memory_order_acq_rel);
  while (arm != kDisarmed && (arm == kArmedNext || matches_solicited)) {
    if (arm_.compare_exchange_weak(arm, kDisarmed, std::memory_order_acq_rel)) {
      if (options_.armed_count != nullptr)
        options_.armed_count->fetch_sub(1, std::memory_order_seq_cst);
      std::lock_guard lock(notify_mutex_);
      if (notify_) notify_(*this);
      break;
    }
  }
  return true;
}

}  // namespace urdma::provider
