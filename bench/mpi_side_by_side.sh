#!/usr/bin/env bash
# MPI ping-pong latency and bandwidth (bench/mpi_pingpong.c, 2 ranks, Open MPI 4.1) over four
# transports in one run, in a fresh network namespace:
#   ob1-tcp     Open MPI's own TCP transport (--mca pml ob1 --mca btl tcp,self)
#   ucx-tcp     UCX's TCP transport (--mca pml ucx, UCX_TLS=tcp,self)
#   ucx-urdma   UCX's rc_verbs on urdma0 (under `urdma run`, UCX_TLS=rc_verbs,ud_verbs:aux,self)
#   ob1-vader   Open MPI's shared-memory transport (what one host can do without a network)
# and prints each size's figures with urdma's ratio to ob1-tcp. A benchmark: nothing passes or
# fails on speed; a transport that fails prints "failed" and makes the exit status 1.
#
#   bench/mpi_side_by_side.sh [BUILD_DIR]     (default build-bench; needs openmpi-bin, ucx-utils)
#
# The ranks talk over a veth pair's address (10.93.0.1) in the namespace, never loopback.
set -uo pipefail
build=$(realpath "${1:-build-bench}")
urdma=$build/tools/urdma/urdma
[ -x "$urdma" ] || { echo "no $urdma: build it first" >&2; exit 2; }
for t in mpicc.openmpi mpirun.openmpi ucx_info; do
  command -v "$t" >/dev/null || { echo "$t not installed (scripts/deps.sh)" >&2; exit 2; }
done

# A network namespace and a mount namespace, so that a sysfs of this network namespace can
# be mounted on /sys (as `ip netns exec` does): UCX finds its TCP devices in /sys/class/net.
if [ "${URDMA_MPI_SIDE_IN_NETNS:-0}" != 1 ]; then
  ns=(unshare -nm)
  [ "$(id -u)" = 0 ] || ns=(unshare -rnm)
  exec env URDMA_MPI_SIDE_IN_NETNS=1 "${ns[@]}" "$0" "$build"
fi
mount --make-rslave / && mount -t sysfs sysfs /sys || { echo "cannot mount sysfs" >&2; exit 2; }
ip link set lo up
ip link add mpb0 type veth peer name mpb1 && ip addr add 10.93.0.1/24 dev mpb0 &&
  ip link set mpb1 up && ip link set mpb0 up || { echo "no veth pair" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
src=$(dirname "$(realpath "$0")")/mpi_pingpong.c
mpicc.openmpi -O2 -o "$out/mpi_pingpong" "$src" || exit 2

run() {  # name, then the launcher's extra arguments
  local name=$1
  shift
  timeout 300 "$@" "$out/mpi_pingpong" >"$out/$name" 2>&1 ||
    echo "($name failed: $(tail -3 "$out/$name" | tr '\n' ' '))" >&2
}
mpirun=(mpirun.openmpi --allow-run-as-root --oversubscribe -np 2 --host 10.93.0.1:2
        --mca oob_tcp_if_include mpb0)
run ob1-tcp "${mpirun[@]}" --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include mpb0
run ucx-tcp env UCX_TLS=tcp,self UCX_NET_DEVICES=mpb0 "${mpirun[@]}" --mca pml ucx \
  --mca pml_ucx_tls any --mca pml_ucx_devices any --mca btl self -x UCX_TLS -x UCX_NET_DEVICES
run ucx-urdma "$urdma" run env UCX_TLS=rc_verbs,ud_verbs:aux,self UCX_NET_DEVICES=urdma0:1 "${mpirun[@]}" \
  --mca pml ucx --mca osc ucx --mca btl self -x UCX_TLS -x UCX_NET_DEVICES
run ob1-vader "${mpirun[@]}" --mca pml ob1 --mca btl vader,self

value() {  # transport size key
  sed -n "s/^size=$2 .*$3=\([0-9.]*\).*/\1/p" "$out/$1" | head -1
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b }'; }
failures=0
for t in ob1-tcp ucx-tcp ucx-urdma ob1-vader; do
  grep -q '^size=1048576' "$out/$t" || failures=$((failures + 1))
done

printf '%-8s %-7s %10s %10s %10s %10s %14s\n' size metric ob1-tcp ucx-tcp ucx-urdma ob1-vader "urdma/ob1-tcp"
for s in 8 1024 4096 65536 1048576; do
  for m in lat_us bw_MBps; do
    [ "$m" = bw_MBps ] && [ "$s" -lt 4096 ] && continue
    a=$(value ob1-tcp "$s" "$m"); b=$(value ucx-tcp "$s" "$m")
    c=$(value ucx-urdma "$s" "$m"); d=$(value ob1-vader "$s" "$m")
    printf '%-8s %-7s %10s %10s %10s %10s %14s\n' "$s" "$m" "${a:-failed}" "${b:-failed}" \
      "${c:-failed}" "${d:-failed}" "$(ratio "$c" "$a")"
  done
done
[ "$failures" -eq 0 ]
