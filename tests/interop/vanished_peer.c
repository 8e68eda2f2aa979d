// vanished_peer: RC retry exhaustion across two stacks. The responder's process is killed
// (SIGKILL, by the suite) after one RDMA WRITE went through; the requester's next WRITE must then
// complete with IBV_WC_RETRY_EXC_ERR after retry_cnt retries (IBA 9.7.6.1.3: sent retry_cnt + 1
// times in all), the QP must be in the error state, and a WR posted after that must complete with
// IBV_WC_WR_FLUSH_ERR (ibv_poll_cq(3)).
//   responder: vanished_peer -d DEV -g GID                     (exports a buffer, waits to be killed)
//   requester: vanished_peer -d DEV -g GID -w CUE_FILE SERVER_IP (writes, waits, writes again)
// The two exchange QPN, PSN, GID, address and rkey over TCP (port 18517). After its first WRITE
// the requester prints "waiting for the responder to die" and waits for that TCP connection to end
// and then for CUE_FILE to exist: the suite creates it once the killed responder was reaped. The
// TCP end alone is too early: the kernel may close a dying process's socket before its uverbs
// file, and rxe ACKed WRITEs to the QP in between. Exit 0 when every completion is as above
// (the responder never exits by itself: 1 if the requester went first). The requester prints the
// second WRITE's destination QP and PSN, so the suite can count its transmissions on the wire
// (retry_cnt + 1). Timeout 14 (~67 ms) and retry_cnt 2 keep the exhaustion under a second.
// Built against Debian's libibverbs: on the host it runs under `urdma run`, in the guest on rxe0.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { kPort = 18517, kBufSize = 4096, kWriteLen = 64, kTimeout = 14, kRetryCnt = 2 };

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
  a.timeout = kTimeout;
  a.retry_cnt = kRetryCnt;  // not 7: rxe retries forever with 7 (NOTES.md)
  a.rnr_retry = 0;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
    die("modify RTS");
}

static void post_write(struct ibv_qp* qp, struct ibv_mr* mr, const struct peer* theirs,
                       uint64_t wr_id) {
  struct ibv_sge sge = {.addr = (uintptr_t)mr->addr, .length = kWriteLen, .lkey = mr->lkey};
  struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
                           .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
  wr.wr.rdma.remote_addr = theirs->addr;
  wr.wr.rdma.rkey = theirs->rkey;
  struct ibv_send_wr* bad;
  if (ibv_post_send(qp, &wr, &bad)) die("post_send");
}

// The next completion's status (-1: none within 30 s; its wr_id must be `wr_id`).
static int completion(struct ibv_cq* cq, uint64_t wr_id) {
  struct ibv_wc wc;
  const time_t deadline = time(NULL) + 30;
  while (time(NULL) < deadline) {
    const int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) die("poll_cq");
    if (n == 1) {
      if (wc.wr_id != wr_id) {
        printf("completion of wr_id %llu, expected %llu\n", (unsigned long long)wc.wr_id,
               (unsigned long long)wr_id);
        return -1;
      }
      return wc.status;
    }
    usleep(1000);
  }
  printf("no completion of wr_id %llu within 30 s\n", (unsigned long long)wr_id);
  return -1;
}

// Prints "NAME: STATUS (N)" and whether it is the expected one.
static int expect(const char* name, int status, int want) {
  printf("%s: %s (%d)\n", name, status >= 0 ? ibv_wc_status_str(status) : "none", status);
  return status == want;
}

static int requester(int sock, const char* cue_file, struct ibv_qp* qp, struct ibv_cq* cq,
                     struct ibv_mr* mr, const struct peer* mine, const struct peer* theirs) {
  post_write(qp, mr, theirs, 1);
  if (!expect("write 1 (peer alive)", completion(cq, 1), IBV_WC_SUCCESS)) return 1;
  printf("waiting for the responder to die\n");
  char c;
  if (recv(sock, &c, 1, 0) != 0) { printf("the responder wrote to its socket\n"); return 1; }
  struct stat st;
  const time_t deadline = time(NULL) + 60;
  while (stat(cue_file, &st) != 0) {
    if (time(NULL) >= deadline) { printf("no %s within 60 s\n", cue_file); return 1; }
    usleep(10000);
  }
  printf("write 2: dest_qp 0x%06x psn %u retry_cnt %d\n", theirs->qpn, (mine->psn + 1) & 0xffffff,
         kRetryCnt);
  post_write(qp, mr, theirs, 2);
  int ok = expect("write 2 (peer gone)", completion(cq, 2), IBV_WC_RETRY_EXC_ERR);
  struct ibv_qp_attr attr;
  struct ibv_qp_init_attr init;
  if (ibv_query_qp(qp, &attr, IBV_QP_STATE, &init)) die("query_qp");
  printf("qp state after: %d (IBV_QPS_ERR is %d)\n", attr.qp_state, IBV_QPS_ERR);
  ok &= attr.qp_state == IBV_QPS_ERR;
  post_write(qp, mr, theirs, 3);
  ok &= expect("write 3 (after the error)", completion(cq, 3), IBV_WC_WR_FLUSH_ERR);
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  const char *dev_name = NULL, *cue_file = NULL;
  int gid_index = 0, opt;
  while ((opt = getopt(argc, argv, "d:g:w:")) != -1) {
    if (opt == 'd') dev_name = optarg;
    else if (opt == 'g') gid_index = atoi(optarg);
    else if (opt == 'w') cue_file = optarg;
    else return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* server_ip = optind < argc ? argv[optind] : NULL;
  if (server_ip && !cue_file) { fprintf(stderr, "the requester needs -w CUE_FILE\n"); return 2; }
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
  memset(buf, 0, kBufSize);
  struct ibv_mr* mr = ibv_reg_mr(pd, buf, kBufSize, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                .cap = {.max_send_wr = 4, .max_recv_wr = 1,
                                        .max_send_sge = 1, .max_recv_sge = 1}};
  struct ibv_qp* qp = pd && cq && mr ? ibv_create_qp(pd, &qa) : NULL;
  if (!qp) die("setup");

  struct peer mine = {.qpn = qp->qp_num, .psn = (uint32_t)getpid() & 0xffffff,
                      .rkey = mr->rkey, .addr = (uintptr_t)buf}, theirs;
  if (ibv_query_gid(ctx, 1, gid_index, &mine.gid)) die("query_gid");
  const int sock = tcp_pair(server_ip);
  exchange(sock, &mine, &theirs);
  connect_qp(qp, gid_index, &mine, &theirs);
  if (server_ip) return requester(sock, cue_file, qp, cq, mr, &mine, &theirs);
  printf("responder qpn 0x%06x: waiting to be killed\n", mine.qpn);
  char c;
  recv(sock, &c, 1, 0);
  printf("the requester went first\n");
  return 1;
}
