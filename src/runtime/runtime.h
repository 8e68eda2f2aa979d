// The runtime: one per process. It owns the engine, its packet I/O, the clock and the engine
// thread, and makes the provider safe to use from any application thread.
//
//   runtime::RuntimeConfig cfg;  cfg.device = ...;  cfg.engine = ...;
//   auto rt = runtime::Runtime::open({}, cfg, &err, &why);         // urdmad's slot socket
//   auto rt = std::make_unique<runtime::Runtime>(std::move(io), cfg);  // any PacketIo (tests)
//   provider::Device& dev = rt->device();   // post/poll from any thread
//   rt->try_progress();                     // from ibv_poll_cq: drive the engine inline
//
// THREADS AND WHO OWNS WHAT
// * The engine (engine::Engine and everything it reaches through `_st` methods) is run by
//   whoever holds the progress token (`token_`, one atomic): the engine thread, or an
//   application thread inside try_progress() (DESIGN.md: "whoever polls drives the engine") or
//   waiting for a completion event (wait_readable).
//   One holder at a time; taking and releasing it is one CAS and one store, never a lock held
//   across a syscall. A holder runs engine.poll() turns; the engine thread does not poll while
//   an application thread holds the token — it waits on the token (futex) and takes a turn when
//   it is released.
// * Application threads post through the provider (SQ/RQ rings, their own locks) and ring the
//   doorbell: atomic stores (engine/rung_qps.h) then Runtime::send_posted() for send WQEs. A
//   receive WQE calls Runtime::wake() only on a QP in ERR, where a turn must flush it
//   (engine::DoorbellRelay::ring_rq); a modify always does.
// * WAKE-UP (liburing's need-wakeup handshake, src/queue.c sq_ring_needs_enter): the engine
//   thread, about to sleep, stores sleeping_ = true (seq_cst) and re-reads doorbell_; a
//   poster stores doorbell_ = true (seq_cst) and writes the eventfd only if it reads sleeping_ ==
//   true. Both sides are seq_cst, so at least one of them sees the other: a post is never missed
//   and a busy engine costs the poster no syscall. The engine thread sleeps in epoll_wait on
//   the socket, the doorbell eventfd, a timerfd armed at the earlier of engine.next_deadline_ns()
//   and the PacketIo's next_deadline_ns() (a fault wrapper's held datagrams), and the
//   application timer; an idle process costs no CPU. Before it sleeps the thread reads the
//   engine's deadline again after publishing armed_deadline_ns_: a turn an application thread
//   took in between compared its deadline with 0 ("awake") and did not set the application
//   timer. The first send a thread posts after it took a completion event takes the turn
//   itself when the engine thread sleeps (send_posted): the answer to the event leaves without
//   a second thread woken for it. Only that one: a burst's later posts ring the doorbell, so
//   they leave in the engine thread's batches rather than a turn and a sendmmsg each.
// * APPLICATION TIMER: a turn on an application thread that leaves a deadline earlier than the
//   sleeping engine thread's timer (a retransmission timer, an ACK held for a reply) sets
//   app_timer_fd_ to it before it lets go of the token, and the next such turn to what that turn
//   left (later, or none: the ACK left with the reply; lazily, below) — the engine thread is
//   woken at the deadline, not to re-arm its own timer. It disarms it (lazily) when it takes a
//   turn.
// * A THREAD WAITING FOR A COMPLETION EVENT DRIVES THE ENGINE (wait_readable, from a blocking
//   ibv_get_cq_event): it polls the channel's fd and the socket, and a datagram makes it take
//   the turn; the first such thread takes the socket out of the engine thread's epoll set and
//   the last puts it back, so the datagram wakes the thread that wants the event instead of the
//   engine thread, which would then wake it through the channel. An event that turn fires is
//   handed to the thread in memory (CompletionChannel). ACKs its turns owe are not held for a
//   reply (engine.h, Engine::poll).
// * TIMERS: both timerfds are set lazily (lazy_timer.h): earlier deadlines at once, later ones
//   only when the armed one is due within a millisecond.
// * BUSY POLLING: RuntimeConfig::busy_poll_ns (URDMA_BUSY_POLL_US) is the longest the engine
//   thread spins after a turn before it sleeps; the window adapts to how soon work has been
//   coming (busy_poll.h). A post, a due timer or a readable socket (epoll_wait with no
//   timeout) ends the spin at once, and so does an application thread seen busy-polling its CQ
//   (a few try_progress turns within the window: it drives the engine itself).
// * MEMORY LIFETIME: dereg_mr / rereg_mr / dealloc_mw call Doorbell::memory_released after the
//   MR table changed; the engine waits until its turn epoch has moved past every turn that was
//   running (engine.h), so no pointer looked up before the change is used after the verb
//   returns. destroy_qp and modify to RESET take the engine's turn lock (qp_destroyed /
//   qp_modified), so the QP's rings are not touched after they return.
// * BACK-PRESSURE: a datagram the socket refuses with EAGAIN/ENOBUFS waits in the engine's
//   transmit backlog (Engine::tx_blocked); the engine thread then also waits for EPOLLOUT.
// * NAPPING: while an application thread busy-polls its CQ (a poll turn within kPollerNs), the
//   engine thread naps instead of sleeping: at most kNapNs, without the need-wakeup flag
//   (a post rings no eventfd: the polling thread's next turn sends it, or a thread about to
//   block in wait_readable does), without arming the I/O's rings (a peer's datagram writes no
//   doorbell: the polling thread reads it) and without the application timer (an ACK held for
//   a reply leaves with the reply or at the next turn). A wake-up per post or per datagram
//   would cost a syscall on both sides and a context switch on a core the pollers need; the
//   nap bounds what is left to the engine thread to kNapNs when the poller stops. Where the
//   poller reads the socket on every turn (no shared-memory region: net/shm_packet_io.h), the
//   nap also takes the socket out of the thread's epoll set (nap_socket), unless a CQ is armed
//   for an event (a thread may sleep on its channel's fd, where no turn sees it; req_notify
//   puts the socket back), and it goes back in when the thread stops napping: a socket in an
//   epoll set runs the set's callback for every datagram queued on it, inside the sender's
//   sendmsg, whether anybody waits or not, and woke the napping thread for a datagram the
//   poller reads (docs/PERFORMANCE.md).
// * STREAMS: a turn of the engine thread that read kStreamRecords or more from shared-memory
//   rings (a peer streams: its next records come within microseconds) is followed by up to
//   kStreamSpinNs of looking at the rings before the thread sleeps. Asleep, every burst would
//   cost the peer a doorbell write and this thread a wake-up; a ping-pong's turns read one or two
//   records and never spin.
// * COUNTERS for other threads: counters() is a copy the engine makes between turns.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/client.h"
#include "engine/engine.h"
#include "net/clock.h"
#include "net/packet_io.h"
#include "provider/device.h"
#include "runtime/busy_poll.h"
#include "runtime/completion_channel.h"

