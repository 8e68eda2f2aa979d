#!/usr/bin/env bash
# The main job. Today: decode the reference captures of real Linux rxe traffic with urdma's own
# wire codec (every packet parsed, every ICRC verified), then run the transport engine — two
# simulated hosts exchanging every RDMA operation over a lossy, reordering network — for a few
# seeds. When the verbs libraries and the daemon exist this becomes the seed's
# write_server/write_client over urdma.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target urdma urdma-sim
for f in tests/data/rxe-to-rxe.pcap tests/data/rxe-guest-to-host.pcap; do
  echo "== urdma decode $f"
  build/tools/urdma/urdma decode "$f"
done
echo "== urdma-sim: two engines on a simulated network with 1% loss, 1% reordering, 0.5% corruption"
build/tests/sim/urdma-sim --seeds 1-5 --loss-ppm 10000 --reorder-ppm 10000 --corrupt-ppm 5000 -vv
