#!/usr/bin/env bash
# Unmodified tools on urdma beside the kernel's UDP, in one run (issue 8's side by side):
#   qperf udp_lat / udp_bw (plain qperf: the kernel's UDP on loopback, the limit)
#   qperf rc_lat (completion events, qperf's default, and -cp1 busy polling), rc_bw,
#     rc_rdma_write_bw on urdma (-cm1: the connection through our librdmacm)
#   perftest ib_write_bw / ib_send_bw / ib_read_bw at 64 B, 4 KiB, 64 KiB, 1 MiB, and
#     ib_write_lat / ib_send_lat 8 B on urdma
# and prints each urdma figure with its ratio to the limit of the same run. A benchmark: nothing
# here passes or fails on speed; a tool that fails prints "failed" in its row and makes the exit
# status 1 (ctest runs the script once that way: bench.ToolsSideBySideRunsEveryTool).
#
#   bench/tools_side_by_side.sh [BUILD_DIR]      (default build-bench; needs qperf and perftest)
#
# Runs in a fresh network namespace with only lo up (root: unshare -n; otherwise unshare -rn),
# so no other traffic shares the loopback queue and urdmad is this run's own. Extra environment
# (URDMA_TX_BATCH=1, say) passes through to the urdma processes.
set -uo pipefail
build=$(realpath "${1:-build-bench}")
urdma=$build/tools/urdma/urdma
[ -x "$urdma" ] || { echo "no $urdma: build it first (README, "Tuning")" >&2; exit 2; }
for t in qperf ib_write_bw ib_write_lat; do
  command -v "$t" >/dev/null || { echo "$t not installed (scripts/deps.sh)" >&2; exit 2; }
done

if [ "${URDMA_SIDE_BY_SIDE_IN_NETNS:-0}" != 1 ]; then
  ns=(unshare -n)
  [ "$(id -u)" = 0 ] || ns=(unshare -rn)
  exec env URDMA_SIDE_BY_SIDE_IN_NETNS=1 "${ns[@]}" "$0" "$build"
fi
ip link set lo up
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$out"' EXIT

# qperf's "name = value unit" lines → value in µs (latency) or MB/s (bandwidth).
qperf_value() {  # file key
  awk -v k="$2" '$1 == k && $2 == "=" {
      v = $3; u = $4
      if (u == "ms") v *= 1000; else if (u == "ns") v /= 1000;
      else if (u == "GB/sec") v *= 1000; else if (u == "KB/sec") v /= 1000;
      print v; exit }' "$1"
}
failures=0
or_failed() {  # value → value, or "failed" (counted)
  if [ -n "$1" ]; then echo "$1"; else echo failed; fi
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b }'; }

# ---- limits: qperf over the kernel's UDP ----
qperf -lp 19950 >/dev/null 2>&1 &
qsrv=$!
sleep 0.5
timeout 60 qperf -lp 19950 127.0.0.1 -t 3 udp_lat udp_bw >"$out/udp" 2>&1
kill "$qsrv" 2>/dev/null; wait "$qsrv" 2>/dev/null
udp_lat=$(qperf_value "$out/udp" latency)
udp_bw=$(awk '$1 == "recv_bw" { v = $3; if ($4 == "GB/sec") v *= 1000; print v; exit }' "$out/udp")

# ---- qperf's RC tests on urdma ----
"$urdma" run qperf -lp 19951 >/dev/null 2>&1 &
rsrv=$!
sleep 1
timeout 60 "$urdma" run qperf -lp 19951 -cm1 127.0.0.1 -t 3 rc_lat >"$out/rc_lat" 2>&1
timeout 60 "$urdma" run qperf -lp 19951 -cm1 -cp1 127.0.0.1 -t 3 rc_lat >"$out/rc_lat_poll" 2>&1
timeout 60 "$urdma" run qperf -lp 19951 -cm1 127.0.0.1 -t 3 rc_bw >"$out/rc_bw" 2>&1
timeout 60 "$urdma" run qperf -lp 19951 -cm1 127.0.0.1 -t 3 rc_rdma_write_bw >"$out/rc_wbw" 2>&1
kill "$rsrv" 2>/dev/null; wait "$rsrv" 2>/dev/null
rc_lat=$(qperf_value "$out/rc_lat" latency)
rc_lat_poll=$(qperf_value "$out/rc_lat_poll" latency)
rc_bw=$(qperf_value "$out/rc_bw" bw)
rc_wbw=$(qperf_value "$out/rc_wbw" bw)
for v in "$udp_lat" "$udp_bw" "$rc_lat" "$rc_lat_poll" "$rc_bw" "$rc_wbw"; do
  [ -n "$v" ] || failures=$((failures + 1))