namespace urdma::net {
class CaptureTap;
class ShmPacketIo;
}  // namespace urdma::net

namespace urdma::runtime {

struct RuntimeConfig {
  provider::DeviceConfig device;  // its doorbell is the runtime's (overwritten)
  engine::EngineConfig engine;
  // Start the engine thread. Without it nothing runs the engine but try_progress() (tests).
  bool engine_thread = true;
  // How long the engine thread keeps polling after its last work before it sleeps: at most this
  // long, sized by how soon work has been coming (busy_poll.h); adaptive false: always this long.
  uint64_t busy_poll_ns = 0;
  bool busy_poll_adaptive = true;
  // A thread blocked in ibv_get_cq_event drives the engine (wait_readable); false: it sleeps in
  // read() and the engine thread wakes it through the channel.
  bool waiting_thread_drives = true;
  // The shared-memory I/O inside `io`, if there is one (net/shm_packet_io.h): a napping engine
  // thread watches its socket for the busy poller.
  net::ShmPacketIo* shm_io = nullptr;
};

class Runtime final : public engine::Waker, public EventWaiter {
 public:
  // Over any PacketIo; with the engine thread, io->readable_fd() must be a pollable fd.
  Runtime(std::unique_ptr<net::PacketIo> io, RuntimeConfig config);
  // The process's runtime over urdmad: connects (or starts it), leases a slot and runs the
  // engine over the slot's socket (net::make_packet_io_from_env: per-flow source ports, and
  // URDMA_FAULTS), with the slot's QPN range as the device's qpn_base. Null
  // with an errno in *err and a sentence in *detail on failure.
  static std::unique_ptr<Runtime> open(const daemon::ClientOptions& options, RuntimeConfig config,
                                       int* err, std::string* detail);
  ~Runtime() override;
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  provider::Device& device() { return device_; }

  // The urdmad connection holding the slot (null for a Runtime made over any PacketIo): librdmacm
  // listens on service IDs through it and reads the slot (its number, a dup of its socket for
  // sending CM MADs) from kept_slot(). Client calls are thread-safe (client.h).
  daemon::Client* daemon_client() { return client_.get(); }

  // Any thread: `tap` (an I/O of this process besides the engine's: librdmacm's CM MADs) gets
  // every capture socket urdmad pushes from now on, and the ones that capture now (`urdma
  // capture`, net/capture_tap.h). It must outlive the runtime.
  void add_capture_tap(net::CaptureTap* tap);

