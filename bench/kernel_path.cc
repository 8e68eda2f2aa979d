// urdma_kernel_path_bench: what this machine charges for the way urdma's hop runs — a syscall,
// the pages user space touches after it, and UDP ping-pongs through io_uring beside the
// recv/sendto one that urdma_loopback_bench uses as its limit. It measures no urdma code: it
// says why urdma's own share of a hop costs what it does here (docs/PERFORMANCE.md, "Pages
// after a syscall").
//
//   build-bench/bench/urdma_kernel_path_bench [--rounds N] [--sleeping]
//
// Rows:
//  * a syscall that does nothing (getppid), and an empty recv(MSG_DONTWAIT) on a UDP socket;
//  * a dependent walk over one cache line in each of N distinct 4 KiB pages, alone and right
//    after a syscall. The walk after the syscall, less the syscall alone, is what user space
//    pays for those N pages when the syscall left the TLB empty (kernel page-table isolation
//    without PCID switches the page tables at every entry and exit, and flushes the TLB with
//    them). The same N lines in one page are the control: lines that were cached but whose
//    page was not. And the N pages in memory madvised for transparent huge pages;
//  * a UDP ping-pong of 8-byte datagrams between two processes on loopback: sendto + a
//    recv(MSG_DONTWAIT) spin (the limit of urdma_loopback_bench), interleaved in blocks with
//    the msghdr calls urdma's UdpSocketIo makes (docs/PERFORMANCE.md, "One datagram, one
//    recvmsg"): sendmsg + recvmsg — also with the receiving socket in an epoll set that nobody
//    waits on, and with that set in a second one (an engine thread's epoll set, alone and
//    around a shared-memory I/O's: the kernel runs each set's callback for every datagram
//    queued) — and sendmmsg + recvmmsg over 1 and over 32 buffers (a read
//    of one waiting datagram that goes back to the socket for a second), and through io_uring
//    (send and recv submitted together) spinning on io_uring_get_events with
//    IORING_SETUP_DEFER_TASKRUN. Then, each alone after the recv spin, the io_uring ways:
//    spinning on the completion ring in user space, and DEFER_TASKRUN again;
//  * sleeping ping-pongs (--sleeping: only these): both sides block between hops. UDP's send +
//    blocking recv (qperf's udp_lat, the limit of rc_lat with events) interleaved with an
//    eventfd's write + poll + read, the same with the fcntl and the epoll_ctl pair a completion
//    channel's wait adds in urdma, and a futex's wake + wait; and what timerfd_settime costs
//    for a timer 50 us ahead (armed, then disarmed) and for one a second ahead.
// A benchmark, not a test: nothing here asserts a speed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#if URDMA_HAVE_LIBURING
#include <liburing.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <new>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kPage = 4096;
constexpr size_t kHugePage = 2 << 20;
constexpr size_t kLine = 64;
constexpr int kPingBytes = 8;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "urdma_kernel_path_bench: %s: %s\n", what, std::strerror(errno));
  std::exit(2);
}

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

// Medians of repeated timings: the machine is a shared VM, and one slow batch must not move a
// row.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---------------------------------------------------------------------------------------------
// Syscalls and pages.

long null_syscall() {
  return syscall(SYS_getppid);
}

// A walk through `count` cache lines, each holding the address of the next, in a shuffled order
// so that each load depends on the one before (as code does: a pointer, then what it points
// to) and no prefetcher guesses the next page.
struct Walk {
  std::vector<char*> lines;

  void link() {
    for (size_t i = 0; i < lines.size(); ++i)
      *reinterpret_cast<char**>(lines[i]) = lines[(i + 1) % lines.size()];
  }
  char* run(char* p, size_t steps) const {
    for (size_t i = 0; i < steps; ++i) p = *reinterpret_cast<char* volatile*>(p);
    return p;
  }
};