done

# ---- perftest on urdma ----
perftest() {  # name args... → the tool's result line (client side), or "failed"
  local port=18600
  "$urdma" run "$@" -d urdma0 -x 0 -F -p $port >"$out/pt_server" 2>&1 &
  local srv=$!
  sleep 0.5
  if timeout 120 "$urdma" run "$@" -d urdma0 -x 0 -F -p $port 127.0.0.1 >"$out/pt_client" 2>&1; then
    awk '$1 ~ /^[0-9]+$/ && NF >= 5 { line = $0 } END { print line }' "$out/pt_client"
  else
    echo failed
  fi
  kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null
}

echo "urdma tools side by side: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "settings: URDMA_TX_BATCH=${URDMA_TX_BATCH:-default} URDMA_ACK_DELAY_US=${URDMA_ACK_DELAY_US:-default} URDMA_BUSY_POLL_US=${URDMA_BUSY_POLL_US:-default} URDMA_UDP_GSO=${URDMA_UDP_GSO:-default}"
echo
printf '%-44s %12s %12s %8s\n' "qperf" "urdma" "limit" "ratio"
printf '%-44s %9s us %9s us %8s\n' "rc_lat (events) vs udp_lat" "${rc_lat:-failed}" "$(or_failed "$udp_lat")" "$(ratio "$rc_lat" "$udp_lat")"
printf '%-44s %9s us %9s us %8s\n' "rc_lat -cp1 (busy poll) vs udp_lat" "${rc_lat_poll:-failed}" "$(or_failed "$udp_lat")" "$(ratio "$rc_lat_poll" "$udp_lat")"
printf '%-44s %7s MB/s %7s MB/s %8s\n' "rc_bw vs udp_bw (receive)" "${rc_bw:-failed}" "$(or_failed "$udp_bw")" "$(ratio "$rc_bw" "$udp_bw")"
printf '%-44s %7s MB/s %7s MB/s %8s\n' "rc_rdma_write_bw vs udp_bw (receive)" "${rc_wbw:-failed}" "$(or_failed "$udp_bw")" "$(ratio "$rc_wbw" "$udp_bw")"
echo
printf '%-44s %12s %12s %8s\n' "perftest (-n iterations)" "avg MB/s" "peak MB/s" "vs udp_bw"
for tool in ib_write_bw ib_send_bw ib_read_bw; do
  for spec in "64 20000" "4096 20000" "65536 5000" "1048576 500"; do
    set -- $spec
    line=$(perftest "$tool" -s "$1" -n "$2")
    if [ "$line" = failed ] || [ -z "$line" ]; then
      failures=$((failures + 1))
      printf '%-44s %12s\n' "$tool -s $1 -n $2" failed
    else
      read -r _ _ peak avg _ <<<"$line"
      printf '%-44s %12s %12s %8s\n' "$tool -s $1 -n $2" "$avg" "$peak" "$(ratio "$avg" "$udp_bw")"
    fi
  done
done
echo
printf '%-44s %10s %10s %10s %10s\n' "perftest latency (8 B, 10000)" "typical us" "avg us" "99% us" "vs udp_lat"
for tool in ib_write_lat ib_send_lat; do
  line=$(perftest "$tool" -s 8 -n 10000)
  if [ "$line" = failed ] || [ -z "$line" ]; then
    failures=$((failures + 1))
    printf '%-44s %10s\n' "$tool" failed
  else
    read -r _ _ _ _ typical avg _ p99 _ <<<"$line"
    printf '%-44s %10s %10s %10s %10s\n' "$tool" "$typical" "$avg" "$p99" "$(ratio "$typical" "$udp_lat")"
  fi
done
[ "$failures" = 0 ] || { echo "$failures rows failed" >&2; exit 1; }
