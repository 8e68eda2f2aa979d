// vanished_peer: RC retry exhaustion across two stacks. The responder's process is killed
// (SIGKILL, by the suite) after one RDMA WRITE went through; the requester's next WRITE must then
// complete with IBV_WC_RETRY_EXC_ERR after retry_cnt retries (IBA 9.7.6.1.3: sent retry_cnt + 1
// times in all), the QP must be in the error state, and a WR posted after that must complete with
// IBV_WC_WR_FLUSH_ERR (ibv_poll_cq(3)).
//   responder: vanished_peer -d DEV -g GID                     (exports a buffer, waits to be killed)
//   requester: vanished_peer -d DEV -g GID -w CUE_FILE SERVER_IP (writes, waits, writes again)
// The two exchange QPN, PSN, GID, address and rkey over TCP (port 18517) and wait for each other's
// RTS (rc_pair.h's rts_barrier). After its first WRITE the requester prints "waiting for the
// responder to die" and waits for that TCP connection to end and then for CUE_FILE to exist: the
// suite creates it once the killed responder was reaped. The TCP end alone is too early: the kernel
// may close a dying process's socket before its uverbs file, and rxe ACKed WRITEs to the QP in
// between. Exit 0 when every completion is as above (the responder never exits by itself: 1 if the
// requester went first). The requester prints the second WRITE's destination QP and PSN, so the
// suite can count its transmissions on the wire (retry_cnt + 1). Timeout 14 (~67 ms) and retry_cnt
// 2 keep the exhaustion under a second.
// Built against Debian's libibverbs: on the host it runs under `urdma run`, in the guest on rxe0.
#include <sys/stat.h>

#include "rc_pair.h"

enum { kPort = 18517, kBufSize = 4096, kWriteLen = 64, kTimeout = 14, kRetryCnt = 2 };

// The next completion's status (-1: none within 30 s; its wr_id must be `wr_id`).
static int completion(struct ibv_cq* cq, uint64_t wr_id) {
  struct ibv_wc wc;
  if (!poll_one(cq, 30, &wc)) {
    printf("no completion of wr_id %llu within 30 s\n", (unsigned long long)wr_id);
    return -1;
  }
  if (wc.wr_id != wr_id) {
    printf("completion of wr_id %llu, expected %llu\n", (unsigned long long)wc.wr_id,
           (unsigned long long)wr_id);
    return -1;
  }
  return wc.status;
}

// Prints "NAME: STATUS (N)" and whether it is the expected one.
static int expect(const char* name, int status, int want) {
  printf("%s: %s (%d)\n", name, status >= 0 ? ibv_wc_status_str(status) : "none", status);
  return status == want;
}

static int requester(int sock, const char* cue_file, struct ibv_qp* qp, struct ibv_cq* cq,
                     struct ibv_mr* mr, const struct peer* mine, const struct peer* theirs) {
  post_write(qp, mr, kWriteLen, theirs, theirs->rkey, 1);
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
  post_write(qp, mr, kWriteLen, theirs, theirs->rkey, 2);
  int ok = expect("write 2 (peer gone)", completion(cq, 2), IBV_WC_RETRY_EXC_ERR);
  struct ibv_qp_attr attr;
  struct ibv_qp_init_attr init;
  if (ibv_query_qp(qp, &attr, IBV_QP_STATE, &init)) die("query_qp");
  printf("qp state after: %d (IBV_QPS_ERR is %d)\n", attr.qp_state, IBV_QPS_ERR);
  ok &= attr.qp_state == IBV_QPS_ERR;
  post_write(qp, mr, kWriteLen, theirs, theirs->rkey, 3);
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
  struct rc_end e;
  rc_open(&e, dev_name, gid_index, kBufSize, 0, 4, 1);
  struct peer theirs;
  const int sock = tcp_pair(server_ip, kPort);
  exchange(sock, &e.mine, &theirs);
  connect_qp(e.qp, gid_index, &e.mine, &theirs,
             (struct rc_rts){.timeout = kTimeout, .retry_cnt = kRetryCnt, .rnr_retry = 0});
  rts_barrier(sock);
  if (server_ip) return requester(sock, cue_file, e.qp, e.cq, e.mr, &e.mine, &theirs);
  printf("responder qpn 0x%06x: waiting to be killed\n", e.mine.qpn);
  char c;
  recv(sock, &c, 1, 0);
  printf("the requester went first\n");
  return 1;
}