// One line in each of `pages` pages of `base` (spread over the lines of a page, so that they
// do not share a cache set), or `pages` lines of one page.
Walk make_walk(char* base, size_t pages, bool one_page, uint32_t seed) {
  Walk w;
  for (size_t i = 0; i < pages; ++i)
    w.lines.push_back(one_page ? base + i * kLine
                               : base + i * kPage + (i % (kPage / kLine)) * kLine);
  std::shuffle(w.lines.begin(), w.lines.end(), std::mt19937(seed));
  w.link();
  return w;
}

// Nanoseconds per iteration of: [a syscall], then the whole walk. Median of 9 batches.
double time_walk(const Walk& w, bool with_syscall, int iters) {
  std::vector<double> batches;
  char* p = w.lines.empty() ? nullptr : w.lines[0];
  for (int b = 0; b < 9; ++b) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      if (with_syscall) null_syscall();
      if (p != nullptr) p = w.run(p, w.lines.size());
    }
    batches.push_back(ns_since(t0) / iters);
  }
  return median(batches);
}

double time_empty_recv(int iters) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
  if (fd < 0) die("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("bind");
  char buf[64];
  std::vector<double> batches;
  for (int b = 0; b < 9; ++b) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i)
      if (recv(fd, buf, sizeof buf, MSG_DONTWAIT) >= 0) die("recv found a datagram");
    batches.push_back(ns_since(t0) / iters);
  }
  close(fd);
  return median(batches);
}

std::string first_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s.empty() ? "unknown" : s;
}

bool cpu_has_flag(const char* flag) {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    return (line + " ").find(std::string(" ") + flag + " ") != std::string::npos;
  }
  return false;
}

// Kibibytes of the calling process's memory in transparent huge pages.
long anon_huge_kib() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string key;
  long value = 0;
  while (f >> key) {
    if (key == "AnonHugePages:") {
      f >> value;
      return value;
    }
    f.ignore(1 << 12, '\n');
  }
  return -1;
}

void pages_rows() {
  const int iters = 20000;
  const double sys = time_walk(Walk{}, true, iters);
  const double recv_ns = time_empty_recv(iters);
  std::printf("a syscall that does nothing (getppid)                  %7.0f ns\n", sys);
  std::printf("an empty recv(MSG_DONTWAIT) on a UDP socket            %7.0f ns\n", recv_ns);
  std::printf("kernel page-table isolation: %s; CPU flag pcid: %s\n",
              first_line("/sys/devices/system/cpu/vulnerabilities/meltdown").c_str(),
              cpu_has_flag("pcid") ? "yes" : "no");

  // The walks over 4 KiB pages, then one page of its own for the control walk.
  constexpr size_t kMaxPages = 128;
  constexpr size_t kSmallBytes = (kMaxPages + 1) * kPage;
  char* small = static_cast<char*>(std::aligned_alloc(kPage, kSmallBytes));
  char* control_page = small + kMaxPages * kPage;
  // Huge pages: a 2 MiB-aligned anonymous mapping madvised before it is first touched.
  const size_t huge_len = 2 * kHugePage;
  void* m = mmap(nullptr, huge_len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (small == nullptr || m == MAP_FAILED) die("memory");
  char* huge = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(m) + kHugePage - 1) &
                                       ~(uintptr_t{kHugePage} - 1));
  const long huge_before = anon_huge_kib();
  const bool advised = madvise(huge, huge_len, MADV_HUGEPAGE) == 0;
  std::memset(small, 1, kSmallBytes);
  std::memset(huge, 1, huge_len);
  const long huge_kib = anon_huge_kib() - huge_before;

  // Columns: the walk alone; a syscall and then the walk; that less the syscall alone (what the
  // walk cost after the syscall); and that per page.
  std::printf("\n%-42s %9s %9s %9s %12s\n", "dependent walk, one line per page", "walk", "sys+walk",
              "-sys", "per page");
  for (size_t n : {8, 32, 64, 128}) {
    struct Case {
      const char* what;
      Walk w;
    } cases[] = {
        {"4 KiB pages", make_walk(small, n, false, 1)},
        {"(control: the same lines in one page)",
         make_walk(control_page, std::min(n, kPage / kLine), true, 1)},
        {"pages madvised for huge pages", make_walk(huge, n, false, 1)},
    };
    for (const Case& c : cases) {
      if (c.w.lines.size() != n) continue;
      const double alone = time_walk(c.w, false, iters);
      const double after = time_walk(c.w, true, iters);
      std::printf("%3zu %-38s %6.0f ns %6.0f ns %6.0f ns %7.1f ns\n", n, c.what, alone, after,
                  after - sys, (after - sys) / static_cast<double>(n));
    }
  }
  std::printf("huge pages: madvise %s, %ld KiB of the walk's memory in transparent huge pages\n",
              advised ? "ok" : "refused", huge_kib);
  munmap(m, huge_len + kHugePage);
  std::free(small);
}

