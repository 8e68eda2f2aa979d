// bad_rkey: an RDMA WRITE with a wrong rkey across two stacks must end in a remote access error.
//   server: bad_rkey -d DEV -g GID            (registers a buffer, exports its address and rkey)
//   client: bad_rkey -d DEV -g GID SERVER_IP  (writes to it with the rkey's key byte flipped)
// The client exits 0 when its completion is IBV_WC_REM_ACCESS_ERR (the responder's NAK: remote
// access error); the server exits 0 when its buffer is untouched after the client is done. The two
// exchange QPN, PSN, GID, address and rkey over TCP (port 18516), as ibv_rc_pingpong does, and
// the client writes only once both QPs are in RTS.
// Built against Debian's libibverbs: on the host it runs under `urdma run`, in the guest on rxe0.
#include "rc_pair.h"

enum { kPort = 18516, kBufSize = 4096, kWriteLen = 64, kFill = 0x5a };

// The client's one WRITE, rkey's low (key) byte flipped; returns its completion status.
static int write_with_bad_rkey(struct ibv_qp* qp, struct ibv_cq* cq, struct ibv_mr* mr,
                               const struct peer* theirs) {
  post_write(qp, mr, kWriteLen, theirs, theirs->rkey ^ 0xff, 1);
  struct ibv_wc wc;
  if (poll_one(cq, 60, &wc)) return wc.status;
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
  struct rc_end e;
  rc_open(&e, dev_name, gid_index, kBufSize, kFill, 2, 2);
  struct peer theirs;
  const int sock = tcp_pair(server_ip, kPort);
  exchange(sock, &e.mine, &theirs);
  connect_qp(e.qp, gid_index, &e.mine, &theirs,
             (struct rc_rts){.timeout = 14, .retry_cnt = 3, .rnr_retry = 3});
  rts_barrier(sock);  // the client's WRITE must not reach a server still in RTR
  char done = 'd';
  if (server_ip) {  // client
    const int status = write_with_bad_rkey(e.qp, e.cq, e.mr, &theirs);
    if (write(sock, &done, 1) != 1) die("write");
    printf("RDMA WRITE with rkey 0x%x (theirs 0x%x): %s (%d)\n", theirs.rkey ^ 0xff, theirs.rkey,
           status >= 0 ? ibv_wc_status_str(status) : "none", status);
    return status == IBV_WC_REM_ACCESS_ERR ? 0 : 1;
  }
  if (recv(sock, &done, 1, MSG_WAITALL) != 1) die("read");
  for (int i = 0; i < kBufSize; ++i)
    if (e.buf[i] != kFill) { printf("buffer changed at byte %d\n", i); return 1; }
  printf("buffer untouched\n");
  return 0;
}
