// librdmacm.so.1 over urdma: rdma_cm's API on cm::Manager, with CM MADs over the process's
// urdmad slot.
//
// THE PROCESS: one `Cma` (below), made at the first call that needs the device. It opens urdma0
// through OUR libibverbs (so the application's own ibv_open_device and ours view the same
// runtime: one slot, one QPN range, one key space), and from that runtime's urdmad connection
// (runtime::Runtime::daemon_client) takes the slot number and a dup of the slot's UDP socket.
//  * Receiving: a second urdmad connection is the slot's MAD channel (daemon::Client::
//    open_mad_channel): REQ/SIDR_REQ for our listened service IDs and every MAD whose
//    communication ID carries our slot arrive there as datagrams (BTH..ICRC).
//  * Sending: a sendmsg on the dup of the slot socket, from any thread holding the lock. One UDP
//    datagram per sendmsg is atomic in the kernel, so it needs nothing from the engine thread
//    (which owns the PacketIo and sends on the same socket); IP_PKTINFO picks the source address
//    of the GID the Manager chose, and the ICRC is computed for the socket's own source port.
//  * The CM thread: polls the MAD channel and a wake-up eventfd, with the Manager's next timer
//    as timeout; feeds MADs and time to the Manager, applies QP attributes, queues events.
// Everything the Manager and the ids hold is under one mutex (`Cma::mu`).
//
// EVENT CHANNELS: an eventfd in semaphore mode counts the queued events; rdma_get_cm_event
// reads it (blocking unless the application made the fd non-blocking: EAGAIN) then pops one.
// Synchronous mode (a NULL channel): the id gets a channel of its own and resolve_addr,
// resolve_route, connect and accept wait for their event on it (rdma-core's ucma_complete).
//
// Port spaces: RDMA_PS_TCP and RDMA_PS_IB are RC connections (REQ/REP/RTU), RDMA_PS_UDP and
// RDMA_PS_IPOIB UD QPs found by SIDR. Not built, with rdma-core's error for an unsupported
// operation: multicast (rdma_join_multicast[_ex], rdma_leave_multicast: ENOSYS), ECE
// (EOPNOTSUPP), rdma_create_qp_ex beyond a PD (ENOSYS), rsockets (every r* call: -1, errno
// ENOSYS). rdma_set_option: TOS and ACK_TIMEOUT take effect,
// REUSEADDR and AFONLY are accepted without effect; other options are ENOSYS.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/env.h"
#include "base/secure_random.h"
#include "cm/manager.h"
#include "daemon/client.h"
#include "daemon/protocol.h"
#include "net/clock.h"
#include "runtime/runtime.h"
#include "verbs/internal.h"
#include "wire/cm.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/packet.h"
#include "wire/rdma_cm_ip.h"

#define URDMA_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using urdma::cm::ConnId;
using urdma::cm::Gid;

int fail(int err) {
  errno = err;
  return -1;
}

struct Channel {
  rdma_event_channel ch;  // first: the application's pointer
  std::deque<rdma_cm_event*> queue;
};

enum class IdState {
  kIdle,
  kBound,
  kAddrResolved,
  kRouteResolved,
  kListening,
  kConnecting,
  kRequest,
  kConnected,
  kDisconnected
};

struct Id {
  rdma_cm_id id;  // first
  Channel* chan = nullptr;
  IdState state = IdState::kIdle;
  bool has_conn = false;
  ConnId conn = 0;
  bool reported_up = false;  // urdmad knows the connection (report_up_locked)
  uint64_t listen_sid = 0;
  bool listening = false;
  bool claimed = false;  // listen_sid is registered with urdmad (rdma_bind_addr or rdma_listen)
  Gid sgid{};
  Gid dgid{};
  uint8_t sgid_index = 0;
  uint16_t local_port = 0;  // host order
  bool owns_port = false;   // local_port is in ports_in_use for this id (not a request's child)
  int pending_events = 0;
  // Synchronous mode (created with a NULL channel): a channel of its own, waited on by the calls.
  bool sync = false;
  // rdma_create_ep on a passive endpoint: the QP every rdma_get_request creates.
  bool has_ep_attr = false;
  ibv_qp_init_attr ep_attr{};
  ibv_pd* ep_pd = nullptr;
  bool own_cqs = false;    // rdma_create_qp made the CQs and their channels
  ibv_sa_path_rec path{};  // id.route.path_rec once the route is resolved (or the REQ arrived)
  // rdma_set_option: the route's traffic class (taken at rdma_resolve_route, as Linux's
  // cma_resolve_iboe_route takes id_priv->tos) and the QP's local ACK timeout, which replaces
  // the path's in every RTS attribute set (Linux rdma_init_qp_attr, cma_modify_qp_rts).
  uint8_t tos = 0;
  bool ack_timeout_set = false;
  uint8_t ack_timeout = 0;
  static Id* from(rdma_cm_id* x) { return reinterpret_cast<Id*>(x); }
};

// RDMA_OPTION_ID_ACK_TIMEOUT replaces the timeout the path gave an RTS attribute set.
void apply_ack_timeout(const Id& x, ibv_qp_attr* attr, int mask) {
  if (x.ack_timeout_set && (mask & IBV_QP_TIMEOUT)) attr->timeout = x.ack_timeout;
}

// An event with the storage its private data points into.
struct Event {
  rdma_cm_event ev;  // first
  std::vector<uint8_t> private_data;
  Id* owner = nullptr;
};

// The wildcard (0.0.0.0, ::) or a loopback address (127/8, ::1), as GIDs (IPv4-mapped for
// IPv4): Linux cma.c's cma_any_addr.
bool is_any_or_loopback(const Gid& g) {
  static constexpr Gid kZero{};
  static constexpr Gid kAnyV4{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0, 0, 0};
  static constexpr Gid kLoopbackV6{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  const bool v4 = std::equal(kAnyV4.begin(), kAnyV4.begin() + 12, g.begin());
  return g == kZero || g == kLoopbackV6 || (v4 && (g == kAnyV4 || g[12] == 127));
}

Gid gid_of(const sockaddr* sa) {
  Gid g{};
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    g[10] = g[11] = 0xFF;
    std::memcpy(&g[12], &in->sin_addr, 4);
  } else if (sa->sa_family == AF_INET6) {
    std::memcpy(g.data(), &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, 16);
  }
  return g;
}
// rdma_cma.h RDMA_UDP_QKEY: the Q_Key of every RDMA_PS_UDP QP.
constexpr uint32_t kUdpQkey = 0x01234567;
// One count from a channel's eventfd, or false when none is left — without blocking and
// without setting O_NONBLOCK on the file, which a reader entering read() at that moment would
// see as EAGAIN (RWF_NOWAIT; eventfds honour it since Linux 5.9, older kernels refuse it with
// EOPNOTSUPP and get the flag for the one read).
bool take_count_nowait(int fd) {
  uint64_t v;
  iovec io{&v, sizeof v};
  const ssize_t n = preadv2(fd, &io, 1, -1, RWF_NOWAIT);
  if (n >= 0 || errno != EOPNOTSUPP) return n == static_cast<ssize_t>(sizeof v);
  const int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  const bool taken = read(fd, &v, sizeof v) == static_cast<ssize_t>(sizeof v);
  fcntl(fd, F_SETFL, fl);
  return taken;
}

bool is_ud_ps(rdma_port_space ps) {
  return ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB;
}