// ---------------------------------------------------------------------------------------------
// UDP ping-pong between two processes.

enum class Wait {
  kRecvSpin,
  kRecvmsg,
  kRecvmsgEpoll,
  kRecvmsgNestedEpoll,
  kRecvmmsgOne,
  kRecvmmsgBatch,
  kRingSpin,
  kDeferTaskrun
};

const char* wait_name(Wait w) {
  switch (w) {
    case Wait::kRecvSpin:
      return "sendto + recv(MSG_DONTWAIT) spin";
    case Wait::kRecvmsg:
      return "sendmsg + recvmsg spin (address, cmsg space)";
    case Wait::kRecvmsgEpoll:
      return "the same, socket in an epoll set nobody waits on";
    case Wait::kRecvmsgNestedEpoll:
      return "the same, that set in a second epoll set";
    case Wait::kRecvmmsgOne:
      return "sendmmsg + recvmmsg spin, 1 buffer";
    case Wait::kRecvmmsgBatch:
      return "sendmmsg + recvmmsg spin, 32 buffers";
    case Wait::kRingSpin:
      return "io_uring, completion ring spun in user space";
    case Wait::kDeferTaskrun:
      return "io_uring DEFER_TASKRUN, io_uring_get_events spin";
  }
  return "";
}

// A connected pair of UDP sockets on 127.0.0.1 and 127.0.0.2, ports chosen by the kernel.
void socket_pair(int fds[2]) {
  sockaddr_in addr[2]{};
  for (int i = 0; i < 2; ++i) {
    fds[i] = socket(AF_INET, SOCK_DGRAM, 0);
    if (fds[i] < 0) die("socket");
    addr[i].sin_family = AF_INET;
    addr[i].sin_addr.s_addr = htonl(INADDR_LOOPBACK + i);
    if (bind(fds[i], reinterpret_cast<sockaddr*>(&addr[i]), sizeof addr[i]) != 0) die("bind");
    socklen_t len = sizeof addr[i];
    getsockname(fds[i], reinterpret_cast<sockaddr*>(&addr[i]), &len);
  }
  for (int i = 0; i < 2; ++i)
    if (connect(fds[i], reinterpret_cast<sockaddr*>(&addr[1 - i]), sizeof addr[1 - i]) != 0)
      die("connect");
}

// One side of the ping-pong. hop() sends a datagram (unless `send` is false: B's first wait)
// and returns when the peer's has arrived.
class Side {
 public:
  Side(int fd, Wait wait) : fd_(fd), wait_(wait) {
    // An engine thread's epoll set holds the socket while an application thread reads it: the
    // kernel runs the set's callback for every datagram queued, whoever waits.
    if (wait_ == Wait::kRecvmsgEpoll || wait_ == Wait::kRecvmsgNestedEpoll) {
      epoll_[0] = epoll_create1(EPOLL_CLOEXEC);
      watch(epoll_[0], fd_);
      if (wait_ == Wait::kRecvmsgNestedEpoll) {
        epoll_[1] = epoll_create1(EPOLL_CLOEXEC);
        watch(epoll_[1], epoll_[0]);
      }
    }
  }
  ~Side() {
    for (int e : epoll_)
      if (e >= 0) close(e);
#if URDMA_HAVE_LIBURING
    if (ring_ok_) io_uring_queue_exit(&ring_);
#endif
  }

