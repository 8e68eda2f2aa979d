// One side of an rdma_cm failure-path test (rdmacm_test.cc), written against Debian's
// <rdma/rdma_cma.h> and linked to Debian's librdmacm like any application; run with urdma's
// libraries first on LD_LIBRARY_PATH.
//
//   rdmacm_peer reject-server PORT TEXT   listen; reject the first request with TEXT as private
//                                         data; prints "rejected"
//   rdmacm_peer client ADDR PORT [err-qp|abandon]
//                                         connect (with a QP); prints the event it got, its status
//                                         and its private data as text; err-qp: the QP is moved
//                                         to ERR before rdma_connect (it cannot reach RTR);
//                                         abandon: no event expected — after 500 ms it prints
//                                         "abandoned" and destroys the connecting id
//   rdmacm_peer hold-server PORT MS      listen; take the first request and neither accept nor
//                                         reject it; print the next event on the channel within
//                                         MS milliseconds (or "no event"), then rdma_accept's
//                                         result
//   rdmacm_peer recv-server PORT          listen; accept the first request (QP by rdma_create_qp,
//                                         one RECV posted, "accepted" as private data); prints its
//                                         QPN, each event, and the message the RECV got
//   rdmacm_peer establish-client ADDR PORT TEXT
//                                         connect with a QP of its own (not rdma_create_qp):
//                                         prints the CONNECT_RESPONSE's fields, moves the QP to
//                                         RTS with rdma_init_qp_attr + ibv_modify_qp, calls
//                                         rdma_establish and SENDs TEXT
//   rdmacm_peer migrate ADDR pending|acked|sync
//                                         resolve ADDR on one channel, migrate the id to another
//                                         (its event still queued, or taken and acked first):
//                                         where events arrive; sync: to NULL (synchronous mode)
//   rdmacm_peer destroy-taken ADDR        resolve ADDR; with the event queued, take its wake-up
//                                         from the channel's fd by hand (urdma's channel fd is an
//                                         eventfd in semaphore mode, and rdma_get_cm_event's first
//                                         step is that read), then rdma_destroy_id on another
//                                         thread: prints whether it waits, the event a second
//                                         reader then gets, and rdma_destroy_id's result
//   rdmacm_peer bind-twice PORT           bind two ids to 127.0.0.1:PORT: the second's errno
//   rdmacm_peer devices                   rdma_get_devices: the count and each device's name
//   rdmacm_peer leave-server PORT channel|exit
//                                         listen; accept the first request; take DISCONNECTED and
//                                         never call rdma_disconnect nor destroy the id (as
//                                         qperf 0.4.11's server): channel — destroy the event
//                                         channel, print "channel destroyed" and stay until
//                                         killed; exit — exit at once
//   rdmacm_peer late-listen-server PORT MS
//                                         bind, print "bound", wait MS milliseconds, then listen
//                                         (qperf 0.4.11's order: it tells the client its port
//                                         before rdma_listen); accept the first request; print
//                                         "established" and wait for DISCONNECTED
//   rdmacm_peer disconnect-client ADDR PORT
//                                         connect, rdma_disconnect, print the DISCONNECTED
//                                         event's status (or that none came within 30 s)
//   rdmacm_peer srq-server PORT N id|ep  listen; on the request, rdma_create_srq on the new id
//                                         (no PD: the id's), N RECVs posted to id->srq, then
//                                         rdma_create_qp with no SRQ named (the id's is used);
//                                         accept, print N received SENDs' bytes and checksum,
//                                         its QP's traffic class, then destroy QP, SRQ and id;
//                                         ep: SRQ and QP on a PD of its own, rdma_destroy_ep
//                                         alone, then ibv_dealloc_pd's result (EBUSY: the SRQ
//                                         was left)
//   rdmacm_peer send-client ADDR PORT N TOS TIMEOUT
//                                         rdma_set_option TOS and ACK_TIMEOUT (-1: not set)
//                                         before rdma_resolve_route, connect, print the
//                                         connected QP's traffic class and timeout
//                                         (ibv_query_qp), SEND N 64-byte messages and print
//                                         their checksum
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

sockaddr_in ipv4(const char* address, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (address) inet_pton(AF_INET, address, &addr.sin_addr);
  return addr;
}

// The next event on `ec`, which must be `expected`; nullptr (and a line saying what came) if not.
rdma_cm_event* expect_event(rdma_event_channel* ec, rdma_cm_event_type expected) {
  rdma_cm_event* event = nullptr;
  if (rdma_get_cm_event(ec, &event) != 0) {
    std::printf("rdma_get_cm_event: errno %d\n", errno);
    return nullptr;
  }
  if (event->event != expected) {
    std::printf("expected %s, got %s status %d\n", rdma_event_str(expected),
                rdma_event_str(event->event), event->status);
    rdma_ack_cm_event(event);
    return nullptr;
  }
  return event;
}

