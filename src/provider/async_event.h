// Asynchronous events: the provider's side of ibv_get_async_event.
//
// Design: the provider and the engine push `AsyncEvent` records (ibv_async_event's type plus
// which object it concerns) into the device's bounded `AsyncEventQueue`; the verbs layer pops
// them for ibv_get_async_event and translates object pointers to its ibv_* structs through
// each object's `user_context`. A notify hook (e.g. an eventfd write) tells the verbs layer
// that the queue went from empty to non-empty, so the async fd can become readable.
// Destroying an object discards its queued events.
// Overflowing the bounded queue drops the newest event and counts it (a real device's event
// queue is bounded too); nothing blocks the engine thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>

#include <infiniband/verbs.h>

namespace urdma::provider {

class Cq;
class Qp;
class Srq;

struct AsyncEvent {
  ibv_event_type type;
  // Exactly one of these is set, according to `type` (IBV_EVENT_PORT_* use `port_num`).
  Cq* cq = nullptr;
  Qp* qp = nullptr;
  Srq* srq = nullptr;
  uint8_t port_num = 0;
  // The object was destroyed while the event waited: it is delivered to no one (the kernel
  // drops a destroyed object's unread events, ib_uverbs_release_uevent).
  bool discarded = false;
};

class AsyncEventQueue {
 public:
  static constexpr size_t kMaxPendingEvents = 4096;

  // Called (outside the queue's lock) when an event was queued.
  void set_notify(std::function<void()> notify);

  // Thread-safe; any thread (engine or application) may push.
  void push(const AsyncEvent& event);
  // `under_lock` sees the event before the queue's lock is released, so it may read the object
  // the event names: discard() of that object waits for it.
  std::optional<AsyncEvent> try_pop(const std::function<void(const AsyncEvent&)>& under_lock = {});
  // Marks the queued events of a CQ, QP or SRQ about to be destroyed `discarded`; each still
  // counts as one queued event (the async fd counts them), but names no object. Then calls the
  // discard hook (outside the lock), so queues the events were copied into discard them too.
  void discard(const void* object);
  void set_discard_hook(std::function<void(const void*)> hook);
  size_t size() const;
  uint64_t dropped() const;

 private:
  mutable std::mutex mutex_;
  std::deque<AsyncEvent> events_;
  uint64_t dropped_ = 0;
  std::function<void()> notify_;
  std::function<void(const void*)> discard_hook_;
};

}  // namespace urdma::provider