  // 0, or the errno io_uring_queue_init gave.
  int open() {
    if (wait_ != Wait::kRingSpin && wait_ != Wait::kDeferTaskrun) return 0;
#if URDMA_HAVE_LIBURING
    io_uring_params p{};
    if (wait_ == Wait::kDeferTaskrun)
      p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    const int e = io_uring_queue_init_params(8, &ring_, &p);
    ring_ok_ = e == 0;
    return -e;
#else
    return ENOSYS;
#endif
  }

  void hop(bool send) {
    if (wait_ == Wait::kRecvSpin) {
      if (send && ::send(fd_, out_, kPingBytes, 0) != kPingBytes) die("send");
      while (recv(fd_, in_, sizeof in_, MSG_DONTWAIT) < 0)
        if (errno != EAGAIN) die("recv");
      return;
    }
    if (wait_ != Wait::kRingSpin && wait_ != Wait::kDeferTaskrun) {
      msg_hop(send);
      return;
    }
#if URDMA_HAVE_LIBURING
    if (send) io_uring_prep_send(io_uring_get_sqe(&ring_), fd_, out_, kPingBytes, 0);
    io_uring_sqe* r = io_uring_get_sqe(&ring_);
    io_uring_prep_recv(r, fd_, in_, sizeof in_, 0);
    io_uring_sqe_set_data64(r, kRecvTag);
    if (io_uring_submit(&ring_) < 0) die("io_uring_submit");
    for (;;) {
      if (wait_ == Wait::kDeferTaskrun && io_uring_cq_ready(&ring_) == 0)
        io_uring_get_events(&ring_);
      io_uring_cqe* c;
      if (io_uring_peek_cqe(&ring_, &c) != 0) continue;
      const uint64_t tag = c->user_data;
      const int res = c->res;
      io_uring_cqe_seen(&ring_, c);
      if (res < 0) {
        errno = -res;
        die("io_uring send/recv");
      }
      if (tag == kRecvTag) return;
    }
#endif
  }

  // The peer's last datagram goes out without waiting for an answer.
  void last_send() {
    if (::send(fd_, out_, kPingBytes, 0) != kPingBytes) die("send");
  }

 private:
  // The msghdr ways, each datagram read as UdpSocketIo reads it: into a buffer with room for
  // the sender's address and for cmsgs.
  void msg_hop(bool send) {
    constexpr unsigned kBatch = 32;
    iovec out{out_, kPingBytes};
    mmsghdr s{};
    s.msg_hdr.msg_iov = &out;
    s.msg_hdr.msg_iovlen = 1;
    const bool by_msg = wait_ != Wait::kRecvmmsgOne && wait_ != Wait::kRecvmmsgBatch;
    if (send && (by_msg ? sendmsg(fd_, &s.msg_hdr, 0) != kPingBytes : sendmmsg(fd_, &s, 1, 0) != 1))
      die("sendmsg/sendmmsg");
    static char bufs[kBatch][64];
    static sockaddr_storage names[kBatch];
    alignas(cmsghdr) static char control[kBatch][128];
    iovec iov[kBatch];
    mmsghdr m[kBatch];
    const unsigned n = wait_ == Wait::kRecvmmsgBatch ? kBatch : 1;
    for (;;) {
      for (unsigned i = 0; i < n; ++i) {
        iov[i] = iovec{bufs[i], sizeof bufs[i]};
        m[i] = mmsghdr{};
        m[i].msg_hdr.msg_name = &names[i];
        m[i].msg_hdr.msg_namelen = sizeof names[i];
        m[i].msg_hdr.msg_iov = &iov[i];
        m[i].msg_hdr.msg_iovlen = 1;
        m[i].msg_hdr.msg_control = control[i];
        m[i].msg_hdr.msg_controllen = sizeof control[i];
      }
      const long r = by_msg ? recvmsg(fd_, &m[0].msg_hdr, MSG_DONTWAIT)
                            : recvmmsg(fd_, m, n, MSG_DONTWAIT, nullptr);
      if (r > 0) return;
      if (errno != EAGAIN) die("recvmsg/recvmmsg");
    }
  }

