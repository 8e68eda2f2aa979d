# shellcheck shell=bash
# Loss on the link: RC traffic that checks its own data, both directions, while 2% of the
# packets each way are dropped on the tap between the bridge and the guest. RC retransmission
# must hide it: each tool exits 0 with the bytes and iterations asked for, and its data checks
# pass (pingpong -c, rping -V). The loss must be real and must have cost retransmissions:
#   - the drop rules' own counters are non-zero in both directions;
#   - every stack that sends requests in the case retransmitted: rxe's completer_retry_err
#     (`rdma statistic`, before and after the case) and urdma's (`urdma status --json`, sampled
#     while the programs run; a process that left stays as a "departed" row with its last
#     report) are above 0 — or, for urdma, when no report with them was seen, rxe's responder saw a request PSN again or
#     a gap (duplicate_request, out_of_seq_request) in a transfer that completed.
# (rping: both directions' drops and both stacks' retransmissions together, see under_loss.)
# The drops are nftables rules on tap0 in the namespace (netdev family: egress towards the guest,
# ingress from it), a random 2% each way, silent to both stacks. Not netem: the host's kernel may
# lack sch_netem (this one does), and netem in the guest on an ifb for its ingress held rxe's
# received packets back for ~0.6 s at a time under TCG (rxe sent nothing in reply meanwhile,
# urdma's RC timer ran out: RETRY_EXC_ERR), which is no longer a link's loss. So no reordering
# either. The rules are removed after each case, whatever its result. rxe's sequence-error
# counters grow under loss by design, so each case leaves its counter deltas in
# rxe-counters-delta.txt, which the final counter check of wire_checks.sh subtracts.
# One packet kind is spared, in ibv_rc_pingpong's cases only: the ACK of the last message
# (opcode 0x11 with AETH MSN equal to the iterations; every message is one SEND, so MSN N is the
# N-th). ibv_rc_pingpong has no closing handshake: a side exits once its own last SEND is
# acknowledged and the peer's last SEND has arrived, so the ACK it sent for that SEND, when
# lost, reaches a peer whose retransmissions nobody answers any more (CI at ac23028: urdma's
# ACK of rxe's 60th SEND dropped after urdma exited; rxe, for which retry_cnt 7 means forever,
# resent it until the deadline). That is the tool's race, the same on any RDMA device; every
# other ACK and NAK is still lost at 2%.

LOSS_PER_MILLE=20

# loss_on [MSN]: the drop rules; with MSN, RC ACKs (opcode 0x11) whose AETH MSN is MSN pass
# (UDP payload byte 0 is the BTH opcode, bytes 13-15 the AETH MSN).
loss_on() {
  local spare=""
  [ -n "${1:-}" ] && spare="udp dport 4791 @th,64,8 0x11 @th,168,24 $1 counter accept;"
  in_ns nft -f - << NFT
table netdev interop_loss {
  chain to_rxe { type filter hook egress device "tap0" priority 0; $spare numgen random mod 1000 < $LOSS_PER_MILLE counter drop; }
  chain to_urdma { type filter hook ingress device "tap0" priority 0; $spare numgen random mod 1000 < $LOSS_PER_MILLE counter drop; }
}
NFT
}

loss_off() { in_ns nft delete table netdev interop_loss; }

# loss_drops: "to_urdma N" and "to_rxe N", the packets the rules dropped each way (and
# "spared_to_urdma N", "spared_to_rxe N": last-message ACKs let through, when spared).
loss_drops() {
  in_ns nft list table netdev interop_loss |
    awk '/chain / { c = $2 } /counter packets/ {
      for (i = 1; i < NF; i++) if ($i == "packets") print (/ accept/ ? "spared_" c : c), $(i + 1) }'
}

# rxe_counters: rxe0's port counters, "NAME VALUE" a line.
rxe_counters() {
  guest 'rdma statistic show link rxe0/1' |
    awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^[a-z_]+$/ && $(i + 1) ~ /^[0-9]+$/) print $i, $(i + 1) }'
}

