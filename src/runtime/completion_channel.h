// Completion channels and the async event fd: real file descriptors that work with poll/epoll
// and with blocking reads, as ibv_get_cq_event(3) and ibv_get_async_event(3) describe.
//
// Design: each is an eventfd in semaphore mode (EFD_SEMAPHORE) whose counter is the number of
// queued events. The producer (the engine, in the CQ's notify hook; any thread for async
// events) queues the event under a short lock, then adds 1 to the counter; a consumer's read()
// takes 1 — blocking while there is none, unless the application made the fd O_NONBLOCK
// (EAGAIN) — and then pops one event, which is therefore already queued. The fd is readable
// exactly while events wait, so poll/epoll/select on it work as on rdma-core's channel fd.
//
// An event produced by the turn of the thread that waits for it (Runtime::wait_readable: the
// thread blocked in get_event takes the turn of the datagram it waits for) is handed to it in
// memory instead: queued as above but counted in direct_, not in the eventfd, so that thread
// neither writes the eventfd nor wakes on it and reads it back (three syscalls saved per
// event; a syscall can cost over a microsecond on a VM). Only while that thread is inside
// get_event, which takes the event right after the turn; when one turn fires two CQs of the
// channel, the first is that thread's and the others go to the eventfd, so other consumers of
// the fd still see every event that nobody is about to take.
//
// Arm/poll races: an event is queued for every firing of an armed CQ, and the CQ's arming and
// its producer are ordered by seq_cst fences (provider/cq.cc), so the documented consumer loop
// — get_event, ack, req_notify, then poll the CQ until empty — never sleeps on a completion
// that arrived after its last poll (ibv_get_cq_event(3), "the user should ... call
// ibv_req_notify_cq() ... and then poll").
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "provider/async_event.h"
#include "provider/cq.h"
#include "provider/status.h"

namespace urdma::runtime {

// Who waits for a channel's fd to become readable in a blocking ibv_get_cq_event: the runtime,
// which drives the engine from the waiting thread (Runtime::wait_readable).
class EventWaiter {
 public:
  virtual ~EventWaiter() = default;
  // Returns 0 once `fd` may be readable or `delivered` became true (an event this thread's own
  // turn produced was handed to it in memory: CompletionChannel), or an errno (EINTR: a signal
  // ended the wait) — only while `delivered` is false, so no handed-over event is left behind.
  virtual int wait_readable(int fd, const bool& delivered) = 0;
  // This thread took an event (get_event returns it).
  virtual void event_taken() {}
};

// ibv_create_comp_channel / ibv_get_cq_event / ibv_ack_cq_events.
class CompletionChannel {
 public:
  explicit CompletionChannel(EventWaiter* waiter = nullptr);
  ~CompletionChannel();
  CompletionChannel(const CompletionChannel&) = delete;
  CompletionChannel& operator=(const CompletionChannel&) = delete;

  // The channel's fd (ibv_comp_channel.fd): readable while events wait.
  int fd() const { return fd_; }

  // ibv_create_cq with this channel: the CQ's notify hook queues an event here.
  void attach(provider::Cq& cq);
  // Before destroying the CQ: after this returns the CQ queues no more events here (events
  // already queued for it are dropped).
  void detach(provider::Cq& cq);

  // ibv_get_cq_event: the CQ of the next event; blocks until there is one (EAGAIN if the fd is
  // non-blocking and none waits).
  provider::Result<provider::Cq*> get_event();
  // ibv_ack_cq_events; unacked(cq) is what ibv_destroy_cq waits for in rdma-core.
  void ack_events(provider::Cq& cq, unsigned n);
  uint64_t unacked(const provider::Cq& cq) const;
  // Events handed in memory to the thread whose turn produced them while it waited (above).
  uint64_t direct_events() const;

 private:
  void notify(provider::Cq& cq);
  // Takes one from the semaphore (get_event's first step): 0 or an errno.
  int take();
  // An event handed over in memory (direct_), if there is one; *fd_has_events: whether the
  // eventfd counts any.
  bool take_direct(bool* fd_has_events);
  void taken_from_fd();

  EventWaiter* const waiter_;
  int fd_ = -1;
  mutable std::mutex mutex_;
  std::deque<provider::Cq*> events_;
  // events_ = in_fd_ (counted in the eventfd, or about to be) + direct_ (handed in memory).
  uint64_t in_fd_ = 0;
  uint64_t direct_ = 0;
  uint64_t direct_total_ = 0;
  std::unordered_map<const provider::Cq*, uint64_t> unacked_;
};

// The context's async fd (ibv_context.async_fd): readable while the device's AsyncEventQueue
// holds events; get_event is ibv_get_async_event.
class AsyncEventFd {
 public:
  explicit AsyncEventFd(provider::AsyncEventQueue& queue);
  ~AsyncEventFd();
  AsyncEventFd(const AsyncEventFd&) = delete;
  AsyncEventFd& operator=(const AsyncEventFd&) = delete;

  int fd() const { return fd_; }
  // Blocks until an event (EAGAIN if the fd is non-blocking and none waits). Events of
  // destroyed objects are skipped; `under_lock` sees the event while its object cannot be
  // destroyed (AsyncEventQueue::try_pop).
  provider::Result<provider::AsyncEvent> get_event(
      const std::function<void(const provider::AsyncEvent&)>& under_lock = {});

 private:
  provider::AsyncEventQueue& queue_;
  int fd_ = -1;
};

}  // namespace urdma::runtime