  static void watch(int epoll_fd, int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_fd < 0 || epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll");
  }

  static constexpr uint64_t kRecvTag = 1;
  int fd_;
  Wait wait_;
  int epoll_[2] = {-1, -1};
  char out_[kPingBytes] = {};
  char in_[64] = {};
#if URDMA_HAVE_LIBURING
  io_uring ring_{};
  bool ring_ok_ = false;
#endif
};

// Waits for the answering process; it must have succeeded.
void reap(pid_t pid) {
  int status;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "urdma_kernel_path_bench: the answering process failed\n");
    std::exit(2);
  }
}

// Median one-way latency (half the round trip) in microseconds, or a negative errno when the
// way of waiting is not available here.
double ping_pong(Wait wait, int rounds) {
  int fds[2];
  socket_pair(fds);
  int ready[2];
  if (pipe(ready) != 0) die("pipe");
  const pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {  // B: answers every datagram
    close(fds[0]);
    close(ready[0]);
    Side b(fds[1], wait);
    const int e = b.open();
    if (write(ready[1], &e, sizeof e) != sizeof e) _exit(2);
    if (e != 0) _exit(0);
    b.hop(false);
    for (int i = 1; i < rounds; ++i) b.hop(true);
    b.last_send();
    _exit(0);
  }
  close(fds[1]);
  close(ready[1]);
  int peer_error = 0;
  if (read(ready[0], &peer_error, sizeof peer_error) != sizeof peer_error) die("read");
  close(ready[0]);
  double result;
  if (peer_error != 0) {
    result = -peer_error;
  } else {
    Side a(fds[0], wait);
    if (const int e = a.open(); e != 0) die("io_uring in A but not in B");
    std::vector<double> rtt(static_cast<size_t>(rounds));
    for (double& t : rtt) {
      const auto t0 = Clock::now();
      a.hop(true);
      t = ns_since(t0);
    }
    result = median(rtt) / 2 / 1000;
  }
  close(fds[0]);
  reap(pid);
  return result;
}

