// Exported calls: endpoints (rdma_create_ep, rdma_get_request) and address information
// (rdma_getaddrinfo).

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
    auto [c, lock, l] = lock_id(listen);
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