  // Any thread (ibv_poll_cq finding its CQ empty): runs one engine turn on this thread if
  // nobody holds the progress token; false if somebody does (the engine is being driven).
  bool try_progress();
  // Any thread (ibv_req_notify_cq): arms `cq`, and puts the socket back in the engine thread's
  // epoll set if a nap took it out: the caller may now sleep on the channel's fd (NAPPING).
  void req_notify(provider::Cq& cq, bool solicited_only);
  // Any thread (ibv_resize_cq; a QP's move to ERR and its destroy, context.h): runs one engine
  // turn on this thread, waiting for the token while another thread's turn runs, so whatever
  // was posted before the call has executed as far as the device can take it alone (a UD send
  // has left and completed) and what arrived before it is taken in, as a kernel device does.
  // False if the token stayed taken for kProgressWaitNs (a thread driving the engine without
  // pause).
  bool progress_now();
  static constexpr uint64_t kProgressWaitNs = 100'000'000;

  // engine::Waker: a doorbell rang (any thread).
  void wake() override;
  // engine::Waker: send WQEs were posted. As wake(), except that the first send a thread posts
  // after it took a completion event (event_taken) takes the turn on that thread when the
  // engine thread sleeps and the token is free: the answer to the event leaves at once,
  // without a second thread woken for it.
  void send_posted() override;

  // EventWaiter (a blocking ibv_get_cq_event): waits on this thread for `fd` or a datagram, and
  // takes the engine's turn when a datagram comes, so the datagram wakes the waiting thread
  // instead of the engine thread, which then would wake it through the channel.
  int wait_readable(int fd, const bool& delivered) override;
  // EventWaiter: the first send this thread posts from now on may take the turn (send_posted).
  void event_taken() override;
  // What a completion channel of this process waits through: this runtime, or none when
  // RuntimeConfig::waiting_thread_drives is false.
  EventWaiter* event_waiter() { return waiting_thread_drives_ ? this : nullptr; }

  // ---- observation (any thread) ----
  engine::EngineCounters counters() const { return engine_.counters_snapshot(); }
  uint64_t engine_thread_turns() const { return turns_.load(std::memory_order_relaxed); }
  // Naps the engine thread took beside a busy poller (NAPPING).
  uint64_t naps() const { return naps_.load(std::memory_order_relaxed); }
  uint64_t eventfd_wakeups() const { return wakeups_.load(std::memory_order_relaxed); }
  uint64_t inline_turns() const { return inline_turns_.load(std::memory_order_relaxed); }
  // Turns a thread took for the first send it posted after a completion event (send_posted).
  uint64_t reply_turns() const { return reply_turns_.load(std::memory_order_relaxed); }
  // Busy-poll windows that ended with work (a datagram, a post or a due timer).
  uint64_t busy_poll_hits() const { return busy_poll_hits_.load(std::memory_order_relaxed); }
  // The engine thread's kernel thread id (0 before it started or without one).
  pid_t engine_tid() const { return engine_tid_.load(std::memory_order_acquire); }

 private:
  enum Token : uint32_t { kFree = 0, kEngineThread = 1, kApplication = 2 };

  void run();
  void release_token();
  // One engine turn on this thread if the token is free: for a poll (try_progress), a wait
  // on a completion channel (wait_readable) or the send posted after such a wait (send_posted).
  enum TurnKind { kPoll, kWait, kReply };
  bool take_turn(TurnKind kind);
  // Token holder, at the end of an application thread's turn that left `deadline`: the
  // application timer wakes a sleeping engine thread then, if its own timer is later.
  void set_app_timer(uint64_t deadline);
  // Sets timerfd `fd`, armed for *armed, to wake at `want` or earlier (lazy_timer.h).
  void set_timer(int fd, uint64_t* armed, uint64_t want);
  void wake_token_waiter();
  // Engine thread: the socket out of its epoll set for a nap (NAPPING), or back in.
  void nap_socket(bool out);
  // Sleeps in epoll until a datagram, a post, the deadline or stop. True when woken by work
  // (a datagram or the doorbell), not by the timer alone.
  bool sleep_until(uint64_t deadline_ns);
  bool spin_on_rings(uint64_t until_ns);
  // EPOLLOUT on the socket while the engine is blocked on transmit (Engine::tx_blocked).
  void want_writable(bool on);
  // The socket back into the engine thread's epoll set (watch_mutex_ held).
  void socket_back();

