// urdma_runtime_peer: one side of a transfer between two processes, built on the runtime and the
// provider API (runtime::Runtime::open over urdmad — which it starts when absent — and
// provider::Device; not libibverbs). runtime_process_test.cc runs two of them.
//
//   urdma_runtime_peer --role server --addr 127.0.0.1 --listen 7001 [options]
//   urdma_runtime_peer --role client --addr 127.0.0.1 --connect 127.0.0.1:7001 [options]
//   urdma_runtime_peer --scribble QPN SECONDS   (a hostile peer of one host: scribble())
//
// The client is the active side: it posts RC SENDs, RDMA WRITEs, RDMA READs, atomics
// (FETCH_ADD and CMP_SWP, successful and failing) and UD SENDs over `--qps` RC QPs (message i
// on QP i % qps) and one UD QP. With --mw, each side binds a type 2 memory window over its region
// on each RC QP, and the WRITEs and READs of QP q name the peer's window of QP q. The server
// receives, exposes its memory and checks. The two exchange QP information (QPN, PSN, GID, rkey,
// address) and phase markers over one TCP connection; the data path is RDMA only.
//
// With --srq, the server's RC QPs have no receive queue of their own: their SENDs land in the
// WQEs of one SRQ (qps x recv-depth of them), which the server reposts as they complete. urdma's
// SRQ, a queue as rxe's is, gives out its WQEs in the order they were posted, each to one
// message: every WQE carries its posting number, and when the SENDs are in, the numbers completed
// must be exactly 0 .. completions-1 (srq_gaps counts those skipped: a WQE taken, never completed).
//
// The oracle: message i of an operation is a stream of bytes from a seeded counter-based PRNG
// (splitmix64 of seed, operation, i and the word index) — nothing of the engine. Whoever sends
// hashes the bytes it handed to the device; whoever receives hashes the bytes that arrived and
// compares every message with the PRNG stream it regenerates itself. Each operation's checksum
// is the sum of its messages' hashes over the whole transfer; the receiver's sum travels back
// over TCP, and the client's result line prints both (sum= own, peer_sum= the other side's).
//
// Output: progress lines ("CONNECTED qpn_base=0x...", "IDLE") and exactly one result line
//   RESULT role=client ok=1 status=success qpn_base=0x... send_msgs=.. send_bytes=..
//          send_sum=0x.. send_peer_sum=0x.. send_bad=0 write_... read_... atomic_... ud_...
//          ud_lost=0 seconds=..
// Exit codes: 0 every check passed; 1 bad usage; 2 setup failed (runtime, QP, TCP); 3 a work
// request completed in error (status= names the first one); 4 data differed (a *_bad count,
// a sum mismatch or a lost UD datagram); 5 the peer went away or a phase timed out.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "daemon/client.h"
#include "net/address.h"
#include "net/shm_ring.h"
#include "runtime/runtime.h"
#include "support/qp_setup.h"

namespace urdma::peer {
namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- the oracle: PRNG and hash

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Message `msg` of the stream `key`: word w is mix(base + w), the tail the low bytes of the next.
void generate(uint64_t key, uint64_t msg, uint8_t* p, size_t n) {
  const uint64_t base = mix(key ^ mix(msg + 1));
  size_t w = 0;
  for (; (w + 1) * 8 <= n; ++w) {
    const uint64_t v = mix(base + w);
    std::memcpy(p + w * 8, &v, 8);
  }
  if (w * 8 < n) {
    const uint64_t v = mix(base + w);
    std::memcpy(p + w * 8, &v, n - w * 8);
  }
}

// Per word xor-multiply (a bijection per step: any one changed word changes the result).
uint64_t hash(uint64_t msg, const uint8_t* p, size_t n) {
  uint64_t h = mix(msg * 0x2545F4914F6CDD1Dull ^ n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    h = (h ^ v) * 0x100000001B3ull;
  }
  if (i < n) {
    uint64_t v = 0;
    std::memcpy(&v, p + i, n - i);
    h = (h ^ v) * 0x100000001B3ull;
  }
  return mix(h);
}

// True when p[0, n) is message `msg` of stream `key` (regenerated here, chunk by chunk).
bool matches(uint64_t key, uint64_t msg, const uint8_t* p, size_t n) {
  const uint64_t base = mix(key ^ mix(msg + 1));
  size_t w = 0;
  for (; (w + 1) * 8 <= n; ++w) {
    const uint64_t v = mix(base + w);
    if (std::memcmp(p + w * 8, &v, 8) != 0) return false;
  }
  if (w * 8 < n) {
    const uint64_t v = mix(base + w);
    if (std::memcmp(p + w * 8, &v, n - w * 8) != 0) return false;
  }
  return true;
}

// Message sizes: 1 B to multi-MiB, cycled; only those <= the cap take part.
constexpr uint32_t kSizes[] = {
    1,    2,    7,     64,    1000,   1024,           1025,           4095,          4096,
    4097, 8193, 65536, 65537, 262144, (1u << 20) + 3, (4u << 20) - 1, (4u << 20) + 1};

std::vector<uint32_t> size_cycle(uint64_t cap) {
  std::vector<uint32_t> v;
  for (uint32_t s : kSizes)
    if (s <= cap) v.push_back(s);
  if (v.empty()) v.push_back(1);
  return v;
}

enum Op : uint64_t { kSend = 1, kWrite = 2, kRead = 3, kAtomic = 4, kUd = 5 };
uint64_t stream_key(uint64_t seed, Op op) {
  return mix(seed * 0x100 + op);
}

// ---------------------------------------------------------------- options

struct Options {
  bool server = false;
  std::string addr;  // our own IP: the GID and the engine's source address
  uint16_t listen_port = 0;
  std::string connect_host;
  uint16_t connect_port = 0;
  bool send = true, write = true, read = true, atomic = true, ud = true;
  uint64_t bytes = 8u << 20;     // per operation (send, write, read)
  uint64_t ud_bytes = 1u << 20;  // UD volume
  uint64_t max_size = 4u << 20;  // largest message
  uint64_t send_max = 4u << 20;  // largest SEND (the receive buffers' size)
  uint64_t region = 16u << 20;   // the WRITE target / READ source
  uint32_t qps = 1;
  uint32_t atomics = 3000;
  uint32_t recv_depth = 4;  // RC receives posted per QP
  uint32_t sq_depth = 0;    // outstanding send WRs per QP (0: chosen from qps)
  uint64_t seed = 1;
  ibv_mtu mtu = IBV_MTU_4096;
  uint8_t timeout = 16;  // local ACK timeout code: 4.096 us << 16 = 268 ms
  uint8_t retry = 7;
  bool stream = false;   // WRITE without per-round checks, until done or an error (kill test)
  bool hold = false;     // after the result line, wait for EOF on stdin
  bool mw = false;       // WRITE and READ through type 2 memory windows, one per RC QP
  bool srq = false;      // server: the RC QPs receive from one SRQ
  uint32_t idle_ms = 0;  // client: idle this long with the QPs open before finishing
  uint32_t phase_timeout_s = 120;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "urdma_runtime_peer: %s\n", why);
  std::exit(1);
}

