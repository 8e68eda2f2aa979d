// One side of an rdma_cm failure-path test (rdmacm_test.cc), written against Debian's
// <rdma/rdma_cma.h> and linked to Debian's librdmacm like any application; run with urdma's
// libraries first on LD_LIBRARY_PATH.
//
//   rdmacm_peer reject-server PORT TEXT   listen; reject the first request with TEXT as private
//                                         data; prints "rejected"
//   rdmacm_peer client ADDR PORT          connect (with a QP); prints the event it got, its status
//                                         and its private data as text
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

int reject_server(int port, const char* text) {
  rdma_event_channel* ec = rdma_create_event_channel();
  rdma_cm_id* listener = nullptr;
  if (!ec || rdma_create_id(ec, &listener, nullptr, RDMA_PS_TCP) != 0) return 2;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (rdma_bind_addr(listener, reinterpret_cast<sockaddr*>(&addr)) != 0) return 3;
  if (rdma_listen(listener, 1) != 0) return 4;
  std::printf("listening\n");
  std::fflush(stdout);
  rdma_cm_event* event = nullptr;
  if (rdma_get_cm_event(ec, &event) != 0) return 5;
  if (event->event != RDMA_CM_EVENT_CONNECT_REQUEST) return 6;
  rdma_cm_id* id = event->id;
  rdma_ack_cm_event(event);
  if (rdma_reject(id, text, static_cast<uint8_t>(std::strlen(text) + 1)) != 0) return 7;
  std::printf("rejected\n");
  rdma_destroy_id(id);
  rdma_destroy_id(listener);
  rdma_destroy_event_channel(ec);
  return 0;
}

int client(const char* server, int port) {
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
  rdma_conn_param param{};
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  if (rdma_connect(id, &param) != 0) return 7;
  if (rdma_get_cm_event(ec, &event) != 0) return 8;
  std::string data;
  if (event->param.conn.private_data && event->param.conn.private_data_len)
    data.assign(static_cast<const char*>(event->param.conn.private_data),
                strnlen(static_cast<const char*>(event->param.conn.private_data),
                        event->param.conn.private_data_len));
  std::printf("event %s status %d private_data '%s'\n", rdma_event_str(event->event),
              event->status, data.c_str());
  rdma_ack_cm_event(event);
  rdma_destroy_qp(id);
  ibv_destroy_cq(cq);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ec);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "reject-server") == 0)
    return reject_server(std::atoi(argv[2]), argv[3]);
  if (argc == 4 && std::strcmp(argv[1], "client") == 0) return client(argv[2], std::atoi(argv[3]));
  std::fprintf(stderr, "usage: rdmacm_peer reject-server PORT TEXT | client ADDR PORT\n");
  return 1;
}