bool readable(rdma_event_channel* ec, int timeout_ms) {
  pollfd p{ec->fd, POLLIN, 0};
  return poll(&p, 1, timeout_ms) == 1;
}

// A server's first steps: an event channel, an RC id bound to PORT on every address (after
// printing "bound" and sleeping listen_delay_ms when that is > 0: qperf's order), rdma_listen
// ("listening" printed), then the first CONNECT_REQUEST, acked. 0, or the exit code of the step
// that failed: 2 channel or id, 3 bind, 4 listen, 5 no request.
struct Server {
  rdma_event_channel* ec = nullptr;
  rdma_cm_id* listener = nullptr;
  rdma_cm_id* id = nullptr;  // the request's
};
int take_first_request(int port, Server* s, int listen_delay_ms = 0) {
  s->ec = rdma_create_event_channel();
  if (!s->ec || rdma_create_id(s->ec, &s->listener, nullptr, RDMA_PS_TCP) != 0) return 2;
  sockaddr_in addr = ipv4(nullptr, port);
  if (rdma_bind_addr(s->listener, reinterpret_cast<sockaddr*>(&addr)) != 0) return 3;
  if (listen_delay_ms > 0) {
    std::printf("bound\n");
    std::fflush(stdout);
    usleep(static_cast<useconds_t>(listen_delay_ms) * 1000);
  }
  if (rdma_listen(s->listener, 1) != 0) return 4;
  std::printf("listening\n");
  std::fflush(stdout);
  rdma_cm_event* event = expect_event(s->ec, RDMA_CM_EVENT_CONNECT_REQUEST);
  if (!event) return 5;
  s->id = event->id;
  rdma_ack_cm_event(event);
  return 0;
}

// rdma_create_qp's RC QP with one WR and one SGE each way, on the id's PD and implicit CQs.
int create_small_rc_qp(rdma_cm_id* id) {
  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 1;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  return rdma_create_qp(id, nullptr, &attr);
}

int recv_server(int port) {
  Server srv;
  if (int e = take_first_request(port, &srv)) return e;
  rdma_event_channel* ec = srv.ec;
  rdma_cm_id* listener = srv.listener;
  rdma_cm_id* id = srv.id;
  rdma_cm_event* event = nullptr;
  if (create_small_rc_qp(id) != 0) return 6;
  char buffer[64] = {};
  ibv_mr* mr = ibv_reg_mr(id->pd, buffer, sizeof buffer, IBV_ACCESS_LOCAL_WRITE);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buffer), sizeof buffer, mr ? mr->lkey : 0};
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (!mr || ibv_post_recv(id->qp, &wr, &bad) != 0) return 7;
  std::printf("server qp_num %u\n", id->qp->qp_num);
  rdma_conn_param param{};
  param.private_data = "accepted";
  param.private_data_len = 9;
  param.responder_resources = param.initiator_depth = 1;
  if (rdma_accept(id, &param) != 0) return 8;
  if (!(event = expect_event(ec, RDMA_CM_EVENT_ESTABLISHED))) return 9;
  std::printf("event %s\n", rdma_event_str(event->event));
  std::fflush(stdout);
  rdma_ack_cm_event(event);
  ibv_wc wc{};
  int n = 0;
  for (int i = 0; i < 10000 && n == 0; ++i) {  // up to ~10 s
    n = ibv_poll_cq(id->recv_cq, 1, &wc);
    if (n == 0) usleep(1000);
  }
  if (n != 1) return 10;
  std::printf("recv status %s byte_len %u data '%.*s'\n", ibv_wc_status_str(wc.status), wc.byte_len,
              static_cast<int>(strnlen(buffer, sizeof buffer)), buffer);
  std::fflush(stdout);
  if ((event = expect_event(ec, RDMA_CM_EVENT_DISCONNECTED))) rdma_ack_cm_event(event);
  rdma_disconnect(id);
  rdma_destroy_qp(id);
  ibv_dereg_mr(mr);
  rdma_destroy_id(id);
  rdma_destroy_id(listener);
  rdma_destroy_event_channel(ec);
  return 0;
}

// Moves `qp` to `state` with the attributes rdma_init_qp_attr gives for it.
bool move_qp(rdma_cm_id* id, ibv_qp* qp, ibv_qp_state state) {
  ibv_qp_attr attr{};
  int mask = 0;
  attr.qp_state = state;
  if (rdma_init_qp_attr(id, &attr, &mask) != 0) {
    std::printf("rdma_init_qp_attr(%d): errno %d\n", state, errno);
    return false;
  }
  if (const int e = ibv_modify_qp(qp, &attr, mask)) {
    std::printf("ibv_modify_qp(%d, mask 0x%x): %d\n", state, mask, e);
    return false;
  }
  return true;
}