// The recv spin, the msghdr ways and (where it is available) io_uring with DEFER_TASKRUN,
// interleaved: blocks of 1,000 rounds of each in turn over one socket pair, so that a VM's slow
// and fast spells fall on all of them. Prints each way's median over the blocks of its one-way
// median, and the median over the blocks of its ratio to the recv spin's in the same block.
void interleaved_rows(int rounds) {
  std::vector<Wait> ways = {Wait::kRecvSpin,           Wait::kRecvmsg,     Wait::kRecvmsgEpoll,
                            Wait::kRecvmsgNestedEpoll, Wait::kRecvmmsgOne, Wait::kRecvmmsgBatch};
  int fds[2];
  socket_pair(fds);
  if (Side probe(fds[0], Wait::kDeferTaskrun); probe.open() == 0)
    ways.push_back(Wait::kDeferTaskrun);
  const size_t kN = ways.size();
  constexpr int kPer = 1000;
  const int blocks = std::max(rounds / kPer / static_cast<int>(kN), 5);
  const pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {  // B: answers every datagram, block by block
    close(fds[0]);
    for (int b = 0; b < blocks; ++b) {
      for (Wait w : ways) {
        Side side(fds[1], w);
        if (side.open() != 0) die("io_uring in A but not in B");
        side.hop(false);
        for (int i = 1; i < kPer; ++i) side.hop(true);
        side.last_send();
      }
    }
    _exit(0);
  }
  close(fds[1]);
  std::vector<std::vector<double>> us(kN), ratio(kN);
  for (int b = 0; b < blocks; ++b) {
    std::vector<double> block_us(kN);
    for (size_t k = 0; k < kN; ++k) {
      Side side(fds[0], ways[k]);
      if (side.open() != 0) die("io_uring_queue_init");
      std::vector<double> rtt(kPer);
      for (double& t : rtt) {
        const auto t0 = Clock::now();
        side.hop(true);
        t = ns_since(t0);
      }
      block_us[k] = median(rtt) / 2 / 1000;
      us[k].push_back(block_us[k]);
    }
    for (size_t k = 0; k < kN; ++k) ratio[k].push_back(block_us[k] / block_us[0]);
  }
  close(fds[0]);
  reap(pid);
  std::printf("\n%-52s %12s %8s\n", "UDP ping-pong 8 B, interleaved blocks of 1000 rounds",
              "one-way med", "ratio");
  for (size_t k = 0; k < kN; ++k)
    std::printf("%-52s %9.2f us %8.3f\n", wait_name(ways[k]), median(us[k]), median(ratio[k]));
  std::printf("(%d blocks of each)\n", blocks);
}

void ping_pong_rows(int rounds) {
  std::printf("\n%-52s %12s %8s\n", "UDP ping-pong 8 B, two processes on loopback", "one-way med",
              "ratio");
  double limit = 0;
  for (Wait w : {Wait::kRecvSpin, Wait::kRingSpin, Wait::kDeferTaskrun}) {
    // Waiting on the ring in user space takes tens of microseconds a hop: fewer rounds.
    const double us = ping_pong(w, w == Wait::kRingSpin ? std::max(rounds / 10, 100) : rounds);
    if (us < 0) {
      std::printf("%-52s unavailable: %s\n", wait_name(w), std::strerror(static_cast<int>(-us)));
      continue;
    }
    if (w == Wait::kRecvSpin) limit = us;
    std::printf("%-52s %9.2f us %8.2f\n", wait_name(w), us, us / limit);
  }
}

// ---------------------------------------------------------------------------------------------
// Sleeping ping-pongs: both sides block between hops, as qperf's udp_lat does and as a thread
// blocked in ibv_get_cq_event does. The UDP row is the limit of `rc_lat` with events; the
// others are the least a completion channel's wait can cost over shared memory, each way with
// the syscalls it adds (docs/PERFORMANCE.md, "A wait for a completion event").

enum class Sleep { kUdp, kEventfd, kEventfdFcntl, kEventfdSteered, kFutex };

const char* sleep_name(Sleep s) {
  switch (s) {
    case Sleep::kUdp:
      return "UDP: send + blocking recv (qperf udp_lat)";
    case Sleep::kEventfd:
      return "eventfd: write the peer's, poll + read own";
    case Sleep::kEventfdFcntl:
      return "eventfd, + fcntl(F_GETFL) per wait";
    case Sleep::kEventfdSteered:
      return "eventfd, + fcntl + epoll_ctl DEL/ADD per wait";
    case Sleep::kFutex:
      return "futex: FUTEX_WAKE the peer's word, FUTEX_WAIT";
  }
  return "";
}

// What both processes share: eventfds, futex words (in a MAP_SHARED page), a UDP pair, and
// an epoll set per side holding that side's socket (the set a wait steers the socket out of).
struct SleepShared {
  int udp[2];
  int efd[2];
  int epfd[2];
  std::atomic<uint32_t>* word[2];
};

long futex(std::atomic<uint32_t>* w, int op, uint32_t v) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), op, v, nullptr, nullptr, 0);
}

