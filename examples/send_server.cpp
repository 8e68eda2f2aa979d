// SEND/RECV in the style of the seed's write_server.cpp: the server posts a receive before it
// accepts, and prints the message the client's SEND delivered into it (a two-sided operation:
// the receiver chooses where the data goes, no address or rkey is exchanged).
#include <iostream>
#include <cstring>
#include <cstdlib>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#define PORT 51217
#define BUFFER_SIZE 1024

int main() {
  struct rdma_event_channel *ec = rdma_create_event_channel();
  if (!ec) {
    std::cerr << "Failed to create event channel" << std::endl;
    return -1;
  }
  struct rdma_cm_id *listener = NULL;
  if (rdma_create_id(ec, &listener, NULL, RDMA_PS_TCP)) {
    std::cerr << "Failed to create RDMA CM ID" << std::endl;
    return -1;
  }
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_port = htons(PORT);
  addr.sin_addr.s_addr = INADDR_ANY;
  if (rdma_bind_addr(listener, (struct sockaddr *)&addr) || rdma_listen(listener, 1)) {
    std::cerr << "Failed to bind/listen" << std::endl;
    return -1;
  }
  std::cout << "Server listening on port " << PORT << std::endl;

  struct rdma_cm_event *event = NULL;
  if (rdma_get_cm_event(ec, &event) || event->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
    std::cerr << "Expected CONNECT_REQUEST" << std::endl;
    return -1;
  }
  struct rdma_cm_id *conn_id = event->id;
  rdma_ack_cm_event(event);

  struct ibv_pd *pd = ibv_alloc_pd(conn_id->verbs);
  char *buffer = (char *)calloc(1, BUFFER_SIZE);
  struct ibv_mr *mr = pd && buffer ? ibv_reg_mr(pd, buffer, BUFFER_SIZE, IBV_ACCESS_LOCAL_WRITE) : NULL;
  struct ibv_cq *cq = ibv_create_cq(conn_id->verbs, 10, NULL, NULL, 0);
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
  if (rdma_create_qp(conn_id, pd, &qp_attr)) {
    std::cerr << "Failed to create QP" << std::endl;
    return -1;
  }

  // The receive must be posted before the client's SEND can arrive: before the accept.
  struct ibv_sge sge;
  sge.addr = (uint64_t)buffer;
  sge.length = BUFFER_SIZE;
  sge.lkey = mr->lkey;
  struct ibv_recv_wr rwr;
  memset(&rwr, 0, sizeof(rwr));
  rwr.wr_id = 1;
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  struct ibv_recv_wr *bad_rwr = NULL;
  if (ibv_post_recv(conn_id->qp, &rwr, &bad_rwr)) {
    std::cerr << "Failed to post receive" << std::endl;
    return -1;
  }

  struct rdma_conn_param conn_param;
  memset(&conn_param, 0, sizeof(conn_param));
  conn_param.rnr_retry_count = 7;
  if (rdma_accept(conn_id, &conn_param)) {
    std::cerr << "Failed to accept connection" << std::endl;
    return -1;
  }
  if (rdma_get_cm_event(ec, &event) || event->event != RDMA_CM_EVENT_ESTABLISHED) {
    std::cerr << "Expected ESTABLISHED" << std::endl;
    return -1;
  }
  rdma_ack_cm_event(event);
  std::cout << "Connection established. Waiting for a SEND..." << std::endl;

  struct ibv_wc wc;
  int n;
  while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {
  }
  if (n < 0 || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) {
    std::cerr << "Receive failed: " << (n < 0 ? "poll error" : ibv_wc_status_str(wc.status)) << std::endl;
    return -1;
  }
  std::cout << "Received " << wc.byte_len << " bytes: " << buffer << std::endl;

  rdma_disconnect(conn_id);
  rdma_destroy_qp(conn_id);
  ibv_destroy_cq(cq);
  ibv_dereg_mr(mr);
  free(buffer);
  ibv_dealloc_pd(pd);
  rdma_destroy_id(conn_id);
  rdma_destroy_id(listener);
  rdma_destroy_event_channel(ec);
  return 0;
}