int establish_client(const char* server, int port, const char* text) {
  rdma_event_channel* ec = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ec || rdma_create_id(ec, &id, nullptr, RDMA_PS_TCP) != 0) return 2;
  sockaddr_in addr = ipv4(server, port);
  rdma_cm_event* event = nullptr;
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&addr), 2000) != 0 ||
      !(event = expect_event(ec, RDMA_CM_EVENT_ADDR_RESOLVED)))
    return 3;
  rdma_ack_cm_event(event);
  if (rdma_resolve_route(id, 2000) != 0 ||
      !(event = expect_event(ec, RDMA_CM_EVENT_ROUTE_RESOLVED)))
    return 4;
  rdma_ack_cm_event(event);
  // The application's own QP: rdma_create_qp is not called, so the CM leaves it alone.
  ibv_pd* pd = ibv_alloc_pd(id->verbs);
  ibv_cq* cq = pd ? ibv_create_cq(id->verbs, 4, nullptr, nullptr, 0) : nullptr;
  if (!cq) return 5;
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = init.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd, &init);
  if (!qp) return 6;
  rdma_conn_param param{};
  param.qp_num = qp->qp_num;
  param.responder_resources = param.initiator_depth = 1;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  if (rdma_connect(id, &param) != 0) return 7;
  if (!(event = expect_event(ec, RDMA_CM_EVENT_CONNECT_RESPONSE))) return 8;
  const rdma_conn_param& c = event->param.conn;
  std::printf("event %s status %d qp_num %u private_data '%.*s'\n", rdma_event_str(event->event),
              event->status, c.qp_num,
              c.private_data ? static_cast<int>(strnlen(static_cast<const char*>(c.private_data),
                                                        c.private_data_len))
                             : 0,
              c.private_data ? static_cast<const char*>(c.private_data) : "");
  rdma_ack_cm_event(event);
  if (!move_qp(id, qp, IBV_QPS_INIT) || !move_qp(id, qp, IBV_QPS_RTR) ||
      !move_qp(id, qp, IBV_QPS_RTS))
    return 9;
  if (rdma_establish(id) != 0) {
    std::printf("rdma_establish: errno %d\n", errno);
    return 10;
  }
  std::printf("established\n");
  char buffer[64] = {};
  std::snprintf(buffer, sizeof buffer, "%s", text);
  ibv_mr* mr = ibv_reg_mr(pd, buffer, sizeof buffer, 0);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buffer), static_cast<uint32_t>(std::strlen(buffer) + 1),
              mr ? mr->lkey : 0};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (!mr || ibv_post_send(qp, &wr, &bad) != 0) return 11;
  ibv_wc wc{};
  int n = 0;
  for (int i = 0; i < 10000 && n == 0; ++i) {
    n = ibv_poll_cq(cq, 1, &wc);
    if (n == 0) usleep(1000);
  }
  if (n != 1) return 12;
  std::printf("send status %s\n", ibv_wc_status_str(wc.status));
  rdma_disconnect(id);
  ibv_destroy_qp(qp);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ec);
  return 0;
}

// pending: the ADDR_RESOLVED event is still queued on the old channel when the id moves;
// otherwise it was taken and acknowledged first.
int migrate(const char* address, bool pending) {
  rdma_event_channel* from = rdma_create_event_channel();
  rdma_event_channel* to = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!from || !to || rdma_create_id(from, &id, nullptr, RDMA_PS_TCP) != 0) return 2;
  sockaddr_in addr = ipv4(address, 7999);
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&addr), 2000) != 0) return 3;
  if (!readable(from, 5000)) return 4;
  rdma_cm_event* event = nullptr;
  if (!pending) {
    if (!(event = expect_event(from, RDMA_CM_EVENT_ADDR_RESOLVED))) return 4;
    rdma_ack_cm_event(event);
  }
  if (rdma_migrate_id(id, to) != 0) {
    std::printf("rdma_migrate_id: errno %d\n", errno);
    return 5;
  }
  std::printf("id channel is the new one: %s\n", id->channel == to ? "yes" : "no");
  if (pending) {
    std::printf("pending event on the old channel: %s\n", readable(from, 0) ? "yes" : "no");
    if (!readable(to, 5000) || !(event = expect_event(to, RDMA_CM_EVENT_ADDR_RESOLVED))) return 6;
    std::printf("new channel: %s\n", rdma_event_str(event->event));
    rdma_ack_cm_event(event);
  }
  if (rdma_resolve_route(id, 2000) != 0) return 7;
  if (!readable(to, 5000) || !(event = expect_event(to, RDMA_CM_EVENT_ROUTE_RESOLVED))) return 8;
  std::printf("new channel: %s\n", rdma_event_str(event->event));
  rdma_ack_cm_event(event);
  std::printf("old channel after: %s\n", readable(from, 0) ? "an event" : "nothing");
  rdma_destroy_id(id);
  rdma_destroy_event_channel(to);
  rdma_destroy_event_channel(from);
  return 0;
}