// Side `me` waits for the peer's hop, then hops (sends/wakes) unless `send` is false.
void sleep_hop(const SleepShared& sh, int me, Sleep s, bool wait, bool send) {
  const int peer = 1 - me;
  char buf[64];
  uint64_t one = 1;
  if (wait) {
    switch (s) {
      case Sleep::kUdp:
        if (recv(sh.udp[me], buf, sizeof buf, 0) < 0) die("recv");
        break;
      case Sleep::kEventfdSteered:
        if (epoll_ctl(sh.epfd[me], EPOLL_CTL_DEL, sh.udp[me], nullptr) != 0) die("epoll_ctl");
        [[fallthrough]];
      case Sleep::kEventfdFcntl:
        if (fcntl(sh.efd[me], F_GETFL) < 0) die("fcntl");
        [[fallthrough]];
      case Sleep::kEventfd: {
        pollfd p{sh.efd[me], POLLIN, 0};
        if (poll(&p, 1, -1) != 1) die("poll");
        if (read(sh.efd[me], &one, sizeof one) != sizeof one) die("read");
        if (s == Sleep::kEventfdSteered) {
          epoll_event ev{};
          ev.events = EPOLLIN;
          if (epoll_ctl(sh.epfd[me], EPOLL_CTL_ADD, sh.udp[me], &ev) != 0) die("epoll_ctl");
        }
        break;
      }
      case Sleep::kFutex:
        while (sh.word[me]->load(std::memory_order_acquire) == 0) futex(sh.word[me], FUTEX_WAIT, 0);
        sh.word[me]->store(0, std::memory_order_relaxed);
        break;
    }
  }
  if (!send) return;
  one = 1;
  switch (s) {
    case Sleep::kUdp:
      if (::send(sh.udp[me], buf, kPingBytes, 0) != kPingBytes) die("send");
      break;
    case Sleep::kFutex:
      sh.word[peer]->store(1, std::memory_order_release);
      futex(sh.word[peer], FUTEX_WAKE, 1);
      break;
    default:
      if (write(sh.efd[peer], &one, sizeof one) != sizeof one) die("write");
      break;
  }
}

