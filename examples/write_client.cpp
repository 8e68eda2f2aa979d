// The seed's write_client.cpp: connects to write_server with RDMA CM, takes the server's buffer
// {addr, rkey} from the ESTABLISHED event's private data and RDMA-writes "Hello from RDMA client!"
// into it.
//
// Kept as the seed wrote it — the same steps, messages and error handling — with its garbled
// syntax repaired. Repairs beyond syntax are marked "seed:": the port is passed to getaddrinfo as
// a string, and the cleanup destroys the QP before its CQs (EBUSY otherwise).
#include <iostream>
#include <cstring>
#include <cstdlib>
#include <string>
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
  uint32_t remote_rkey;
  uint64_t remote_addr;
  struct ibv_cq *send_cq;
  struct ibv_cq *recv_cq;
};

int main(int argc, char **argv) {
  struct rdma_event_channel *ec = NULL;
  struct rdma_cm_id *cm_id = NULL;
  struct rdma_cm_event *event = NULL;
  struct ibv_pd *pd = NULL;
  struct connection conn;
  int err;

  // 解析参数 (arguments: [-d device] [server address])
  const char *dev_name = "mlx5_0";          // 默认设备 (printed only)
  const char *server_addr = "127.0.0.1";  // 默认地址
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-d") == 0 && i + 1 < argc) {
      dev_name = argv[++i];
    } else if (i == argc - 1) {
      server_addr = argv[i];
    }
  }
  std::cout << "Connecting to server: " << server_addr << " using device: " << dev_name << std::endl;

  // 1. 创建事件通道 (event channel)
  ec = rdma_create_event_channel();
  if (!ec) {
    std::cerr << "Failed to create event channel" << std::endl;
    return -1;
  }

  // 2. 创建RDMA CM ID
  err = rdma_create_id(ec, &cm_id, NULL, RDMA_PS_TCP);
  if (err) {
    std::cerr << "Failed to create RDMA CM ID" << std::endl;
    return -1;
  }

  // 3. 解析服务器地址 (resolve the server's address)
  struct addrinfo *res;
  struct addrinfo hints;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  err = getaddrinfo(server_addr, std::to_string(PORT).c_str(), &hints, &res);  // seed: PORT as text
  if (err) {
    std::cerr << "Failed to resolve address: " << gai_strerror(err) << std::endl;
    return -1;
  }

  // 4. 连接到服务器 (resolve the RDMA address)
  err = rdma_resolve_addr(cm_id, NULL, res->ai_addr, 2000);
  if (err) {
    std::cerr << "Failed to resolve address" << std::endl;
    freeaddrinfo(res);
    return -1;
  }
  freeaddrinfo(res);

  // 5. 等待地址解析完成 (wait for ADDR_RESOLVED)
  err = rdma_get_cm_event(ec, &event);
  if (err) {
    std::cerr << "Failed to get CM event" << std::endl;
    return -1;
  }
  if (event->event != RDMA_CM_EVENT_ADDR_RESOLVED) {
    std::cerr << "Expected ADDR_RESOLVED, got " << event->event << std::endl;
    rdma_ack_cm_event(event);
    return -1;
  }
  rdma_ack_cm_event(event);

  // 6. 解析路由 (resolve the route)
  err = rdma_resolve_route(cm_id, 2000);
  if (err) {
    std::cerr << "Failed to resolve route" << std::endl;
    return -1;
  }

  // 7. 等待路由解析完成 (wait for ROUTE_RESOLVED)
  err = rdma_get_cm_event(ec, &event);
  if (err) {
    std::cerr << "Failed to get CM event" << std::endl;
    return -1;
  }
  if (event->event != RDMA_CM_EVENT_ROUTE_RESOLVED) {
    std::cerr << "Expected ROUTE_RESOLVED, got " << event->event << std::endl;
    rdma_ack_cm_event(event);
    return -1;
  }
  rdma_ack_cm_event(event);

  // 8. 获取保护域 (protection domain)
  pd = ibv_alloc_pd(cm_id->verbs);
  if (!pd) {
    std::cerr << "Failed to allocate protection domain" << std::endl;
    return -1;
  }

  // 9. 分配并注册内存 (the buffer holding the message)
  conn.buffer = (char *)malloc(BUFFER_SIZE);
  if (!conn.buffer) {
    std::cerr << "Failed to allocate buffer" << std::endl;
    ibv_dealloc_pd(pd);
    return -1;
  }
  // 准备要发送的数据
  const char *message = "Hello from RDMA client!";
  strncpy(conn.buffer, message, BUFFER_SIZE - 1);
  conn.buffer[BUFFER_SIZE - 1] = '\0';
  conn.mr = ibv_reg_mr(pd, conn.buffer, BUFFER_SIZE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!conn.mr) {
    std::cerr << "Failed to register memory region" << std::endl;
    free(conn.buffer);
    ibv_dealloc_pd(pd);
    return -1;
  }
  std::cout << "Registered memory at address: " << (void *)conn.buffer << ", rkey: " << conn.mr->rkey
            << std::endl;

  // 10. 创建队列对 (queue pair)
  struct ibv_qp_init_attr qp_attr;
  memset(&qp_attr, 0, sizeof(qp_attr));
  qp_attr.cap.max_send_wr = 1;
  qp_attr.cap.max_recv_wr = 1;
  qp_attr.cap.max_send_sge = 1;
  qp_attr.cap.max_recv_sge = 1;
  qp_attr.qp_type = IBV_QPT_RC;
  conn.send_cq = ibv_create_cq(cm_id->verbs, 10, NULL, NULL, 0);
  conn.recv_cq = ibv_create_cq(cm_id->verbs, 10, NULL, NULL, 0);
  qp_attr.send_cq = conn.send_cq;
  qp_attr.recv_cq = conn.recv_cq;
  if (!conn.send_cq || !conn.recv_cq) {
    std::cerr << "Failed to create completion queue" << std::endl;
    ibv_dereg_mr(conn.mr);
    free(conn.buffer);
    ibv_dealloc_pd(pd);
    return -1;
  }
  err = rdma_create_qp(cm_id, pd, &qp_attr);
  if (err) {
    std::cerr << "Failed to create QP" << std::endl;
    ibv_destroy_cq(conn.send_cq);
    ibv_destroy_cq(conn.recv_cq);
    ibv_dereg_mr(conn.mr);
    free(conn.buffer);
    ibv_dealloc_pd(pd);
    return -1;
  }
  conn.qp = cm_id->qp;

  // 11. 连接服务器 (connect, sending the local rkey as private data)
  struct rdma_conn_param conn_param;
  memset(&conn_param, 0, sizeof(conn_param));
  conn_param.initiator_depth = 1;
  conn_param.responder_resources = 1;
  conn_param.retry_count = 7;
  // 发送本地rkey给服务器
  conn_param.private_data = &conn.mr->rkey;
  conn_param.private_data_len = sizeof(conn.mr->rkey);
  err = rdma_connect(cm_id, &conn_param);
  if (err) {
    std::cerr << "Failed to connect" << std::endl;
    return -1;
  }

  // 12. 等待连接建立完成 (wait for ESTABLISHED; it carries the server's memory info)
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
  // 从服务器接收远程内存信息
  if (event->param.conn.private_data && event->param.conn.private_data_len >= sizeof(struct mem_info)) {
    struct mem_info minfo;
    memcpy(&minfo, event->param.conn.private_data, sizeof(minfo));
    conn.remote_addr = minfo.addr;
    conn.remote_rkey = minfo.rkey;
    std::cout << "Got remote memory info - addr: " << (void *)conn.remote_addr << ", rkey: " << conn.remote_rkey
              << std::endl;
  } else {
    std::cerr << "No valid private data received from server" << std::endl;
    if (event->param.conn.private_data) {
      std::cerr << "Data length: " << (int)event->param.conn.private_data_len << std::endl;
    }
    rdma_ack_cm_event(event);
    return -1;
  }
  rdma_ack_cm_event(event);
  std::cout << "Connection established. Sending data..." << std::endl;

  // 13. 执行RDMA Write操作 (the RDMA WRITE of the message, terminating NUL included)
  struct ibv_sge sge;
  sge.addr = (uint64_t)conn.buffer;
  sge.length = strlen(message) + 1;
  sge.lkey = conn.mr->lkey;

  struct ibv_send_wr wr;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = 0;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  // 设置远程内存信息（现在有正确的地址了）
  wr.wr.rdma.remote_addr = conn.remote_addr;
  wr.wr.rdma.rkey = conn.remote_rkey;

  std::cout << "Posting RDMA write to remote addr: " << (void *)conn.remote_addr
            << " with rkey: " << conn.remote_rkey << std::endl;
  struct ibv_send_wr *bad_wr = NULL;
  err = ibv_post_send(conn.qp, &wr, &bad_wr);
  if (err) {
    std::cerr << "Failed to post send: " << strerror(errno) << std::endl;
    return -1;
  }

  // 14. 等待发送完成 (poll for the completion, up to ~100 ms)
  struct ibv_wc wc;
  int num_completed;
  int retry_count = 0;
  const int max_retries = 100;
  std::cout << "Waiting for completion..." << std::endl;
  do {
    num_completed = ibv_poll_cq(conn.send_cq, 1, &wc);
    if (num_completed < 0) {
      std::cerr << "Error polling CQ" << std::endl;
      break;
    }
    retry_count++;
    if (retry_count > max_retries) {
      std::cerr << "Timeout waiting for completion" << std::endl;
      break;
    }
    usleep(1000);  // 睡眠1ms
  } while (num_completed == 0);

  if (num_completed > 0) {
    if (wc.status == IBV_WC_SUCCESS) {
      std::cout << "RDMA Write completed successfully!" << std::endl;
      std::cout << "Sent message: " << message << std::endl;
    } else {
      std::cerr << "RDMA Write failed with status: " << ibv_wc_status_str(wc.status) << " (" << wc.status << ")"
                << std::endl;
    }
  }
  sleep(1);  // 确保服务器收到数据 (give the server time to see the data)

  // 清理 (clean up)
  std::cout << "Disconnecting..." << std::endl;
  rdma_disconnect(cm_id);
  rdma_destroy_qp(cm_id);  // seed: destroyed after the CQs, which EBUSY refuses
  ibv_destroy_cq(conn.send_cq);
  ibv_destroy_cq(conn.recv_cq);
  ibv_dereg_mr(conn.mr);
  free(conn.buffer);
  ibv_dealloc_pd(pd);
  rdma_destroy_id(cm_id);
  rdma_destroy_event_channel(ec);
  return 0;
}