uint64_t parse_u64(const char* s) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 0);
  if (errno != 0 || end == s || *end != '\0') usage("a number does not parse");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view k = argv[i];
    if (k == "--stream") {
      o.stream = true;
      continue;
    }
    if (k == "--mw") {
      o.mw = true;
      continue;
    }
    if (k == "--hold") {
      o.hold = true;
      continue;
    }
    if (k == "--srq") {
      o.srq = true;
      continue;
    }
    if (i + 1 >= argc) usage("an option lacks its value");
    const char* v = argv[++i];
    if (k == "--role") {
      if (std::string_view(v) != "server" && std::string_view(v) != "client") usage("--role");
      o.server = std::string_view(v) == "server";
    } else if (k == "--addr") {
      o.addr = v;
    } else if (k == "--listen") {
      o.listen_port = static_cast<uint16_t>(parse_u64(v));
    } else if (k == "--connect") {
      const std::string s = v;
      const auto colon = s.rfind(':');
      if (colon == std::string::npos) usage("--connect HOST:PORT");
      o.connect_host = s.substr(0, colon);
      o.connect_port = static_cast<uint16_t>(parse_u64(s.c_str() + colon + 1));
    } else if (k == "--ops") {
      const std::string s = std::string(",") + v + ",";
      auto has = [&](const char* n) { return s.find(std::string(",") + n + ",") != s.npos; };
      o.send = has("send");
      o.write = has("write");
      o.read = has("read");
      o.atomic = has("atomic");
      o.ud = has("ud");
    } else if (k == "--bytes") {
      o.bytes = parse_u64(v);
    } else if (k == "--ud-bytes") {
      o.ud_bytes = parse_u64(v);
    } else if (k == "--max-size") {
      o.max_size = parse_u64(v);
    } else if (k == "--send-max") {
      o.send_max = parse_u64(v);
    } else if (k == "--region") {
      o.region = parse_u64(v);
    } else if (k == "--qps") {
      o.qps = static_cast<uint32_t>(parse_u64(v));
    } else if (k == "--atomics") {
      o.atomics = static_cast<uint32_t>(parse_u64(v));
    } else if (k == "--recv-depth") {
      o.recv_depth = static_cast<uint32_t>(parse_u64(v));
    } else if (k == "--sq-depth") {
      o.sq_depth = static_cast<uint32_t>(parse_u64(v));
    } else if (k == "--seed") {
      o.seed = parse_u64(v);
    } else if (k == "--mtu") {
      const uint64_t m = parse_u64(v);
      o.mtu = m == 1024   ? IBV_MTU_1024
              : m == 2048 ? IBV_MTU_2048
              : m == 4096 ? IBV_MTU_4096
                          : IBV_MTU_256;
      if (m != 1024 && m != 2048 && m != 4096) usage("--mtu 1024|2048|4096");
    } else if (k == "--timeout") {
      o.timeout = static_cast<uint8_t>(parse_u64(v));
    } else if (k == "--retry") {
      o.retry = static_cast<uint8_t>(parse_u64(v));
    } else if (k == "--idle-ms") {
      o.idle_ms = static_cast<uint32_t>(parse_u64(v));
    } else if (k == "--phase-timeout") {
      o.phase_timeout_s = static_cast<uint32_t>(parse_u64(v));
    } else {
      usage("unknown option");
    }
  }
  if (o.addr.empty()) usage("--addr is required");
  if (o.server ? o.listen_port == 0 : o.connect_port == 0) usage("--listen or --connect");
  if (o.qps == 0 || o.qps > 4000) usage("--qps 1..4000");
  o.max_size = std::min(o.max_size, o.region);
  o.send_max = std::min(o.send_max, o.max_size);
  if (o.sq_depth == 0) o.sq_depth = std::clamp<uint32_t>(16000 / o.qps, 4, 64);
  if (o.recv_depth == 0 || o.qps * o.recv_depth > 16000) usage("--recv-depth");
  return o;
}

// ---------------------------------------------------------------- the TCP control channel

enum CtlType : uint32_t {
  kSendBegin = 1,  // a = messages: the server receives them all, then acks
  kWriteRound,     // b = first message, c = count: written; the server checks them
  kReadRound,      // b = first, c = count: the server generates them for the client to read
  kAtomicEnd,      // the server hashes its counters
  kUdBatch,        // b = first, c = count: sent; the server waits for them
  kDone,           // the client is finished
  kAck,            // b = sum, c = bad (or the received count), d = extra
};

struct Ctl {
  uint32_t type = 0;
  uint32_t a = 0;
  uint64_t b = 0, c = 0, d = 0;
};

struct Hello {
  uint32_t magic = 0x55525044;  // "URPD"
  uint32_t qps = 0;
  uint8_t gid[16] = {};
  uint32_t ud_qpn = 0;
  uint32_t qpn_base = 0;
  uint64_t region_addr = 0;
  uint64_t region_bytes = 0;
  uint32_t region_rkey = 0;
  uint32_t counters_rkey = 0;
  uint64_t counters_addr = 0;
};
struct QpWire {
  uint32_t qpn;
  uint32_t psn;
};

