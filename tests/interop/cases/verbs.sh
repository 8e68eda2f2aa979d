# shellcheck shell=bash
# Verbs cases against rxe: the Debian ibverbs-utils and perftest programs on both sides (ours
# under urdma on the host, Debian's on rxe0 in the guest), each case in both directions:
# urdma->rxe (urdma is the client) and rxe->urdma (rxe is the client, urdma the server).
# Function only (TCG is slow): small sizes and iteration counts; exit status 0 = pass. The
# helpers (pair, pingpong, perftest, case_both) are in lib.sh: cases/loss.sh uses them too.

for size in 1 1024 4096 65536; do
  case_both "ibv_rc_pingpong -s $size -c" pingpong ibv_rc_pingpong -s "$size" -n 20 -c
done
case_both "ibv_uc_pingpong -s 4096 -c" pingpong ibv_uc_pingpong -s 4096 -n 20 -c
case_both "ibv_ud_pingpong -s 512 -c" pingpong ibv_ud_pingpong -s 512 -n 20 -c
case_both "ibv_srq_pingpong -q 4 -s 4096 -c" pingpong ibv_srq_pingpong -q 4 -s 4096 -n 20 -c
case_both "ib_write_bw" perftest ib_write_bw -s 65536 -n 50
case_both "ib_read_bw" perftest ib_read_bw -s 65536 -n 50
case_both "ib_send_bw" perftest ib_send_bw -s 65536 -n 50
case_both "ib_atomic_bw" perftest ib_atomic_bw -n 50
case_both "ib_write_lat" perftest ib_write_lat -s 64 -n 50
case_both "ib_read_lat" perftest ib_read_lat -s 64 -n 50

# bad_rkey.c, built here against Debian's libibverbs into the shared build dir: the host runs it
# under urdma, the guest on rxe0.
bad_rkey() { pair "$1" 18516 "\$BIN/bad_rkey -d \$DEV -g \$GID" "\$BIN/bad_rkey -d \$DEV -g \$GID \$PEER"; }
build_bad_rkey() {
  mkdir -p "$BUILD/interop-bin" &&
    cc -O2 -Wall -o "$BUILD/interop-bin/bad_rkey" "$INTEROP_DIR/bad_rkey.c" -libverbs
}
case_run "bad_rkey.c: build" both build_bad_rkey
case_both "RDMA WRITE, bad rkey -> remote access error" bad_rkey
