// Exported calls on ids: create and destroy, bind and listen, address and route resolution,
// options, and moving an id to another channel.

#include "cm/librdmacm/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

using namespace urdma::rdmacm;

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
  auto [c, lock, x] = lock_id(id);
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
  c.acked.wait_for(lock, std::chrono::seconds(10), [x = x] { return x->pending_events <= 0; });
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
  auto [c, lock, x] = lock_id(id, {IdState::kIdle});
  if (!x) return fail(EINVAL);
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
  auto [c, lock, x] = lock_id(id, {IdState::kBound});
  if (!x) return fail(EINVAL);
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

static int rdma_resolve_addr_async(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr,
                                   int /*timeout_ms*/) {
  if (!dst_addr || (dst_addr->sa_family != AF_INET && dst_addr->sa_family != AF_INET6))
    return fail(EINVAL);
  {
    auto [c, lock, x] = lock_id(id, {IdState::kIdle, IdState::kBound});
    if (!x) return fail(EINVAL);
  }
  if (src_addr && Id::from(id)->state == IdState::kIdle) {
    if (rdma_bind_addr(id, src_addr) != 0) return -1;
  }
  auto [c, lock, x] = lock_id(id);
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
    reinterpret_cast<sockaddr_in*>(&dst)->sin_port = htons(urdma::net::kRoceV2UdpPort);
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
  auto [c, lock, x] = lock_id(id, {IdState::kAddrResolved});
  if (!x) return fail(EINVAL);
  x->state = IdState::kRouteResolved;
  c.set_route_path(x, active_flow_label(*x));
  c.queue_event(x, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
  return 0;
}

URDMA_EXPORT int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr,
                                   int timeout_ms) {
  if (rdma_resolve_addr_async(id, src_addr, dst_addr, timeout_ms) != 0) return -1;
  return is_sync(id) ? sync_wait(id, RDMA_CM_EVENT_ADDR_RESOLVED) : 0;
}

URDMA_EXPORT int rdma_resolve_route(rdma_cm_id* id, int timeout_ms) {
  if (rdma_resolve_route_async(id, timeout_ms) != 0) return -1;
  return is_sync(id) ? sync_wait(id, RDMA_CM_EVENT_ROUTE_RESOLVED) : 0;
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
  auto [c, lock, x] = lock_id(id);
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
  if (!lock_id(id).x) return fail(EINVAL);
  const bool sync = channel == nullptr;
  if (sync && !(channel = rdma_create_event_channel())) return -1;
  auto [c, lock, x] = lock_id(id);
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
  c.acked.wait(lock, [x = x, to] {
    int queued = 0;
    for (rdma_cm_event* e : to->queue) queued += reinterpret_cast<Event*>(e)->owner == x;
    return x->pending_events <= queued;
  });
  return 0;
}
