# shellcheck shell=bash
# The interop suite's machinery (sourced by scripts/interop.sh; README.md here says how to run).
# One Linux rxe peer (a qemu guest, tests/interop/image.sh) on a bridge in a network namespace;
# urdma runs on the host side of the bridge, in that namespace, under `urdma run`.
#
#   namespace $NS ── bridge br0 $HOST_IP (urdma: urdmad + the host programs, `host ...`)
#                      └─ tap0 ── qemu ── guest eth0 $GUEST_IP, rxe0 (`guest ...`)
#
# Case files (cases/*.sh) call `case_run NAME DIRECTION FUNC`; FUNC uses:
#   guest CMD | guest_bg NAME CMD | guest_wait NAME [TIMEOUT_S] | guest_wait_listen tcp:PORT|cm
#   host CMD  | host_bg NAME CMD  | host_wait NAME [TIMEOUT_S]  | host_wait_listen tcp:PORT|cm
# and GUEST_DEV GUEST_GID GUEST_IP GUEST_SHARE HOST_DEV HOST_GID HOST_IP OUT. Inside a case, OUT
# is the case's own folder ($OUT_ROOT/cases/NAME.DIRECTION); NAME.guest.log / NAME.host.log land
# there. Every command has a deadline: a hang is a failure (124), never a stuck run.

INTEROP_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# One namespace per run, named by this shell's pid: two runs on one host (a CI job next to a
# developer's run) never meet, and a killed run's namespace does not stop the next one.
NS=${URDMA_INTEROP_NS:-urdma-interop-$$}
NET=${URDMA_INTEROP_NET:-10.90.0}
HOST_IP=$NET.1
GUEST_IP=$NET.2
HOST_DEV=urdma0
GUEST_DEV=rxe0
GUEST_SHARE=/mnt/build
MTU=${URDMA_INTEROP_MTU:-1500}
CACHE=${URDMA_INTEROP_CACHE:-/var/tmp/urdma-interop}
TIMEOUT=${URDMA_INTEROP_TIMEOUT:-180}  # default deadline of one command, seconds
BUILD=${URDMA_BUILD:-$(cd "$INTEROP_DIR/../.." && pwd)/build}
OUT_ROOT=${URDMA_INTEROP_OUT:-$BUILD/interop}
OUT=$OUT_ROOT
CTL=$OUT_ROOT/vm            # the guest's control share: queue/, ready, console.log
URDMA=$BUILD/tools/urdma/urdma
RESULTS=$OUT_ROOT/results.txt  # NAME|DIRECTION|pass, fail or known|seconds
CASE_FILTER=${URDMA_INTEROP_CASES:-}

say() { echo "[interop] $*" >&2; }

in_ns() { ip netns exec "$NS" "$@"; }

# ------------------------------------------------------------------------------------ the VM

net_up() {
  ip netns add "$NS" && ip -n "$NS" link set lo up &&
    ip -n "$NS" link add br0 type bridge stp_state 0 forward_delay 0 &&
    ip -n "$NS" addr add "$HOST_IP/24" dev br0 &&
    ip -n "$NS" tuntap add dev tap0 mode tap &&
    ip -n "$NS" link set tap0 mtu "$MTU" master br0 up &&
    ip -n "$NS" link set br0 mtu "$MTU" up
}

capture_start() { # every RoCEv2 packet on the bridge, for the whole run
  # ip netns exec, not in_ns: $! must be tcpdump itself (a backgrounded function is a subshell).
  ip netns exec "$NS" tcpdump -Z root -i br0 -U -s 0 -w "$OUT_ROOT/interop.pcap" udp port 4791 \
    < /dev/null > /dev/null 2> "$OUT_ROOT/tcpdump.log" &
  TCPDUMP_PID=$!
  local i
  for i in $(seq 100); do grep -q listening "$OUT_ROOT/tcpdump.log" && return 0; sleep 0.1; done
  say "tcpdump did not start: $(cat "$OUT_ROOT/tcpdump.log")"
  return 1
}

