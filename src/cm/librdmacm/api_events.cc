// Exported calls: event channels and their events, the device list, and synchronous mode's wait
// for an id's own event.

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

namespace urdma::rdmacm {

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
  const Id* x = lock_id(id).x;
  return x && x->sync;
}

// The request event rdma_get_request left on the id is acked by the id's next call.
void ack_request_event(rdma_cm_id* id) {
  rdma_cm_event* e;
  {
    auto [c, lock, x] = lock_id(id);
    if (!x || !x->id.event) return;
    e = x->id.event;
    x->id.event = nullptr;
  }
  rdma_ack_cm_event(e);
}

}  // namespace urdma::rdmacm

using namespace urdma::rdmacm;

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
