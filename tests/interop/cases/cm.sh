# RDMA CM cases against rxe: Debian's rdmacm-utils and perftest -R, and the project's examples,
# on both sides (ours under urdma on the host: our librdmacm and CM; Debian's librdmacm and the
# kernel's rdma_cm in the guest), each in both directions: urdma->rxe (urdma is the client) and
# rxe->urdma (rxe is the client). A case passes on what the programs print (rping's -V check, the
# tools' "return status 0", the server's "Received data: ..." line, the REJECTED event and its
# status), never on timing. NOTES-cm.md says what the two stacks do differently.

# Filled per side: ADDR (this side's IP), PEER (the other side's), DEV, BIN (where the project's
# binaries are on this side: the guest sees the build folder at $GUEST_SHARE).
cm_side() {
  if [ "$1" = guest ]; then
    echo "ADDR=$GUEST_IP PEER=$HOST_IP DEV=$GUEST_DEV BIN=$GUEST_SHARE"
  else
    echo "ADDR=$HOST_IP PEER=$GUEST_IP DEV=$HOST_DEV BIN=$BUILD"
  fi
}

# cm_server_side DIRECTION / cm_client_side DIRECTION: guest or host.
cm_server_side() { [ "$1" = "urdma->rxe" ] && echo guest || echo host; }
cm_client_side() { [ "$1" = "urdma->rxe" ] && echo host || echo guest; }

# cm_start_server DIRECTION CMD: the server (job "server"), started and listening.
cm_start_server() {
  local side
  side=$(cm_server_side "$1")
  if [ "$side" = guest ]; then
    guest_bg server "$(cm_side guest); $2" && guest_wait_listen cm
  else
    host_bg server "$(cm_side host); $2" && host_wait_listen cm
  fi
}

# cm_client DIRECTION CMD: runs the client (job "client") to its end; its status.
cm_client() {
  if [ "$(cm_client_side "$1")" = guest ]; then
    guest_bg client "$(cm_side guest); $2"
    guest_wait client
  else
    host_bg client "$(cm_side host); $2"
    host_wait client
  fi
}

cm_wait_server() {
  if [ "$(cm_server_side "$1")" = guest ]; then guest_wait server 60; else host_wait server 60; fi
}

# cm_log DIRECTION server|client: the job's output file.
cm_log() {
  local side
  if [ "$2" = server ]; then side=$(cm_server_side "$1"); else side=$(cm_client_side "$1"); fi
  echo "$OUT/$2.$side.log"
}

# cm_expect FILE PATTERN [COUNT]: FILE holds at least COUNT (default 1) lines matching PATTERN
# (grep -E); says which when not.
cm_expect() {
  local n
  n=$(grep -Ec -- "$2" "$1" 2>/dev/null)
  [ "${n:-0}" -ge "${3:-1}" ] && return 0
  echo "expected ${3:-1} line(s) matching '$2' in $1, found ${n:-0}"
  return 1
}

# cm_pair DIRECTION SERVER_CMD CLIENT_CMD: both exit 0.
cm_pair() {
  cm_start_server "$1" "$2" || return 1
  cm_client "$1" "$3" || { echo "client failed: $?"; return 1; }
  cm_wait_server "$1" || { echo "server failed: $?"; return 1; }
}

# --------------------------------------------------------------------------- the cases

# rping -V: every ping's data checked by both sides; 5 verified pings seen by each.
cm_rping() {
  cm_pair "$CASE_DIR" 'rping -s -v -V -C 5 -a $ADDR' 'rping -c -v -V -C 5 -a $PEER' &&
    cm_expect "$(cm_log "$CASE_DIR" client)" '^ping data: rdma-ping-[0-4]: ' 5 &&
    cm_expect "$(cm_log "$CASE_DIR" server)" 'server ping data: rdma-ping-[0-4]: ' 5
}

cm_ucmatose() {
  cm_pair "$CASE_DIR" 'ucmatose -c 3 -C 5' 'ucmatose -c 3 -C 5 -s $PEER' &&
    cm_expect "$(cm_log "$CASE_DIR" client)" '^return status 0$' &&
    cm_expect "$(cm_log "$CASE_DIR" server)" '^return status 0$'
}

