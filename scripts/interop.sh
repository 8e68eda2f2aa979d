#!/usr/bin/env bash
# The live interop suite: urdma against Linux rxe (kernel Soft-RoCE) in a qemu guest, both
# directions, every packet captured and checked (tests/interop/README.md). Needs root.
#   sudo scripts/interop.sh                       all cases
#   URDMA_INTEROP_CASES='rc_pingpong' sudo scripts/interop.sh   the cases whose "NAME DIRECTION" match
#   sudo scripts/interop.sh --prepare             only the host tools and the guest image (no
#                                                 guest, no cases): scripts/test.sh runs this in
#                                                 the background while it compiles
# Uses the build in $URDMA_BUILD (default build/); prints a markdown table (also
# $OUT/table.md), compares it with docs/COMPATIBILITY.md's (a difference is a failure, unless
# URDMA_INTEROP_CASES selected a subset) and prints "interop: N passed, M failed"; exit status
# non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

[ "$(id -u)" = 0 ] || { echo "interop.sh needs root (network namespace, tap, debootstrap)" >&2; exit 2; }

# Host tools, installed here rather than in scripts/deps.sh: qemu and debootstrap are ~100 MB
# that only this suite needs.
need=()
for t in qemu-system-x86_64:qemu-system-x86 debootstrap:debootstrap mkfs.ext4:e2fsprogs \
         cpio:cpio tcpdump:tcpdump tshark:tshark ibv_rc_pingpong:ibverbs-utils \
         ib_write_bw:perftest rping:rdmacm-utils cc:gcc ss:iproute2 xz:xz-utils nft:nftables; do
  command -v "${t%%:*}" > /dev/null || need+=("${t#*:}")
done
[ "$(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null)" = "install ok installed" ] ||
  need+=(busybox-static)
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "[interop] installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${need[@]}" > /dev/null || exit 2
fi
if [ "${1:-}" = --prepare ]; then
  tests/interop/image.sh
  rc=$?
  echo "[interop] host tools and guest image: exit $rc after ${SECONDS} s"
  exit $rc
fi

. tests/interop/lib.sh
declare -A GUEST_JOBS=() HOST_JOBS=()
trap vm_down EXIT
trap 'exit 130' INT TERM

if ! vm_up; then
  echo "[interop] the rxe guest did not come up" >&2
  echo "interop: 0 passed, 1 failed"
  exit 1
fi
for f in tests/interop/cases/*.sh; do . "$f"; done
. tests/interop/wire_checks.sh
vm_down

results_table
passed=$(grep -c '|pass|' "$RESULTS")
failed=$(grep -c '|fail|' "$RESULTS")
# The document's table must be this run's (tests/interop/check_table.py), unless only some cases ran.
if [ -z "$CASE_FILTER" ]; then
  python3 tests/interop/check_table.py docs/COMPATIBILITY.md "$OUT_ROOT/table.md" ||
    { echo "interop: docs/COMPATIBILITY.md's table is not this run's (update it, or fix the run)"
      failed=$((failed + 1)); }
else
  echo "interop: some cases selected (URDMA_INTEROP_CASES): docs/COMPATIBILITY.md's table not compared"
fi
known=$(grep -c '|known|' "$RESULTS")
[ "$known" -eq 0 ] || echo "interop: $known case(s) ended only in a known third-party bug (tests/interop/NOTES*.md)"
echo "interop: $passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