// rdma_migrate_id(id, NULL): synchronous mode — rdma_resolve_route returns once the route is
// resolved, no event to fetch.
int migrate_to_sync(const char* address) {
  rdma_event_channel* from = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!from || rdma_create_id(from, &id, nullptr, RDMA_PS_TCP) != 0) return 2;
  sockaddr_in addr = ipv4(address, 7999);
  rdma_cm_event* event = nullptr;
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&addr), 2000) != 0 ||
      !(event = expect_event(from, RDMA_CM_EVENT_ADDR_RESOLVED)))
    return 3;
  rdma_ack_cm_event(event);
  if (rdma_migrate_id(id, nullptr) != 0) {
    std::printf("rdma_migrate_id(NULL): errno %d\n", errno);
    return 5;
  }
  const int ret = rdma_resolve_route(id, 2000);
  std::printf("synchronous rdma_resolve_route %d, route paths %d\n", ret, id->route.num_paths);
  std::printf("old channel after: %s\n", readable(from, 0) ? "an event" : "nothing");
  rdma_destroy_id(id);
  rdma_destroy_event_channel(from);
  return 0;
}

// A reader between rdma_get_cm_event's two steps (the wake-up taken, the event not yet popped)
// when rdma_destroy_id runs: the event is that reader's, as the kernel's read() would have
// delivered it, so rdma_destroy_id waits for its ack instead of dropping it.
int destroy_taken(const char* address) {
  rdma_event_channel* ec = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ec || rdma_create_id(ec, &id, nullptr, RDMA_PS_TCP) != 0) return 2;
  sockaddr_in addr = ipv4(address, 7999);
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&addr), 2000) != 0) return 3;
  if (!readable(ec, 5000)) return 4;
  uint64_t count = 0;
  if (read(ec->fd, &count, sizeof count) != static_cast<ssize_t>(sizeof count)) return 5;
  int destroyed = -2;
  std::atomic<bool> returned{false};
  std::thread destroyer([&] {
    destroyed = rdma_destroy_id(id);
    returned = true;
  });
  usleep(300000);
  std::printf("rdma_destroy_id %s\n", returned ? "returned at once" : "waits");
  // The reader's second step: the event it took the wake-up for. (Its wake-up is given back
  // first, as rdma_get_cm_event starts from the read again; non-blocking, so a dropped event
  // shows as EAGAIN instead of a hang.)
  count = 1;
  if (write(ec->fd, &count, sizeof count) != static_cast<ssize_t>(sizeof count)) return 6;
  fcntl(ec->fd, F_SETFL, fcntl(ec->fd, F_GETFL) | O_NONBLOCK);
  rdma_cm_event* event = nullptr;
  if (rdma_get_cm_event(ec, &event) == 0) {
    std::printf("reader got %s of the destroyed id: %s\n", rdma_event_str(event->event),
                event->id == id ? "yes" : "no");
    rdma_ack_cm_event(event);
  } else {
    std::printf("reader got nothing: errno %d\n", errno);
  }
  destroyer.join();
  std::printf("rdma_destroy_id %d\n", destroyed);
  rdma_destroy_event_channel(ec);
  return 0;
}

int bind_twice(int port) {
  rdma_event_channel* ec = rdma_create_event_channel();
  rdma_cm_id *first = nullptr, *second = nullptr;
  if (!ec || rdma_create_id(ec, &first, nullptr, RDMA_PS_TCP) != 0 ||
      rdma_create_id(ec, &second, nullptr, RDMA_PS_TCP) != 0)
    return 2;
  sockaddr_in addr = ipv4("127.0.0.1", port);
  if (rdma_bind_addr(first, reinterpret_cast<sockaddr*>(&addr)) != 0) return 3;
  errno = 0;
  const int ret = rdma_bind_addr(second, reinterpret_cast<sockaddr*>(&addr));
  const int err = errno;
  std::printf("second bind %d errno %s\n", ret,
              err == EADDRINUSE ? "EADDRINUSE" : std::strerror(err));
  rdma_destroy_id(second);
  rdma_destroy_id(first);
  rdma_destroy_event_channel(ec);
  return 0;
}

