# shellcheck shell=bash
# RC retry exhaustion against a vanished peer (vanished_peer.c): the responder's process is killed
# after one RDMA WRITE went through; the requester's next WRITE must complete with
# IBV_WC_RETRY_EXC_ERR, its QP must be in the error state and a later WR must flush
# (IBV_WC_WR_FLUSH_ERR). urdma->rxe: urdma is the requester and the rxe process dies (rxe drops a
# packet for a destroyed QP); rxe->urdma: rxe is the requester and the urdma process dies (urdmad
# drops a packet for a QPN no process holds). retry_cnt is 2, not 7 (rxe's 7 is infinite,
# NOTES.md); the capture must show the second WRITE sent retry_cnt + 1 = 3 times, no more.
# Uses cm.sh's cm_client_output, cm_kill_server and cm_wait_server.

build_vanished_peer() {
  mkdir -p "$BUILD/interop-bin" &&
    cc -O2 -Wall -o "$BUILD/interop-bin/vanished_peer" "$INTEROP_DIR/vanished_peer.c" -libverbs
}

# The responder is started as the "server" job, the requester as "client"; the suite kills the
# responder once the requester's first WRITE completed, waits until it is reaped (status 137),
# then gives the requester its cue (a file in the control share both sides see).
vanished_peer() {
  local prog='$BIN/vanished_peer -d $DEV -g $GID' cue=vanished-cue.$RANDOM log rc
  local gside="DEV=$GUEST_DEV GID=$GUEST_GID BIN=$GUEST_SHARE/interop-bin"
  local hside="DEV=$HOST_DEV GID=$HOST_GID BIN=$BUILD/interop-bin"
  if [ "$CASE_DIR" = "urdma->rxe" ]; then
    guest_bg server "$gside; $prog" && guest_wait_listen tcp:18517 &&
      host_bg client "$hside; $prog -w $CTL/$cue $GUEST_IP" || return 1
    log=$OUT/client.host.log
  else
    host_bg server "$hside; $prog" && host_wait_listen tcp:18517 &&
      guest_bg client "$gside; $prog -w /mnt/ctl/$cue $HOST_IP" || return 1
    log=$OUT/client.guest.log
  fi
  local deadline=$((SECONDS + 60))
  until cm_client_output "$CASE_DIR" | grep -q '^waiting for the responder to die$'; do
    [ $SECONDS -lt $deadline ] || { echo "the requester's first WRITE did not complete"; return 1; }
    sleep 0.1
  done
  cm_kill_server "$CASE_DIR" vanished_peer
  cm_wait_server "$CASE_DIR"; rc=$?
  [ $rc -eq 137 ] || { echo "the responder ended with $rc, not SIGKILL (137)"; return 1; }
  touch "$CTL/$cue"
  if [ "$CASE_DIR" = "urdma->rxe" ]; then host_wait client 60; else guest_wait client 60; fi
  rc=$?
  rm -f "$CTL/$cue"
  local want
  for want in '^write 1 \(peer alive\): .* \(0\)$' '^write 2 \(peer gone\): .* \(12\)$' \
    '^qp state after: 6 ' '^write 3 \(after the error\): .* \(5\)$'; do
    grep -Eq "$want" "$log" || { echo "no line '$want' from the requester"; cat "$log"; return 1; }
  done
  [ $rc -eq 0 ] || { echo "the requester exited $rc"; return 1; }
  # The second WRITE on the wire: sent once and retried retry_cnt times.
  local qpn psn retry_cnt sent
  read -r qpn psn retry_cnt <<< "$(grep -m1 '^write 2: dest_qp ' "$log" | awk '{ print $4, $6, $8 }')"
  sent=$(tshark -r "$OUT_ROOT/interop.pcap" -T fields -e frame.number \
    -Y "infiniband.bth.destqp == $qpn && infiniband.bth.psn == $psn" 2> /dev/null | wc -l)
  echo "write 2 (dest_qp $qpn, psn $psn) on the wire: $sent times (retry_cnt $retry_cnt)"
  [ "$sent" -eq $((retry_cnt + 1)) ]
}

case_run "vanished_peer.c: build" both build_vanished_peer
case_both "RC peer killed -> RETRY_EXC_ERR, then WR_FLUSH_ERR" vanished_peer
