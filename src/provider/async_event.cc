// Asynchronous event queue; see async_event.h.
#include "provider/async_event.h"

namespace urdma::provider {

void AsyncEventQueue::set_notify(std::function<void()> notify) {
  std::lock_guard lock(mutex_);
  notify_ = std::move(notify);
}

void AsyncEventQueue::push(const AsyncEvent& event) {
  std::function<void()> notify;
  {
    std::lock_guard lock(mutex_);
    if (events_.size() >= kMaxPendingEvents) {
      ++dropped_;
      return;
    }
    events_.push_back(event);
    notify = notify_;
  }
  if (notify) notify();
}

std::optional<AsyncEvent> AsyncEventQueue::try_pop(
    const std::function<void(const AsyncEvent&)>& under_lock) {
  std::lock_guard lock(mutex_);
  if (events_.empty()) return std::nullopt;
  AsyncEvent event = events_.front();
  events_.pop_front();
  if (under_lock && !event.discarded) under_lock(event);
  return event;
}

void AsyncEventQueue::discard(const void* object) {
  std::function<void(const void*)> hook;
  {
    std::lock_guard lock(mutex_);
    for (AsyncEvent& e : events_) {
      if (e.cq != object && e.qp != object && e.srq != object) continue;
      e.discarded = true;
      e.cq = nullptr;
      e.qp = nullptr;
      e.srq = nullptr;
    }
    hook = discard_hook_;
  }
  if (hook) hook(object);
}

void AsyncEventQueue::set_discard_hook(std::function<void(const void*)> hook) {
  std::lock_guard lock(mutex_);
  discard_hook_ = std::move(hook);
}

size_t AsyncEventQueue::size() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

uint64_t AsyncEventQueue::dropped() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

}  // namespace urdma::provider