capture_stop() {
  [ -n "${TCPDUMP_PID:-}" ] || return 0
  # TERM, not INT: a background job of a non-interactive shell ignores SIGINT.
  kill -TERM "$TCPDUMP_PID" 2>/dev/null
  wait "$TCPDUMP_PID" 2>/dev/null
  TCPDUMP_PID=
}

qemu_alive() { [ -n "${QEMU_PID:-}" ] && kill -0 "$QEMU_PID" 2>/dev/null; }

# A killed run leaves its namespace behind. One of ours with no process in it (a live run has
# tcpdump and qemu there within seconds of making it) and older than ten minutes is removed.
sweep_stale_namespaces() {
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E '^urdma-interop(-[0-9]+)?$'); do
    [ "$ns" != "$NS" ] && [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] &&
      [ -n "$(find "/run/netns/$ns" -maxdepth 0 -mmin +10 2>/dev/null)" ] || continue
    say "removing $ns, a stale namespace of a killed run"
    ip netns del "$ns"
  done
}

# The guest stands for another machine, with CPUs of its own; here its TCG vCPUs and qemu's
# I/O thread share 2 cores with the host-side tools, which busy-poll (ibv_rc_pingpong without
# -e, perftest). Starved, the guest's network stalled for 0.5-0.7 s at a time: no packet in or
# out (rxe's IP IDs show ~110 packets it sent in such a gap that never reached the bridge), then
# all of rxe's answers at once — longer than ibv_rc_pingpong's whole retry budget (timeout 14 =
# 67 ms, retry_cnt 7: 0.54 s), so urdma's side failed with RETRY_EXC_ERR in 2 of 4 runs of
# `loss 2%: ibv_rc_pingpong -s 4096 -c` rxe->urdma. qemu's threads run at a higher priority
# (nice -10 against the tools' 0), as a peer with its own CPUs would answer.
qemu_priority() {
  sleep 0.5  # qemu's vCPU and I/O threads exist by then
  local t
  for t in /proc/"$QEMU_PID"/task/*; do renice -n -10 -p "${t##*/}" > /dev/null 2>&1; done
}