  // The connection holding the slot when open() made the runtime (Client::keep holds the slot:
  // closing the connection returns it).
  std::unique_ptr<daemon::Client> client_;
  // A capture socket urdmad pushed: to the engine's tap and every added one (a copy each).
  void capture_pushed(daemon::UniqueFd socket, uint32_t slot);
  // The shared-memory path (net/shm_packet_io.h) when URDMA_SHM allows it and urdmad gave a
  // doorbell; its regions asked for on the broker's thread (runtime.cc, ShmBroker).
  class ShmBroker;
  std::unique_ptr<ShmBroker> shm_broker_;
  net::ShmPacketIo* shm_io_ = nullptr;
  std::mutex capture_mu_;
  net::CaptureTap* engine_tap_ = nullptr;        // set before the keeper starts
  std::vector<net::CaptureTap*> capture_taps_;   // under capture_mu_
  // A copy of every pushed socket whose capturer is still there, for taps added later.
  std::vector<std::pair<daemon::UniqueFd, uint32_t>> capture_sockets_;  // under capture_mu_

  net::MonotonicClock clock_;
  std::unique_ptr<net::PacketIo> io_;
  engine::DoorbellRelay relay_;
  provider::Device device_;
  engine::Engine engine_;
  const bool has_thread_;
  const bool waiting_thread_drives_;
  BusyPollWindow busy_poll_;  // engine thread only

  int epoll_fd_ = -1;
  int event_fd_ = -1;      // the doorbell: written only when sleeping_
  int timer_fd_ = -1;      // armed at the engine's next deadline
  int app_timer_fd_ = -1;  // armed by application threads' turns (arm_app_timer)
  // The engine thread waits for EPOLLOUT on the socket too (written by it under watch_mutex_).
  bool epollout_ = false;

  std::atomic<uint32_t> token_{kFree};
  // The engine thread waits for the token (run()): it sets engine_waits_token_ and sleeps until
  // token_wakes_ moves; the releasing application thread takes the flag and moves it, so each
  // wait costs one futex wake however often the token changes hands meanwhile.
  std::atomic<bool> engine_waits_token_{false};
  // The same for a thread in wait_readable whose datagram's turn somebody else holds.
  std::atomic<bool> app_waits_token_{false};
  std::atomic<uint32_t> token_wakes_{0};
  std::atomic<bool> doorbell_{false};
  std::atomic<bool> sleeping_{false};
  // NAPPING (below): the engine thread sleeps at most kNapNs, woken by nobody's post.
  std::atomic<bool> napping_{false};
  // When an application thread last took a poll turn (try_progress): within kPollerNs, it
  // busy-polls.
  std::atomic<uint64_t> last_poll_ns_{0};
  static constexpr uint64_t kPollerNs = 200'000;
  // Each nap's end is a wake-up on a core a poller spins on: ~10 µs of the poller's time on
  // these VMs (the timer, two context switches, the look around). 1 ms makes that 1% and
  // bounds what a poller that stopped leaves waiting (a peer's ring records, a due timer) to
  // 1 ms, as kUdpWatchedPollNs bounds the socket's reads under a nap (shm_packet_io.h).
  static constexpr uint64_t kNapNs = 1'000'000;
  // STREAMS: a turn that read this many records from rings, then kStreamSpinNs of looking.
  static constexpr uint64_t kStreamRecords = 16;
  static constexpr uint64_t kStreamSpinNs = 20'000;
  bool napped_idle_ = false;  // engine thread only: the last sleep was a nap
  bool nap_woke_ = false;     // engine thread only: its last nap beside a poller ended by work
  // The deadline the sleeping engine thread armed (kNever: none): a turn on an application
  // thread that leaves an earlier one wakes it.
  std::atomic<uint64_t> armed_deadline_ns_{net::kNever};
  // What app_timer_fd_ is armed for (kNever: disarmed); the token's holder's. It may be armed
  // earlier than the deadline it serves (lazy_timer.h).
  uint64_t app_timer_ns_ = net::kNever;
  // The same for timer_fd_ (engine thread only).
  uint64_t timer_ns_ = net::kNever;
  std::atomic<bool> stop_{false};

  std::atomic<uint64_t> turns_{0};
  std::atomic<uint64_t> naps_{0};
  std::atomic<uint64_t> inline_turns_{0};
  std::atomic<uint64_t> reply_turns_{0};
  std::atomic<uint64_t> wakeups_{0};
  std::atomic<uint64_t> busy_poll_hits_{0};
  std::atomic<pid_t> engine_tid_{0};
  // Threads in wait_readable. While there is one, or while the engine thread naps with the
  // socket out (nap_out_: set by that thread, cleared by it or by req_notify), the socket is out
  // of the engine thread's epoll set (socket_out_), unless the engine waits for EPOLLOUT.
  // watch_mutex_ guards these and every epoll_ctl on the socket after the constructor.
  std::mutex watch_mutex_;
  int watchers_ = 0;
  std::atomic<bool> nap_out_{false};  // stored under watch_mutex_
  bool socket_out_ = false;
  std::thread thread_;
};

}  // namespace urdma::runtime
