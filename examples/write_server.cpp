// The seed's write_server.cpp: an RDMA CM server that registers a buffer for remote write, hands
// the client {addr, rkey} in rdma_accept's private data and prints what the client wrote.
//
// Kept as the seed wrote it — the same steps, messages and error handling — with its garbled
// syntax repaired. Two repairs go beyond syntax, each marked "seed:" below: the port is a number
// (the seed passed it through atoi), and the cleanup destroys the QP before the CQs it uses (a
// device refuses to destroy a CQ a QP still uses, EBUSY, which the seed's order ran into).
//
// Built against Debian's librdmacm/libibverbs like any RDMA program; `urdma run` runs it on urdma.
#include <iostream>
#include <cstring>
#include <cstdlib>
#include <unistd.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#define PORT 51216
#define BUFFER_SIZE 1024

// 定义数据结构用于交换内存信息 (the memory information the server hands the client)
struct mem_info {
  uint64_t addr;  // 内存地址 (address)
  uint32_t rkey;  // 远程键 (remote key)
};

struct connection {
  struct ibv_qp *qp;
  struct ibv_mr *mr;
  char *buffer;
  struct ibv_cq *send_cq;
  struct ibv_cq *recv_cq;
};

int main(int argc, char **argv) {
  struct rdma_event_channel *ec = NULL;
  struct rdma_cm_id *listener = NULL;
  struct rdma_cm_event *event = NULL;
  struct ibv_pd *pd = NULL;
  struct connection conn;
  int err;

  // 解析设备参数 (device argument; printed only — rdma_cm picks the device from the address)
  const char *dev_name = "mlx5_0";  // 默认设备
  if (argc > 2 && strcmp(argv[1], "-d") == 0) {
    dev_name = argv[2];
  }
  std::cout << "Server starting with device: " << dev_name << std::endl;

  // 1. 创建事件通道 (event channel)
  ec = rdma_create_event_channel();
  if (!ec) {
    std::cerr << "Failed to create event channel" << std::endl;
    return -1;
  }

  // 2. 创建RDMA CM ID
  err = rdma_create_id(ec, &listener, NULL, RDMA_PS_TCP);
  if (err) {
    std::cerr << "Failed to create RDMA CM ID" << std::endl;
    return -1;
  }

  // 3. 绑定到端口 (bind to the port)
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_port = htons(PORT);  // seed: htons(atoi(PORT)), PORT being a number
  addr.sin_addr.s_addr = INADDR_ANY;
  err = rdma_bind_addr(listener, (struct sockaddr *)&addr);
  if (err) {
    std::cerr << "Failed to bind address" << std::endl;
    return -1;
  }

  // 4. 监听连接 (listen)
  err = rdma_listen(listener, 1);
  if (err) {
    std::cerr << "Failed to listen" << std::endl;
    return -1;
  }
  std::cout << "Server listening on port " << PORT << std::endl;

  // 5. 等待连接请求事件 (wait for the connect request)
  err = rdma_get_cm_event(ec, &event);
  if (err) {
    std::cerr << "Failed to get CM event" << std::endl;
    return -1;
  }
  if (event->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
    std::cerr << "Expected CONNECT_REQUEST, got " << event->event << std::endl;
    rdma_ack_cm_event(event);
    return -1;
  }

  // 6. 接受连接 (the new connection's id)
  struct rdma_cm_id *conn_id = event->id;
  rdma_ack_cm_event(event);

  // 7. 获取保护域 (protection domain)
  pd = ibv_alloc_pd(conn_id->verbs);
  if (!pd) {
    std::cerr << "Failed to allocate protection domain" << std::endl;
    return -1;
  }

  // 8. 分配并注册内存 (allocate and register the buffer the client writes into)
  conn.buffer = (char *)malloc(BUFFER_SIZE);
  if (!conn.buffer) {
    std::cerr << "Failed to allocate buffer" << std::endl;
    ibv_dealloc_pd(pd);
    return -1;
  }
  memset(conn.buffer, 0, BUFFER_SIZE);
  conn.mr = ibv_reg_mr(pd, conn.buffer, BUFFER_SIZE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!conn.mr) {
    std::cerr << "Failed to register memory region" << std::endl;
    free(conn.buffer);
    ibv_dealloc_pd(pd);
    return -1;
  }
  std::cout << "Registered memory at address: " << (void *)conn.buffer << ", rkey: " << conn.mr->rkey
            << std::endl;

  // 9. 创建队列对 (queue pair)
  struct ibv_qp_init_attr qp_attr;
  memset(&qp_attr, 0, sizeof(qp_attr));
  qp_attr.cap.max_send_wr = 1;
  qp_attr.cap.max_recv_wr = 1;
  qp_attr.cap.max_send_sge = 1;
  qp_attr.cap.max_recv_sge = 1;
  qp_attr.qp_type = IBV_QPT_RC;
  conn.send_cq = ibv_create_cq(conn_id->verbs, 10, NULL, NULL, 0);
  conn.recv_cq = ibv_create_cq(conn_id->verbs, 10, NULL, NULL, 0);
  qp_attr.send_cq = conn.send_cq;
  qp_attr.recv_cq = conn.recv_cq;
  if (!conn.send_cq || !conn.recv_cq) {
    std::cerr << "Failed to create completion queue" << std::endl;
    ibv_dereg_mr(conn.mr);
    free(conn.buffer);
    ibv_dealloc_pd(pd);
    return -1;
  }
  err = rdma_create_qp(conn_id, pd, &qp_attr);
  if (err) {
    std::cerr << "Failed to create QP" << std::endl;
    ibv_destroy_cq(conn.send_cq);
    ibv_destroy_cq(conn.recv_cq);
    ibv_dereg_mr(conn.mr);
    free(conn.buffer);
    ibv_dealloc_pd(pd);
    return -1;
  }
  conn.qp = conn_id->qp;

  // 10. 发送连接信息给客户端 (accept, handing the client the buffer's address and rkey)
  struct rdma_conn_param conn_param;
  memset(&conn_param, 0, sizeof(conn_param));
  conn_param.responder_resources = 1;
  conn_param.initiator_depth = 1;
  conn_param.rnr_retry_count = 7;

  // 创建内存信息结构体
  struct mem_info minfo;
  minfo.addr = (uint64_t)conn.buffer;
  minfo.rkey = conn.mr->rkey;

  // 发送服务器MR的地址和rkey给客户端
  conn_param.private_data = &minfo;
  conn_param.private_data_len = sizeof(minfo);
  std::cout << "Sending memory info to client - addr: " << (void *)minfo.addr << ", rkey: " << minfo.rkey
            << std::endl;
  err = rdma_accept(conn_id, &conn_param);
  if (err) {
    std::cerr << "Failed to accept connection" << std::endl;
    return -1;
  }
  std::cout << "Connection established. Waiting for data..." << std::endl;

  // 11. 等待连接建立完成 (wait for ESTABLISHED)
  err = rdma_get_cm_event(ec, &event);
  if (err) {
    std::cerr << "Failed to get CM event" << std::endl;
    return -1;
  }
  if (event->event != RDMA_CM_EVENT_ESTABLISHED) {
    std::cerr << "Expected ESTABLISHED, got " << event->event << std::endl;
    rdma_ack_cm_event(event);
    return -1;
  }
  // 可以在这里读取客户端发送的信息 (the client's private data, if the event carries any)
  if (event->param.conn.private_data && event->param.conn.private_data_len >= sizeof(uint32_t)) {
    uint32_t client_rkey;
    memcpy(&client_rkey, event->param.conn.private_data, sizeof(uint32_t));
    std::cout << "Got client rkey: " << client_rkey << std::endl;
  }
  rdma_ack_cm_event(event);

  // 12. 等待数据写入 (wait up to 10 s for the client's RDMA WRITE)
  std::cout << "Waiting for RDMA write..." << std::endl;
  for (int i = 0; i < 10; i++) {
    if (strlen(conn.buffer) > 0) {
      break;
    }
    sleep(1);
  }
  if (strlen(conn.buffer) > 0) {
    std::cout << "Received data: " << conn.buffer << std::endl;
  } else {
    std::cout << "No data received or data was empty" << std::endl;
  }

  // 清理 (clean up)
  std::cout << "Disconnecting..." << std::endl;
  rdma_disconnect(conn_id);
  rdma_destroy_qp(conn_id);  // seed: destroyed after the CQs, which EBUSY refuses
  ibv_destroy_cq(conn.send_cq);
  ibv_destroy_cq(conn.recv_cq);
  ibv_dereg_mr(conn.mr);
  free(conn.buffer);
  ibv_dealloc_pd(pd);
  rdma_destroy_id(conn_id);
  rdma_destroy_id(listener);
  rdma_destroy_event_channel(ec);
  return 0;
}