// What a timerfd_settime costs: arming a timer 50 us ahead (the CPU's earliest timer, which the
// kernel programs into the clock device: on a VM, an exit or a hypercall), disarming it again,
// and arming one a second ahead (behind an earlier timer: nothing to program). An ACK held for
// a reply behind a timer pays the first two per reply (docs/PERFORMANCE.md, "A wait for a
// completion event").
void timer_rows() {
  const int fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
  if (fd < 0) die("timerfd_create");
  auto at = [](uint64_t ns) {
    itimerspec its{};
    its.it_value.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
    its.it_value.tv_nsec = static_cast<long>(ns % 1'000'000'000);
    return its;
  };
  auto now_ns = [] {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000 + static_cast<uint64_t>(t.tv_nsec);
  };
  constexpr int kRounds = 20000;
  std::vector<double> near(kRounds), off(kRounds), far(kRounds);
  const itimerspec none{};
  for (int i = 0; i < kRounds; ++i) {
    auto t0 = Clock::now();
    itimerspec its = at(now_ns() + 50'000);
    if (timerfd_settime(fd, TFD_TIMER_ABSTIME, &its, nullptr) != 0) die("timerfd_settime");
    near[i] = ns_since(t0);
    t0 = Clock::now();
    timerfd_settime(fd, 0, &none, nullptr);
    off[i] = ns_since(t0);
    t0 = Clock::now();
    its = at(now_ns() + 1'000'000'000);
    timerfd_settime(fd, TFD_TIMER_ABSTIME, &its, nullptr);
    far[i] = ns_since(t0);
    timerfd_settime(fd, 0, &none, nullptr);
  }
  close(fd);
  std::printf("\n%-52s %12s\n", "timerfd_settime, median of 20000", "");
  std::printf("%-52s %9.0f ns\n", "arm 50 us ahead (the earliest timer)", median(near));
  std::printf("%-52s %9.0f ns\n", "disarm it", median(off));
  std::printf("%-52s %9.0f ns\n", "arm 1 s ahead (behind earlier timers)", median(far));
}

// Interleaved blocks of 1,000 rounds of each way over the same processes; prints each way's
// median one-way and its median ratio to the UDP way of the same block.
void sleeping_rows(int rounds) {
  const std::vector<Sleep> ways = {Sleep::kUdp, Sleep::kEventfd, Sleep::kEventfdFcntl,
                                   Sleep::kEventfdSteered, Sleep::kFutex};
  SleepShared sh{};
  socket_pair(sh.udp);
  void* page = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) die("mmap");
  for (int i = 0; i < 2; ++i) {
    sh.efd[i] = eventfd(0, 0);
    sh.epfd[i] = epoll_create1(0);
    if (sh.efd[i] < 0 || sh.epfd[i] < 0) die("eventfd/epoll_create1");
    epoll_event ev{};
    ev.events = EPOLLIN;
    if (epoll_ctl(sh.epfd[i], EPOLL_CTL_ADD, sh.udp[i], &ev) != 0) die("epoll_ctl");
    // A cache line each, 64 bytes apart.
    sh.word[i] = new (static_cast<char*>(page) + i * kLine) std::atomic<uint32_t>(0);
  }
  const size_t kN = ways.size();
  constexpr int kPer = 1000;
  const int blocks = std::max(rounds / kPer / static_cast<int>(kN), 5);
  const pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {  // B: answers every hop, block by block
    for (int b = 0; b < blocks; ++b)
      for (Sleep s : ways)
        for (int i = 0; i < kPer; ++i) sleep_hop(sh, 1, s, /*wait=*/true, /*send=*/true);
    _exit(0);
  }
  std::vector<std::vector<double>> us(kN), ratio(kN);
  for (int b = 0; b < blocks; ++b) {
    std::vector<double> block_us(kN);
    for (size_t k = 0; k < kN; ++k) {
      std::vector<double> rtt(kPer);
      for (double& t : rtt) {
        const auto t0 = Clock::now();
        sleep_hop(sh, 0, ways[k], /*wait=*/false, /*send=*/true);
        sleep_hop(sh, 0, ways[k], /*wait=*/true, /*send=*/false);
        t = ns_since(t0);
      }
      block_us[k] = median(rtt) / 2 / 1000;
      us[k].push_back(block_us[k]);
    }
    for (size_t k = 0; k < kN; ++k) ratio[k].push_back(block_us[k] / block_us[0]);
  }
  reap(pid);
  std::printf("\n%-52s %12s %8s\n", "sleeping ping-pong 8 B, interleaved blocks of 1000 rounds",
              "one-way med", "ratio");
  for (size_t k = 0; k < kN; ++k)
    std::printf("%-52s %9.2f us %8.3f\n", sleep_name(ways[k]), median(us[k]), median(ratio[k]));
  std::printf("(%d blocks of each)\n", blocks);
  for (int i = 0; i < 2; ++i) {
    close(sh.udp[i]);
    close(sh.efd[i]);
    close(sh.epfd[i]);
  }
  munmap(page, kPage);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 20000;
  bool sleeping_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::max(100, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--sleeping") == 0) {
      sleeping_only = true;
    } else {
      std::fprintf(stderr, "usage: %s [--rounds N] [--sleeping]\n", argv[0]);
      return 2;
    }
  }
  if (sleeping_only) {
    sleeping_rows(rounds);
    timer_rows();
    return 0;
  }
  pages_rows();
  interleaved_rows(rounds * 4);
  ping_pong_rows(rounds);
  sleeping_rows(rounds);
  timer_rows();
  return 0;
}