int devices() {
  int n = -1;
  ibv_context** list = rdma_get_devices(&n);
  if (!list) {
    std::printf("rdma_get_devices: errno %d\n", errno);
    return 2;
  }
  int listed = 0;
  for (ibv_context** c = list; *c; ++c, ++listed) {
    ibv_device_attr attr{};
    std::printf("device %s query %d\n", ibv_get_device_name((*c)->device),
                ibv_query_device(*c, &attr));
  }
  std::printf("num_devices %d listed %d\n", n, listed);
  rdma_free_devices(list);
  return 0;
}

int reject_server(int port, const char* text) {
  Server srv;
  if (int e = take_first_request(port, &srv)) return e;
  rdma_event_channel* ec = srv.ec;
  rdma_cm_id* listener = srv.listener;
  rdma_cm_id* id = srv.id;
  if (rdma_reject(id, text, static_cast<uint8_t>(std::strlen(text) + 1)) != 0) return 7;
  std::printf("rejected\n");
  rdma_destroy_id(id);
  rdma_destroy_id(listener);
  rdma_destroy_event_channel(ec);
  return 0;
}

int client(const char* server, int port, bool err_qp, bool abandon) {
  rdma_event_channel* ec = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ec || rdma_create_id(ec, &id, nullptr, RDMA_PS_TCP) != 0) return 2;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, server, &addr.sin_addr) != 1) return 3;
  rdma_cm_event* event = nullptr;
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&addr), 2000) != 0 ||
      rdma_get_cm_event(ec, &event) != 0 || event->event != RDMA_CM_EVENT_ADDR_RESOLVED)
    return 4;
  rdma_ack_cm_event(event);
  if (rdma_resolve_route(id, 2000) != 0 || rdma_get_cm_event(ec, &event) != 0 ||
      event->event != RDMA_CM_EVENT_ROUTE_RESOLVED)
    return 5;
  rdma_ack_cm_event(event);
  ibv_cq* cq = ibv_create_cq(id->verbs, 4, nullptr, nullptr, 0);
  ibv_qp_init_attr attr{};
  attr.send_cq = attr.recv_cq = cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 1;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  if (!cq || rdma_create_qp(id, nullptr, &attr) != 0) return 6;
  if (err_qp) {
    ibv_qp_attr to_err{};
    to_err.qp_state = IBV_QPS_ERR;
    if (ibv_modify_qp(id->qp, &to_err, IBV_QP_STATE) != 0) return 9;
  }
  rdma_conn_param param{};
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  if (rdma_connect(id, &param) != 0) return 7;
  if (abandon) {
    // Long before the REQ's first retry (rdma_cm's CM response timeout is ~4 s).
    if (readable(ec, 500)) return 10;
    std::printf("abandoned\n");
    std::fflush(stdout);
    rdma_destroy_qp(id);
    ibv_destroy_cq(cq);
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ec);
    return 0;
  }
  if (rdma_get_cm_event(ec, &event) != 0) return 8;
  std::string data;
  if (event->param.conn.private_data && event->param.conn.private_data_len)
    data.assign(static_cast<const char*>(event->param.conn.private_data),
                strnlen(static_cast<const char*>(event->param.conn.private_data),
                        event->param.conn.private_data_len));
  std::printf("event %s status %d private_data '%s'\n", rdma_event_str(event->event), event->status,
              data.c_str());
  rdma_ack_cm_event(event);
  rdma_destroy_qp(id);
  ibv_destroy_cq(cq);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ec);
  return 0;
}

int hold_server(int port, int wait_ms) {
  Server srv;
  if (int e = take_first_request(port, &srv)) return e;
  rdma_event_channel* ec = srv.ec;
  rdma_cm_id* listener = srv.listener;
  rdma_cm_id* id = srv.id;
  rdma_cm_event* event = nullptr;
  std::printf("request\n");
  std::fflush(stdout);
  if (readable(ec, wait_ms) && rdma_get_cm_event(ec, &event) == 0) {
    std::printf("event %s status %d on the request's id: %s\n", rdma_event_str(event->event),
                event->status, event->id == id ? "yes" : "no");
    rdma_ack_cm_event(event);
  } else {
    std::printf("no event\n");
  }
  if (create_small_rc_qp(id) != 0) return 6;
  rdma_conn_param param{};
  param.responder_resources = param.initiator_depth = 1;
  errno = 0;
  const int accepted = rdma_accept(id, &param);
  std::printf("accept %d errno %d\n", accepted, accepted ? errno : 0);
  std::fflush(stdout);
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
  rdma_destroy_id(listener);
  rdma_destroy_event_channel(ec);
  return 0;
}