# vm_up: namespace, bridge, capture, the guest booted and rxe0 ready, urdmad's GID known.
vm_up() {
  [ -x "$URDMA" ] || { say "no $URDMA: build first (cmake --build $BUILD)"; return 1; }
  "$INTEROP_DIR/image.sh" || return 1
  sweep_stale_namespaces
  if ip netns list | awk '{print $1}' | grep -qx "$NS"; then
    say "namespace $NS exists (another run, or a killed one: ip netns del $NS)"
    return 1
  fi
  rm -rf "$OUT_ROOT" && mkdir -p "$CTL/queue" "$OUT_ROOT/cases" && : > "$RESULTS"
  NS_OWNED=1  # from here on vm_down removes the namespace (not another run's, found above)
  net_up || return 1
  capture_start || return 1
  local t0=$SECONDS
  ip netns exec "$NS" qemu-system-x86_64 -name urdma-interop -machine pc,accel=tcg -cpu max -smp 2 -m 1024 \
    -nodefaults -no-user-config -display none -vga none -no-reboot \
    -kernel "$CACHE/vmlinux" -initrd "$CACHE/initramfs.cpio.gz" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 mitigations=off nokaslr interop.ip=$GUEST_IP/24 interop.peer=$HOST_IP interop.mtu=$MTU" \
    -drive "file=$CACHE/root.img,if=virtio,format=raw,snapshot=on" \
    -netdev tap,id=n0,ifname=tap0,script=no,downscript=no \
    -device virtio-net-pci,netdev=n0,mac=52:54:00:90:00:02,romfile= \
    -fsdev "local,id=ctl,path=$CTL,security_model=none" -device virtio-9p-pci,fsdev=ctl,mount_tag=ctl \
    -fsdev "local,id=build,path=$BUILD,security_model=none" -device virtio-9p-pci,fsdev=build,mount_tag=build \
    -device virtio-rng-pci -serial "file:$CTL/console.log" \
    < /dev/null > "$CTL/qemu.log" 2>&1 &
  QEMU_PID=$!
  qemu_priority
  until [ -s "$CTL/ready" ]; do
    if [ -f "$CTL/failed" ] || ! qemu_alive || [ $((SECONDS - t0)) -ge 300 ]; then
      say "the guest did not come up:"; cat "$CTL/qemu.log" "$CTL/console.log" "$CTL/failed" >&2 2>/dev/null
      return 1
    fi
    sleep 0.2
  done
  eval "$(cat "$CTL/ready")"  # GUEST_GID GUEST_KERNEL
  HOST_GID=$(in_ns "$URDMA" devices --json | python3 -c '
import json, sys
for d in json.load(sys.stdin)["devices"]:
    for g in d["gids"]:
        if g["address"] == sys.argv[1]: print(g["index"])' "$HOST_IP")
  [ -n "$HOST_GID" ] || { say "urdma has no GID for $HOST_IP"; return 1; }
  say "guest up in $((SECONDS - t0))s: $GUEST_IP $GUEST_DEV gid $GUEST_GID ($GUEST_KERNEL); host $HOST_IP $HOST_DEV gid $HOST_GID; netns $NS"
}

# vm_down: power the guest off (qemu killed by pid after 20 s), stop the capture, stop the
# namespace's urdmad, remove the namespace (only one this run made). Safe to call twice and after
# a failed vm_up.
vm_down() {
  if qemu_alive; then
    touch "$CTL/poweroff"
    local i
    for i in $(seq 100); do qemu_alive || break; sleep 0.2; done
    qemu_alive && kill -KILL "$QEMU_PID"
    wait "$QEMU_PID" 2>/dev/null
  fi
  QEMU_PID=
  capture_stop
  if [ -n "${NS_OWNED:-}" ] && ip netns list | awk '{print $1}' | grep -qx "$NS"; then
    local pid
    for pid in $(ip netns pids "$NS"); do kill -TERM "$pid" 2>/dev/null; done
    ip netns del "$NS"
  fi
  NS_OWNED=
}

# ------------------------------------------------------------------------------ the guest side

# guest_bg NAME CMD: start CMD (bash, in the guest, /etc/interop.env loaded) in the background.
guest_bg() {
  local name=$1 id
  id=$(basename "$OUT").$1.$RANDOM
  printf '%s\n' "$2" > "$CTL/queue/$id.tmp" && mv "$CTL/queue/$id.tmp" "$CTL/queue/$id.cmd"
  GUEST_JOBS[$name]=$id
  echo "[guest $name] $2" >> "$OUT/commands.log"
}

# guest_wait NAME [TIMEOUT_S]: its exit status (124 after the deadline: then it is killed);
# its output is in $OUT/NAME.guest.log.
guest_wait() {
  local name=$1 deadline=$((SECONDS + ${2:-$TIMEOUT})) id=${GUEST_JOBS[$1]:?no guest job $1} rc
  local q=$CTL/queue/$id
  while [ ! -f "$q.rc" ]; do
    if ! qemu_alive; then say "the guest is gone"; rc=125; break; fi
    if [ $SECONDS -ge $deadline ]; then
      touch "$q.kill"
      local i; for i in $(seq 50); do [ -f "$q.rc" ] && break; sleep 0.1; done
      rc=124; echo "[interop] guest $name: deadline passed, killed" >> "$q.out"; break
    fi
    sleep 0.1
  done
  [ -n "${rc:-}" ] || rc=$(cat "$q.rc")
  cp "$q.out" "$OUT/$name.guest.log" 2>/dev/null
  unset "GUEST_JOBS[$name]"
  return "$rc"
}

# guest CMD: run CMD in the guest and wait for it; prints its output, returns its status.
guest() {
  local name=g$((++GUEST_SEQ)) rc
  guest_bg "$name" "$1"
  guest_wait "$name"; rc=$?
  cat "$OUT/$name.guest.log"
  return $rc
}

guest_wait_listen() { guest "wait-listen $1 ${2:-60}" > /dev/null; }

# ------------------------------------------------------------------------------- the host side

# host_bg NAME CMD: CMD (bash) on urdma: in the namespace, under `urdma run` (our libibverbs and
# librdmacm first, urdmad up), in its own session so a kill reaches all of it.
host_bg() {
  local name=$1
  echo "[host $name] $2" >> "$OUT/commands.log"
  setsid ip netns exec "$NS" "$URDMA" run bash -c "$2" < /dev/null > "$OUT/$name.host.log" 2>&1 &
  HOST_JOBS[$name]=$!
}

# host_wait NAME [TIMEOUT_S]: its exit status; 124 after the deadline (it is killed).
host_wait() {
  local name=$1 deadline=$((SECONDS + ${2:-$TIMEOUT})) pid=${HOST_JOBS[$1]:?no host job $1} rc
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL -- "-$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    echo "[interop] host $name: deadline passed, killed" >> "$OUT/$name.host.log"
    rc=124
  else
    wait "$pid"; rc=$?
  fi
  unset "HOST_JOBS[$name]"
  return $rc
}

host() {
  local name=h$((++HOST_SEQ)) rc
  host_bg "$name" "$1"
  host_wait "$name"; rc=$?
  cat "$OUT/$name.host.log"
  return $rc
}

# host_wait_listen tcp:PORT | cm [TIMEOUT_S]. For cm: urdmad reports no listening service IDs
# yet, so this waits until a process holds a slot (its device is open) — the best sign there is.
host_wait_listen() {
  local deadline=$((SECONDS + ${2:-60}))
  while [ $SECONDS -lt $deadline ]; do
    case $1 in
      tcp:*) in_ns ss -Hltn "sport = :${1#tcp:}" | grep -q . && return 0;;
      cm) in_ns "$URDMA" status --json 2>/dev/null | grep -q '"slots_leased":[1-9]' && return 0;;
      *) say "host_wait_listen tcp:PORT|cm"; return 2;;
    esac
    sleep 0.1
  done
  return 1
}

