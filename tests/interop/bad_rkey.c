// bad_rkey: an RDMA WRITE with a wrong rkey across two stacks must end in a remote access error.
//   server: bad_rkey -d DEV -g GID            (registers a buffer, exports its address and rkey)
//   client: bad_rkey -d DEV -g GID SERVER_IP  (writes to it with the rkey's key byte flipped)
// The client exits 0 when its completion is IBV_WC_REM_ACCESS_ERR (the responder's NAK: remote
// access error); the server exits 0 when its buffer is untouched after the client is done. The two
// exchange QPN, PSN, GID, address and rkey over TCP (port 18516), as ibv_rc_pingpong does.
// Built against Debian's libibverbs: on the host it runs under `urdma run`, in the guest on rxe0.
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

enum { kPort = 18516, kBufSize = 4096, kWriteLen = 64, kFill = 0x5a };

struct peer {
  uint32_t qpn, psn, rkey;
  uint64_t addr;
  union ibv_gid gid;
};

static void die(const char* what) {
  perror(what);
  exit(2);
}

static int tcp_pair(const char* server_ip) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(kPort)};
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

static void connect_qp(struct ibv_qp* qp, int gid_index, const struct peer* mine,
                       const struct peer* theirs) {
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
  a.timeout = 14;
  a.retry_cnt = 3;  // not 7: rxe retries forever with 7 (NOTES.md)
  a.rnr_retry = 3;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
    die("modify RTS");
}

// The client's one WRITE, rkey's low (key) byte flipped; returns its completion status.
static int write_with_bad_rkey(struct ibv_qp* qp, struct ibv_cq* cq, struct ibv_mr* mr,
                               const struct peer* theirs) {
  struct ibv_sge sge = {.addr = (uintptr_t)mr->addr, .length = kWriteLen, .lkey = mr->lkey};
  struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1,
                           .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
  wr.wr.rdma.remote_addr = theirs->addr;
  wr.wr.rdma.rkey = theirs->rkey ^ 0xff;
  struct ibv_send_wr* bad;
  if (ibv_post_send(qp, &wr, &bad)) die("post_send");
  struct ibv_wc wc;
  const time_t deadline = time(NULL) + 60;
  while (time(NULL) < deadline) {
    const int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) die("poll_cq");
    if (n == 1) return wc.status;
    usleep(1000);
  }
  fprintf(stderr, "no completion within 60 s\n");
  return -1;
}

int main(int argc, char** argv) {
  const char* dev_name = NULL;
  int gid_index = 0, opt;
  while ((opt = getopt(argc, argv, "d:g:")) != -1) {
    if (opt == 'd') dev_name = optarg;
    else if (opt == 'g') gid_index = atoi(optarg);
    else return 2;
  }
  const char* server_ip = optind < argc ? argv[optind] : NULL;
  struct ibv_device** list = ibv_get_device_list(NULL);
  struct ibv_device* dev = NULL;
  for (int i = 0; list && list[i]; ++i)
    if (!dev_name || !strcmp(ibv_get_device_name(list[i]), dev_name)) dev = list[i];
  if (!dev) { fprintf(stderr, "no device %s\n", dev_name ? dev_name : ""); return 2; }
  struct ibv_context* ctx = ibv_open_device(dev);
  if (!ctx) die("open_device");
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  struct ibv_cq* cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
  char* buf = aligned_alloc(4096, kBufSize);
  memset(buf, kFill, kBufSize);
  struct ibv_mr* mr = ibv_reg_mr(pd, buf, kBufSize, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                .cap = {.max_send_wr = 2, .max_recv_wr = 2,
                                        .max_send_sge = 1, .max_recv_sge = 1}};
  struct ibv_qp* qp = pd && cq && mr ? ibv_create_qp(pd, &qa) : NULL;
  if (!qp) die("setup");

  struct peer mine = {.qpn = qp->qp_num, .psn = (uint32_t)getpid() & 0xffffff,
                      .rkey = mr->rkey, .addr = (uintptr_t)buf}, theirs;
  if (ibv_query_gid(ctx, 1, gid_index, &mine.gid)) die("query_gid");
  const int sock = tcp_pair(server_ip);
  exchange(sock, &mine, &theirs);
  connect_qp(qp, gid_index, &mine, &theirs);
  char done = 'd';
  if (server_ip) {  // client
    const int status = write_with_bad_rkey(qp, cq, mr, &theirs);
    if (write(sock, &done, 1) != 1) die("write");
    printf("RDMA WRITE with rkey 0x%x (theirs 0x%x): %s (%d)\n", theirs.rkey ^ 0xff, theirs.rkey,
           status >= 0 ? ibv_wc_status_str(status) : "none", status);
    return status == IBV_WC_REM_ACCESS_ERR ? 0 : 1;
  }
  if (recv(sock, &done, 1, MSG_WAITALL) != 1) die("read");
  for (int i = 0; i < kBufSize; ++i)
    if (buf[i] != kFill) { printf("buffer changed at byte %d\n", i); return 1; }
  printf("buffer untouched\n");
  return 0;
}
