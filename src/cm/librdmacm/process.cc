// The process's one CM (Cma): the device it opens, its ids' bookkeeping, the events it queues,
// and the id helpers the calls share. Its CM thread is cm_thread.cc.

#include "cm/librdmacm/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/env.h"
#include "net/capture_tap.h"
#include "runtime/runtime.h"
#include "verbs/internal.h"

namespace urdma::rdmacm {

namespace {

Cma* g_cma = nullptr;

// In a forked child: a CM of its own, on the device the child opens (libibverbs' process()
// forgets the parent's too). The parent's ids, CM thread and MAD channel stay the parent's;
// what the child inherited is never destroyed (the thread does not exist here).
void forget_the_parents_cm() { g_cma = new Cma; }

}  // namespace

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
  // GMPs leave from the slot's own socket through an I/O of their own: the engine's is its
  // thread's alone. The engine's I/O configured the socket already (the options this one sets
  // are the same; no offload, no port pool).
  const int gmp_fd = fcntl(slot->fd.get(), F_DUPFD_CLOEXEC, 0);
  if (gmp_fd < 0) return open_errno = errno;
  std::string io_why;
  std::unique_ptr<urdma::net::PacketIo> socket_io =
      urdma::net::UdpSocketIo::adopt(gmp_fd, &io_why, {.gso = false});
  if (!socket_io) return open_errno = errno ? errno : EIO;
  auto tap = std::make_unique<urdma::net::CaptureTap>(std::move(socket_io),
                                                      static_cast<uint32_t>(getpid()));
  rt.add_capture_tap(tap.get());  // the Cma and its I/O live as long as the process
  gmp_io_ = std::move(tap);

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
  gmp_sender_.emplace(*gmp_io_, random_psn());
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
  // Linux leaves the id's groups when it is destroyed (cma_leave_mc_groups).
  detach_mc_locked(x);
  x->mc.clear();
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

LockedId lock_id(rdma_cm_id* id, std::initializer_list<IdState> states) {
  Cma& c = cma();
  std::unique_lock lock(c.mu);
  Id* x = live_id(c, id);
  if (x && states.size() != 0 && std::find(states.begin(), states.end(), x->state) == states.end())
    x = nullptr;
  return {c, std::move(lock), x};
}

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

}  // namespace urdma::rdmacm