bool gid_is_v4(const Gid& g) {
  static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  return std::memcmp(g.data(), kPrefix, 12) == 0;
}
void set_sockaddr(sockaddr_storage* out, const Gid& g, uint16_t port_host) {
  std::memset(out, 0, sizeof *out);
  if (gid_is_v4(g)) {
    auto* in = reinterpret_cast<sockaddr_in*>(out);
    in->sin_family = AF_INET;
    in->sin_port = htons(port_host);
    std::memcpy(&in->sin_addr, &g[12], 4);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(out);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port_host);
    std::memcpy(&in6->sin6_addr, g.data(), 16);
  }
}
uint16_t port_of(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  return 0;
}
size_t sockaddr_size(const sockaddr* sa) {
  return sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

urdma::wire::RdmaPortSpace port_space(rdma_port_space ps) {
  switch (ps) {
    case RDMA_PS_UDP:
      return urdma::wire::RdmaPortSpace::kUdp;
    case RDMA_PS_IB:
      return urdma::wire::RdmaPortSpace::kIb;
    case RDMA_PS_IPOIB:
      return urdma::wire::RdmaPortSpace::kIpoib;
    default:
      return urdma::wire::RdmaPortSpace::kTcp;
  }
}

class Cma {
 public:
  std::mutex mu;
  std::condition_variable acked;  // an event was acked (rdma_destroy_id waits for its own)
  ibv_context* verbs = nullptr;
  ibv_pd* default_pd = nullptr;
  int open_errno = 0;
  bool opened = false;

  int open_locked();
  // Under mu: the device's PD, made on first use, which every id with a device names as its
  // pd (rdma-core's ucma_get_device): rdma_create_qp and rdma_create_srq default to it, and
  // applications build their own QPs and AHs on id->pd.
  ibv_pd* device_pd() {
    if (!default_pd && verbs) default_pd = ibv_alloc_pd(verbs);
    return default_pd;
  }
  void wake();
  uint32_t random_psn() { return static_cast<uint32_t>(rng_()) & 0xFFFFFF; }
  uint16_t ephemeral_port();
  int find_gid_index(const Gid& g, uint8_t* index);
  void set_route_path(Id* x, uint32_t flow_label);

  // Under mu: after any Manager call, apply what it produced.
  void pump_locked();
  // Under mu: the id's connection and listen are forgotten, and the peer hears what it must.
  void release_locked(Id* x);
  // urdmad releases (DREQ) the connections a process established if it dies, and learns them
  // from the process only (daemon/cm_agent.h): up when established, down when it ends.
  void report_up_locked(Id* id);
  void report_down_locked(Id* id);
  // Under mu: the service ID of a bound id is registered with urdmad and claimed in the
  // Manager, so a REQ that comes before rdma_listen waits for it, a bounded time
  // (cm::Manager::claim; Linux answers it REJ 8; qperf 0.4.11 sends its port to the client
  // before calling rdma_listen, and about one first connection in ten lost that race).
  int claim_locked(Id* x, uint64_t sid);
  // Under mu: a bound id that will not listen gives its service ID back; what waited for it is
  // answered as Linux answers it (REJ 8, SIDR_REP status 1).
  void unclaim_locked(Id* x);
  // What the kernel does when an rdma_cm fd closes (ucma_close destroys every id of the file):
  // for the ids of one channel, or of the whole process at exit.
  void release_channel_locked(Channel* ch);
  void release_all();
  void queue_event(Id* id, rdma_cm_event_type type, int status,
                   const urdma::cm::Event* src = nullptr, Id* listen = nullptr);

  std::unique_ptr<urdma::cm::Manager> manager;
  std::map<ConnId, Id*> by_conn;
  std::map<uint64_t, Id*> listeners;  // service ID -> listening id
  std::set<Id*> live;
  std::set<uint16_t> ports_in_use;
  urdma::daemon::Client* slot_client = nullptr;

 private:
  void loop();
  bool reopen_mad_channel();
  void receive_locked(const urdma::daemon::MadDelivery& info, const std::vector<uint8_t>& dgram);
  void send_mad_locked(const urdma::cm::OutgoingMad& m);
  int apply_qp_locked(Id* id, const urdma::cm::QpAttrs& q);  // ibv_modify_qp's result
  void to_error_locked(Id* id);

  urdma::net::MonotonicClock clock_;
  // PSNs, the comm ID and TID bases and ports: what a peer could guess comes from getrandom(2).
  urdma::base::SecureRandom rng_;
  urdma::daemon::Client mad_channel_;  // the CM thread's alone once it runs
  unsigned slot_ = 0;
  int send_fd_ = -1;
  int send_family_ = AF_INET6;
  uint16_t send_port_ = 0;
  uint32_t mad_psn_ = 0;
  int wake_fd_ = -1;
  std::thread thread_;
  pid_t opener_pid_ = 0;  // a forked child's exit closes only its copy of the fd: nothing to do
};

Cma* g_cma = nullptr;

// In a forked child: a CM of its own, on the device the child opens (libibverbs' process()
// forgets the parent's too). The parent's ids, CM thread and MAD channel stay the parent's;
// what the child inherited is never destroyed (the thread does not exist here).
void forget_the_parents_cm() { g_cma = new Cma; }

Cma& cma() {
  // Lives as long as the process (threads may still run at exit).
  static const bool made = [] {
    g_cma = new Cma;
    pthread_atfork(nullptr, nullptr, forget_the_parents_cm);
    return true;
  }();
  (void)made;
  return *g_cma;
}

int Cma::open_locked() {
  if (opened) return open_errno;
  opened = true;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n == 0) {
    if (list) ibv_free_device_list(list);
    return open_errno = ENODEV;
  }
  verbs = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!verbs) return open_errno = errno ? errno : ENODEV;
  // The runtime our libibverbs opened (verbs/internal.h: every context is a runtime view).
  urdma::runtime::Runtime& rt = urdma::verbs::Context::from(verbs)->rt->runtime();
  slot_client = rt.daemon_client();
  const urdma::daemon::Slot* slot = slot_client ? slot_client->kept_slot() : nullptr;
  if (!slot) return open_errno = ENODEV;
  send_fd_ = fcntl(slot->fd.get(), F_DUPFD_CLOEXEC, 0);
  if (send_fd_ < 0) return open_errno = errno;
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (getsockname(send_fd_, reinterpret_cast<sockaddr*>(&local), &len) != 0)
    return open_errno = errno;
  send_family_ = local.ss_family;
  send_port_ = port_of(reinterpret_cast<sockaddr*>(&local));

  std::string why;
  slot_ = slot->info.slot;
  if (int e = urdma::daemon::Client::connect_or_spawn({}, &mad_channel_, &why))
    return open_errno = e;
  if (int e = mad_channel_.open_mad_channel(slot_)) return open_errno = e;

  ibv_device_attr dattr{};
  urdma::cm::ManagerConfig cfg;
  cfg.slot = slot->info.slot;
  cfg.local_ca_guid = be64toh(ibv_get_device_guid(verbs->device));
  cfg.seed = rng_();
  cfg.tid_high = static_cast<uint32_t>(rng_());
  cfg.random = [r = urdma::base::SecureRandom()]() mutable { return r(); };
  uint64_t wait_ms = urdma::cm::kListenWaitMs;
  std::string env_why;
  if (urdma::base::env_number("URDMA_LISTEN_WAIT_MS", 0, 60000, &wait_ms, &env_why) != 0)
    std::fprintf(stderr, "librdmacm (urdma): %s; %llu ms used\n", env_why.c_str(),
                 static_cast<unsigned long long>(wait_ms));
  cfg.listen_wait_ns = wait_ms * 1'000'000;
  if (ibv_query_device(verbs, &dattr) == 0) {
    cfg.max_initiator_depth = static_cast<uint8_t>(std::min(dattr.max_qp_rd_atom, 255));
    cfg.max_responder_resources = static_cast<uint8_t>(std::min(dattr.max_qp_init_rd_atom, 255));
  }
  manager = std::make_unique<urdma::cm::Manager>(cfg, clock_);
  mad_psn_ = random_psn();
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return open_errno = errno;
  thread_ = std::thread([this] { loop(); });
  thread_.detach();
  // A process that exits with ids still open (qperf's server never destroys its connected
  // id) must not leave its peers waiting: the kernel would destroy them as the fd closes.
  opener_pid_ = getpid();
  std::atexit([] { cma().release_all(); });
  return 0;
}

void Cma::wake() {
  uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof one);
}

uint16_t Cma::ephemeral_port() {
  for (int i = 0; i < 100000; ++i) {
    auto p = static_cast<uint16_t>(32768 + rng_() % 28232);
    if (!ports_in_use.count(p)) return p;
  }
  return 0;
}

int Cma::find_gid_index(const Gid& g, uint8_t* index) {
  ibv_port_attr pattr{};
  if (ibv_query_port(verbs, 1, &pattr) != 0) return errno;
  for (int i = 0; i < pattr.gid_tbl_len; ++i) {
    ibv_gid gid{};
    if (ibv_query_gid(verbs, 1, i, &gid) != 0) continue;
    if (std::memcmp(gid.raw, g.data(), 16) == 0) {
      *index = static_cast<uint8_t>(i);
      return 0;
    }
  }
  return EADDRNOTAVAIL;
}

// The one path of a RoCE route, as Linux's cma_resolve_iboe_route fills it (and ucma_query_route
// hands it to rdma-core): the GIDs, P_Key 0xFFFF, the port's active MTU, the rate of the link the
// port reports (1X EDR: 25 Gb/s), hop limit 64, packet lifetime 16 (CMA_IBOE_PACKET_LIFETIME),
// reversible, and the connection's flow label. Multi-byte fields in network order.
void Cma::set_route_path(Id* x, uint32_t flow_label) {
  ibv_sa_path_rec& p = x->path;
  p = {};
  std::memcpy(p.sgid.raw, x->sgid.data(), 16);
  std::memcpy(p.dgid.raw, x->dgid.data(), 16);
  p.flow_label = htonl(flow_label);
  p.traffic_class = x->tos;
  p.hop_limit = 64;
  p.reversible = 1;
  p.numb_path = 1;
  p.pkey = htons(0xFFFF);
  p.mtu_selector = 2;  // exactly (IB SA selector "="), as rdma_cm's IB_SA_EQ
  ibv_port_attr pattr{};
  p.mtu = ibv_query_port(verbs, 1, &pattr) == 0 ? pattr.active_mtu : IBV_MTU_1024;
  p.rate_selector = 2;
  p.rate = IBV_RATE_25_GBPS;
  p.packet_life_time_selector = 2;
  p.packet_life_time = 16;
  x->id.route.path_rec = &p;
  x->id.route.num_paths = 1;
}

// A new urdmad (a takeover, README "Takeover after a restart") knows the slot once this
// process's keeper has reattached it (daemon/client.h); until then the channel is refused
// (EPERM) and the CM thread tries again.
bool Cma::reopen_mad_channel() {
  urdma::daemon::Client fresh;
  std::string why;
  if (urdma::daemon::Client::connect_or_spawn({}, &fresh, &why) != 0) return false;
  if (fresh.open_mad_channel(slot_) != 0) return false;
  mad_channel_ = std::move(fresh);
  return true;
}

void Cma::loop() {
  // While urdmad is gone the Manager's timers still run (a REQ's retries, a DREQ's, TimeWait)
  // and the channel is reopened with back-off; MADs sent meanwhile are lost as on a lossy
  // fabric, and their senders' retries find the new channel.
  uint64_t reopen_at = 0;
  uint64_t reopen_backoff_ns = 20'000'000;
  for (;;) {
    if (!mad_channel_.connected() && clock_.now_ns() >= reopen_at) {
      if (reopen_mad_channel()) {
        reopen_backoff_ns = 20'000'000;
      } else {
        reopen_at = clock_.now_ns() + reopen_backoff_ns;
        reopen_backoff_ns = std::min<uint64_t>(reopen_backoff_ns * 2, 1'000'000'000);
      }
    }
    uint64_t deadline;
    {
      std::lock_guard lock(mu);
      deadline = manager->next_deadline_ns();
    }
    if (!mad_channel_.connected()) deadline = std::min(deadline, reopen_at);
    int timeout_ms = -1;
    if (deadline != urdma::net::kNever) {
      const uint64_t now = clock_.now_ns();
      timeout_ms = deadline <= now ? 0
                                   : static_cast<int>(std::min<uint64_t>(
                                         (deadline - now + 999'999) / 1'000'000, 60'000));
    }
    // A negative fd is skipped by poll: only the wake-up and the timers while the channel is down.
    pollfd fds[2] = {{mad_channel_.connected() ? mad_channel_.fd() : -1, POLLIN, 0},
                     {wake_fd_, POLLIN, 0}};
    const int r = poll(fds, 2, timeout_ms);
    if (r < 0 && errno != EINTR) return;
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof v);
    }
    bool hung_up = (fds[0].revents & (POLLHUP | POLLERR | POLLNVAL)) != 0;
    std::lock_guard lock(mu);
    while (mad_channel_.connected()) {
      urdma::daemon::MadDelivery info{};
      std::vector<uint8_t> dgram;
      const int e = mad_channel_.next_mad(&info, &dgram);
      if (e == ECONNRESET || e == EPIPE || e == ENOTCONN) hung_up = true;  // urdmad's end closed
      if (e != 0) break;  // none queued (EAGAIN), or a record we could not read: dropped
      receive_locked(info, dgram);
    }
    if (hung_up) {
      mad_channel_ = urdma::daemon::Client{};  // urdmad went away: reopen it (above)
      reopen_at = clock_.now_ns();
    }
    if (manager->next_deadline_ns() <= clock_.now_ns()) manager->run_timers();
    pump_locked();
  }
}

void Cma::receive_locked(const urdma::daemon::MadDelivery& info,
                         const std::vector<uint8_t>& dgram) {
  auto parsed = urdma::wire::parse_packet(dgram);
  if (!parsed || parsed->opcode() != urdma::wire::op::kUdSendOnly || !parsed->deth()) return;
  if (parsed->bth().dest_qp() != urdma::wire::kMadGsiQpn) return;
  if (parsed->deth()->qkey() != urdma::wire::kMadGsiQKey) return;
  // The ICRC: the source and destination addresses and ports it covers came with the MAD.
  Gid src{}, dst{};
  std::memcpy(src.data(), info.src_address, 16);
  std::memcpy(dst.data(), info.dst_address, 16);
  bool ok;
  if (gid_is_v4(src)) {
    urdma::wire::IcrcIpv4Flow flow;
    std::memcpy(flow.src_addr.data(), &src[12], 4);
    std::memcpy(flow.dst_addr.data(), &dst[12], 4);
    flow.udp_src_port = info.src_port;
    flow.udp_dst_port = info.dst_port;
    ok = urdma::wire::verify_icrc_ipv4(flow, dgram, urdma::wire::Ipv4DfSearch::kSetOnly).ok;
  } else {
    urdma::wire::IcrcIpv6 h;
    std::memcpy(h.src_addr.data(), src.data(), 16);
    std::memcpy(h.dst_addr.data(), dst.data(), 16);
    h.udp_src_port = info.src_port;
    h.udp_dst_port = info.dst_port;
    ok = urdma::wire::verify_icrc_ipv6(h, dgram);
  }
  if (!ok) return;
  manager->receive(src, parsed->deth()->src_qp(), parsed->payload());
}

