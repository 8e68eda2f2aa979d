# Verbs cases against rxe: the Debian ibverbs-utils and perftest programs on both sides (ours
# under urdma on the host, Debian's on rxe0 in the guest), each case in both directions:
# urdma->rxe (urdma is the client) and rxe->urdma (rxe is the client, urdma the server).
# Function only (TCG is slow): small sizes and iteration counts; exit status 0 = pass.

# pair DIRECTION PORT SERVER_CMD CLIENT_CMD: starts the server side, waits for its TCP port, runs
# the client; both must exit 0. The commands get "$DEV", "$GID", "$PEER" filled per side.
pair() {
  local dir=$1 port=$2 server=$3 client=$4
  local gside="DEV=$GUEST_DEV GID=$GUEST_GID PEER=$HOST_IP"
  local hside="DEV=$HOST_DEV GID=$HOST_GID PEER=$GUEST_IP"
  if [ "$dir" = "urdma->rxe" ]; then
    guest_bg server "$gside; $server" && guest_wait_listen "tcp:$port" &&
      host "$hside; $client" && guest_wait server 60
  else
    host_bg server "$hside; $server" && host_wait_listen "tcp:$port" &&
      guest "$gside; $client" && host_wait server 60
  fi
}

pingpong() { # pingpong DIRECTION PROGRAM ARGS: ibv_*_pingpong, server and client
  local dir=$1 prog=$2; shift 2
  pair "$dir" 18515 "$prog -d \$DEV -g \$GID $*" "$prog -d \$DEV -g \$GID $* \$PEER"
}

for dir in "urdma->rxe" "rxe->urdma"; do
  for size in 1 1024 4096 65536; do
    eval "rc_pingpong_$size() { pingpong \"\$CASE_DIR\" ibv_rc_pingpong -s $size -n 20 -c; }"
    CASE_DIR=$dir case_run "rc_pingpong -s $size -c" "$dir" "rc_pingpong_$size"
  done
done