# UD: the client resolves the server's QPN and Q_Key with SIDR_REQ/SIDR_REP on QP1.
cm_udaddy() {
  cm_pair "$CASE_DIR" 'udaddy -c 2 -C 5' 'udaddy -c 2 -C 5 -s $PEER' &&
    cm_expect "$(cm_log "$CASE_DIR" client)" '^return status 0$' &&
    cm_expect "$(cm_log "$CASE_DIR" server)" '^return status 0$'
}

# The synchronous API (rdma_getaddrinfo, rdma_create_ep, rdma_get_request, NULL channel).
cm_rdma_server_client() {
  cm_pair "$CASE_DIR" 'rdma_server' 'rdma_client -s $PEER' &&
    cm_expect "$(cm_log "$CASE_DIR" client)" '^rdma_client: end 0$' &&
    cm_expect "$(cm_log "$CASE_DIR" server)" '^rdma_server: end 0$'
}

# perftest through rdma_cm: its out-of-band exchange and the measured QP both connect with it.
cm_write_bw_R_once() {
  cm_pair "$CASE_DIR" 'ib_write_bw -R -d $DEV -n 200 -s 4096' \
    'ib_write_bw -R -d $DEV -n 200 -s 4096 $PEER' &&
    cm_expect "$(cm_log "$CASE_DIR" client)" '^ *4096 +200 '
}

# A known perftest 4.5-0.17 race (NOTES-cm.md): its second REQ can arrive before the server
# listens again; an rxe server answers REJ 8 (which is right), and perftest's retry then crashes
# (abort under urdma, SIGSEGV under Debian's librdmacm). A urdma server holds such a REQ until it
# listens (urdmad's and the CM's wait for a listener), so the retry below is for urdma->rxe. It loses about half the runs
# against the TCG-slowed guest, so that one failure is run again, up to 6 attempts in all, each
# said on stdout. Any other failure fails the case at once; if every attempt ends in that race,
# the case reports KNOWN_THIRD_PARTY (lib.sh): shown as such in the table, not counted as a pass.
# perftest's report also needs its cycle counter calibrated against the clock (a fit with
# r^2 >= 0.9); in the TCG guest on a loaded host that fit can fail after a transfer that worked
# ("Can't produce a report"): that run is repeated too, and said so.
cm_write_bw_R() {
  local attempt client_log server_log
  for attempt in 1 2 3 4 5 6; do
    cm_write_bw_R_once && return 0
    client_log=$(cm_log "$CASE_DIR" client)
    server_log=$(cm_log "$CASE_DIR" server)
    if grep -qs "Can't produce a report" "$client_log" "$server_log"; then
      echo "attempt $attempt: perftest could not calibrate its cycle counter (r^2 < 0.9)"
    else
      grep -q 'Event: RDMA_CM_EVENT_REJECTED; error: 8\.' "$client_log" || return 1
      echo "attempt $attempt: perftest's listen race (REJ 8 before the server listened again)"
    fi
    cm_kill_server "$CASE_DIR" ib_write_bw
    cm_wait_server "$CASE_DIR"
    mv "$client_log" "$client_log.try$attempt"
  done
  return "$KNOWN_THIRD_PARTY"
}

# The seed's example: the server's MR address and rkey travel in the REP's private data, the
# client RDMA-WRITEs its message there. The guest runs the project's binaries (Debian's
# libibverbs and librdmacm, rxe0).
cm_write_example() {
  cm_pair "$CASE_DIR" '$BIN/examples/write_server -d $DEV' \
    '$BIN/examples/write_client -d $DEV $PEER' &&
    cm_expect "$(cm_log "$CASE_DIR" server)" '^Received data: Hello from RDMA client!$'
}

# Nobody listens on the port: the client's REQ is answered with REJ reason 8 (IBA 12.6.7,
# "invalid service ID"; Linux cm_match_req), which rdma_cm reports as REJECTED, status 8.
cm_reject_no_listener() {
  cm_client "$CASE_DIR" 'rping -c -v -C 1 -a $PEER -p 9999'
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then echo "rping exited $rc, expected a failure"; return 1; fi
  cm_expect "$(cm_log "$CASE_DIR" client)" '^cma event RDMA_CM_EVENT_REJECTED, error 8$'
}