int late_listen_server(int port, int delay_ms) {
  Server srv;
  if (int e = take_first_request(port, &srv, delay_ms)) return e;
  rdma_event_channel* ec = srv.ec;
  rdma_cm_id* listener = srv.listener;
  rdma_cm_id* id = srv.id;
  rdma_cm_event* event = nullptr;
  if (create_small_rc_qp(id) != 0) return 6;
  rdma_conn_param param{};
  param.responder_resources = param.initiator_depth = 1;
  if (rdma_accept(id, &param) != 0) return 7;
  if (!(event = expect_event(ec, RDMA_CM_EVENT_ESTABLISHED))) return 8;
  rdma_ack_cm_event(event);
  std::printf("established\n");
  std::fflush(stdout);
  if ((event = expect_event(ec, RDMA_CM_EVENT_DISCONNECTED))) rdma_ack_cm_event(event);
  rdma_disconnect(id);
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
  rdma_destroy_id(listener);
  rdma_destroy_event_channel(ec);
  return 0;
}

// The passive side of leave-server: its id and channel after the first request was accepted.
int leave_server(int port, bool destroy_channel) {
  Server srv;
  if (int e = take_first_request(port, &srv)) return e;
  rdma_event_channel* ec = srv.ec;
  rdma_cm_id* listener = srv.listener;
  rdma_cm_id* id = srv.id;
  rdma_cm_event* event = nullptr;
  if (create_small_rc_qp(id) != 0) return 6;
  rdma_conn_param param{};
  param.responder_resources = param.initiator_depth = 1;
  if (rdma_accept(id, &param) != 0) return 7;
  if (!(event = expect_event(ec, RDMA_CM_EVENT_ESTABLISHED))) return 8;
  rdma_ack_cm_event(event);
  if (!(event = expect_event(ec, RDMA_CM_EVENT_DISCONNECTED))) return 9;
  rdma_ack_cm_event(event);
  std::printf("disconnected\n");
  std::fflush(stdout);
  if (!destroy_channel) return 0;
  rdma_destroy_id(listener);
  rdma_destroy_event_channel(ec);
  std::printf("channel destroyed\n");
  std::fflush(stdout);
  pause();
  return 0;
}

int disconnect_client(const char* server, int port) {
  rdma_event_channel* ec = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ec || rdma_create_id(ec, &id, nullptr, RDMA_PS_TCP) != 0) return 2;
  sockaddr_in addr = ipv4(server, port);
  rdma_cm_event* event = nullptr;
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&addr), 2000) != 0 ||
      !(event = expect_event(ec, RDMA_CM_EVENT_ADDR_RESOLVED)))
    return 4;
  rdma_ack_cm_event(event);
  if (rdma_resolve_route(id, 2000) != 0 || !(event = expect_event(ec, RDMA_CM_EVENT_ROUTE_RESOLVED)))
    return 5;
  rdma_ack_cm_event(event);
  if (create_small_rc_qp(id) != 0) return 6;
  rdma_conn_param param{};
  param.responder_resources = param.initiator_depth = 1;
  param.retry_count = param.rnr_retry_count = 7;
  if (rdma_connect(id, &param) != 0 || !(event = expect_event(ec, RDMA_CM_EVENT_ESTABLISHED)))
    return 7;
  rdma_ack_cm_event(event);
  if (rdma_disconnect(id) != 0) return 8;
  // The DREP ends the wait. Without one the DREQ is resent every ~4 s, 15 times.
  if (!readable(ec, 30000)) {
    std::printf("no DISCONNECTED within 30 s\n");
    return 9;
  }
  if (!(event = expect_event(ec, RDMA_CM_EVENT_DISCONNECTED))) return 10;
  std::printf("event %s status %d\n", rdma_event_str(event->event), event->status);
  rdma_ack_cm_event(event);
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ec);
  return 0;
}

// The bytes of SEND i (of a run of N): distinct per message, so a lost or repeated one shows.
constexpr uint32_t kSrqMessageSize = 64;
uint8_t message_byte(int message, uint32_t offset) {
  return static_cast<uint8_t>(message * 7 + offset * 13 + 1);
}

// The connected QP's GRH traffic class and local ACK timeout, as ibv_query_qp reports them.
void print_qp_route(const char* who, ibv_qp* qp) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(qp, &attr, IBV_QP_AV | IBV_QP_TIMEOUT, &init) != 0) {
    std::printf("%s ibv_query_qp: errno %d\n", who, errno);
    return;
  }
  std::printf("%s traffic_class %u timeout %u\n", who, attr.ah_attr.grh.traffic_class,
              attr.timeout);
}

