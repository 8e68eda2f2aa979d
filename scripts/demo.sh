#!/usr/bin/env bash
# The main job: the seed's write_server/write_client over urdma. Installs the build dependencies
# (apt), builds urdma (urdmad, the `urdma` tool, our libibverbs.so.1 and librdmacm.so.1) and the
# seed's examples (built against Debian's librdmacm/libibverbs like any RDMA program), then runs
# the pair unmodified on urdma with `urdma run`, which puts urdma's libraries first; urdmad starts
# by itself. The server prints "Received data: Hello from RDMA client!".
set -euo pipefail
cd "$(dirname "$0")/.."
# URDMA_BUILD_DIR: another build tree (default build/); URDMA_SKIP_DEPS=1: no apt step.
build=${URDMA_BUILD_DIR:-build}
[ "${URDMA_SKIP_DEPS:-0}" = 1 ] || ./scripts/deps.sh
gen=()
[ -f "$build/CMakeCache.txt" ] || gen=(-G Ninja)
cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target urdma urdmad urdma_verbs urdma_rdmacm write_server \
  write_client
urdma=$build/tools/urdma/urdma
out=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; rm -rf "$out"' EXIT

echo "== urdma run write_server"
"$urdma" run "$build/examples/write_server" >"$out/server" 2>&1 &
server=$!
for _ in $(seq 100); do
  grep -q "Server listening" "$out/server" 2>/dev/null && break
  sleep 0.1
done
echo "== urdma run write_client 127.0.0.1"
status=0
timeout 30 "$urdma" run "$build/examples/write_client" 127.0.0.1 || status=$?
for _ in $(seq 100); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
echo "== write_server's output"
cat "$out/server"
wait "$server" || status=$?
grep -q "Received data: Hello from RDMA client!" "$out/server" || status=1
exit "$status"