# The server rejects with private data: the client's REJECTED carries it and status 28
# (consumer defined). urdma_rdmacm_peer is built against Debian's librdmacm.
cm_reject_private_data() {
  cm_pair "$CASE_DIR" '$BIN/tests/process/urdma_rdmacm_peer reject-server 7555 go-away' \
    '$BIN/tests/process/urdma_rdmacm_peer client $PEER 7555' &&
    cm_expect "$(cm_log "$CASE_DIR" client)" \
      "^event RDMA_CM_EVENT_REJECTED status 28 private_data 'go-away'$"
}

# cm_kill_server DIRECTION PROGRAM: SIGKILL to the server's PROGRAM alone (the guest's kernel,
# or urdmad for a urdma process, then tears its connections down with a DREQ).
cm_kill_server() {
  if [ "$(cm_server_side "$1")" = guest ]; then
    guest "pkill -KILL -x $2" > /dev/null
  else
    local p
    for p in $(ip netns pids "$NS"); do
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ] && kill -KILL "$p"
    done
  fi
}

# cm_client_output DIRECTION: the running client's output so far.
cm_client_output() {
  if [ "$(cm_client_side "$1")" = guest ]; then
    cat "$CTL/queue/${GUEST_JOBS[client]}.out" 2>/dev/null
  else
    cat "$OUT/client.host.log" 2>/dev/null
  fi
}

# The server vanishes mid-run (SIGKILL): the client sees DISCONNECTED. (The client's output is
# line-buffered so that its progress shows while it runs.)
cm_peer_vanishes() {
  cm_start_server "$CASE_DIR" 'rping -s -a $ADDR -C 1000000' || return 1
  local client='stdbuf -oL rping -c -v -a $PEER -C 1000000'
  if [ "$(cm_client_side "$CASE_DIR")" = guest ]; then
    guest_bg client "$(cm_side guest); $client"
  else
    host_bg client "$(cm_side host); $client"
  fi
  local deadline=$((SECONDS + 60))
  until cm_client_output "$CASE_DIR" | grep -q 'rdma-ping-5:'; do
    [ $SECONDS -lt $deadline ] || { echo "the client never got to ping 20"; return 1; }
    sleep 0.2
  done
  cm_kill_server "$CASE_DIR" rping
  if [ "$(cm_client_side "$CASE_DIR")" = guest ]; then guest_wait client 90; else host_wait client 90; fi
  local rc=$?
  # Linux's rping (rxe->urdma: the client is the guest's) can hang in its own teardown after it
  # printed the DISCONNECT: CI at 2a99230 saw "client DISCONNECT EVENT...", "wait for
  # RDMA_WRITE_COMPLETE state 10", TIMEWAIT_EXIT, then no exit for 90 s (its main thread joins a
  # CQ thread that no completion wakes). It did notice; a urdma client must still exit.
  if [ $rc -eq 124 ] && [ "$CASE_DIR" = "rxe->urdma" ] &&
     grep -q 'client DISCONNECT EVENT\.\.\.' "$(cm_log "$CASE_DIR" client)"; then
    echo "rxe's rping noticed (DISCONNECT) but did not exit: its own teardown"
    return 0
  fi
  [ $rc -ne 124 ] || { echo "the client did not notice"; return 1; }
  cm_expect "$(cm_log "$CASE_DIR" client)" 'client DISCONNECT EVENT\.\.\.'
}

for CASE_DIR in "urdma->rxe" "rxe->urdma"; do
  case_run "rping -V" "$CASE_DIR" cm_rping
  case_run "ucmatose" "$CASE_DIR" cm_ucmatose
  case_run "udaddy (SIDR)" "$CASE_DIR" cm_udaddy
  case_run "rdma_server/rdma_client" "$CASE_DIR" cm_rdma_server_client
  case_run "ib_write_bw -R" "$CASE_DIR" cm_write_bw_R
  case_run "write_server/write_client" "$CASE_DIR" cm_write_example
  case_run "REJ: no listener" "$CASE_DIR" cm_reject_no_listener
  case_run "REJ: private data" "$CASE_DIR" cm_reject_private_data
  case_run "peer vanishes" "$CASE_DIR" cm_peer_vanishes
done
