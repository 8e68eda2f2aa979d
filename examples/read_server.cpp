// RDMA READ in the style of the seed's write_server.cpp: the server registers a buffer holding
// "Hello from RDMA server!" for remote read, hands {addr, rkey} to the client in rdma_accept's
// private data, and waits until the client — which reads the buffer with RDMA READ, a one-sided
// operation the server's CPU never sees — disconnects.
#include <iostream>
#include <cstring>
#include <cstdlib>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#define PORT 51218
#define BUFFER_SIZE 1024

struct mem_info {
  uint64_t addr;
  uint32_t rkey;
};

int main() {
  struct rdma_event_channel *ec = rdma_create_event_channel();
  struct rdma_cm_id *listener = NULL;
  if (!ec || rdma_create_id(ec, &listener, NULL, RDMA_PS_TCP)) {
    std::cerr << "Failed to create event channel / RDMA CM ID" << std::endl;
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
  if (buffer) strncpy(buffer, "Hello from RDMA server!", BUFFER_SIZE - 1);
  struct ibv_mr *mr =
      pd && buffer ? ibv_reg_mr(pd, buffer, BUFFER_SIZE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) : NULL;
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

  struct mem_info minfo;
  minfo.addr = (uint64_t)buffer;
  minfo.rkey = mr->rkey;
  struct rdma_conn_param conn_param;
  memset(&conn_param, 0, sizeof(conn_param));
  conn_param.responder_resources = 1;  // the client's READs need responder resources here
  conn_param.private_data = &minfo;
  conn_param.private_data_len = sizeof(minfo);
  std::cout << "Offering " << (void *)minfo.addr << ", rkey: " << minfo.rkey << std::endl;
  if (rdma_accept(conn_id, &conn_param)) {
    std::cerr << "Failed to accept connection" << std::endl;
    return -1;
  }
  if (rdma_get_cm_event(ec, &event) || event->event != RDMA_CM_EVENT_ESTABLISHED) {
    std::cerr << "Expected ESTABLISHED" << std::endl;
    return -1;
  }
  rdma_ack_cm_event(event);
  std::cout << "Connection established. Waiting for the client to read and disconnect..." << std::endl;

  if (rdma_get_cm_event(ec, &event) || event->event != RDMA_CM_EVENT_DISCONNECTED) {
    std::cerr << "Expected DISCONNECTED" << std::endl;
    return -1;
  }
  rdma_ack_cm_event(event);
  std::cout << "Client disconnected" << std::endl;

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