int Cma::claim_locked(Id* x, uint64_t sid) {
  if (!slot_client) return ENODEV;
  // The Manager first: urdmad may hand over a REQ that waited for this ID at once.
  if (!manager->claim(sid).ok()) return EADDRINUSE;
  if (int e = slot_client->listen(sid)) {
    (void)manager->unclaim(sid);
    wake();  // the CM thread sends what the Manager queued
    return e;
  }
  x->listen_sid = sid;
  x->claimed = true;
  return 0;
}

void Cma::unclaim_locked(Id* x) {
  if (!x->claimed || x->listening) return;
  x->claimed = false;
  if (slot_client) slot_client->unlisten(x->listen_sid);
  // What waited for it is refused; the CM thread sends the answers (a pump here could make ids
  // while the caller walks them).
  (void)manager->unclaim(x->listen_sid);
  wake();
}

void Cma::send_mad_locked(const urdma::cm::OutgoingMad& m) {
  std::array<uint8_t, 12 + 8 + urdma::wire::kMadSize + 4> buf{};
  auto built = urdma::wire::build_packet(buf, urdma::wire::op::kUdSendOnly, m.mad);
  if (!built) return;
  auto bth = built->headers.bth();
  bth.set_pkey(urdma::wire::kDefaultPkey);
  bth.set_dest_qp(m.dest_qpn);
  bth.set_psn(mad_psn_);
  mad_psn_ = (mad_psn_ + 1) & urdma::wire::kQpnMask;
  auto deth = *built->headers.deth();
  deth.set_qkey(urdma::wire::kMadGsiQKey);
  deth.set_src_qp(urdma::wire::kMadGsiQpn);
  // The source GID: the one the Manager put in the message's path (REQ: the local GID).
  // Received requests are answered from the address they came to; we keep it per connection
  // in the ids, but the Manager's OutgoingMad names only the destination, so use the local
  // address the kernel routes from.
  Gid src{};
  {
    sockaddr_storage dst{};
    set_sockaddr(&dst, m.dest_gid, urdma::wire::kRoceV2UdpPort);
    const int probe = socket(dst.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (probe < 0) return;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    const bool routed = connect(probe, reinterpret_cast<sockaddr*>(&dst),
                                sockaddr_size(reinterpret_cast<sockaddr*>(&dst))) == 0 &&
                        getsockname(probe, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    close(probe);
    if (!routed) return;
    src = gid_of(reinterpret_cast<sockaddr*>(&local));
  }
  if (gid_is_v4(m.dest_gid)) {
    urdma::wire::IcrcIpv4 h;
    std::memcpy(h.flow.src_addr.data(), &src[12], 4);
    std::memcpy(h.flow.dst_addr.data(), &m.dest_gid[12], 4);
    h.flow.udp_src_port = send_port_;
    urdma::wire::seal_icrc(h, built->datagram);
  } else {
    urdma::wire::IcrcIpv6 h;
    std::memcpy(h.src_addr.data(), src.data(), 16);
    std::memcpy(h.dst_addr.data(), m.dest_gid.data(), 16);
    h.udp_src_port = send_port_;
    urdma::wire::seal_icrc(h, built->datagram);
  }
  sockaddr_storage to{};
  socklen_t tolen;
  if (send_family_ == AF_INET) {
    if (!gid_is_v4(m.dest_gid)) return;
    set_sockaddr(&to, m.dest_gid, urdma::wire::kRoceV2UdpPort);
    tolen = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&to);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(urdma::wire::kRoceV2UdpPort);
    std::memcpy(&in6->sin6_addr, m.dest_gid.data(), 16);
    tolen = sizeof(sockaddr_in6);
  }
  iovec iov{built->datagram.data(), built->datagram.size()};
  msghdr msg{};
  msg.msg_name = &to;
  msg.msg_namelen = tolen;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(in6_pktinfo))] = {};
  msg.msg_control = control;
  cmsghdr* c = reinterpret_cast<cmsghdr*>(control);
  if (gid_is_v4(m.dest_gid)) {
    in_pktinfo pi{};
    std::memcpy(&pi.ipi_spec_dst, &src[12], 4);
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof pi);
    std::memcpy(CMSG_DATA(c), &pi, sizeof pi);
    msg.msg_controllen = CMSG_SPACE(sizeof pi);
  } else {
    in6_pktinfo pi{};
    std::memcpy(&pi.ipi6_addr, src.data(), 16);
    c->cmsg_level = IPPROTO_IPV6;
    c->cmsg_type = IPV6_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof pi);
    std::memcpy(CMSG_DATA(c), &pi, sizeof pi);
    msg.msg_controllen = CMSG_SPACE(sizeof pi);
  }
  (void)sendmsg(send_fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);  // lost: the CM retransmits
}

int Cma::apply_qp_locked(Id* id, const urdma::cm::QpAttrs& q) {
  if (!id->id.qp) return 0;
  ibv_qp_attr attr = q.attr;
  if (q.mask & IBV_QP_AV) {
    uint8_t index = id->sgid_index;
    if (find_gid_index(q.sgid, &index) == 0) id->sgid_index = index;
    attr.ah_attr.grh.sgid_index = index;
  }
  apply_ack_timeout(*id, &attr, q.mask);
  return ibv_modify_qp(id->id.qp, &attr, q.mask);
}

void Cma::to_error_locked(Id* id) {
  if (!id->id.qp) return;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(id->id.qp, &attr, IBV_QP_STATE);
}

void Cma::queue_event(Id* id, rdma_cm_event_type type, int status, const urdma::cm::Event* src,
                      Id* listen) {
  Channel* chan = listen ? listen->chan : id->chan;
  if (!chan) return;
  auto* e = new Event();
  e->ev.id = &id->id;
  e->ev.listen_id = listen ? &listen->id : nullptr;
  e->ev.event = type;
  e->ev.status = status;
  e->owner = id;
  if (src && is_ud_ps(id->id.ps)) {
    e->private_data = src->private_data;
    auto& u = e->ev.param.ud;
    u.private_data = e->private_data.empty() ? nullptr : e->private_data.data();
    u.private_data_len = static_cast<uint8_t>(std::min<size_t>(e->private_data.size(), 255));
    if (type == RDMA_CM_EVENT_ESTABLISHED) {
      u.qp_num = src->remote_qpn;
      u.qkey = src->qkey;
      u.ah_attr.is_global = 1;
      u.ah_attr.port_num = 1;
      std::memcpy(u.ah_attr.grh.dgid.raw, id->dgid.data(), 16);
      u.ah_attr.grh.sgid_index = id->sgid_index;
      u.ah_attr.grh.hop_limit = 64;
    }
  } else if (src) {
    e->private_data = src->private_data;
    auto& c = e->ev.param.conn;
    c.private_data = e->private_data.empty() ? nullptr : e->private_data.data();
    c.private_data_len = static_cast<uint8_t>(std::min<size_t>(e->private_data.size(), 255));
    c.responder_resources = src->responder_resources;
    c.initiator_depth = src->initiator_depth;
    c.flow_control = src->flow_control;
    c.retry_count = src->retry_count;
    c.rnr_retry_count = src->rnr_retry_count;
    c.srq = src->srq;
    c.qp_num = src->remote_qpn;
  }
  ++id->pending_events;
  chan->queue.push_back(&e->ev);
  uint64_t one = 1;
  (void)!write(chan->ch.fd, &one, sizeof one);
}