# ------------------------------------------------------------------------------------- cases

# Kills what a case left running (its deadline already counted as a failure).
case_cleanup() {
  local n
  for n in "${!HOST_JOBS[@]}"; do kill -KILL -- "-${HOST_JOBS[$n]}" 2>/dev/null; done
  for n in "${!GUEST_JOBS[@]}"; do touch "$CTL/queue/${GUEST_JOBS[$n]}.kill"; done
}

# case_run NAME DIRECTION FUNC: runs FUNC in a subshell with OUT=$OUT_ROOT/cases/NAME.DIR,
# records pass/fail and time in $RESULTS, prints one line (and the logs on failure).
# URDMA_INTEROP_CASES (an extended regex over "NAME DIRECTION") selects cases.
# A case function returns this when it failed only on a third-party bug it recognised by its
# exact signature (NOTES*.md name each one): neither a pass nor a failure of urdma.
KNOWN_THIRD_PARTY=77

case_run() {
  local name=$1 dir=$2 func=$3 t0=$SECONDS rc
  if [ -n "$CASE_FILTER" ] && ! grep -Eq -- "$CASE_FILTER" <<< "$name $dir"; then return 0; fi
  local out=$OUT_ROOT/cases/$name.${dir//[^a-z]/_}
  mkdir -p "$out"
  (
    OUT=$out GUEST_SEQ=0 HOST_SEQ=0
    declare -A GUEST_JOBS=() HOST_JOBS=()
    trap case_cleanup EXIT
    "$func"
  ) > "$out/case.log" 2>&1
  rc=$?
  local secs=$((SECONDS - t0)) verdict=pass
  [ $rc -eq 0 ] || verdict=fail
  [ $rc -eq "$KNOWN_THIRD_PARTY" ] && verdict=known
  echo "$name|$dir|$verdict|$secs" >> "$RESULTS"
  printf '%-4s %-28s %-11s %4ss\n' "$verdict" "$name" "$dir" "$secs"
  if [ $verdict = fail ]; then
    local f
    for f in "$out"/*.log; do echo "  --- $f (exit $rc)"; tail -n 25 "$f" | sed 's/^/  | /'; done
  fi
  return 0
}

# ------------------------------------------------------------- helpers shared by the case files

# pair DIRECTION PORT SERVER_CMD CLIENT_CMD: starts the server side, waits for its TCP port, runs
# the client (jobs "server" and "client": $OUT/server.SIDE.log, $OUT/client.SIDE.log); both must
# exit 0. The commands get "$DEV", "$GID", "$PEER" and "$BIN" (where the suite's own C programs
# are, $BUILD/interop-bin as each side sees it) set per side.
pair() {
  local dir=$1 port=$2 server=$3 client=$4
  local gside="DEV=$GUEST_DEV GID=$GUEST_GID PEER=$HOST_IP BIN=$GUEST_SHARE/interop-bin"
  local hside="DEV=$HOST_DEV GID=$HOST_GID PEER=$GUEST_IP BIN=$BUILD/interop-bin"
  if [ "$dir" = "urdma->rxe" ]; then
    guest_bg server "$gside; $server" && guest_wait_listen "tcp:$port" &&
      host_bg client "$hside; $client" && host_wait client && guest_wait server 60
  else
    host_bg server "$hside; $server" && host_wait_listen "tcp:$port" &&
      guest_bg client "$gside; $client" && guest_wait client && host_wait server 60
  fi
}

CASE_FN_SEQ=0

pingpong() { # pingpong DIRECTION PROGRAM ARGS: ibv_*_pingpong, server and client
  local dir=$1 prog=$2; shift 2
  pair "$dir" 18515 "$prog -d \$DEV -g \$GID $*" "$prog -d \$DEV -g \$GID $* \$PEER"
}

perftest() { # perftest DIRECTION PROGRAM ARGS: a perftest pair, server then client
  local dir=$1 prog=$2; shift 2
  pair "$dir" 18515 "$prog -d \$DEV -x \$GID -F $*" "$prog -d \$DEV -x \$GID -F $* \$PEER"
}

# case_both NAME COMMAND...: one case per direction; COMMAND runs with the direction as its first word.
case_both() {
  local name=$1 dir fn=case_fn_$((++CASE_FN_SEQ)); shift
  eval "$fn() { $(printf '%q ' "$1") \"\$CASE_DIR\" $(printf '%q ' "${@:2}"); }"
  for dir in "urdma->rxe" "rxe->urdma"; do CASE_DIR=$dir case_run "$name" "$dir" "$fn"; done
}

# results_table: the markdown table (case x direction) of $RESULTS, into $OUT_ROOT/table.md.
results_table() {
  awk -F'|' '
    { if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 }
      cell[$1, $2] = ($3 == "pass" ? "pass" : $3 == "known" ? "known third-party bug" : "**FAIL**") }
    END {
      print "| case | urdma->rxe | rxe->urdma | both |"
      print "|---|---|---|---|"
      for (i = 1; i <= n; i++) {
        c = order[i]; line = "| " c
        split("urdma->rxe rxe->urdma both", d, " ")
        for (j = 1; j <= 3; j++) line = line " | " ((c, d[j]) in cell ? cell[c, d[j]] : "")
        print line " |"
      }
    }' "$RESULTS" > "$OUT_ROOT/table.md"
  cat "$OUT_ROOT/table.md"
}