int srq_server(int port, int messages, bool ep) {
  Server srv;
  if (int e = take_first_request(port, &srv)) return e;
  rdma_event_channel* ec = srv.ec;
  rdma_cm_id* listener = srv.listener;
  rdma_cm_id* id = srv.id;
  rdma_cm_event* event = nullptr;
  ibv_pd* own_pd = ep ? ibv_alloc_pd(id->verbs) : nullptr;
  if (ep && !own_pd) return 6;
  ibv_srq_init_attr srq_attr{};
  srq_attr.attr.max_wr = static_cast<uint32_t>(messages);
  srq_attr.attr.max_sge = 1;
  if (rdma_create_srq(id, own_pd, &srq_attr) != 0) {
    std::printf("rdma_create_srq: errno %d\n", errno);
    return 6;
  }
  std::printf("srq created: %s, pd %s\n", id->srq ? "yes" : "no", id->pd ? "set" : "none");
  std::string buffer(static_cast<size_t>(messages) * kSrqMessageSize, '\0');
  // The SRQ's PD: id->pd stays the device's PD when rdma_create_srq is given one of its own
  // (rdma-core's rdma_create_srq_ex sets id->pd only when the id has none).
  ibv_mr* mr = ibv_reg_mr(own_pd ? own_pd : id->pd, buffer.data(), buffer.size(),
                          IBV_ACCESS_LOCAL_WRITE);
  if (!mr) return 7;
  for (int i = 0; i < messages; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(&buffer[i * kSrqMessageSize]), kSrqMessageSize,
                mr->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = static_cast<uint64_t>(i);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_srq_recv(id->srq, &wr, &bad) != 0) return 8;
  }
  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = 1;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_wr = static_cast<uint32_t>(messages);  // sizes the recv CQ rdma_cm makes
  if (rdma_create_qp(id, own_pd, &attr) != 0) return 9;
  std::printf("qp on the id's srq: %s\n", id->qp->srq == id->srq ? "yes" : "no");
  rdma_conn_param param{};
  param.responder_resources = param.initiator_depth = 1;
  if (rdma_accept(id, &param) != 0) return 10;
  if (!(event = expect_event(ec, RDMA_CM_EVENT_ESTABLISHED))) return 11;
  rdma_ack_cm_event(event);
  print_qp_route("server", id->qp);
  uint32_t bytes = 0, checksum = 0;
  int received = 0, failed = 0;
  for (int i = 0; i < 10000 && received < messages; ++i) {  // up to ~10 s
    ibv_wc wc{};
    if (ibv_poll_cq(id->recv_cq, 1, &wc) != 1) {
      usleep(1000);
      continue;
    }
    ++received;
    if (wc.status != IBV_WC_SUCCESS) ++failed;
    bytes += wc.byte_len;
    for (uint32_t b = 0; b < wc.byte_len; ++b)
      checksum = checksum * 31 + static_cast<uint8_t>(buffer[wc.wr_id * kSrqMessageSize + b]);
  }
  std::printf("received %d failed %d bytes %u checksum %08x\n", received, failed, bytes, checksum);
  std::fflush(stdout);
  if ((event = expect_event(ec, RDMA_CM_EVENT_DISCONNECTED))) rdma_ack_cm_event(event);
  ibv_dereg_mr(mr);
  if (ep) {
    rdma_destroy_ep(id);
    std::printf("pd dealloc after rdma_destroy_ep: %d\n", ibv_dealloc_pd(own_pd));
  } else {
    rdma_destroy_qp(id);
    rdma_destroy_srq(id);
    std::printf("srq destroyed: %s\n", id->srq ? "no" : "yes");
    rdma_destroy_id(id);
  }
  rdma_destroy_id(listener);
  rdma_destroy_event_channel(ec);
  return 0;
}