void Cma::pump_locked() {
  for (const urdma::cm::Event& ev : manager->take_events()) {
    using T = urdma::cm::EventType;
    if (ev.type == T::kConnectRequest || ev.type == T::kSidrRequest) {
      auto lit = listeners.find(ev.service_id);
      if (lit == listeners.end()) {
        manager->destroy(ev.id);
        continue;
      }
      // Linux cm_req_handler: a REQ whose path our GID table cannot carry — sent to a local
      // address that is no GID here (127.0.0.2: all of 127/8 reaches lo), or to one removed
      // meanwhile — is REJ "invalid GID" (12) with our GID 0 as ARI. Accepted, its QP would
      // answer from another address and both sides would end in RETRY_EXC_ERR.
      // A SIDR_REQ carries no path: its local address is the one rdma_cm's private data says
      // it was sent to. Linux answers one it cannot serve the same way (cma_ib_req_handler
      // fails, and cm_destroy_id rejects the SIDR request): SIDR_REP status 2, "reject".
      Gid local = ev.local_gid;
      if (ev.type == T::kSidrRequest && ev.ip)
        std::copy(ev.ip->dst_addr.begin(), ev.ip->dst_addr.end(), local.begin());
      uint8_t local_index = 0;
      const bool local_gid_known = find_gid_index(local, &local_index) == 0;
      if (ev.type == T::kConnectRequest && !local_gid_known) {
        ibv_gid gid0{};
        urdma::cm::RejectParams rej;
        rej.reason = static_cast<uint16_t>(urdma::wire::CmRejReason::kInvalidGid);
        if (ibv_query_gid(verbs, 1, 0, &gid0) == 0) rej.ari = std::span<const uint8_t>(gid0.raw);
        (void)manager->reject(ev.id, rej);
        continue;
      }
      if (ev.type == T::kSidrRequest && ev.ip && !local_gid_known) {
        urdma::cm::SidrAnswerParams no;
        no.status = static_cast<uint8_t>(urdma::wire::CmSidrStatus::kReject);
        (void)manager->sidr_answer(ev.id, no);
        continue;
      }
      Id* l = lit->second;
      auto* child = new Id();
      child->id.verbs = verbs;
      child->id.pd = device_pd();
      child->id.channel = l->id.channel;
      child->id.context = l->id.context;
      child->id.ps = l->id.ps;
      child->id.qp_type = l->id.qp_type;
      child->id.port_num = 1;
      child->chan = l->chan;
      if (l->sync) {
        auto* own = new Channel();
        own->ch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
        child->chan = own;
        child->id.channel = &own->ch;
        child->sync = true;
      }
      child->state = IdState::kRequest;
      child->has_conn = true;
      child->conn = ev.id;
      child->sgid = ev.local_gid;
      child->dgid = ev.remote_gid;
      uint16_t src_port = 0;
      if (ev.ip) {
        Gid s{}, d{};
        std::copy(ev.ip->src_addr.begin(), ev.ip->src_addr.end(), s.begin());
        std::copy(ev.ip->dst_addr.begin(), ev.ip->dst_addr.end(), d.begin());
        child->sgid = d;  // the request's destination is our address
        src_port = ev.ip->src_port;
        set_sockaddr(&child->id.route.addr.dst_storage, s, src_port);
      } else {
        set_sockaddr(&child->id.route.addr.dst_storage, ev.remote_gid, 0);
      }
      child->local_port = l->local_port;
      set_sockaddr(&child->id.route.addr.src_storage, child->sgid, l->local_port);
      child->sgid_index = local_index;  // found above (0 for a SIDR request without an address)
      set_route_path(child, urdma::cm::roce_flow_label(src_port, l->local_port));
      live.insert(child);
      by_conn[ev.id] = child;
      queue_event(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0, &ev, l);
      continue;
    }
    auto it = by_conn.find(ev.id);
    if (it == by_conn.end()) continue;
    Id* id = it->second;
    switch (ev.type) {
      case T::kSidrResponse:
        if (ev.sidr_status == 0) {
          id->state = IdState::kConnected;
          queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, &ev);
        } else {
          id->state = IdState::kDisconnected;
          queue_event(id, RDMA_CM_EVENT_UNREACHABLE, ev.sidr_status, &ev);
        }
        break;
      case T::kConnectResponse: {
        if (id->state != IdState::kConnecting) break;
        if (!id->id.qp) {  // the application moves its own QP, then calls rdma_establish
          queue_event(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, &ev);
          break;
        }
        // Active side with rdma_create_qp's QP (librdmacm's ucma_process_conn_resp): move it
        // to RTR and RTS, then send the RTU. A QP that cannot move (the application put it in
        // ERR, say) ends in ERR with no RTU: CONNECT_ERROR, status -1; destroying the id then
        // sends the REJ (consumer defined) that tells the passive side.
        int err = 0;
        for (ibv_qp_state s : {IBV_QPS_RTR, IBV_QPS_RTS}) {
          auto q = manager->qp_attrs(ev.id, s);
          err = q.ok() ? apply_qp_locked(id, *q) : q.error();
          if (err != 0) break;
        }
        if (err == 0) err = manager->establish(ev.id).error();
        if (err == 0) {
          id->state = IdState::kConnected;
          report_up_locked(id);
          queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, &ev);
        } else {
          to_error_locked(id);
          id->state = IdState::kDisconnected;
          queue_event(id, RDMA_CM_EVENT_CONNECT_ERROR, -1, &ev);
        }
        break;
      }
      case T::kEstablished:  // the passive side's RTU (its QP moved at rdma_accept)
        id->state = IdState::kConnected;
        report_up_locked(id);
        queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, &ev);
        break;
      case T::kRejected: {
        to_error_locked(id);
        id->state = IdState::kDisconnected;
        queue_event(id, RDMA_CM_EVENT_REJECTED, ev.reason, &ev);
        break;
      }
      case T::kUnreachable:
        to_error_locked(id);
        id->state = IdState::kDisconnected;
        queue_event(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT, &ev);
        break;
      case T::kDisconnected:
        // As Linux's rdma_cm: a DREQ (or DREP) leaves the QP alone — WRs in flight still
        // complete (the peer may disconnect the moment our WRITE's data lands, before its ACK
        // reached us); rdma_disconnect moves it to ERR.
        if (id->state == IdState::kConnected || id->state == IdState::kRequest ||
            id->state == IdState::kConnecting) {
          id->state = IdState::kDisconnected;
          queue_event(id, RDMA_CM_EVENT_DISCONNECTED, 0, &ev);
        }
        report_down_locked(id);
        break;
      case T::kTimewaitExit:
        queue_event(id, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
        break;
      default:
        break;
    }
  }
  for (const urdma::cm::OutgoingMad& m : manager->take_outgoing()) send_mad_locked(m);
}

// Linux ib_destroy_cm_id, through Manager::destroy: a DREP for a DREQ received (qperf's server
// takes DISCONNECTED and never calls rdma_disconnect: without this the client waited for its
// DREQ's retransmission, ~6 s), a DREQ for an established connection, a REJ for a pending one.
void Cma::report_up_locked(Id* id) {
  if (!slot_client || !id->has_conn || id->reported_up) return;
  const auto peer = manager->peer(id->conn);
  if (!peer) return;
  urdma::daemon::ConnRecord r{};
  r.local_comm_id = id->conn;
  r.remote_comm_id = peer->remote_comm_id;
  r.remote_qpn = peer->remote_qpn;
  std::memcpy(r.local_address, peer->local_gid.data(), sizeof r.local_address);
  std::memcpy(r.peer_address, peer->remote_gid.data(), sizeof r.peer_address);
  // Best effort: a daemon that refuses it (ENOSPC) only sends no DREQ for it.
  id->reported_up = slot_client->conn_up(r) == 0;
}

void Cma::report_down_locked(Id* id) {
  if (!id->reported_up) return;
  id->reported_up = false;
  if (slot_client) (void)slot_client->conn_down(id->conn);
}

void Cma::release_locked(Id* x) {
  unclaim_locked(x);
  report_down_locked(x);
  if (x->has_conn) {
    manager->destroy(x->conn);
    by_conn.erase(x->conn);
    x->has_conn = false;
  }
  if (x->listening) {
    (void)manager->stop_listening(x->listen_sid);
    listeners.erase(x->listen_sid);
    if (slot_client) slot_client->unlisten(x->listen_sid);
    x->listening = false;
    x->claimed = false;
  }
}

void Cma::release_channel_locked(Channel* ch) {
  for (Id* x : live) {
    if (x->chan != ch) continue;
    release_locked(x);
    x->chan = nullptr;  // its queued events go with the channel; no more are queued
  }
  for (rdma_cm_event* e : ch->queue) {
    auto* ev = reinterpret_cast<Event*>(e);
    if (live.count(ev->owner)) --ev->owner->pending_events;
    delete ev;
  }
  ch->queue.clear();
  pump_locked();
  wake();
}

void Cma::release_all() {
  if (getpid() != opener_pid_) return;
  // Exit may come from a thread while another holds mu for a moment; never wait forever (a
  // signal handler calling exit() on the thread that holds it).
  std::unique_lock lock(mu, std::defer_lock);
  for (int i = 0; i < 1000 && !lock.try_lock(); ++i) usleep(1000);
  if (!lock.owns_lock() || !manager) return;
  for (Id* x : live) release_locked(x);
  pump_locked();
}

// Whole-library entry: the device and the CM thread.
int ensure_open(Cma& c) {
  if (int e = c.open_locked()) return e;
  return 0;
}

Id* live_id(Cma& c, rdma_cm_id* x) {
  Id* id = Id::from(x);
  return x && c.live.count(id) ? id : nullptr;
}

}  // namespace

// ---- event channels ----

URDMA_EXPORT rdma_event_channel* rdma_create_event_channel(void) {
  Cma& c = cma();
  {
    std::lock_guard lock(c.mu);
    if (int e = ensure_open(c)) {
      errno = e;
      return nullptr;
    }
  }
  auto* ch = new Channel();
  ch->ch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (ch->ch.fd < 0) {
    const int e = errno;
    delete ch;
    errno = e;
    return nullptr;
  }
  return &ch->ch;
}

URDMA_EXPORT void rdma_destroy_event_channel(rdma_event_channel* channel) {
  if (!channel) return;
  auto* ch = reinterpret_cast<Channel*>(channel);
  {
    std::lock_guard lock(cma().mu);
    // rdma-core's ids live in the channel's fd: closing it destroys those the application left.
    cma().release_channel_locked(ch);
  }
  close(ch->ch.fd);
  delete ch;
}

URDMA_EXPORT int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  if (!channel || !event) return fail(EINVAL);
  auto* ch = reinterpret_cast<Channel*>(channel);
  Cma& c = cma();
  for (;;) {
    uint64_t v;
    if (read(ch->ch.fd, &v, sizeof v) != static_cast<ssize_t>(sizeof v)) return -1;  // errno
    std::lock_guard lock(c.mu);
    if (ch->queue.empty()) continue;
    rdma_cm_event* e = ch->queue.front();
    ch->queue.pop_front();
    *event = e;
    return 0;
  }
}

URDMA_EXPORT int rdma_ack_cm_event(rdma_cm_event* event) {
  if (!event) return fail(EINVAL);
  auto* e = reinterpret_cast<Event*>(event);
  {
    std::lock_guard lock(cma().mu);
    if (cma().live.count(e->owner)) --e->owner->pending_events;
  }
  cma().acked.notify_all();
  delete e;
  return 0;
}

URDMA_EXPORT const char* rdma_event_str(rdma_cm_event_type event) {
  switch (event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      return "RDMA_CM_EVENT_ADDR_RESOLVED";
    case RDMA_CM_EVENT_ADDR_ERROR:
      return "RDMA_CM_EVENT_ADDR_ERROR";
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      return "RDMA_CM_EVENT_ROUTE_RESOLVED";
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return "RDMA_CM_EVENT_ROUTE_ERROR";
    case RDMA_CM_EVENT_CONNECT_REQUEST:
      return "RDMA_CM_EVENT_CONNECT_REQUEST";
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      return "RDMA_CM_EVENT_CONNECT_RESPONSE";
    case RDMA_CM_EVENT_CONNECT_ERROR:
      return "RDMA_CM_EVENT_CONNECT_ERROR";
    case RDMA_CM_EVENT_UNREACHABLE:
      return "RDMA_CM_EVENT_UNREACHABLE";
    case RDMA_CM_EVENT_REJECTED:
      return "RDMA_CM_EVENT_REJECTED";
    case RDMA_CM_EVENT_ESTABLISHED:
      return "RDMA_CM_EVENT_ESTABLISHED";
    case RDMA_CM_EVENT_DISCONNECTED:
      return "RDMA_CM_EVENT_DISCONNECTED";
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      return "RDMA_CM_EVENT_DEVICE_REMOVAL";
    case RDMA_CM_EVENT_MULTICAST_JOIN:
      return "RDMA_CM_EVENT_MULTICAST_JOIN";
    case RDMA_CM_EVENT_MULTICAST_ERROR:
      return "RDMA_CM_EVENT_MULTICAST_ERROR";
    case RDMA_CM_EVENT_ADDR_CHANGE:
      return "RDMA_CM_EVENT_ADDR_CHANGE";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
      return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
    default:
      return "UNKNOWN EVENT";
  }
}

// ---- devices ----

URDMA_EXPORT ibv_context** rdma_get_devices(int* num_devices) {
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  if (int e = ensure_open(c)) {
    if (num_devices) *num_devices = 0;
    auto** none = static_cast<ibv_context**>(calloc(1, sizeof(ibv_context*)));
    if (!none) errno = e;
    return none;
  }
  auto** list = static_cast<ibv_context**>(calloc(2, sizeof(ibv_context*)));
  if (!list) return nullptr;
  list[0] = c.verbs;
  if (num_devices) *num_devices = 1;
  return list;
}

