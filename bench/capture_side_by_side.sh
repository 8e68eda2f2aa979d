#!/usr/bin/env bash
# What `urdma capture` costs the processes it watches: perftest's ib_write_bw (64 KiB) and
# ib_write_lat (8 B) on urdma, each run without a capture and then with `urdma capture /dev/null`
# running (every datagram recorded twice: by its sender and by its receiver), alternately,
# ROUNDS times (default 3). Prints each pair and the capture's own summary line (packets
# written, dropped). A benchmark: nothing here passes or fails on speed; a tool or capture that
# fails prints "failed" and makes the exit status 1 (ctest runs one round that way:
# bench.CaptureSideBySideRuns).
#
#   bench/capture_side_by_side.sh [BUILD_DIR] [ROUNDS]     (default build-bench, 3; needs perftest)
#
# Runs in a fresh network namespace with only lo up (root: unshare -n; otherwise unshare -rn).
set -uo pipefail
build=$(realpath "${1:-build-bench}")
rounds=${2:-3}
urdma=$build/tools/urdma/urdma
[ -x "$urdma" ] || { echo "no $urdma: build it first" >&2; exit 2; }
for t in ib_write_bw ib_write_lat; do
  command -v "$t" >/dev/null || { echo "$t not installed (scripts/deps.sh)" >&2; exit 2; }
done
if [ "${URDMA_CAPTURE_BENCH_IN_NETNS:-0}" != 1 ]; then
  ns=(unshare -n)
  [ "$(id -u)" = 0 ] || ns=(unshare -rn)
  exec env URDMA_CAPTURE_BENCH_IN_NETNS=1 "${ns[@]}" "$0" "$build" "$rounds"
fi
ip link set lo up
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$out"' EXIT
port=19000
failures=0

# pair TOOL ARGS...: one perftest pair on urdma; prints the client's result line's figure
# (ib_write_bw: Gb/s average; ib_write_lat: typical µs), or "failed".
pair() {
  local tool=$1 field=$2
  shift 2
  port=$((port + 1))
  "$urdma" run "$tool" -d urdma0 -x 0 -F -p $port "$@" >"$out/server" 2>&1 &
  local srv=$!
  sleep 0.5
  local v
  v=$(timeout 120 "$urdma" run "$tool" -d urdma0 -x 0 -F -p $port "$@" 127.0.0.1 2>&1 |
      awk -v f="$field" '$1 ~ /^[0-9]+$/ && NF >= f { print $f; exit }')
  wait "$srv" 2>/dev/null
  echo "${v:-failed}"
}

# with_capture CMD...: runs CMD while `urdma capture /dev/null` runs; then its summary line.
with_capture() {
  "$urdma" capture /dev/null 2>"$out/capture" &
  local cap=$!
  sleep 0.5
  "$@"
  kill -INT "$cap"
  wait "$cap" || echo "    urdma capture failed"
  tail -1 "$out/capture" | sed 's/^/    /'
}

bw() { echo "ib_write_bw 64 KiB, Gb/s, capture $1: $(pair ib_write_bw 4 -s 65536 -n 5000 --report_gbits)"; }
lat() { echo "ib_write_lat 8 B typical, us, capture $1: $(pair ib_write_lat 5 -s 8 -n 5000)"; }
for ((i = 1; i <= rounds; i++)); do
  bw off
  with_capture bw on
  lat off
  with_capture lat on
done | tee "$out/report"
grep -q "failed" "$out/report" && exit 1
grep -q "packets written" "$out/report" || exit 1
exit 0