# urdma_sampler_start / _stop: `urdma status --json` every 0.2 s into $OUT/urdma-status.json.
urdma_sampler_start() {
  # Processes already listed (earlier cases' departed rows) are not this case's.
  in_ns "$URDMA" status --json > "$OUT/urdma-status-before.json" 2> /dev/null
  (while :; do in_ns "$URDMA" status --json 2> /dev/null && echo; sleep 0.2; done) \
    > "$OUT/urdma-status.json" &
  URDMA_SAMPLER=$!
}
urdma_sampler_stop() {
  kill "$URDMA_SAMPLER" 2> /dev/null
  wait "$URDMA_SAMPLER" 2> /dev/null
  # The last reports, made as the programs closed their devices (kept as departed rows).
  in_ns "$URDMA" status --json > "$OUT/urdma-status-last.json" 2> /dev/null
}

# urdma_counters: per counter, the sum over urdma's processes of the largest value each reported.
urdma_counters() {
  python3 - "$OUT/urdma-status-before.json" "$OUT/urdma-status.json" \
    "$OUT/urdma-status-last.json" << 'PY'
import json, sys
try: earlier = {c["pid"] for c in json.load(open(sys.argv[1])).get("clients", [])}
except (OSError, ValueError): earlier = set()
dec, best = json.JSONDecoder(), {}
for path in sys.argv[2:]:
    try: text, pos = open(path).read(), 0
    except OSError: continue
    while True:
        while pos < len(text) and text[pos].isspace(): pos += 1
        if pos >= len(text): break
        try: doc, pos = dec.raw_decode(text, pos)
        except ValueError: break  # the last sample, cut off by the sampler's stop
        for c in doc.get("clients", []):
            if c["pid"] in earlier: continue
            for name, v in (c.get("counters") or {}).items():
                if isinstance(v, int): best[(c["pid"], name)] = max(best.get((c["pid"], name), 0), v)
total = {}
for (pid, name), v in best.items(): total[name] = total.get(name, 0) + v
for name in sorted(total): print(name, total[name])
PY
}

# value FILE NAME: NAME's number in a "NAME VALUE" file (0 when absent).
value() { awk -v n="$2" '$1 == n { v = $2 } END { print v + 0 }' "$1"; }

