// RDMA READ in the style of the seed's write_client.cpp: connects to read_server, takes
// {addr, rkey} from the ESTABLISHED event's private data, RDMA-READs the server's buffer and
// prints what it read.
#include <iostream>
#include <cstring>
#include <cstdlib>
#include <string>
#include <netdb.h>
#include <rdma/rdma_cma.h>

#define PORT 51218
#define BUFFER_SIZE 1024

struct mem_info {
  uint64_t addr;
  uint32_t rkey;
};

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
  struct rdma_cm_event *event = NULL;
  if (err || rdma_get_cm_event(ec, &event) || event->event != RDMA_CM_EVENT_ADDR_RESOLVED) {
    std::cerr << "Failed to resolve address" << std::endl;
    return -1;
  }
  rdma_ack_cm_event(event);
  if (rdma_resolve_route(cm_id, 2000) || rdma_get_cm_event(ec, &event) ||
      event->event != RDMA_CM_EVENT_ROUTE_RESOLVED) {
    std::cerr << "Failed to resolve route" << std::endl;
    return -1;
  }
  rdma_ack_cm_event(event);

  struct ibv_pd *pd = ibv_alloc_pd(cm_id->verbs);
  char *buffer = (char *)calloc(1, BUFFER_SIZE);
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
  conn_param.initiator_depth = 1;  // one READ outstanding
  conn_param.retry_count = 7;
  if (rdma_connect(cm_id, &conn_param) || rdma_get_cm_event(ec, &event) ||
      event->event != RDMA_CM_EVENT_ESTABLISHED) {
    std::cerr << "Failed to connect" << std::endl;
    return -1;
  }
  struct mem_info minfo;
  if (!event->param.conn.private_data || event->param.conn.private_data_len < sizeof(minfo)) {
    std::cerr << "No valid private data received from server" << std::endl;
    rdma_ack_cm_event(event);
    return -1;
  }
  memcpy(&minfo, event->param.conn.private_data, sizeof(minfo));
  rdma_ack_cm_event(event);
  std::cout << "Reading from remote addr: " << (void *)minfo.addr << " with rkey: " << minfo.rkey << std::endl;

  struct ibv_sge sge;
  sge.addr = (uint64_t)buffer;
  sge.length = BUFFER_SIZE;
  sge.lkey = mr->lkey;
  struct ibv_send_wr wr, *bad_wr = NULL;
  memset(&wr, 0, sizeof(wr));
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = minfo.addr;
  wr.wr.rdma.rkey = minfo.rkey;
  if (ibv_post_send(cm_id->qp, &wr, &bad_wr)) {
    std::cerr << "Failed to post RDMA READ: " << strerror(errno) << std::endl;
    return -1;
  }
  struct ibv_wc wc;
  int n;
  while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {
  }
  if (n < 0 || wc.status != IBV_WC_SUCCESS) {
    std::cerr << "RDMA READ failed: " << (n < 0 ? "poll error" : ibv_wc_status_str(wc.status)) << std::endl;
    return -1;
  }
  buffer[BUFFER_SIZE - 1] = '\0';
  std::cout << "RDMA Read completed successfully! Read: " << buffer << std::endl;

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