URDMA_EXPORT void rdma_free_devices(ibv_context** list) {
  free(list);
}

// ---- ids ----

URDMA_EXPORT int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context,
                                rdma_port_space ps) {
  if (!id) return fail(EINVAL);
  bool sync = false;
  if (!channel) {
    channel = rdma_create_event_channel();
    if (!channel) return -1;
    sync = true;
  }
  if (ps != RDMA_PS_TCP && ps != RDMA_PS_UDP && ps != RDMA_PS_IB && ps != RDMA_PS_IPOIB)
    return fail(EINVAL);
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  if (int e = ensure_open(c)) return fail(e);
  auto* x = new Id();
  x->id.channel = channel;
  x->id.context = context;
  x->id.ps = ps;
  x->id.qp_type = is_ud_ps(ps) ? IBV_QPT_UD : IBV_QPT_RC;
  x->chan = reinterpret_cast<Channel*>(channel);
  x->sync = sync;
  c.live.insert(x);
  *id = &x->id;
  return 0;
}

URDMA_EXPORT int rdma_destroy_id(rdma_cm_id* id) {
  Cma& c = cma();
  std::unique_lock lock(c.mu);
  Id* x = live_id(c, id);
  if (!x) return fail(EINVAL);
  if (x->owns_port && !x->has_conn) c.ports_in_use.erase(x->local_port);
  c.release_locked(x);
  // Events still queued for it are dropped (the application acked what it took), each with its
  // count from the eventfd — but not those a reader already holds. rdma_get_cm_event takes an
  // event in two steps: a count from the eventfd, then, under mu, the queue's front. When no
  // count is left to take, every event still queued belongs to a reader between those steps:
  // it is delivered (as the kernel delivers an event a read() has taken), and the wait for acks
  // below waits for it too. Dropping it left that reader with a count and no event: it read
  // again — in rping, whose main thread destroys the id and then the channel while its CM
  // thread waits in rdma_get_cm_event, on a closed fd ("rdma_get_cm_event: Bad file
  // descriptor", exit 255, its DISCONNECTED event never seen).
  if (x->chan) {
    auto& q = x->chan->queue;
    for (auto it = q.begin(); it != q.end();) {
      auto* e = reinterpret_cast<Event*>(*it);
      if (e->owner != x) {
        ++it;
        continue;
      }
      if (!take_count_nowait(x->chan->ch.fd)) break;  // the rest are held by readers
      delete e;
      --x->pending_events;
      it = q.erase(it);
    }
  }
  if (x->id.event) {  // rdma_get_request's, not acked yet
    delete reinterpret_cast<Event*>(x->id.event);
    x->id.event = nullptr;
    --x->pending_events;
  }
  c.pump_locked();
  c.wake();  // a DREQ or REJ it left may await an answer: the CM thread re-arms its timer
  // rdma_destroy_id(3): "will block until related events have been acknowledged" (bounded here,
  // so that an application holding one forever gets its id destroyed after 10 s anyway).
  c.acked.wait_for(lock, std::chrono::seconds(10), [x] { return x->pending_events <= 0; });
  c.live.erase(x);
  if (x->sync && x->chan) {
    for (rdma_cm_event* e : x->chan->queue) delete reinterpret_cast<Event*>(e);
    close(x->chan->ch.fd);
    delete x->chan;
  }
  delete x;
  return 0;
}

URDMA_EXPORT int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
  if (!addr || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)) return fail(EINVAL);
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x || x->state != IdState::kIdle) return fail(EINVAL);
  const Gid g = gid_of(addr);
  // Linux cma.c (rdma_bind_addr, cma_any_addr): the wildcard and every loopback address
  // (127/8, ::1) bind no device — id->verbs stays NULL and a listen covers every device;
  // any other address must be one of the device's (a GID here). libfabric's verbs provider
  // relies on it: it binds "localhost" and, finding no device, takes its interfaces' addresses.
  const bool any = is_any_or_loopback(g);
  uint8_t sgid_index = 0;
  if (!any && c.find_gid_index(g, &sgid_index) != 0) return fail(EADDRNOTAVAIL);
  // The port is the namespace's, as rdma_cm's ports are: urdmad refuses one another process
  // holds (EADDRINUSE; an ephemeral port is chosen again).
  uint16_t port = port_of(addr);
  if (port != 0 && c.ports_in_use.count(port)) return fail(EADDRINUSE);
  const bool ephemeral = port == 0;
  for (int attempt = 0;; ++attempt) {
    if (ephemeral) port = c.ephemeral_port();
    const int e = c.claim_locked(x, urdma::wire::rdma_service_id(port_space(x->id.ps), port));
    if (e == 0) break;
    if (!ephemeral || e != EADDRINUSE || attempt == 16) return fail(e);
  }
  if (!any) {
    x->sgid_index = sgid_index;
    x->sgid = g;
    x->id.verbs = c.verbs;
    x->id.pd = c.device_pd();
    x->id.port_num = 1;
  }
  c.ports_in_use.insert(port);
  x->local_port = port;
  x->owns_port = true;
  std::memset(&x->id.route.addr.src_storage, 0, sizeof x->id.route.addr.src_storage);
  std::memcpy(&x->id.route.addr.src_storage, addr, sockaddr_size(addr));
  if (addr->sa_family == AF_INET)
    x->id.route.addr.src_sin.sin_port = htons(port);
  else
    x->id.route.addr.src_sin6.sin6_port = htons(port);
  x->state = IdState::kBound;
  return 0;
}

URDMA_EXPORT int rdma_listen(rdma_cm_id* id, int /*backlog*/) {
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x || x->state != IdState::kBound) return fail(EINVAL);
  const uint64_t sid = urdma::wire::rdma_service_id(port_space(x->id.ps), x->local_port);
  if (c.listeners.count(sid)) return fail(EADDRINUSE);
  if (int e = c.slot_client->listen(sid)) return fail(e);
  // The requests that came between bind and listen are served now (their events are queued
  // for this id by the pump below).
  if (auto s = c.manager->listen(sid); !s.ok()) {
    c.slot_client->unlisten(sid);
    return fail(EADDRINUSE);
  }
  c.listeners[sid] = x;
  x->listen_sid = sid;
  x->listening = true;
  x->claimed = true;
  x->state = IdState::kListening;
  if (!x->id.verbs) {
    x->id.verbs = c.verbs;
    x->id.pd = c.device_pd();
    x->id.port_num = 1;
  }
  c.pump_locked();
  c.wake();
  return 0;
}

namespace {

// The rdma_cm IP header an active side puts at the start of its REQ / SIDR_REQ private data.
urdma::wire::CmaAddress cma_address(const Id& x) {
  urdma::wire::CmaAddress ip;
  ip.ip_version = gid_is_v4(x.sgid) ? urdma::wire::kCmaIpVersion4 : urdma::wire::kCmaIpVersion6;
  ip.src_port = x.local_port;
  std::copy(x.sgid.begin(), x.sgid.end(), ip.src_addr.begin());
  std::copy(x.dgid.begin(), x.dgid.end(), ip.dst_addr.begin());
  return ip;
}

// The flow label of an active side's route, as Linux rdma_cm derives it from the IP ports (an
// IPv6 source's own flow label when it has one).
uint32_t active_flow_label(const Id& x) {
  const sockaddr_in6& src6 = x.id.route.addr.src_sin6;
  return urdma::cm::roce_flow_label(x.local_port, port_of(&x.id.route.addr.dst_addr),
                                    src6.sin6_family == AF_INET6 ? ntohl(src6.sin6_flowinfo) : 0);
}

}  // namespace

static int rdma_resolve_addr_async(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr,
                                   int /*timeout_ms*/) {
  if (!dst_addr || (dst_addr->sa_family != AF_INET && dst_addr->sa_family != AF_INET6))
    return fail(EINVAL);
  Cma& c = cma();
  {
    std::lock_guard lock(c.mu);
    Id* x = live_id(c, id);
    if (!x || (x->state != IdState::kIdle && x->state != IdState::kBound)) return fail(EINVAL);
  }
  if (src_addr && Id::from(id)->state == IdState::kIdle) {
    if (rdma_bind_addr(id, src_addr) != 0) return -1;
  }
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x) return fail(EINVAL);
  c.unclaim_locked(x);  // an active side: it will not listen on its port
  if (x->state == IdState::kIdle) {
    x->local_port = c.ephemeral_port();
    c.ports_in_use.insert(x->local_port);
    x->owns_port = true;
  }
  x->dgid = gid_of(dst_addr);
  std::memset(&x->id.route.addr.dst_storage, 0, sizeof x->id.route.addr.dst_storage);
  std::memcpy(&x->id.route.addr.dst_storage, dst_addr, sockaddr_size(dst_addr));
  // The local address that routes to the destination, unless bound to one.
  static constexpr Gid kZero{};
  int status = 0;
  if (x->sgid == kZero || x->sgid == Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0, 0, 0}) {
    const int probe = socket(dst_addr->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_storage dst{};
    std::memcpy(&dst, dst_addr, sockaddr_size(dst_addr));
    reinterpret_cast<sockaddr_in*>(&dst)->sin_port = htons(urdma::wire::kRoceV2UdpPort);
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (probe < 0 ||
        connect(probe, reinterpret_cast<sockaddr*>(&dst), sockaddr_size(dst_addr)) != 0 ||
        getsockname(probe, reinterpret_cast<sockaddr*>(&local), &len) != 0)
      status = -EHOSTUNREACH;
    if (probe >= 0) close(probe);
    if (status == 0) x->sgid = gid_of(reinterpret_cast<sockaddr*>(&local));
  }
  if (status == 0 && c.find_gid_index(x->sgid, &x->sgid_index) != 0) status = -EADDRNOTAVAIL;
  if (status == 0) {
    set_sockaddr(&x->id.route.addr.src_storage, x->sgid, x->local_port);
    x->id.verbs = c.verbs;
    x->id.pd = c.device_pd();
    x->id.port_num = 1;
    x->state = IdState::kAddrResolved;
    c.queue_event(x, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
  } else {
    c.queue_event(x, RDMA_CM_EVENT_ADDR_ERROR, status);
  }
  return 0;
}

static int rdma_resolve_route_async(rdma_cm_id* id, int /*timeout_ms*/) {
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x || x->state != IdState::kAddrResolved) return fail(EINVAL);
  x->state = IdState::kRouteResolved;
  c.set_route_path(x, active_flow_label(*x));
  c.queue_event(x, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
  return 0;
}

// ---- QPs ----

// rdma_create_srq(3): the id's SRQ, on the given PD or the id's (the device's default PD when the
// id has none yet, which rdma_create_qp then uses too); rdma_create_qp gives it to the id's QP.
// The type must be named, as rdma-core asks; XRC SRQs fail in ibv_create_srq_ex (no XRC), so
// the CQ rdma-core creates for an XRC SRQ is never needed.
URDMA_EXPORT int rdma_create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
  if (!attr || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)) return fail(EINVAL);
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x || !x->id.verbs || x->id.srq) return fail(EINVAL);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
    attr->pd = x->id.pd ? x->id.pd : c.device_pd();
    if (!attr->pd) return -1;
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
  }
  if (attr->pd->context != x->id.verbs) return fail(EINVAL);
  ibv_srq* srq = ibv_create_srq_ex(x->id.verbs, attr);
  if (!srq) return -1;
  if (!x->id.pd) x->id.pd = attr->pd;
  x->id.srq = srq;
  return 0;
}

