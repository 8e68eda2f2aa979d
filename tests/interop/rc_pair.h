// What the interop suite's small RC programs (bad_rkey.c, vanished_peer.c) share: one RC QP on
// a named device with one registered buffer, its parameters swapped with the peer's over TCP
// (as ibv_rc_pingpong does), the QP brought to RTS, and a signaled RDMA WRITE posted and its
// completion waited for. Header-only C: each program is one `cc file.c -libverbs`.
#pragma once
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

// What each side sends the other.
struct peer {
  uint32_t qpn, psn, rkey;
  uint64_t addr;
  union ibv_gid gid;
};

// One side: the device's objects and the buffer registered for local and remote write.
struct rc_end {
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  struct ibv_mr* mr;
  struct ibv_qp* qp;
  char* buf;
  struct peer mine;
};

// The RTS attributes that differ between the programs.
struct rc_rts {
  uint8_t timeout, retry_cnt, rnr_retry;
};

static void die(const char* what) {
  perror(what);
  exit(2);
}

// Opens `dev_name` (any device if NULL), registers `buf_size` bytes filled with `fill` and
// creates an RC QP with `max_send_wr` send and `max_recv_wr` receive WRs; exits 2 on failure.
static void rc_open(struct rc_end* e, const char* dev_name, int gid_index, int buf_size,
                    uint8_t fill, uint32_t max_send_wr, uint32_t max_recv_wr) {
  struct ibv_device** list = ibv_get_device_list(NULL);
  struct ibv_device* dev = NULL;
  for (int i = 0; list && list[i]; ++i)
    if (!dev_name || !strcmp(ibv_get_device_name(list[i]), dev_name)) dev = list[i];
  if (!dev) {
    fprintf(stderr, "no device %s\n", dev_name ? dev_name : "");
    exit(2);
  }
  e->ctx = ibv_open_device(dev);
  if (!e->ctx) die("open_device");
  e->pd = ibv_alloc_pd(e->ctx);
  e->cq = ibv_create_cq(e->ctx, 4, NULL, NULL, 0);
  e->buf = aligned_alloc(4096, (size_t)buf_size);
  if (!e->buf) die("aligned_alloc");
  memset(e->buf, fill, (size_t)buf_size);
  e->mr = e->pd ? ibv_reg_mr(e->pd, e->buf, (size_t)buf_size,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
                : NULL;
  struct ibv_qp_init_attr qa = {.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
                                .cap = {.max_send_wr = max_send_wr, .max_recv_wr = max_recv_wr,
                                        .max_send_sge = 1, .max_recv_sge = 1}};
  e->qp = e->pd && e->cq && e->mr ? ibv_create_qp(e->pd, &qa) : NULL;
  if (!e->qp) die("setup");
  e->mine = (struct peer){.qpn = e->qp->qp_num, .psn = (uint32_t)getpid() & 0xffffff,
                          .rkey = e->mr->rkey, .addr = (uintptr_t)e->buf};
  if (ibv_query_gid(e->ctx, 1, gid_index, &e->mine.gid)) die("query_gid");
}

// The client connects to server_ip:port; the server (server_ip NULL) accepts one connection.
static int tcp_pair(const char* server_ip, uint16_t port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) die("socket");
  if (server_ip) {
    inet_pton(AF_INET, server_ip, &a.sin_addr);
    if (connect(s, (struct sockaddr*)&a, sizeof a)) die("connect");
    return s;
  }
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(s, (struct sockaddr*)&a, sizeof a) || listen(s, 1)) die("bind/listen");
  int c = accept(s, NULL, NULL);
  if (c < 0) die("accept");
  close(s);
  return c;
}

static void exchange(int sock, const struct peer* mine, struct peer* theirs) {
  if (write(sock, mine, sizeof *mine) != (ssize_t)sizeof *mine) die("write");
  if (recv(sock, theirs, sizeof *theirs, MSG_WAITALL) != (ssize_t)sizeof *theirs) die("read");
}

// RESET -> INIT -> RTR -> RTS towards `theirs` (path MTU 1024, the GID at `gid_index`).
static void connect_qp(struct ibv_qp* qp, int gid_index, const struct peer* mine,
                       const struct peer* theirs, struct rc_rts rts) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                          .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    die("modify INIT");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = theirs->qpn;
  a.rq_psn = theirs->psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = theirs->gid;
  a.ah_attr.grh.sgid_index = gid_index;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    die("modify RTR");
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = mine->psn;
  a.timeout = rts.timeout;
  a.retry_cnt = rts.retry_cnt;  // never 7 with rxe: it retries forever then (NOTES.md)
  a.rnr_retry = rts.rnr_retry;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
    die("modify RTS");
}

// Waits until the peer's QP is in RTS as this one is: each side writes one byte and reads the
// other's. Without it the first request can reach a peer still in INIT, which drops it (a retry
// a timeout later, and a slow guest can exhaust them), or in RTR, which answers it: rxe moves an
// RC responder's QP to the error state on a bad rkey, and its own move to RTS then fails (EINVAL).
static void rts_barrier(int sock) {
  char c = 'r';
  if (write(sock, &c, 1) != 1) die("write");
  if (recv(sock, &c, 1, MSG_WAITALL) != 1) die("read");
}

// Posts one signaled RDMA WRITE of the first `len` bytes of `mr` to the peer's buffer, with
// `rkey` (the peer's, or a wrong one on purpose).
static void post_write(struct ibv_qp* qp, struct ibv_mr* mr, uint32_t len,
                       const struct peer* theirs, uint32_t rkey, uint64_t wr_id) {
  struct ibv_sge sge = {.addr = (uintptr_t)mr->addr, .length = len, .lkey = mr->lkey};
  struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
                           .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
  wr.wr.rdma.remote_addr = theirs->addr;
  wr.wr.rdma.rkey = rkey;
  struct ibv_send_wr* bad;
  if (ibv_post_send(qp, &wr, &bad)) die("post_send");
}

// Polls `cq` for one completion for at most `seconds`: 1 with it in *wc, 0 if none came.
static int poll_one(struct ibv_cq* cq, int seconds, struct ibv_wc* wc) {
  const time_t deadline = time(NULL) + seconds;
  while (time(NULL) < deadline) {
    const int n = ibv_poll_cq(cq, 1, wc);
    if (n < 0) die("poll_cq");
    if (n == 1) return 1;
    usleep(1000);
  }
  return 0;
}