bool write_all(int fd, const void* data, size_t n) {
  auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, size_t n, int timeout_ms) {
  auto* p = static_cast<uint8_t*>(data);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (n > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int r = poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

int tcp_server(uint16_t port, uint32_t qpn_base) {
  const int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  sin.sin_addr.s_addr = htonl(INADDR_ANY);
  if (bind(ls, reinterpret_cast<sockaddr*>(&sin), sizeof sin) != 0 || listen(ls, 1) != 0) {
    std::fprintf(stderr, "tcp listen on %u: %s\n", port, std::strerror(errno));
    return -1;
  }
  std::printf("LISTENING port=%u qpn_base=%#x\n", port, qpn_base);
  std::fflush(stdout);
  pollfd pfd{ls, POLLIN, 0};
  if (poll(&pfd, 1, 60000) != 1) return -1;
  const int fd = accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
  close(ls);
  if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int tcp_client(const std::string& host, uint16_t port) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &sin.sin_addr) != 1) return -1;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) == 0) {
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

// ---------------------------------------------------------------- the peer

// Every registered buffer ends at a PROT_NONE page and starts one page after another: a write
// past either end of a region (a stray placement from the wire or from shared memory) kills the
// process, and the test that runs it fails.
struct GuardedPages {
  uint8_t* base = nullptr;
  size_t bytes = 0;
  GuardedPages() = default;
  GuardedPages(GuardedPages&& o) noexcept : base(std::exchange(o.base, nullptr)), bytes(o.bytes) {}
  GuardedPages& operator=(GuardedPages&& o) noexcept {
    std::swap(base, o.base);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~GuardedPages() {
    if (base != nullptr) munmap(base, bytes);
  }
};

struct Buffer {
  GuardedPages pages;
  uint8_t* start = nullptr;
  size_t size = 0;
  provider::Mr* mr = nullptr;
  uint8_t* data() const { return start; }
  uint64_t addr() const { return reinterpret_cast<uintptr_t>(start); }
};

struct OpStats {
  uint64_t msgs = 0, bytes = 0, sum = 0, peer_sum = 0, bad = 0;
};

class Peer {
 public:
  explicit Peer(Options o) : o_(std::move(o)) {}
  int run();

 private:
  // Setup.
  int open_device();
  Buffer make_buffer(size_t n);
  provider::Qp* make_qp(ibv_qp_type type);
  // A receive for RC QP q: on its own queue, or with --srq on the server's SRQ.
  bool post_rc_recv(uint32_t q, ibv_recv_wr& wr);
  int exchange_and_connect();
  // --mw: binds a type 2 window over the region on each RC QP and trades the rkeys.
  int exchange_windows();
  // The rkey that reaches the peer's region from RC QP q.
  uint32_t region_rkey(uint32_t q) const { return o_.mw ? peer_windows_[q] : peer_.region_rkey; }

  // The client's phases (each returns an exit code, 0 when it went well).
  int client_send();
  int client_write();
  int client_stream();
  int client_read();
  int client_atomic();
  int client_ud();
  // The server's loop.
  int serve();
  int server_send(uint64_t messages);
  void server_write_round(uint64_t first, uint64_t count, Ctl* ack);
  void server_read_round(uint64_t first, uint64_t count, Ctl* ack);
  int server_ud(uint64_t first, uint64_t count, Ctl* ack);

  // Work requests.
  // Posts on RC QP q once it has room (completions are reaped meanwhile); false on an error.
  bool post_rc(uint32_t q, ibv_send_wr& wr);
  // Reaps send completions until none is outstanding.
  bool drain_sends();
  // One poll of the send CQ (drives the engine when empty). False once a WR failed.
  bool reap_sends();
  // Waits a little: polls again soon, driving the engine inline if nobody does.
  void pause(uint32_t& idle);
  bool ctl_send(const Ctl& c) { return write_all(tcp_, &c, sizeof c); }
  bool ctl_recv(Ctl* c) { return read_all(tcp_, c, sizeof *c, int(o_.phase_timeout_s) * 1000); }
  int ctl_ack(Ctl* ack) { return ctl_recv(ack) && ack->type == kAck ? 0 : fail(5, "no ack"); }
  int fail(int code, const char* why) {
    if (exit_code_ == 0) exit_code_ = code;
    if (why_.empty()) why_ = why;
    return code;
  }

  // Layout of a WRITE/READ round: messages from `first` packed into the region, at most `left`.
  struct Round {
    uint64_t first = 0, count = 0;
    std::vector<uint64_t> offsets;
  };
  Round plan_round(uint64_t first, uint64_t left) const;
  uint32_t size_of(uint64_t i) const { return sizes_[i % sizes_.size()]; }
  uint64_t messages_for(uint64_t bytes, const std::vector<uint32_t>& sizes) const;

  void print_result(double seconds);

  Options o_;
  std::vector<uint32_t> sizes_, send_sizes_, ud_sizes_;
  // Declared before the runtime: destroyed after it (its engine thread may still place data).
  Buffer region_, counters_, results_, recvs_, ud_bufs_;
  std::unique_ptr<runtime::Runtime> rt_;
  provider::Pd* pd_ = nullptr;
  provider::Cq* scq_ = nullptr;
  provider::Cq* rcq_ = nullptr;
  std::vector<provider::Qp*> qps_;
  provider::Srq* srq_ = nullptr;  // --srq on the server: the RC QPs' receive WQEs
  uint64_t srq_posts_ = 0;        // WQEs posted to srq_: the next one's posting number
  std::vector<bool> srq_done_;    // by posting number: completed
  uint64_t srq_gaps_ = 0;
  std::unordered_map<uint32_t, uint32_t> qp_index_;  // qp_num -> q
  std::vector<uint32_t> outstanding_;                // send WRs per RC QP
  uint64_t outstanding_total_ = 0;
  provider::Qp* ud_qp_ = nullptr;
  provider::Ah* ah_ = nullptr;
  ibv_ah ah_ref_{};  // what a WR names: the handle of ah_
  uint32_t ud_slot_bytes_ = 0;
  int tcp_ = -1;
  Hello peer_{};
  std::vector<QpWire> peer_qps_;
  std::vector<provider::Mw*> windows_;   // --mw: ours, bound on qps_[q]
  std::vector<uint32_t> peer_windows_;  // --mw: the peer's rkeys, per QP
  OpStats send_, write_, read_, atomic_, ud_;
  uint64_t ud_lost_ = 0;
  uint32_t send_qps_ = 0;  // server: RC QPs that delivered at least one SEND
  ibv_wc_status first_error_ = IBV_WC_SUCCESS;
  int exit_code_ = 0;
  std::string why_;
};

int Peer::open_device() {
  const auto addr = net::Address::parse(o_.addr);
  if (!addr) return fail(1, "--addr does not parse");
  runtime::RuntimeConfig c;
  c.device = test::device_config(nullptr, *addr, o_.mtu);
  c.engine.local_address = *addr;
  int err = 0;
  std::string why;
  rt_ = runtime::Runtime::open({}, c, &err, &why);
  if (!rt_) {
    std::fprintf(stderr, "Runtime::open: %s (%s)\n", std::strerror(err), why.c_str());
    return fail(2, "Runtime::open failed");
  }
  provider::Device& dev = rt_->device();
  pd_ = dev.alloc_pd().value();
  const uint32_t rc_send = o_.qps * o_.sq_depth + 64;
  const uint32_t rc_recv = o_.qps * o_.recv_depth + 256;
  auto scq = dev.create_cq(static_cast<int>(std::min(rc_send, provider::kLimits.max_cqe)));
  auto rcq = dev.create_cq(static_cast<int>(std::min(rc_recv, provider::kLimits.max_cqe)));
  if (!scq.ok() || !rcq.ok()) return fail(2, "create_cq failed");
  scq_ = scq.value();
  rcq_ = rcq.value();
  return 0;
}

Buffer Peer::make_buffer(size_t n) {
  Buffer b;
  b.size = (std::max<size_t>(n, 8) + 7) & ~size_t{7};  // atomics' targets stay 8-byte aligned
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t inner = (b.size + page - 1) / page * page;
  void* all = mmap(nullptr, inner + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (all == MAP_FAILED) {
    fail(2, "mmap failed");
    return b;
  }
  b.pages.base = static_cast<uint8_t*>(all);
  b.pages.bytes = inner + 2 * page;
  if (mprotect(b.pages.base + page, inner, PROT_READ | PROT_WRITE) != 0) {
    fail(2, "mprotect failed");
    return b;
  }
  b.start = b.pages.base + page + (inner - b.size);  // the last byte abuts the guard page
  auto mr = rt_->device().reg_mr(pd_, b.start, b.size, b.addr(),
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                     IBV_ACCESS_MW_BIND);
  if (!mr.ok()) {
    fail(2, "reg_mr failed");
    return b;
  }
  b.mr = mr.value();
  return b;
}

provider::Qp* Peer::make_qp(ibv_qp_type type) {
  provider::QpInitAttr init;
  init.qp_type = type;
  init.pd = pd_;
  init.send_cq = scq_;
  init.recv_cq = rcq_;
  init.cap.max_send_wr = type == IBV_QPT_UD ? 64 : o_.sq_depth;
  init.cap.max_recv_wr = type == IBV_QPT_UD ? 64 : o_.recv_depth;
  if (type == IBV_QPT_RC && srq_ != nullptr) {
    init.srq = srq_;
    init.cap.max_recv_wr = 0;
  }
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  auto q = rt_->device().create_qp(init);
  if (!q.ok()) {
    std::fprintf(stderr, "create_qp: %s\n", std::strerror(q.error()));
    fail(2, "create_qp failed");
    return nullptr;
  }
  return q.value();
}

// A receive's wr_id: its buffer slot in the low kSlotBits, and on the SRQ its posting number
// above them.
constexpr int kSlotBits = 20;
constexpr uint64_t kSlotMask = (uint64_t{1} << kSlotBits) - 1;

bool Peer::post_rc_recv(uint32_t q, ibv_recv_wr& wr) {
  ibv_recv_wr* bad = nullptr;
  if (srq_ == nullptr) return qps_[q]->post_recv(&wr, &bad).ok();
  wr.wr_id = (srq_posts_ << kSlotBits) | (wr.wr_id & kSlotMask);
  if (!srq_->post_recv(&wr, &bad).ok()) return false;
  ++srq_posts_;
  return true;
}

uint32_t psn_of(uint64_t seed, uint32_t qpn) {
  return static_cast<uint32_t>(mix(seed ^ qpn)) & 0xFFFFFF;
}

int Peer::exchange_and_connect() {
  Hello h;
  h.qps = o_.qps;
  const auto addr = net::Address::parse(o_.addr);
  std::memcpy(h.gid, addr->bytes().data(), 16);
  h.ud_qpn = ud_qp_->qp_num();
  h.qpn_base = rt_->device().qpn_base();
  h.region_addr = region_.addr();
  h.region_bytes = region_.size;
  h.region_rkey = region_.mr->rkey();
  h.counters_addr = counters_.addr();
  h.counters_rkey = counters_.mr->rkey();
  std::vector<QpWire> mine;
  for (provider::Qp* q : qps_) mine.push_back({q->qp_num(), psn_of(o_.seed, q->qp_num())});
  if (!write_all(tcp_, &h, sizeof h) || !write_all(tcp_, mine.data(), mine.size() * sizeof(QpWire)))
    return fail(5, "hello not sent");
  if (!read_all(tcp_, &peer_, sizeof peer_, 30000) || peer_.magic != h.magic || peer_.qps != o_.qps)
    return fail(5, "no hello from the peer (or --qps differs)");
  peer_qps_.resize(peer_.qps);
  if (!read_all(tcp_, peer_qps_.data(), peer_qps_.size() * sizeof(QpWire), 30000))
    return fail(5, "no QP list from the peer");
  const net::Address peer_addr = net::Address::from_v6(std::span<const uint8_t, 16>(peer_.gid));
  for (uint32_t q = 0; q < o_.qps; ++q) {
    test::QpParams p;
    p.type = IBV_QPT_RC;
    p.mtu = o_.mtu;
    p.sq_psn = mine[q].psn;
    p.rq_psn = peer_qps_[q].psn;
    p.timeout = o_.timeout;
    p.retry_cnt = o_.retry;
    p.rnr_retry = 7;
    p.max_rd_atomic = 16;
    p.max_dest_rd_atomic = 16;
    const test::BringUp r = test::bring_up(*qps_[q], p, peer_addr, peer_qps_[q].qpn);
    if (!r.ok()) {
      std::fprintf(stderr, "bring_up QP %u: %s\n", q, std::strerror(r.status.error()));
      return fail(2, "RC bring-up failed");
    }
  }
  test::QpParams u;
  u.type = IBV_QPT_UD;
  u.sq_psn = psn_of(o_.seed, ud_qp_->qp_num());
  if (!test::bring_up(*ud_qp_, u, peer_addr, 0).ok()) return fail(2, "UD bring-up failed");
  ibv_ah_attr ah{};
  ah.is_global = 1;
  ah.port_num = provider::kPortNum;
  std::memcpy(ah.grh.dgid.raw, peer_.gid, 16);
  ah.grh.sgid_index = 0;
  ah.grh.hop_limit = 64;
  auto made = rt_->device().create_ah(pd_, ah);
  if (!made.ok()) return fail(2, "create_ah failed");
  ah_ = made.value();
  ah_ref_.handle = ah_->handle();
  return o_.mw ? exchange_windows() : 0;
}

int Peer::exchange_windows() {
  ibv_mr verbs_mr{};
  verbs_mr.handle = region_.mr->handle();
  std::vector<uint32_t> rkeys;
  std::vector<ibv_mw> verbs_mws(o_.qps);
  for (uint32_t q = 0; q < o_.qps; ++q) {
    auto mw = rt_->device().alloc_mw(pd_, IBV_MW_TYPE_2);
    if (!mw.ok()) return fail(2, "alloc_mw failed");
    windows_.push_back(mw.value());
    verbs_mws[q].handle = mw.value()->handle();
    ibv_send_wr wr{};
    wr.wr_id = q;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = &verbs_mws[q];
    // A fresh key byte: the rkey the window answers to from now on (ibv_bind_mw(3)).
    wr.bind_mw.rkey = (mw.value()->rkey() & ~0xFFu) | ((q + 0x5A) & 0xFFu);
    wr.bind_mw.bind_info.mr = &verbs_mr;
    wr.bind_mw.bind_info.addr = region_.addr();
    wr.bind_mw.bind_info.length = region_.size;
    wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    rkeys.push_back(wr.bind_mw.rkey);
    if (!post_rc(q, wr)) return exit_code_;
  }
  if (!drain_sends()) return exit_code_;
  for (uint32_t q = 0; q < o_.qps; ++q)
    if (!windows_[q]->bound() || windows_[q]->rkey() != rkeys[q])
      return fail(3, "a window did not bind");
  peer_windows_.resize(o_.qps);
  if (!write_all(tcp_, rkeys.data(), rkeys.size() * sizeof(uint32_t)) ||
      !read_all(tcp_, peer_windows_.data(), peer_windows_.size() * sizeof(uint32_t), 30000))
    return fail(5, "no window rkeys from the peer");
  return 0;
}

void Peer::pause(uint32_t& idle) {
  if (++idle < 64) {
    if (!rt_->try_progress()) std::this_thread::yield();
    return;
  }
  // Nothing for a while: leave the engine to its thread and let the other processes run.
  std::this_thread::sleep_for(std::chrono::microseconds(50));
}

bool Peer::reap_sends() {
  ibv_wc wc[64];
  const int n = scq_->poll(64, wc);
  for (int i = 0; i < n; ++i) {
    if (wc[i].status != IBV_WC_SUCCESS) {
      if (first_error_ == IBV_WC_SUCCESS) {
        first_error_ = wc[i].status;
        std::fprintf(stderr, "wr %" PRIu64 " on QPN %#x: %s\n", wc[i].wr_id, wc[i].qp_num,
                     ibv_wc_status_str(wc[i].status));
      }
      fail(3, "a work request completed in error");
    }
    const auto it = qp_index_.find(wc[i].qp_num);
    if (it != qp_index_.end()) --outstanding_[it->second];
    --outstanding_total_;
  }
  return first_error_ == IBV_WC_SUCCESS;
}

bool Peer::post_rc(uint32_t q, ibv_send_wr& wr) {
  uint32_t idle = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(o_.phase_timeout_s);
  while (outstanding_[q] >= o_.sq_depth) {
    if (!reap_sends()) return false;
    if (Clock::now() > deadline) {
      fail(5, "send queue stuck");
      return false;
    }
    pause(idle);
  }
  ibv_send_wr* bad = nullptr;
  const provider::Status st = qps_[q]->post_send(&wr, &bad);
  if (!st.ok()) {
    std::fprintf(stderr, "post_send: %s\n", std::strerror(st.error()));
    fail(3, "post_send failed");
    return false;
  }
  ++outstanding_[q];
  ++outstanding_total_;
  return true;
}

bool Peer::drain_sends() {
  uint32_t idle = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(o_.phase_timeout_s);
  while (outstanding_total_ > 0) {
    const uint64_t before = outstanding_total_;
    if (!reap_sends()) {
      // Every WR of a failed QP completes (flushed): reap them all so the report is complete.
      while (outstanding_total_ > 0 && Clock::now() < deadline) {
        reap_sends();
        pause(idle);
      }
      return false;
    }
    if (Clock::now() > deadline) {
      fail(5, "send completions missing");
      return false;
    }
    if (outstanding_total_ == before)
      pause(idle);
    else
      idle = 0;
  }
  return true;
}

uint64_t Peer::messages_for(uint64_t bytes, const std::vector<uint32_t>& sizes) const {
  uint64_t n = 0, sum = 0;
  while (sum < bytes || n < o_.qps) sum += sizes[n++ % sizes.size()];
  return n;
}

Peer::Round Peer::plan_round(uint64_t first, uint64_t left) const {
  Round r;
  r.first = first;
  uint64_t off = 0;
  while (r.count < left && off + size_of(first + r.count) <= region_.size) {
    r.offsets.push_back(off);
    off += size_of(first + r.count);
    ++r.count;
  }
  return r;
}

// ---- client phases

int Peer::client_send() {
  const uint64_t key = stream_key(o_.seed, kSend);
  const uint64_t m = messages_for(o_.bytes, send_sizes_);
  if (!ctl_send({kSendBegin, 0, m, 0, 0})) return fail(5, "tcp");
  // Send buffers are slots of the client's region (free during this phase), used in turn; all
  // sends are reaped before the ring wraps, so no buffer is rewritten while a WR still owns it.
  Buffer& buf = region_;
  const uint64_t slot_bytes = o_.send_max;
  const uint64_t slots = std::max<uint64_t>(1, buf.size / slot_bytes);
  for (uint64_t i = 0; i < m; ++i) {
    const uint32_t q = static_cast<uint32_t>(i % o_.qps);
    const uint32_t n = send_sizes_[i % send_sizes_.size()];
    const uint64_t s = i % slots;
    if (i > 0 && s == 0 && !drain_sends()) return exit_code_;
    uint8_t* p = buf.data() + s * slot_bytes;
    generate(key, i, p, n);
    send_.sum += hash(i, p, n);
    send_.bytes += n;
    ibv_sge sge{reinterpret_cast<uintptr_t>(p), n, buf.mr->lkey()};
    ibv_send_wr wr{};
    wr.wr_id = i;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (!post_rc(q, wr)) return exit_code_;
  }
  if (!drain_sends()) return exit_code_;
  send_.msgs = m;
  Ctl ack;
  if (int e = ctl_ack(&ack)) return e;
  send_.peer_sum = ack.b;
  send_.bad = ack.c;
  return 0;
}

int Peer::client_write() {
  const uint64_t key = stream_key(o_.seed, kWrite);
  const uint64_t m = messages_for(o_.bytes, sizes_);
  for (uint64_t first = 0; first < m;) {
    const Round r = plan_round(first, m - first);
    for (uint64_t k = 0; k < r.count; ++k) {
      const uint64_t i = first + k;
      const uint32_t n = size_of(i);
      uint8_t* p = region_.data() + r.offsets[k];
      generate(key, i, p, n);
      write_.sum += hash(i, p, n);
      write_.bytes += n;
      ibv_sge sge{reinterpret_cast<uintptr_t>(p), n, region_.mr->lkey()};
      ibv_send_wr wr{};
      wr.wr_id = i;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = peer_.region_addr + r.offsets[k];
      wr.wr.rdma.rkey = region_rkey(static_cast<uint32_t>(i % o_.qps));
      if (!post_rc(static_cast<uint32_t>(i % o_.qps), wr)) return exit_code_;
    }
    if (!drain_sends()) return exit_code_;
    // Every WRITE is placed (each completed: the responder ACKs after placing, IBA 9.7.5.1).
    if (!ctl_send({kWriteRound, 0, first, r.count, 0})) return fail(5, "tcp");
    Ctl ack;
    if (int e = ctl_ack(&ack)) return e;
    write_.peer_sum += ack.b;
    write_.bad += ack.c;
    first += r.count;
  }
  write_.msgs = m;
  return 0;
}

// WRITE round after round into the server's region, no checks: until --bytes or an error.
int Peer::client_stream() {
  const uint64_t m = messages_for(o_.bytes, sizes_);
  std::printf("STREAMING\n");
  std::fflush(stdout);
  for (uint64_t first = 0; first < m;) {
    const Round r = plan_round(first, m - first);
    for (uint64_t k = 0; k < r.count; ++k) {
      const uint64_t i = first + k;
      ibv_sge sge{region_.addr() + r.offsets[k], size_of(i), region_.mr->lkey()};
      ibv_send_wr wr{};
      wr.wr_id = i;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = peer_.region_addr + r.offsets[k];
      wr.wr.rdma.rkey = region_rkey(static_cast<uint32_t>(i % o_.qps));
      if (!post_rc(static_cast<uint32_t>(i % o_.qps), wr)) {
        drain_sends();
        return exit_code_;
      }
      write_.bytes += size_of(i);
      ++write_.msgs;
    }
    first += r.count;
  }
  return drain_sends() ? 0 : exit_code_;
}

int Peer::client_read() {
  const uint64_t key = stream_key(o_.seed, kRead);
  const uint64_t m = messages_for(o_.bytes, sizes_);
  for (uint64_t first = 0; first < m;) {
    const Round r = plan_round(first, m - first);
    if (!ctl_send({kReadRound, 0, first, r.count, 0})) return fail(5, "tcp");
    Ctl ack;
    if (int e = ctl_ack(&ack)) return e;  // the server generated the round
    read_.peer_sum += ack.b;
    for (uint64_t k = 0; k < r.count; ++k) {
      const uint64_t i = first + k;
      ibv_sge sge{region_.addr() + r.offsets[k], size_of(i), region_.mr->lkey()};
      ibv_send_wr wr{};
      wr.wr_id = i;
      wr.opcode = IBV_WR_RDMA_READ;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = peer_.region_addr + r.offsets[k];
      wr.wr.rdma.rkey = region_rkey(static_cast<uint32_t>(i % o_.qps));
      if (!post_rc(static_cast<uint32_t>(i % o_.qps), wr)) return exit_code_;
    }
    if (!drain_sends()) return exit_code_;
    for (uint64_t k = 0; k < r.count; ++k) {
      const uint64_t i = first + k;
      const uint8_t* p = region_.data() + r.offsets[k];
      read_.sum += hash(i, p, size_of(i));
      read_.bytes += size_of(i);
      if (!matches(key, i, p, size_of(i))) ++read_.bad;
    }
    first += r.count;
  }
  read_.msgs = m;
  return 0;
}

constexpr uint32_t kCounters = 64;

uint64_t counter_init(uint64_t seed, uint32_t j) {
  return mix(stream_key(seed, kAtomic) + j);
}

int Peer::client_atomic() {
  // Counter j is only touched through QP j % qps, whose responder executes in order: the
  // value each atomic returns is known in advance from this model.
  std::vector<uint64_t> model(kCounters);
  for (uint32_t j = 0; j < kCounters; ++j) model[j] = counter_init(o_.seed, j);
  std::vector<uint64_t> expect(o_.atomics);
  auto* results = reinterpret_cast<uint64_t*>(results_.data());
  for (uint32_t k = 0; k < o_.atomics; ++k) {
    const uint32_t j = k % kCounters;
    ibv_sge sge{results_.addr() + uint64_t{k} * 8, 8, results_.mr->lkey()};
    ibv_send_wr wr{};
    wr.wr_id = k;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.atomic.remote_addr = peer_.counters_addr + uint64_t{j} * 8;
    wr.wr.atomic.rkey = peer_.counters_rkey;
    expect[k] = model[j];
    const uint64_t r = mix(o_.seed + k);
    switch (k % 3) {
      case 0:  // FETCH_ADD
        wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        wr.wr.atomic.compare_add = r;
        model[j] += r;
        break;
      case 1:  // CMP_SWP that matches: swaps
        wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
        wr.wr.atomic.compare_add = model[j];
        wr.wr.atomic.swap = r;
        model[j] = r;
        break;
      default:  // CMP_SWP that does not match: returns the value, changes nothing
        wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
        wr.wr.atomic.compare_add = model[j] ^ 1;
        wr.wr.atomic.swap = r ^ 0xdead;
        break;
    }
    results[k] = ~expect[k];  // anything but the expected value until the result lands
    if (!post_rc(j % o_.qps, wr)) return exit_code_;
  }
  if (!drain_sends()) return exit_code_;
  for (uint32_t k = 0; k < o_.atomics; ++k) {
    if (results[k] != expect[k]) {
      if (atomic_.bad == 0)
        std::fprintf(stderr, "atomic %u returned %#" PRIx64 ", expected %#" PRIx64 "\n", k,
                     results[k], expect[k]);
      ++atomic_.bad;
    }
  }
  atomic_.msgs = o_.atomics;
  atomic_.bytes = uint64_t{o_.atomics} * 8;
  atomic_.sum = hash(0, reinterpret_cast<const uint8_t*>(model.data()), kCounters * 8);
  if (!ctl_send({kAtomicEnd, 0, 0, 0, 0})) return fail(5, "tcp");
  Ctl ack;
  if (int e = ctl_ack(&ack)) return e;
  atomic_.peer_sum = ack.b;
  return 0;
}

int Peer::client_ud() {
  const uint64_t key = stream_key(o_.seed, kUd);
  const uint64_t m = messages_for(o_.ud_bytes, ud_sizes_);
  constexpr uint64_t kBatch = 32;  // the server has this many receives posted
  uint8_t* base = ud_bufs_.data();
  for (uint64_t first = 0; first < m; first += kBatch) {
    const uint64_t count = std::min(kBatch, m - first);
    for (uint64_t k = 0; k < count; ++k) {
      const uint64_t i = first + k;
      const uint32_t n = ud_sizes_[i % ud_sizes_.size()];
      uint8_t* p = base + k * ud_slot_bytes_;
      generate(key, i, p, n);
      ud_.sum += hash(i, p, n);
      ud_.bytes += n;
      ibv_sge sge{reinterpret_cast<uintptr_t>(p), n, ud_bufs_.mr->lkey()};
      ibv_send_wr wr{};
      wr.wr_id = i;
      wr.opcode = IBV_WR_SEND_WITH_IMM;
      wr.imm_data = htonl(static_cast<uint32_t>(i));
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.ud.ah = &ah_ref_;
      wr.wr.ud.remote_qpn = peer_.ud_qpn;
      wr.wr.ud.remote_qkey = 0x11111111;
      ibv_send_wr* bad = nullptr;
      const provider::Status st = ud_qp_->post_send(&wr, &bad);
      if (!st.ok()) return fail(3, "UD post_send failed");
      ++outstanding_total_;
    }
    if (!drain_sends()) return exit_code_;
    if (!ctl_send({kUdBatch, 0, first, count, 0})) return fail(5, "tcp");
    Ctl ack;
    if (int e = ctl_ack(&ack)) return e;
    ud_.peer_sum += ack.b;
    ud_.bad += ack.c;
    ud_lost_ += count - ack.d;
  }
  ud_.msgs = m;
  return 0;
}

// ---- server

int Peer::server_send(uint64_t messages) {
  const uint64_t key = stream_key(o_.seed, kSend);
  std::vector<uint64_t> seen(o_.qps, 0);
  uint64_t got = 0;
  uint32_t idle = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(o_.phase_timeout_s);
  ibv_wc wc[64];
  while (got < messages) {
    const int n = rcq_->poll(64, wc);
    if (n == 0) {
      if (Clock::now() > deadline) return fail(5, "SENDs missing");
      pause(idle);
      continue;
    }
    idle = 0;
    for (int e = 0; e < n; ++e) {
      if (wc[e].status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "receive: %s\n", ibv_wc_status_str(wc[e].status));
        return fail(3, "a receive completed in error");
      }
      const uint32_t q = qp_index_.at(wc[e].qp_num);
      const uint64_t i = q + seen[q]++ * o_.qps;  // RC delivers in order per QP
      const uint64_t slot = wc[e].wr_id & kSlotMask;
      if (srq_ != nullptr) {
        const uint64_t number = wc[e].wr_id >> kSlotBits;
        if (number >= srq_done_.size()) srq_done_.resize(number + 1);
        srq_done_[number] = true;
      }
      const uint8_t* p = recvs_.data() + slot * o_.send_max;
      const uint32_t size = send_sizes_[i % send_sizes_.size()];
      if (wc[e].byte_len != size || !matches(key, i, p, size)) ++send_.bad;
      send_.sum += hash(i, p, wc[e].byte_len);
      send_.bytes += wc[e].byte_len;
      ++got;
      ibv_sge sge{reinterpret_cast<uintptr_t>(p), static_cast<uint32_t>(o_.send_max),
                  recvs_.mr->lkey()};
      ibv_recv_wr wr{};
      wr.wr_id = slot;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      if (!post_rc_recv(q, wr)) return fail(3, "post_recv failed");
    }
  }
  send_.msgs = got;
  srq_gaps_ = static_cast<uint64_t>(std::count(srq_done_.begin(), srq_done_.end(), false));
  send_qps_ = static_cast<uint32_t>(
      std::count_if(seen.begin(), seen.end(), [](uint64_t n) { return n > 0; }));
  return 0;
}

void Peer::server_write_round(uint64_t first, uint64_t count, Ctl* ack) {
  const uint64_t key = stream_key(o_.seed, kWrite);
  const Round r = plan_round(first, count);
  uint64_t sum = 0, bad = 0;
  for (uint64_t k = 0; k < r.count; ++k) {
    const uint64_t i = first + k;
    const uint8_t* p = region_.data() + r.offsets[k];
    sum += hash(i, p, size_of(i));
    if (!matches(key, i, p, size_of(i))) ++bad;
    write_.bytes += size_of(i);
  }
  write_.msgs += r.count;
  write_.sum += sum;
  write_.bad += bad;
  *ack = {kAck, 0, sum, bad, 0};
}

void Peer::server_read_round(uint64_t first, uint64_t count, Ctl* ack) {
  const uint64_t key = stream_key(o_.seed, kRead);
  const Round r = plan_round(first, count);
  uint64_t sum = 0;
  for (uint64_t k = 0; k < r.count; ++k) {
    const uint64_t i = first + k;
    uint8_t* p = region_.data() + r.offsets[k];
    generate(key, i, p, size_of(i));
    sum += hash(i, p, size_of(i));
    read_.bytes += size_of(i);
  }
  read_.msgs += r.count;
  read_.sum += sum;
  *ack = {kAck, 0, sum, 0, 0};
}

int Peer::server_ud(uint64_t first, uint64_t count, Ctl* ack) {
  const uint64_t key = stream_key(o_.seed, kUd);
  uint64_t got = 0, sum = 0, bad = 0;
  uint32_t idle = 0;
  // UD is unreliable: wait a bounded time for the batch, count what is missing.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  ibv_wc wc[64];
  while (got < count && Clock::now() < deadline) {
    const int n = rcq_->poll(64, wc);
    if (n == 0) {
      pause(idle);
      continue;
    }
    idle = 0;
    for (int e = 0; e < n; ++e) {
      if (wc[e].status != IBV_WC_SUCCESS) return fail(3, "a UD receive completed in error");
      const uint64_t i = ntohl(wc[e].imm_data);
      uint8_t* p = ud_bufs_.data() + wc[e].wr_id * ud_slot_bytes_;
      const uint32_t size = ud_sizes_[i % ud_sizes_.size()];
      const bool in_batch = i >= first && i < first + count && (wc[e].wc_flags & IBV_WC_WITH_IMM);
      if (!in_batch || wc[e].byte_len != 40 + size || !matches(key, i, p + 40, size)) ++bad;
      sum += hash(i, p + 40, wc[e].byte_len >= 40 ? wc[e].byte_len - 40 : 0);
      ud_.bytes += size;
      ++got;
      ibv_sge sge{reinterpret_cast<uintptr_t>(p), ud_slot_bytes_, ud_bufs_.mr->lkey()};
      ibv_recv_wr wr{};
      wr.wr_id = wc[e].wr_id;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      ibv_recv_wr* badwr = nullptr;
      if (!ud_qp_->post_recv(&wr, &badwr).ok()) return fail(3, "UD post_recv failed");
    }
  }
  ud_.msgs += got;
  ud_.sum += sum;
  ud_.bad += bad;
  ud_lost_ += count - got;
  *ack = {kAck, 0, sum, bad, got};
  return 0;
}

int Peer::serve() {
  for (;;) {
    Ctl c;
    if (!ctl_recv(&c)) return fail(5, "the client went away");
    Ctl ack{kAck, 0, 0, 0, 0};
    switch (c.type) {
      case kSendBegin:
        if (int e = server_send(c.b)) return e;
        ack.b = send_.sum;
        ack.c = send_.bad;
        break;
      case kWriteRound:
        server_write_round(c.b, c.c, &ack);
        break;
      case kReadRound:
        server_read_round(c.b, c.c, &ack);
        break;
      case kAtomicEnd:
        rt_->counters();  // order the engine's last atomic before this read (runtime_test_util.h)
        ack.b = hash(0, counters_.data(), kCounters * 8);
        atomic_.sum = ack.b;
        break;
      case kUdBatch:
        if (int e = server_ud(c.b, c.c, &ack)) return e;
        break;
      case kDone:
        return 0;
      default:
        return fail(5, "unknown control record");
    }
    if (!ctl_send(ack)) return fail(5, "tcp");
  }
}

void print_op(const char* name, const OpStats& s) {
  std::printf(" %s_msgs=%" PRIu64 " %s_bytes=%" PRIu64 " %s_sum=%#" PRIx64 " %s_peer_sum=%#" PRIx64
              " %s_bad=%" PRIu64,
              name, s.msgs, name, s.bytes, name, s.sum, name, s.peer_sum, name, s.bad);
}

void Peer::print_result(double seconds) {
  const char* status = first_error_ != IBV_WC_SUCCESS ? ibv_wc_status_str(first_error_) : "success";
  std::string st = status;
  std::replace(st.begin(), st.end(), ' ', '_');
  std::printf("RESULT role=%s ok=%d exit=%d status=%s qpn_base=%#x",
              o_.server ? "server" : "client", exit_code_ == 0, exit_code_, st.c_str(),
              rt_ ? rt_->device().qpn_base() : 0);
  print_op("send", send_);
  print_op("write", write_);
  print_op("read", read_);
  print_op("atomic", atomic_);
  print_op("ud", ud_);
  std::printf(" ud_lost=%" PRIu64 " send_qps=%u srq=%d srq_gaps=%" PRIu64 " seconds=%.3f", ud_lost_,
              send_qps_, srq_ != nullptr, srq_gaps_, seconds);
  if (rt_) {
    const engine::EngineCounters k = rt_->counters();
    std::printf(" sent_pkts=%" PRIu64 " rcvd_pkts=%" PRIu64 " retries=%" PRIu64 " seq_naks=%" PRIu64
                " rnr_naks=%" PRIu64 " dup_requests=%" PRIu64 " out_of_seq=%" PRIu64
                " tx_blocked=%" PRIu64 " drop_icrc=%" PRIu64,
                k.sent_pkts, k.rcvd_pkts, k.completer_retry_err, k.rcvd_seq_err, k.rcvd_rnr_err,
                k.duplicate_request, k.out_of_seq_request, k.tx_blocked, k.drop_icrc);
  }
  if (!why_.empty()) {
    std::string w = why_;
    std::replace(w.begin(), w.end(), ' ', '_');
    std::printf(" why=%s", w.c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

int Peer::run() {
  const auto start = Clock::now();
  auto body = [&]() -> int {
    sizes_ = size_cycle(o_.max_size);
    send_sizes_ = size_cycle(o_.send_max);
    const uint32_t mtu_bytes = 128u << o_.mtu;
    ud_sizes_ = {1, 2, 7, 64, 1000, mtu_bytes / 2 + 1, mtu_bytes - 1, mtu_bytes};
    if (int e = open_device()) return e;
    region_ = make_buffer(o_.region);
    counters_ = make_buffer(kCounters * 8);
    results_ = make_buffer(uint64_t{o_.atomics} * 8);
    ud_slot_bytes_ = 40 + mtu_bytes;
    ud_bufs_ = make_buffer(uint64_t{64} * ud_slot_bytes_);
    if (o_.server) recvs_ = make_buffer(uint64_t{o_.qps} * o_.recv_depth * o_.send_max);
    if (exit_code_) return exit_code_;
    auto* counters = reinterpret_cast<uint64_t*>(counters_.data());
    for (uint32_t j = 0; j < kCounters; ++j) counters[j] = counter_init(o_.seed, j);
    if (o_.srq && o_.server) {
      ibv_srq_attr attr{};
      attr.max_wr = o_.qps * o_.recv_depth;
      attr.max_sge = 1;
      auto srq = rt_->device().create_srq(pd_, attr);
      if (!srq.ok()) return fail(2, "create_srq failed");
      srq_ = srq.value();
    }
    for (uint32_t q = 0; q < o_.qps; ++q) {
      provider::Qp* qp = make_qp(IBV_QPT_RC);
      if (qp == nullptr) return exit_code_;
      qp_index_[qp->qp_num()] = q;
      qps_.push_back(qp);
    }
    outstanding_.assign(o_.qps, 0);
    ud_qp_ = make_qp(IBV_QPT_UD);
    if (ud_qp_ == nullptr) return exit_code_;
    tcp_ = o_.server ? tcp_server(o_.listen_port, rt_->device().qpn_base())
                     : tcp_client(o_.connect_host, o_.connect_port);
    if (tcp_ < 0) return fail(2, "no TCP connection to the peer");
    if (int e = exchange_and_connect()) return e;
    if (o_.server) {
      // Receives before anything can arrive (RNR retries would cover a late one anyway).
      for (uint32_t q = 0; q < o_.qps; ++q) {
        for (uint32_t d = 0; d < o_.recv_depth; ++d) {
          const uint64_t slot = uint64_t{q} * o_.recv_depth + d;
          ibv_sge sge{recvs_.addr() + slot * o_.send_max, static_cast<uint32_t>(o_.send_max),
                      recvs_.mr->lkey()};
          ibv_recv_wr wr{};
          wr.wr_id = slot;
          wr.sg_list = &sge;
          wr.num_sge = 1;
          if (!post_rc_recv(q, wr)) return fail(2, "post_recv failed");
        }
      }
      for (uint32_t d = 0; d < 32; ++d) {
        ibv_sge sge{ud_bufs_.addr() + uint64_t{d} * ud_slot_bytes_, ud_slot_bytes_,
                    ud_bufs_.mr->lkey()};
        ibv_recv_wr wr{};
        wr.wr_id = d;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        ibv_recv_wr* bad = nullptr;
        if (!ud_qp_->post_recv(&wr, &bad).ok()) return fail(2, "UD post_recv failed");
      }
    }
    // Both sides' receives are posted before the client starts (the server's go).
    const char go = 'g';
    if (o_.server ? !write_all(tcp_, &go, 1) : ![&] {
          char g = 0;
          return read_all(tcp_, &g, 1, 30000) && g == go;
        }())
      return fail(5, "no go from the server");
    std::printf("CONNECTED role=%s qpn_base=%#x qps=%u\n", o_.server ? "server" : "client",
                rt_->device().qpn_base(), o_.qps);
    std::fflush(stdout);
    if (o_.server) return serve();
    if (o_.stream) return client_stream();
    if (o_.send)
      if (int e = client_send()) return e;
    if (o_.write)
      if (int e = client_write()) return e;
    if (o_.read)
      if (int e = client_read()) return e;
    if (o_.atomic)
      if (int e = client_atomic()) return e;
    if (o_.ud)
      if (int e = client_ud()) return e;
    if (o_.idle_ms) {
      std::printf("IDLE\n");
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::milliseconds(o_.idle_ms));
    }
    if (!ctl_send({kDone, 0, 0, 0, 0})) return fail(5, "tcp");
    return 0;
  };
  body();
  if (!o_.server && exit_code_ == 0) {
    // The data checks: every receiver's sum equals its sender's, nothing bad or lost.
    for (const OpStats* s : {&send_, &write_, &read_, &atomic_, &ud_})
      if (s->sum != s->peer_sum || s->bad != 0) fail(4, "data differed");
    if (ud_lost_ != 0) fail(4, "UD datagrams lost");
  }
  if (o_.server && exit_code_ == 0 && (send_.bad || write_.bad || ud_.bad || ud_lost_))
    fail(4, "data differed");
  print_result(std::chrono::duration<double>(Clock::now() - start).count());
  if (o_.hold) {
    char c;
    while (read(STDIN_FILENO, &c, 1) > 0) {
    }
  }
  if (tcp_ >= 0) close(tcp_);
  return exit_code_;
}

}  // namespace
}  // namespace urdma::peer

namespace urdma::peer {

// urdma_runtime_peer --scribble QPN SECONDS: a hostile process of the same user. It leases a
// slot, asks urdmad for the shared-memory region to the process holding QPN (at 127.0.0.1) and
// writes random bytes over all of it — both rings' indices, wake flags and data — ringing that
// process's doorbell about once a millisecond, for SECONDS. Prints "SCRIBBLING" once the region
// is mapped and "SCRIBBLED bytes=N" at the end; exit 2 when it gets no region.
int scribble(uint32_t qpn, double seconds) {
  daemon::Client client;
  std::string detail;
  if (const int e = daemon::Client::connect_or_spawn({}, &client, &detail)) {
    std::printf("SCRIBBLE_FAILED step=connect errno=%d %s\n", e, detail.c_str());
    return 2;
  }
  daemon::Slot slot;
  daemon::UniqueFd doorbell;
  daemon::ShmPair pair;
  int e = client.acquire_slot(&slot);
  if (e == 0) e = client.shm_accept(&doorbell);
  if (e == 0) e = client.shm_connect(net::Address::from_v4(127, 0, 0, 1), qpn, &pair);
  if (e != 0) {
    std::printf("SCRIBBLE_FAILED errno=%d\n", e);
    return 2;
  }
  void* mapped = mmap(nullptr, net::kShmRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                      pair.region.get(), 0);
  if (mapped == MAP_FAILED) {
    std::printf("SCRIBBLE_FAILED step=mmap\n");
    return 2;
  }
  auto* region = static_cast<uint8_t*>(mapped);
  std::printf("SCRIBBLING\n");
  std::fflush(stdout);
  uint64_t x = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(getpid());
  uint64_t bytes = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  auto next_bell = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 4096; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      // Every fourth write lands in a ring's header page (its indices and wake flag).
      const size_t ring = (x >> 8) & 1;
      const size_t at = (x & 3) == 0 ? ring * net::kShmRingBytes + ((x >> 16) % 256)
                                     : (x >> 16) % net::kShmRegionBytes;
      region[at] = static_cast<uint8_t>(x >> 56);
      ++bytes;
    }
    if (std::chrono::steady_clock::now() >= next_bell) {
      const uint64_t one = 1;
      (void)!write(pair.peer_doorbell.get(), &one, sizeof one);
      next_bell += std::chrono::milliseconds(1);
    }
  }
  munmap(mapped, net::kShmRegionBytes);
  std::printf("SCRIBBLED bytes=%" PRIu64 "\n", bytes);
  return 0;
}

}  // namespace urdma::peer

int main(int argc, char** argv) {
  if (argc == 4 && std::string_view(argv[1]) == "--scribble")
    return urdma::peer::scribble(static_cast<uint32_t>(std::strtoul(argv[2], nullptr, 0)),
                                 std::atof(argv[3]));
  urdma::peer::Peer peer(urdma::peer::parse(argc, argv));
  return peer.run();
}