URDMA_EXPORT int rdma_create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!attr) return fail(EINVAL);
  ibv_srq_init_attr_ex ex{};
  ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
  ex.srq_type = IBV_SRQT_BASIC;
  ex.srq_context = attr->srq_context;
  ex.attr = attr->attr;
  ex.pd = pd;
  const int r = rdma_create_srq_ex(id, &ex);
  attr->attr = ex.attr;
  return r;
}

// The QP on the SRQ goes first (rdma_destroy_srq(3)); ibv_destroy_srq's EBUSY otherwise keeps it.
URDMA_EXPORT void rdma_destroy_srq(rdma_cm_id* id) {
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x || !x->id.srq) return;
  if (ibv_destroy_srq(x->id.srq) == 0) x->id.srq = nullptr;
}

URDMA_EXPORT int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!qp_init_attr) return fail(EINVAL);
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x || !x->id.verbs || x->id.qp) return fail(EINVAL);
  const bool ud = is_ud_ps(x->id.ps);
  if (qp_init_attr->qp_type != (ud ? IBV_QPT_UD : IBV_QPT_RC)) return fail(ENOSYS);
  if (!pd) pd = x->id.pd;  // rdma_create_srq's
  if (!pd && !(pd = c.device_pd())) return -1;
  if (pd->context != x->id.verbs) return fail(EINVAL);
  if (!qp_init_attr->srq) qp_init_attr->srq = x->id.srq;
  // No CQs given: one per direction with a completion channel each (rdma_verbs.h's
  // rdma_get_send_comp / rdma_get_recv_comp wait on them).
  bool own_cqs = false;
  if (!qp_init_attr->send_cq || !qp_init_attr->recv_cq) {
    if (qp_init_attr->send_cq || qp_init_attr->recv_cq) return fail(EINVAL);
    ibv_comp_channel* sch = ibv_create_comp_channel(x->id.verbs);
    ibv_comp_channel* rch = ibv_create_comp_channel(x->id.verbs);
    ibv_cq* scq = sch ? ibv_create_cq(x->id.verbs, std::max<int>(qp_init_attr->cap.max_send_wr, 1),
                                      &x->id, sch, 0)
                      : nullptr;
    ibv_cq* rcq = rch ? ibv_create_cq(x->id.verbs, std::max<int>(qp_init_attr->cap.max_recv_wr, 1),
                                      &x->id, rch, 0)
                      : nullptr;
    if (!scq || !rcq) {
      const int e = errno ? errno : ENOMEM;
      if (scq) ibv_destroy_cq(scq);
      if (rcq) ibv_destroy_cq(rcq);
      if (sch) ibv_destroy_comp_channel(sch);
      if (rch) ibv_destroy_comp_channel(rch);
      return fail(e);
    }
    x->id.send_cq_channel = sch;
    x->id.recv_cq_channel = rch;
    qp_init_attr->send_cq = scq;
    qp_init_attr->recv_cq = rcq;
    own_cqs = true;
  }
  auto drop_cqs = [&] {
    if (!own_cqs) return;
    ibv_destroy_cq(qp_init_attr->send_cq);
    ibv_destroy_cq(qp_init_attr->recv_cq);
    ibv_destroy_comp_channel(x->id.send_cq_channel);
    ibv_destroy_comp_channel(x->id.recv_cq_channel);
    x->id.send_cq_channel = x->id.recv_cq_channel = nullptr;
    qp_init_attr->send_cq = qp_init_attr->recv_cq = nullptr;
  };
  ibv_qp* qp = ibv_create_qp(pd, qp_init_attr);
  if (!qp) {
    const int e = errno;
    drop_cqs();
    return fail(e);
  }
  x->own_cqs = own_cqs;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = 1;
  attr.qp_access_flags =
      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  attr.qkey = kUdpQkey;
  // A UD QP is ready to send and receive at once (rdma_create_qp(3)): INIT, RTR, RTS.
  ibv_qp_attr rtr{}, rts{};
  rtr.qp_state = IBV_QPS_RTR;
  rts.qp_state = IBV_QPS_RTS;
  rts.sq_psn = c.random_psn();
  if (ud ? (ibv_modify_qp(qp, &attr,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) != 0 ||
            ibv_modify_qp(qp, &rtr, IBV_QP_STATE) != 0 ||
            ibv_modify_qp(qp, &rts, IBV_QP_STATE | IBV_QP_SQ_PSN) != 0)
         : ibv_modify_qp(qp, &attr,
                         IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) !=
               0) {
    const int e = errno;
    ibv_destroy_qp(qp);
    drop_cqs();
    return fail(e);
  }
  x->id.qp = qp;
  x->id.pd = pd;
  x->id.send_cq = qp_init_attr->send_cq;
  x->id.recv_cq = qp_init_attr->recv_cq;
  x->id.qp_type = ud ? IBV_QPT_UD : IBV_QPT_RC;
  return 0;
}

URDMA_EXPORT int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) {
  if (!attr) return fail(EINVAL);
  if ((attr->comp_mask & ~IBV_QP_INIT_ATTR_PD) != 0) return fail(ENOSYS);
  ibv_qp_init_attr a{};
  a.qp_context = attr->qp_context;
  a.send_cq = attr->send_cq;
  a.recv_cq = attr->recv_cq;
  a.srq = attr->srq;
  a.cap = attr->cap;
  a.qp_type = attr->qp_type;
  a.sq_sig_all = attr->sq_sig_all;
  const int r =
      rdma_create_qp(id, (attr->comp_mask & IBV_QP_INIT_ATTR_PD) ? attr->pd : nullptr, &a);
  attr->cap = a.cap;
  return r;
}

URDMA_EXPORT void rdma_destroy_qp(rdma_cm_id* id) {
  Cma& c = cma();
  ibv_qp* qp;
  bool own_cqs;
  {
    std::lock_guard lock(c.mu);
    Id* x = live_id(c, id);
    if (!x || !x->id.qp) return;
    qp = x->id.qp;
    x->id.qp = nullptr;
    own_cqs = x->own_cqs;
    x->own_cqs = false;
  }
  ibv_destroy_qp(qp);
  if (own_cqs) {
    ibv_destroy_cq(id->send_cq);
    ibv_destroy_cq(id->recv_cq);
    ibv_destroy_comp_channel(id->send_cq_channel);
    ibv_destroy_comp_channel(id->recv_cq_channel);
    id->send_cq = id->recv_cq = nullptr;
    id->send_cq_channel = id->recv_cq_channel = nullptr;
  }
}

static int rdma_connect_async(rdma_cm_id* id, rdma_conn_param* p);
static int rdma_accept_async(rdma_cm_id* id, rdma_conn_param* p);

namespace {

// Synchronous mode: the call's outcome is the next event on the id's own channel (rdma-core's
// ucma_complete: REJECTED is ECONNREFUSED, other failures their status).
int sync_wait(rdma_cm_id* id, rdma_cm_event_type want) {
  rdma_cm_event* e = nullptr;
  if (rdma_get_cm_event(id->channel, &e) != 0) return -1;
  const rdma_cm_event_type got = e->event;
  const int status = e->status;
  rdma_ack_cm_event(e);
  if (got == want && status == 0) return 0;
  if (got == RDMA_CM_EVENT_REJECTED) return fail(ECONNREFUSED);
  if (status < 0) return fail(-status);
  return fail(status ? status : EINVAL);
}

bool is_sync(rdma_cm_id* id) {
  std::lock_guard lock(cma().mu);
  Id* x = live_id(cma(), id);
  return x && x->sync;
}

// The request event rdma_get_request left on the id is acked by the id's next call.
void ack_request_event(rdma_cm_id* id) {
  rdma_cm_event* e;
  {
    std::lock_guard lock(cma().mu);
    Id* x = live_id(cma(), id);
    if (!x || !x->id.event) return;
    e = x->id.event;
    x->id.event = nullptr;
  }
  rdma_ack_cm_event(e);
}

}  // namespace

