# shellcheck shell=bash
# Checks of the whole run, after every case (direction "both"): the capture of the bridge
# ($OUT_ROOT/interop.pcap, every UDP 4791 packet both ways) decoded by tshark, by an ICRC
# recomputation that shares no code with urdma (icrc_check.py) and by `urdma decode`; then rxe's
# own counters and kernel log in the guest. Their outputs are kept in each check's folder.

# tshark: every packet is decoded by the InfiniBand dissector down to a BTH, with no malformed
# packet and no expert error. The dissectors that guess an upper protocol from the payload are
# off: the test programs' payload is not RPC-over-RDMA, and that guesser throws on the 1-byte
# SEND of ibv_rc_pingpong -s 1 (from rxe as from us; NOTES.md).
TSHARK_OFF=(--disable-protocol rpcordma --disable-protocol smb_direct --disable-protocol lnet
  --disable-protocol nvme-rdma --disable-protocol iser --disable-protocol smc)
check_tshark() {
  local total bth bad pcap=$OUT_ROOT/interop.pcap
  total=$(tshark -r "$pcap" -T fields -e frame.number 2>/dev/null | wc -l)
  bth=$(tshark -r "$pcap" -Y infiniband.bth -T fields -e frame.number 2>/dev/null | wc -l)
  tshark -r "$pcap" "${TSHARK_OFF[@]}" -Y '_ws.malformed || _ws.expert.severity >= 8388608' \
    2>/dev/null > "$OUT/tshark-bad.txt"
  bad=$(wc -l < "$OUT/tshark-bad.txt")
  echo "tshark: $total packets, $bth with a BTH, $bad malformed or with an expert error"
  head -n 20 "$OUT/tshark-bad.txt"
  [ "$total" -gt 0 ] && [ "$bth" -eq "$total" ] && [ "$bad" -eq 0 ]
}

check_icrc() { /usr/bin/python3 "$INTEROP_DIR/icrc_check.py" "$OUT_ROOT/interop.pcap"; }

check_urdma_decode() {
  "$URDMA" decode "$OUT_ROOT/interop.pcap" > "$OUT/decode.txt"
  local rc=$?
  tail -n 1 "$OUT/decode.txt"
  grep -v 'icrc=ok' "$OUT/decode.txt" | head -n 20
  return $rc
}

# rxe's counters (kept in $OUT_ROOT/rxe-counters.txt): no out-of-sequence request and no
# sequence error NAK, but for those the loss cases caused (cases/loss.sh: each leaves its deltas
# in rxe-counters-delta.txt); the kernel logged no bad ICRC (rxe drops such packets without a
# counter).
check_rxe_counters() {
  guest 'rdma statistic show link rxe0/1' > "$OUT_ROOT/rxe-counters.txt" || return 1
  cat "$OUT_ROOT/rxe-counters.txt"
  guest 'dmesg' > "$OUT/dmesg.txt"
  local counter value lossy failed=0
  for counter in out_of_seq_request rcvd_seq_err; do
    value=$(tr ' ' '\n' < "$OUT_ROOT/rxe-counters.txt" | grep -A1 -x "$counter" | tail -n 1)
    lossy=$(cat /dev/null "$OUT_ROOT"/cases/*/rxe-counters-delta.txt 2> /dev/null |
      awk -v n="$counter" '$1 == n { s += $2 } END { print s + 0 }')
    [ -n "$value" ] && [ "$value" -eq "$lossy" ] ||
      { echo "rxe $counter: ${value:-missing} ($lossy of them in the loss cases)"; failed=1; }
  done
  if grep -i 'icrc' "$OUT/dmesg.txt"; then echo "rxe logged bad ICRCs"; failed=1; fi
  # Not asserted yet, an open bug of ours (NOTES.md): urdma resending what rxe already ACKed.
  value=$(tr ' ' '\n' < "$OUT_ROOT/rxe-counters.txt" | grep -A1 -x duplicate_request | tail -n 1)
  [ "$value" = 0 ] || echo "note: rxe duplicate_request $value (urdma resent requests rxe had ACKed)"
  return $failed
}

capture_stop
CASE_FILTER= case_run "capture: tshark decodes every packet" both check_tshark
CASE_FILTER= case_run "capture: ICRC recomputed (icrc_check.py)" both check_icrc
CASE_FILTER= case_run "capture: urdma decode" both check_urdma_decode
CASE_FILTER= case_run "rxe counters: no sequence or ICRC error" both check_rxe_counters
