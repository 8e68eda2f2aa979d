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

std::optional<AsyncEvent> AsyncEventQueue::try_pop() {
  std::lock_guard lock(mutex_);
  if (events_.empty()) return std::nullopt;
  AsyncEvent event = events_.front();
  events_.pop_front();
  return event;
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