URDMA_EXPORT int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr,
                                   int timeout_ms) {
  if (rdma_resolve_addr_async(id, src_addr, dst_addr, timeout_ms) != 0) return -1;
  return is_sync(id) ? sync_wait(id, RDMA_CM_EVENT_ADDR_RESOLVED) : 0;
}
URDMA_EXPORT int rdma_resolve_route(rdma_cm_id* id, int timeout_ms) {
  if (rdma_resolve_route_async(id, timeout_ms) != 0) return -1;
  return is_sync(id) ? sync_wait(id, RDMA_CM_EVENT_ROUTE_RESOLVED) : 0;
}
URDMA_EXPORT int rdma_connect(rdma_cm_id* id, rdma_conn_param* p) {
  if (rdma_connect_async(id, p) != 0) return -1;
  return is_sync(id) ? sync_wait(id, RDMA_CM_EVENT_ESTABLISHED) : 0;
}
URDMA_EXPORT int rdma_accept(rdma_cm_id* id, rdma_conn_param* p) {
  ack_request_event(id);
  if (rdma_accept_async(id, p) != 0) return -1;
  if (is_ud_ps(id->ps)) return 0;  // SIDR: the answer is the whole exchange
  return is_sync(id) ? sync_wait(id, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

// ---- connections ----

static int rdma_connect_async(rdma_cm_id* id, rdma_conn_param* p) {
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x || x->state != IdState::kRouteResolved) return fail(EINVAL);
  if (is_ud_ps(x->id.ps)) {
    // SIDR: ask the listener for its QPN and Q_Key (ESTABLISHED carries them).
    if (p && p->private_data_len > urdma::cm::kRdmaSidrReqPrivateDataMax) return fail(EINVAL);
    urdma::cm::SidrQueryParams sp;
    sp.path.local_gid = x->sgid;
    sp.path.remote_gid = x->dgid;
    sp.service_id =
        urdma::wire::rdma_service_id(port_space(x->id.ps), port_of(&x->id.route.addr.dst_addr));
    sp.ip = cma_address(*x);
    if (p && p->private_data)
      sp.private_data = {static_cast<const uint8_t*>(p->private_data), p->private_data_len};
    auto r = c.manager->sidr_query(sp);
    if (!r.ok()) return fail(r.error());
    x->conn = *r;
    x->has_conn = true;
    c.by_conn[x->conn] = x;
    x->state = IdState::kConnecting;
    c.pump_locked();
    c.wake();
    return 0;
  }
  if (p && p->private_data_len > urdma::cm::kRdmaReqPrivateDataMax) return fail(EINVAL);
  if (!x->id.qp && !p) return fail(EINVAL);
  urdma::cm::ConnectParams cp;
  cp.path.local_gid = x->sgid;
  cp.path.remote_gid = x->dgid;
  cp.path.flow_label = active_flow_label(*x);
  cp.path.traffic_class = x->path.traffic_class;
  cp.service_id =
      urdma::wire::rdma_service_id(port_space(x->id.ps), port_of(&x->id.route.addr.dst_addr));
  cp.qpn = x->id.qp ? x->id.qp->qp_num : p->qp_num;
  cp.starting_psn = c.random_psn();
  if (p) {
    cp.responder_resources = p->responder_resources;
    cp.initiator_depth = p->initiator_depth;
    cp.retry_count = std::min<uint8_t>(p->retry_count, 7);
    cp.rnr_retry_count = std::min<uint8_t>(p->rnr_retry_count, 7);
    cp.flow_control = p->flow_control;
    cp.srq = x->id.qp ? x->id.qp->srq != nullptr : p->srq;
    cp.private_data = {static_cast<const uint8_t*>(p->private_data),
                       p->private_data ? p->private_data_len : size_t{0}};
  } else {
    cp.responder_resources = 0;
    cp.initiator_depth = 0;
  }
  cp.ip = cma_address(*x);
  // The RTU always waits: for rdma_establish without a QP, and with one until the CM thread
  // has moved it (kConnectResponse in pump_locked).
  cp.manual_rtu = true;
  auto r = c.manager->connect(cp);
  if (!r.ok()) return fail(r.error());
  x->conn = *r;
  x->has_conn = true;
  c.by_conn[x->conn] = x;
  x->state = IdState::kConnecting;
  c.pump_locked();
  c.wake();  // the CM thread arms the REQ's retransmission timer
  return 0;
}

static int rdma_accept_async(rdma_cm_id* id, rdma_conn_param* p) {
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x || x->state != IdState::kRequest || !x->has_conn) return fail(EINVAL);
  if (is_ud_ps(x->id.ps)) {
    if (p && p->private_data_len > urdma::cm::kSidrRepPrivateDataMax) return fail(EINVAL);
    if (!x->id.qp && !p) return fail(EINVAL);
    urdma::cm::SidrAnswerParams sa;
    sa.qpn = x->id.qp ? x->id.qp->qp_num : p->qp_num;
    sa.qkey = kUdpQkey;
    if (p && p->private_data)
      sa.private_data = {static_cast<const uint8_t*>(p->private_data), p->private_data_len};
    if (auto st = c.manager->sidr_answer(x->conn, sa); !st.ok()) return fail(st.error());
    x->state = IdState::kConnected;
    c.pump_locked();
    return 0;
  }
  if (p && p->private_data_len > urdma::cm::kRepPrivateDataMax) return fail(EINVAL);
  if (!x->id.qp && !p) return fail(EINVAL);
  urdma::cm::AcceptParams ap;
  ap.qpn = x->id.qp ? x->id.qp->qp_num : p->qp_num;
  if (p) {
    ap.responder_resources = p->responder_resources;
    ap.initiator_depth = p->initiator_depth;
    ap.rnr_retry_count = std::min<uint8_t>(p->rnr_retry_count, 7);
    ap.flow_control = p->flow_control;
    ap.srq = x->id.qp ? x->id.qp->srq != nullptr : p->srq;
    ap.private_data = {static_cast<const uint8_t*>(p->private_data),
                       p->private_data ? p->private_data_len : size_t{0}};
  }
  auto r = c.manager->accept(x->conn, ap);
  if (!r.ok()) return fail(r.error());
  if (x->id.qp) {
    auto apply = [&](const urdma::cm::QpAttrs& q) {
      ibv_qp_attr attr = q.attr;
      if (q.mask & IBV_QP_AV) {
        uint8_t index = x->sgid_index;
        if (c.find_gid_index(q.sgid, &index) == 0) x->sgid_index = index;
        attr.ah_attr.grh.sgid_index = index;
      }
      apply_ack_timeout(*x, &attr, q.mask);
      return ibv_modify_qp(x->id.qp, &attr, q.mask);
    };
    if (apply(r->rtr) != 0 || apply(r->rts) != 0) {
      const int e = errno ? errno : EINVAL;
      urdma::cm::RejectParams rp;
      (void)c.manager->reject(x->conn, rp);
      c.pump_locked();
      return fail(e);
    }
  }
  x->state = IdState::kConnected;
  c.pump_locked();
  c.wake();
  return 0;
}

URDMA_EXPORT int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  ack_request_event(id);
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x || !x->has_conn) return fail(EINVAL);
  if (private_data_len > urdma::cm::kRejPrivateDataMax) return fail(EINVAL);
  urdma::cm::RejectParams rp;
  rp.private_data = {static_cast<const uint8_t*>(private_data),
                     private_data ? private_data_len : size_t{0}};
  if (auto s = c.manager->reject(x->conn, rp); !s.ok()) return fail(s.error());
  x->state = IdState::kDisconnected;
  c.pump_locked();
  return 0;
}

URDMA_EXPORT int rdma_reject_ece(rdma_cm_id* id, const void* private_data,
                                 uint8_t private_data_len) {
  return rdma_reject(id, private_data, private_data_len);
}

URDMA_EXPORT int rdma_establish(rdma_cm_id* id) {
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x || !x->has_conn || x->id.qp) return fail(EINVAL);
  if (auto s = c.manager->establish(x->conn); !s.ok()) return fail(s.error());
  x->state = IdState::kConnected;
  c.pump_locked();
  c.wake();
  return 0;
}

URDMA_EXPORT int rdma_disconnect(rdma_cm_id* id) {
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x || !x->has_conn) return fail(EINVAL);
  if (x->id.qp) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(x->id.qp, &attr, IBV_QP_STATE);
  }
  auto s = c.manager->disconnect(x->conn);
  c.pump_locked();
  c.wake();
  if (!s.ok()) return fail(s.error());
  return 0;
}

URDMA_EXPORT int rdma_init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  if (!qp_attr || !qp_attr_mask) return fail(EINVAL);
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x) return fail(EINVAL);
  if (qp_attr->qp_state == IBV_QPS_INIT && !x->has_conn) {
    *qp_attr = {};
    qp_attr->qp_state = IBV_QPS_INIT;
    qp_attr->port_num = 1;
    qp_attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    *qp_attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    return 0;
  }
  if (!x->has_conn) return fail(EINVAL);
  auto q = c.manager->qp_attrs(x->conn, qp_attr->qp_state);
  if (!q.ok()) return fail(q.error());
  *qp_attr = q->attr;
  if (q->mask & IBV_QP_AV) {
    uint8_t index = x->sgid_index;
    c.find_gid_index(q->sgid, &index);
    qp_attr->ah_attr.grh.sgid_index = index;
  }
  apply_ack_timeout(*x, qp_attr, q->mask);
  *qp_attr_mask = q->mask;
  return 0;
}

URDMA_EXPORT int rdma_notify(rdma_cm_id* id, ibv_event_type event) {
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x) return fail(EINVAL);
  if (event != IBV_EVENT_COMM_EST || !x->has_conn) return 0;
  (void)c.manager->notify_established(x->conn);
  c.pump_locked();
  return 0;
}

URDMA_EXPORT __be16 rdma_get_src_port(rdma_cm_id* id) {
  return id->route.addr.src_addr.sa_family == AF_INET6 ? id->route.addr.src_sin6.sin6_port
                                                       : id->route.addr.src_sin.sin_port;
}
URDMA_EXPORT __be16 rdma_get_dst_port(rdma_cm_id* id) {
  return id->route.addr.dst_addr.sa_family == AF_INET6 ? id->route.addr.dst_sin6.sin6_port
                                                       : id->route.addr.dst_sin.sin_port;
}

// rdma_set_option as Linux's ucma_set_option_id: each option's value has its own size (EINVAL
// otherwise), an unknown option or level is ENOSYS.
URDMA_EXPORT int rdma_set_option(rdma_cm_id* id, int level, int optname, void* optval,
                                 size_t optlen) {
  if (!id || !optval) return fail(EINVAL);
  if (level != RDMA_OPTION_ID) return fail(ENOSYS);
  Cma& c = cma();
  std::lock_guard lock(c.mu);
  Id* x = live_id(c, id);
  if (!x) return fail(EINVAL);
  switch (optname) {
    case RDMA_OPTION_ID_TOS:  // the next rdma_resolve_route's traffic class
      if (optlen != sizeof(uint8_t)) return fail(EINVAL);
      x->tos = *static_cast<uint8_t*>(optval);
      return 0;
    case RDMA_OPTION_ID_ACK_TIMEOUT:  // Linux rdma_set_ack_timeout: RC ids only
      if (optlen != sizeof(uint8_t)) return fail(EINVAL);
      if (is_ud_ps(x->id.ps)) return fail(EINVAL);
      x->ack_timeout = *static_cast<uint8_t*>(optval);
      x->ack_timeout_set = true;
      return 0;
    // Accepted where Linux accepts them (rdma_set_reuseaddr's and rdma_set_afonly's states) and
    // without effect: a port is one id's at a time, and a destroyed id's port is free at once
    // (docs/COMPATIBILITY.md).
    case RDMA_OPTION_ID_REUSEADDR: {
      if (optlen != sizeof(int)) return fail(EINVAL);
      const bool reuse = *static_cast<int*>(optval) != 0;
      if (!(reuse && x->state != IdState::kListening) && x->state != IdState::kIdle)
        return fail(EINVAL);
      return 0;
    }
    case RDMA_OPTION_ID_AFONLY:
      if (optlen != sizeof(int)) return fail(EINVAL);
      if (x->state != IdState::kIdle && x->state != IdState::kBound) return fail(EINVAL);
      return 0;
    default:
      return fail(ENOSYS);
  }
}

