#!/usr/bin/env bash
# The main job. Today: decode the reference captures of real Linux rxe traffic with urdma's own
# wire codec (every packet parsed, every ICRC verified). When the device exists this becomes the
# seed's write_server/write_client over urdma.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target urdma
for f in tests/data/rxe-to-rxe.pcap tests/data/rxe-guest-to-host.pcap; do
  echo "== urdma decode $f"
  build/tools/urdma/urdma decode "$f"
done