int send_client(const char* server, int port, int messages, int tos, int timeout) {
  rdma_event_channel* ec = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ec || rdma_create_id(ec, &id, nullptr, RDMA_PS_TCP) != 0) return 2;
  int wrong_size = 0;
  std::printf("tos optlen %zu: errno %d\n", sizeof wrong_size,
              rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &wrong_size,
                              sizeof wrong_size) == 0 ? 0 : errno);
  sockaddr_in addr = ipv4(server, port);
  rdma_cm_event* event = nullptr;
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&addr), 2000) != 0 ||
      !(event = expect_event(ec, RDMA_CM_EVENT_ADDR_RESOLVED)))
    return 3;
  rdma_ack_cm_event(event);
  uint8_t tos_value = static_cast<uint8_t>(tos), timeout_value = static_cast<uint8_t>(timeout);
  if (tos >= 0 && rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos_value, 1) != 0)
    return 4;
  if (timeout >= 0 &&
      rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout_value, 1) != 0)
    return 4;
  if (rdma_resolve_route(id, 2000) != 0 ||
      !(event = expect_event(ec, RDMA_CM_EVENT_ROUTE_RESOLVED)))
    return 5;
  rdma_ack_cm_event(event);
  std::printf("route traffic_class %u\n", id->route.path_rec->traffic_class);
  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = static_cast<uint32_t>(messages);
  attr.cap.max_recv_wr = 1;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, nullptr, &attr) != 0) return 6;
  rdma_conn_param param{};
  param.responder_resources = param.initiator_depth = 1;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  if (rdma_connect(id, &param) != 0) return 7;
  if (!(event = expect_event(ec, RDMA_CM_EVENT_ESTABLISHED))) return 8;
  rdma_ack_cm_event(event);
  print_qp_route("client", id->qp);
  std::string buffer(static_cast<size_t>(messages) * kSrqMessageSize, '\0');
  uint32_t checksum = 0;
  for (int i = 0; i < messages; ++i)
    for (uint32_t b = 0; b < kSrqMessageSize; ++b) {
      buffer[i * kSrqMessageSize + b] = static_cast<char>(message_byte(i, b));
      checksum = checksum * 31 + message_byte(i, b);
    }
  ibv_mr* mr = ibv_reg_mr(id->pd, buffer.data(), buffer.size(), 0);
  if (!mr) return 9;
  for (int i = 0; i < messages; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(&buffer[i * kSrqMessageSize]), kSrqMessageSize,
                mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_send(id->qp, &wr, &bad) != 0) return 10;
  }
  int done = 0, failed = 0;
  for (int i = 0; i < 10000 && done < messages; ++i) {
    ibv_wc wc{};
    if (ibv_poll_cq(id->send_cq, 1, &wc) != 1) {
      usleep(1000);
      continue;
    }
    ++done;
    if (wc.status != IBV_WC_SUCCESS) ++failed;
  }
  std::printf("sent %d failed %d bytes %u checksum %08x\n", done, failed,
              static_cast<uint32_t>(done) * kSrqMessageSize, checksum);
  rdma_disconnect(id);
  if ((event = expect_event(ec, RDMA_CM_EVENT_DISCONNECTED))) rdma_ack_cm_event(event);
  rdma_destroy_qp(id);
  ibv_dereg_mr(mr);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ec);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "reject-server") == 0)
    return reject_server(std::atoi(argv[2]), argv[3]);
  if ((argc == 4 || (argc == 5 && (std::strcmp(argv[4], "err-qp") == 0 ||
                                    std::strcmp(argv[4], "abandon") == 0))) &&
      std::strcmp(argv[1], "client") == 0)
    return client(argv[2], std::atoi(argv[3]), argc == 5 && std::strcmp(argv[4], "err-qp") == 0,
                  argc == 5 && std::strcmp(argv[4], "abandon") == 0);
  if (argc == 4 && std::strcmp(argv[1], "hold-server") == 0)
    return hold_server(std::atoi(argv[2]), std::atoi(argv[3]));
  if (argc == 3 && std::strcmp(argv[1], "recv-server") == 0) return recv_server(std::atoi(argv[2]));
  if (argc == 5 && std::strcmp(argv[1], "establish-client") == 0)
    return establish_client(argv[2], std::atoi(argv[3]), argv[4]);
  if (argc == 4 && std::strcmp(argv[1], "migrate") == 0)
    return std::strcmp(argv[3], "sync") == 0
               ? migrate_to_sync(argv[2])
               : migrate(argv[2], std::strcmp(argv[3], "pending") == 0);
  if (argc == 3 && std::strcmp(argv[1], "destroy-taken") == 0) return destroy_taken(argv[2]);
  if (argc == 3 && std::strcmp(argv[1], "bind-twice") == 0) return bind_twice(std::atoi(argv[2]));
  if (argc == 2 && std::strcmp(argv[1], "devices") == 0) return devices();
  if (argc == 4 && std::strcmp(argv[1], "leave-server") == 0)
    return leave_server(std::atoi(argv[2]), std::strcmp(argv[3], "channel") == 0);
  if (argc == 4 && std::strcmp(argv[1], "late-listen-server") == 0)
    return late_listen_server(std::atoi(argv[2]), std::atoi(argv[3]));
  if (argc == 4 && std::strcmp(argv[1], "disconnect-client") == 0)
    return disconnect_client(argv[2], std::atoi(argv[3]));
  if (argc == 5 && std::strcmp(argv[1], "srq-server") == 0)
    return srq_server(std::atoi(argv[2]), std::atoi(argv[3]), std::strcmp(argv[4], "ep") == 0);
  if (argc == 7 && std::strcmp(argv[1], "send-client") == 0)
    return send_client(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]),
                       std::atoi(argv[6]));
  std::fprintf(
      stderr,
      "usage: rdmacm_peer reject-server PORT TEXT | client ADDR PORT [err-qp|abandon] | "
      "hold-server PORT MS | recv-server PORT"
      " | establish-client ADDR PORT TEXT | migrate ADDR pending|acked|sync | destroy-taken ADDR"
      " | bind-twice PORT "
      "| devices\n");
  return 1;
}