// rdma_migrate_id(3): the id's events still queued move to the new channel (one eventfd count
// each, taken from the old fd and given to the new one); a NULL channel puts the id into
// synchronous mode with a channel of its own; the call blocks while the application holds
// events of this id it took from the old channel and has not acknowledged (as rdma-core's
// waits for events_completed to reach events_reported).
URDMA_EXPORT int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  Cma& c = cma();
  {
    std::lock_guard lock(c.mu);
    if (!live_id(c, id)) return fail(EINVAL);
  }
  const bool sync = channel == nullptr;
  if (sync && !(channel = rdma_create_event_channel())) return -1;
  std::unique_lock lock(c.mu);
  Id* x = live_id(c, id);
  if (!x) {
    if (sync) rdma_destroy_event_channel(channel);
    return fail(EINVAL);
  }
  Channel* from = x->chan;
  auto* to = reinterpret_cast<Channel*>(channel);
  if (from != to) {
    for (auto it = from->queue.begin(); it != from->queue.end();) {
      if (reinterpret_cast<Event*>(*it)->owner != x) {
        ++it;
        continue;
      }
      to->queue.push_back(*it);
      it = from->queue.erase(it);
      uint64_t v = 1;
      const int fl = fcntl(from->ch.fd, F_GETFL);
      fcntl(from->ch.fd, F_SETFL, fl | O_NONBLOCK);
      (void)!read(from->ch.fd, &v, sizeof v);
      fcntl(from->ch.fd, F_SETFL, fl);
      v = 1;
      (void)!write(to->ch.fd, &v, sizeof v);
    }
  }
  if (x->sync && from != to) {
    // Its own channel: the request event rdma_get_request left is acked, the channel goes.
    if (x->id.event) {
      delete reinterpret_cast<Event*>(x->id.event);
      x->id.event = nullptr;
      --x->pending_events;
    }
    for (rdma_cm_event* e : from->queue) delete reinterpret_cast<Event*>(e);
    close(from->ch.fd);
    delete from;
  }
  x->chan = to;
  x->id.channel = channel;
  x->sync = sync;
  // Events taken from the old channel and not acked: all of pending_events but those queued on
  // the new channel (the moved ones and any that arrive meanwhile).
  c.acked.wait(lock, [x, to] {
    int queued = 0;
    for (rdma_cm_event* e : to->queue) queued += reinterpret_cast<Event*>(e)->owner == x;
    return x->pending_events <= queued;
  });
  return 0;
}

// ---- not built: the documented error ----

URDMA_EXPORT int rdma_create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd,
                                ibv_qp_init_attr* qp_init_attr) {
  if (!id || !res) return fail(EINVAL);
  rdma_cm_id* cm = nullptr;
  const auto ps =
      res->ai_port_space ? static_cast<rdma_port_space>(res->ai_port_space) : RDMA_PS_TCP;
  if (rdma_create_id(nullptr, &cm, nullptr, ps) != 0) return -1;
  // rdma-core's rdma_create_ep: the QP type is the address info's.
  if (qp_init_attr && res->ai_qp_type)
    qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
  int r;
  if (res->ai_flags & RAI_PASSIVE) {
    r = res->ai_src_addr ? rdma_bind_addr(cm, res->ai_src_addr) : fail(EINVAL);
    if (r == 0 && qp_init_attr) {
      std::lock_guard lock(cma().mu);
      Id* x = Id::from(cm);
      x->has_ep_attr = true;
      x->ep_attr = *qp_init_attr;
      x->ep_pd = pd;
    }
  } else {
    r = rdma_resolve_addr(cm, res->ai_src_addr, res->ai_dst_addr, 2000);
    if (r == 0) r = rdma_resolve_route(cm, 2000);
    if (r == 0 && qp_init_attr) r = rdma_create_qp(cm, pd, qp_init_attr);
  }
  if (r != 0) {
    const int e = errno;
    rdma_destroy_id(cm);
    return fail(e);
  }
  *id = cm;
  return 0;
}
URDMA_EXPORT void rdma_destroy_ep(rdma_cm_id* id) {
  if (!id) return;
  rdma_destroy_qp(id);
  rdma_destroy_srq(id);  // as rdma-core's: the endpoint's SRQ goes with it
  rdma_destroy_id(id);
}
URDMA_EXPORT int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
  if (!listen || !id) return fail(EINVAL);
  bool has_attr;
  ibv_qp_init_attr attr;
  ibv_pd* pd;
  {
    std::lock_guard lock(cma().mu);
    Id* l = live_id(cma(), listen);
    if (!l || !l->sync || !l->listening) return fail(EINVAL);
    has_attr = l->has_ep_attr;
    attr = l->ep_attr;
    pd = l->ep_pd;
  }
  for (;;) {
    rdma_cm_event* e = nullptr;
    if (rdma_get_cm_event(listen->channel, &e) != 0) return -1;
    if (e->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
      rdma_ack_cm_event(e);
      continue;
    }
    rdma_cm_id* child = e->id;
    child->event = e;
    if (has_attr && rdma_create_qp(child, pd, &attr) != 0) {
      const int err = errno;
      rdma_reject(child, nullptr, 0);
      rdma_destroy_id(child);
      return fail(err);
    }
    *id = child;
    return 0;
  }
}
// rdma_getaddrinfo(3) for IP addresses, as rdma-core 44 (librdmacm/addrinfo.c) answers:
//  * with a node or a service, getaddrinfo's first answer becomes the destination (the source
//    with RAI_PASSIVE; the result's flags are then RAI_PASSIVE, else none);
//  * with neither, the answer is the hints themselves: their flags, family, QP type and port
//    space and their destination address (libfabric's verbs provider asks this way for the
//    peer a name exchange gave it);
//  * the hints' source address is kept when the answer has none.
// No route or connect data (no SA: the route is resolved locally). Errors as rdma-core's: -1
// with errno EINVAL for no node, service or hints; getaddrinfo's own error codes otherwise.
URDMA_EXPORT int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints,
                                  rdma_addrinfo** res) {
  if (!res || (!node && !service && !hints)) return fail(EINVAL);
  *res = nullptr;
  if (hints && (hints->ai_flags & ~(RAI_PASSIVE | RAI_NUMERICHOST | RAI_NOROUTE | RAI_FAMILY)))
    return EAI_BADFLAGS;
  if (hints && hints->ai_family != 0 && hints->ai_family != AF_UNSPEC &&
      hints->ai_family != AF_INET && hints->ai_family != AF_INET6)
    return EAI_FAMILY;
  auto copy = [](const sockaddr* a, socklen_t len) {
    auto* out = static_cast<sockaddr*>(calloc(1, sizeof(sockaddr_storage)));
    if (out) std::memcpy(out, a, std::min<size_t>(len, sizeof(sockaddr_storage)));
    return out;
  };
  auto* r = static_cast<rdma_addrinfo*>(calloc(1, sizeof(rdma_addrinfo)));
  if (!r) return EAI_MEMORY;
  if (node || service) {
    addrinfo ai_hints{};
    ai_hints.ai_socktype = SOCK_STREAM;
    if (hints) {
      if (hints->ai_flags & RAI_PASSIVE) ai_hints.ai_flags |= AI_PASSIVE;
      if (hints->ai_flags & RAI_NUMERICHOST) ai_hints.ai_flags |= AI_NUMERICHOST;
      if (hints->ai_family == AF_INET || hints->ai_family == AF_INET6)
        ai_hints.ai_family = hints->ai_family;
    }
    addrinfo* found = nullptr;
    if (int e = getaddrinfo(node, service, &ai_hints, &found)) {
      free(r);
      return e;
    }
    const bool passive = hints && (hints->ai_flags & RAI_PASSIVE);
    r->ai_flags = passive ? RAI_PASSIVE : 0;
    r->ai_family = found->ai_family;
    r->ai_qp_type = hints && hints->ai_qp_type ? hints->ai_qp_type : IBV_QPT_RC;
    r->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
    sockaddr** to = passive ? &r->ai_src_addr : &r->ai_dst_addr;
    socklen_t* to_len = passive ? &r->ai_src_len : &r->ai_dst_len;
    *to = copy(found->ai_addr, found->ai_addrlen);
    *to_len = found->ai_addrlen;
    freeaddrinfo(found);
    if (!*to) {
      rdma_freeaddrinfo(r);
      return EAI_MEMORY;
    }
  } else {
    r->ai_flags = hints->ai_flags;
    r->ai_family = hints->ai_family;
    r->ai_qp_type = hints->ai_qp_type;
    r->ai_port_space = hints->ai_port_space;
    if (hints->ai_dst_addr && hints->ai_dst_len) {
      r->ai_dst_addr = copy(hints->ai_dst_addr, hints->ai_dst_len);
      r->ai_dst_len = hints->ai_dst_len;
      if (!r->ai_dst_addr) {
        rdma_freeaddrinfo(r);
        return EAI_MEMORY;
      }
    }
  }
  if (!r->ai_src_len && hints && hints->ai_src_addr && hints->ai_src_len) {
    r->ai_src_addr = copy(hints->ai_src_addr, hints->ai_src_len);
    r->ai_src_len = hints->ai_src_len;
    if (!r->ai_src_addr) {
      rdma_freeaddrinfo(r);
      return EAI_MEMORY;
    }
  }
  *res = r;
  return 0;
}
URDMA_EXPORT void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    free(res->ai_src_addr);
    free(res->ai_dst_addr);
    free(res->ai_src_canonname);
    free(res->ai_dst_canonname);
    free(res->ai_route);
    free(res->ai_connect);
    free(res);
    res = next;
  }
}
URDMA_EXPORT int rdma_join_multicast(rdma_cm_id*, sockaddr*, void*) {
  return fail(ENOSYS);
}
URDMA_EXPORT int rdma_join_multicast_ex(rdma_cm_id*, rdma_cm_join_mc_attr_ex*, void*) {
  return fail(ENOSYS);
}
URDMA_EXPORT int rdma_leave_multicast(rdma_cm_id*, sockaddr*) {
  return fail(ENOSYS);
}
URDMA_EXPORT int rdma_set_local_ece(rdma_cm_id*, ibv_ece*) {
  return fail(EOPNOTSUPP);
}
URDMA_EXPORT int rdma_get_remote_ece(rdma_cm_id*, ibv_ece*) {
  return fail(EOPNOTSUPP);
}

// rsockets (rdma/rsocket.h): not built. Each sets errno ENOSYS and returns -1.
#define URDMA_RSOCKET_STUB(name) \
  URDMA_EXPORT long name(...) {  \
    return fail(ENOSYS);         \
  }
extern "C" {
URDMA_RSOCKET_STUB(rsocket)
URDMA_RSOCKET_STUB(rbind)
URDMA_RSOCKET_STUB(rlisten)
URDMA_RSOCKET_STUB(raccept)
URDMA_RSOCKET_STUB(rconnect)
URDMA_RSOCKET_STUB(rshutdown)
URDMA_RSOCKET_STUB(rclose)
URDMA_RSOCKET_STUB(rrecv)
URDMA_RSOCKET_STUB(rrecvfrom)
URDMA_RSOCKET_STUB(rrecvmsg)
URDMA_RSOCKET_STUB(rsend)
URDMA_RSOCKET_STUB(rsendto)
URDMA_RSOCKET_STUB(rsendmsg)
URDMA_RSOCKET_STUB(rread)
URDMA_RSOCKET_STUB(rreadv)
URDMA_RSOCKET_STUB(rwrite)
URDMA_RSOCKET_STUB(rwritev)
URDMA_RSOCKET_STUB(rpoll)
URDMA_RSOCKET_STUB(rselect)
URDMA_RSOCKET_STUB(rgetpeername)
URDMA_RSOCKET_STUB(rgetsockname)
URDMA_RSOCKET_STUB(rsetsockopt)
URDMA_RSOCKET_STUB(rgetsockopt)
URDMA_RSOCKET_STUB(rfcntl)
URDMA_RSOCKET_STUB(riomap)
URDMA_RSOCKET_STUB(riounmap)
URDMA_RSOCKET_STUB(riowrite)
}
