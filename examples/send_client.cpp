// SEND/RECV in the style of the seed's write_client.cpp: connects to send_server and SENDs
// "Hello from RDMA client!" into the receive buffer the server posted.
#include <iostream>
#include <cstring>
#include <cstdlib>
#include <string>
#include <netdb.h>
#include <rdma/rdma_cma.h>

#define PORT 51217
#define BUFFER_SIZE 1024

// Waits for the next CM event and checks its type.
static bool expect_event(struct rdma_event_channel *ec, enum rdma_cm_event_type type) {
  struct rdma_cm_event *event = NULL;
  if (rdma_get_cm_event(ec, &event)) {
    std::cerr << "Failed to get CM event" << std::endl;
    return false;
  }
  const bool ok = event->event == type;
  if (!ok) std::cerr << "Expected " << rdma_event_str(type) << ", got " << rdma_event_str(event->event) << std::endl;
  rdma_ack_cm_event(event);
  return ok;
}

int main(int argc, char **argv) {
  const char *server_addr = argc > 1 ? argv[1] : "127.0.0.1";
  std::cout << "Connecting to server: " << server_addr << std::endl;

  struct rdma_event_channel *ec = rdma_create_event_channel();
  struct rdma_cm_id *cm_id = NULL;
  if (!ec || rdma_create_id(ec, &cm_id, NULL, RDMA_PS_TCP)) {
    std::cerr << "Failed to create event channel / RDMA CM ID" << std::endl;
    return -1;
  }
  struct addrinfo hints, *res;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  int err = getaddrinfo(server_addr, std::to_string(PORT).c_str(), &hints, &res);
  if (err) {
    std::cerr << "Failed to resolve address: " << gai_strerror(err) << std::endl;
    return -1;
  }
  err = rdma_resolve_addr(cm_id, NULL, res->ai_addr, 2000);
  freeaddrinfo(res);
  if (err || !expect_event(ec, RDMA_CM_EVENT_ADDR_RESOLVED)) return -1;
  if (rdma_resolve_route(cm_id, 2000) || !expect_event(ec, RDMA_CM_EVENT_ROUTE_RESOLVED)) return -1;

  struct ibv_pd *pd = ibv_alloc_pd(cm_id->verbs);
  char *buffer = (char *)calloc(1, BUFFER_SIZE);
  const char *message = "Hello from RDMA client!";
  if (buffer) strncpy(buffer, message, BUFFER_SIZE - 1);
  struct ibv_mr *mr = pd && buffer ? ibv_reg_mr(pd, buffer, BUFFER_SIZE, IBV_ACCESS_LOCAL_WRITE) : NULL;
  struct ibv_cq *cq = ibv_create_cq(cm_id->verbs, 10, NULL, NULL, 0);
  if (!mr || !cq) {
    std::cerr << "Failed to set up PD/MR/CQ" << std::endl;
    return -1;
  }
  struct ibv_qp_init_attr qp_attr;
  memset(&qp_attr, 0, sizeof(qp_attr));
  qp_attr.cap.max_send_wr = 1;
  qp_attr.cap.max_recv_wr = 1;
  qp_attr.cap.max_send_sge = 1;
  qp_attr.cap.max_recv_sge = 1;
  qp_attr.qp_type = IBV_QPT_RC;
  qp_attr.send_cq = cq;
  qp_attr.recv_cq = cq;
  if (rdma_create_qp(cm_id, pd, &qp_attr)) {
    std::cerr << "Failed to create QP" << std::endl;
    return -1;
  }
  struct rdma_conn_param conn_param;
  memset(&conn_param, 0, sizeof(conn_param));
  conn_param.retry_count = 7;
  conn_param.rnr_retry_count = 7;
  if (rdma_connect(cm_id, &conn_param) || !expect_event(ec, RDMA_CM_EVENT_ESTABLISHED)) return -1;
  std::cout << "Connection established. Sending data..." << std::endl;

  struct ibv_sge sge;
  sge.addr = (uint64_t)buffer;
  sge.length = strlen(message) + 1;
  sge.lkey = mr->lkey;
  struct ibv_send_wr wr, *bad_wr = NULL;
  memset(&wr, 0, sizeof(wr));
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (ibv_post_send(cm_id->qp, &wr, &bad_wr)) {
    std::cerr << "Failed to post send: " << strerror(errno) << std::endl;
    return -1;
  }
  struct ibv_wc wc;
  int n;
  while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {
  }
  if (n < 0 || wc.status != IBV_WC_SUCCESS) {
    std::cerr << "SEND failed: " << (n < 0 ? "poll error" : ibv_wc_status_str(wc.status)) << std::endl;
    return -1;
  }
  std::cout << "SEND completed successfully! Sent message: " << message << std::endl;

  rdma_disconnect(cm_id);
  rdma_destroy_qp(cm_id);
  ibv_destroy_cq(cq);
  ibv_dereg_mr(mr);
  free(buffer);
  ibv_dealloc_pd(pd);
  rdma_destroy_id(cm_id);
  rdma_destroy_event_channel(ec);
  return 0;
}