# under_loss REQUESTERS CMD...: CMD (a case body) with the loss on; then the checks above.
# REQUESTERS: the stacks that send requests in CMD and so must have retransmitted — "urdma rxe",
# "urdma" or "rxe"; "either urdma rxe": one of them at least, and the drops counted both ways
# together (rping: its retransmissions are slow, ~0.5 s, and 60 pings see ~4 drops a way, too
# few to be sure of one each way).
# LOSS_SPARE_MSN (environment): the last message's ACKs pass (see above); each way must then
# have carried at least one, or the rule spared nothing and protects nothing.
under_loss() {
  local requesters=$1 rc failed=0 stack n; shift
  rxe_counters > "$OUT/rxe-counters-before.txt" || return 1
  loss_on "${LOSS_SPARE_MSN:-}" || { loss_off; return 1; }
  urdma_sampler_start
  "$@"; rc=$?
  urdma_sampler_stop
  loss_drops > "$OUT/loss-drops.txt"
  loss_off || { echo "the drop rules could not be removed"; failed=1; }
  rxe_counters > "$OUT/rxe-counters-after.txt"
  join <(sort "$OUT/rxe-counters-before.txt") <(sort "$OUT/rxe-counters-after.txt") |
    awk '{ print $1, $3 - $2 }' > "$OUT/rxe-counters-delta.txt"
  urdma_counters > "$OUT/urdma-counters.txt"
  echo "dropped: $(tr '\n' ' ' < "$OUT/loss-drops.txt")"
  echo "rxe (delta): $(grep -E 'retry|seq|duplicate' "$OUT/rxe-counters-delta.txt" | tr '\n' ' ')"
  echo "urdma: $(grep -E 'retry|seq|duplicate' "$OUT/urdma-counters.txt" | tr '\n' ' ')"
  [ $rc -eq 0 ] || { echo "the programs failed under loss (status $rc)"; return 1; }
  local either=0 sum=0
  [ "${requesters%% *}" = either ] && { either=1; requesters=${requesters#either }; }
  for stack in to_urdma to_rxe; do
    n=$(value "$OUT/loss-drops.txt" $stack)
    sum=$((sum + n))
    [ $either = 1 ] || [ "$n" -gt 0 ] ||
      { echo "nothing dropped $stack: the loss was not real"; failed=1; }
  done
  [ $sum -gt 0 ] || { echo "nothing dropped: the loss was not real"; failed=1; }
  if [ -n "${LOSS_SPARE_MSN:-}" ]; then
    for stack in to_urdma to_rxe; do
      [ "$(value "$OUT/loss-drops.txt" spared_$stack)" -gt 0 ] ||
        { echo "no ACK with MSN $LOSS_SPARE_MSN went $stack: the spare rule matched nothing"; failed=1; }
    done
  fi
  sum=0
  for stack in $requesters; do
    if [ "$stack" = rxe ]; then
      n=$(value "$OUT/rxe-counters-delta.txt" completer_retry_err)
    else
      n=$(value "$OUT/urdma-counters.txt" completer_retry_err)
      # urdma's counters reach urdmad at most once a second and at close; a build from before
      # the close report, or a process that died, may leave none (CI once: ib_write_bw and
      # ib_read_bw in ~1 s).
      # Then rxe's responder tells: a request PSN it had already seen (duplicate_request), or a
      # gap it saw (out_of_seq_request) in a transfer that still completed, came from urdma
      # resending — nothing else sends urdma's requests, and the link does not duplicate.
      [ "$n" -gt 0 ] || n=$(($(value "$OUT/rxe-counters-delta.txt" duplicate_request) +
                             $(value "$OUT/rxe-counters-delta.txt" out_of_seq_request)))
    fi
    sum=$((sum + n))
    [ $either = 1 ] || [ "$n" -gt 0 ] ||
      { echo "$stack never retransmitted (completer_retry_err 0; urdma: nor did rxe see a resent or missing request)"; failed=1; }
  done
  [ $sum -gt 0 ] || { echo "no retransmission at all"; failed=1; }
  return $failed
}

# client_log / server_log: the job's output file in this case's direction (pair's job names).
client_log() { [ "$CASE_DIR" = "urdma->rxe" ] && echo "$OUT/client.host.log" || echo "$OUT/client.guest.log"; }
server_log() { [ "$CASE_DIR" = "urdma->rxe" ] && echo "$OUT/server.guest.log" || echo "$OUT/server.host.log"; }
client_stack() { [ "$CASE_DIR" = "urdma->rxe" ] && echo urdma || echo rxe; }

# expect_number FILE TEXT N: the number just before TEXT in FILE is N ("81920 bytes in").
expect_number() {
  local got
  got=$(grep -m1 -oE "[0-9]+$2" "$1" | grep -oE '^[0-9]+')
  [ "$got" = "$3" ] && return 0
  echo "$1: expected '$3$2', found '${got:-nothing}$2'"
  return 1
}

# urdma's side of the pair: the host job's log.
urdma_log() { [ "$CASE_DIR" = "urdma->rxe" ] && echo "$OUT/client.host.log" || echo "$OUT/server.host.log"; }

# ibv_rc_pingpong -c under loss: both sides send, both check every byte.
# One failure is run again, said on stdout: urdma's side ending in RETRY_EXC_ERR. The tool's
# whole retry budget is 0.54 s (timeout 14, retry_cnt 7, which urdma counts as the spec says and
# rxe as "forever"), and the TCG guest's network can stall for longer even with qemu at nice
# -10 (lib.sh, qemu_priority): CI of 2b0137f, rxe->urdma 64 KiB, once in its two loss
# pingpongs per direction, after 15 + 8 local runs of the case without it. Any other failure,
# or a second one, fails the case.
loss_rc_pingpong() {
  local size=$1 iters=$2 log attempt
  for attempt in 1 2; do
    pingpong "$CASE_DIR" ibv_rc_pingpong -s "$size" -n "$iters" -c && break
    [ "$attempt" = 1 ] && grep -q 'transport retry counter exceeded' "$(urdma_log)" || return 1
    echo "attempt 1: urdma's side ran out of the tool's 0.54 s retry budget; running the pair again"
    for log in "$(client_log)" "$(server_log)"; do [ -f "$log" ] && mv "$log" "$log.try1"; done
  done
  for log in "$(client_log)" "$(server_log)"; do
    expect_number "$log" " bytes in " $((2 * size * iters)) &&
      expect_number "$log" " iters in " "$iters" || return 1
  done
}

# perftest under loss: the client's result row has the size and iterations asked for. A TX depth
# of 16, not perftest's 128: each loss makes the requester go back N, and with 128 messages in
# flight that resent megabytes (a 600 MB capture, a minute of tshark).
loss_perftest() {
  local prog=$1 size=$2 iters=$3
  perftest "$CASE_DIR" "$prog" -s "$size" -n "$iters" -t 16 || return 1
  grep -Eq "^ *$size +$iters " "$(client_log)" && return 0
  echo "no result row '$size $iters' in $(client_log)"
  return 1
}

# pings FILE: how many different rdma-ping-N a side printed.
pings() { grep -oE 'ping data: rdma-ping-[0-9]+: ' "$1" | sort -u | wc -l; }

# rping -V under loss: the CM's MADs cross the lossy link too; every ping verified on both sides.
# Line-buffered: rping's stdout, block-buffered into a file, and its unbuffered stderr ("client
# DISCONNECT EVENT...") interleaved in the middle of a ping's line.
loss_rping() {
  local count=$1 side n
  cm_pair "$CASE_DIR" "stdbuf -oL rping -s -v -V -C $count -a \$ADDR" \
    "stdbuf -oL rping -c -v -V -C $count -a \$PEER" ||
    return 1
  for side in client server; do
    n=$(pings "$(cm_log "$CASE_DIR" $side)")
    [ "$n" -eq "$count" ] || { echo "the rping $side printed $n pings of $count"; return 1; }
  done
}

loss_case_rc_4k() { LOSS_SPARE_MSN=400 under_loss "urdma rxe" loss_rc_pingpong 4096 400; }
loss_case_rc_64k() { LOSS_SPARE_MSN=60 under_loss "urdma rxe" loss_rc_pingpong 65536 60; }
loss_case_write() { under_loss "$(client_stack)" loss_perftest ib_write_bw 8192 300; }
loss_case_read() { under_loss "$(client_stack)" loss_perftest ib_read_bw 8192 300; }
loss_case_send() { under_loss "$(client_stack)" loss_perftest ib_send_bw 8192 300; }
loss_case_rping() { under_loss "either urdma rxe" loss_rping 60; }

for CASE_DIR in "urdma->rxe" "rxe->urdma"; do
  case_run "loss 2%: ibv_rc_pingpong -s 4096 -c" "$CASE_DIR" loss_case_rc_4k
  case_run "loss 2%: ibv_rc_pingpong -s 65536 -c" "$CASE_DIR" loss_case_rc_64k
  case_run "loss 2%: ib_write_bw" "$CASE_DIR" loss_case_write
  case_run "loss 2%: ib_read_bw" "$CASE_DIR" loss_case_read
  case_run "loss 2%: ib_send_bw" "$CASE_DIR" loss_case_send
  case_run "loss 2%: rping -V" "$CASE_DIR" loss_case_rping
done
