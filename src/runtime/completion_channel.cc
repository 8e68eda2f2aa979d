// Completion channels and the async event fd; see completion_channel.h.
#include "runtime/completion_channel.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>

#include "base/check.h"

namespace urdma::runtime {
namespace {

int semaphore_eventfd(unsigned initial) {
  const int fd = eventfd(initial, EFD_SEMAPHORE | EFD_CLOEXEC);
  base::check(fd >= 0, "eventfd");
  return fd;
}

// Adds n to the semaphore's counter.
void add_n(int fd, uint64_t n) {
  ssize_t r;
  do {
    r = write(fd, &n, sizeof n);
  } while (r < 0 && errno == EINTR);
}

void add_one(int fd) { add_n(fd, 1); }

// Takes one from the semaphore; 0 or an errno: EAGAIN on a non-blocking fd, and EINTR when a
// signal interrupted the wait — not retried, because rdma-core's ibv_get_cq_event and
// ibv_get_async_event are one read(2) and programs rely on the signal ending the wait (qperf's
// SIGALRM ends a timed test blocked in ibv_get_cq_event).
int take_one(int fd) {
  uint64_t value;
  if (read(fd, &value, sizeof value) == sizeof value) return 0;
  return errno;
}

// take_one without blocking, whatever the fd's flags: 0 or an errno (EAGAIN: nothing to take).
int take_one_nowait(int fd) {
  uint64_t value;
  iovec iov{&value, sizeof value};
  if (preadv2(fd, &iov, 1, -1, RWF_NOWAIT) == sizeof value) return 0;
  return errno;
}

// The channel whose get_event this thread is blocked in (take), and whether a turn of this
// thread handed it an event meanwhile (notify).
thread_local const CompletionChannel* t_waiting_on = nullptr;
thread_local bool t_delivered = false;

}  // namespace

CompletionChannel::CompletionChannel(EventWaiter* waiter)
    : waiter_(waiter), fd_(semaphore_eventfd(0)) {}

CompletionChannel::~CompletionChannel() {
  close(fd_);
}

void CompletionChannel::attach(provider::Cq& cq) {
  cq.set_notify([this](provider::Cq& fired) { notify(fired); });
}

void CompletionChannel::detach(provider::Cq& cq) {
  // Cq::set_notify takes the CQ's notify lock, which the hook runs under: no notify() of this
  // CQ is running or will run after it.
  cq.set_notify(nullptr);
  std::lock_guard lock(mutex_);
  unacked_.erase(&cq);
  // Queued events for the CQ stay counted in the eventfd; get_event skips them.
  for (provider::Cq*& e : events_)
    if (e == &cq) e = nullptr;
}

void CompletionChannel::notify(provider::Cq& cq) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(&cq);
    // This thread's turn, run while it waits in this channel's get_event: hand it over.
    if (t_waiting_on == this) {
      ++direct_;
      ++direct_total_;
      t_delivered = true;
      return;
    }
    ++in_fd_;
  }
  add_one(fd_);
}

// One event's count: one handed over in memory, else from the eventfd without blocking, then —
// a blocking fd — through the waiter.
int CompletionChannel::take() {
  if (waiter_ == nullptr) return take_one(fd_);
  for (;;) {
    bool fd_has_events;
    if (take_direct(&fd_has_events)) {
      waiter_->event_taken();
      return 0;
    }
    // Nothing counted in the eventfd: no read to find that out (a notify that counts one
    // after this look makes the fd readable, and the wait below sees it).
    if (fd_has_events) {
      const int err = take_one_nowait(fd_);
      if (err == 0) {
        taken_from_fd();
        waiter_->event_taken();
        return 0;
      }
      // A kernel whose eventfd takes no RWF_NOWAIT (before 5.12): wait in read() as before.
      if (err == EOPNOTSUPP) {
        const int rerr = take_one(fd_);
        if (rerr == 0) taken_from_fd();
        return rerr;
      }
      if (err != EAGAIN) return err;
    }
    if (fcntl(fd_, F_GETFL) & O_NONBLOCK) return EAGAIN;
    t_waiting_on = this;
    t_delivered = false;
    const int werr = waiter_->wait_readable(fd_, t_delivered);
    t_waiting_on = nullptr;
    if (werr != 0) return werr;  // never after a hand-over (EventWaiter::wait_readable)
  }
}

bool CompletionChannel::take_direct(bool* fd_has_events) {
  uint64_t spill;
  {
    std::lock_guard lock(mutex_);
    *fd_has_events = in_fd_ > 0;
    if (direct_ == 0) return false;
    // The first is this call's; the others (two CQs fired in one turn) go to the eventfd,
    // where every consumer of the channel sees them.
    spill = direct_ - 1;
    direct_ = 0;
    in_fd_ += spill;
  }
  if (spill > 0) add_n(fd_, spill);
  return true;
}

void CompletionChannel::taken_from_fd() {
  std::lock_guard lock(mutex_);
  if (in_fd_ > 0) --in_fd_;
}

provider::Result<provider::Cq*> CompletionChannel::get_event() {
  for (;;) {
    if (int err = take()) return provider::Status(err);
    std::lock_guard lock(mutex_);
    base::check(!events_.empty(), "completion channel counter ahead of its events");
    provider::Cq* cq = events_.front();
    events_.pop_front();
    if (cq == nullptr) continue;  // its CQ was detached
    ++unacked_[cq];
    return cq;
  }
}

void CompletionChannel::ack_events(provider::Cq& cq, unsigned n) {
  std::lock_guard lock(mutex_);
  uint64_t& u = unacked_[&cq];
  u -= std::min<uint64_t>(u, n);
}

uint64_t CompletionChannel::direct_events() const {
  std::lock_guard lock(mutex_);
  return direct_total_;
}

uint64_t CompletionChannel::unacked(const provider::Cq& cq) const {
  std::lock_guard lock(mutex_);
  auto it = unacked_.find(&cq);
  return it == unacked_.end() ? 0 : it->second;
}

AsyncEventFd::AsyncEventFd(provider::AsyncEventQueue& queue) : queue_(queue) {
  // Events queued before the fd existed count too; set_notify then makes every later push
  // add one (outside the queue's lock, after the event is queued). Counted first: an event
  // pushed in between is counted late (at the next push), never twice.
  fd_ = semaphore_eventfd(static_cast<unsigned>(queue_.size()));
  queue_.set_notify([fd = fd_] { add_one(fd); });
}

AsyncEventFd::~AsyncEventFd() {
  queue_.set_notify(nullptr);
  close(fd_);
}

provider::Result<provider::AsyncEvent> AsyncEventFd::get_event(
    const std::function<void(const provider::AsyncEvent&)>& under_lock) {
  for (;;) {
    if (int err = take_one(fd_)) return provider::Status(err);
    std::optional<provider::AsyncEvent> e = queue_.try_pop(under_lock);
    base::check(e.has_value(), "async event fd counter ahead of its events");
    if (!e->discarded) return *e;
  }
}

}  // namespace urdma::runtime
