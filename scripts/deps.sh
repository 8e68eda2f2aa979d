#!/usr/bin/env bash
# Installs what urdma needs to build and test on Debian 12 (bookworm). Idempotent: packages
# already present are not touched, and nothing runs when all are there.
set -euo pipefail

packages=(
  # toolchains; clang for libFuzzer and the ASan+UBSan build
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
  libibverbs-dev librdmacm-dev       # rdma-core 44 headers: the API urdma implements
  libisal-dev zlib1g-dev             # CRC-32 (isa-l is the measured winner, zlib the fallback oracle)
  libpcap-dev                        # urdma decode: pcap/pcapng reading
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
  liburing-dev                       # io_uring rows of bench/kernel_path.cc (optional there)
  python3 python3-scapy tshark       # independent decoders for the cross-checks
  iproute2 tcpdump ethtool           # network namespaces and captures in process tests
  gdb                                # a process test prints the stacks of a tool that hangs
  ibverbs-utils perftest qperf rdmacm-utils  # unmodified verbs/CM clients the process tests run on urdma
  python3-pyverbs                    # rdma-core's Python binding (for /usr/bin/python3), run on urdma
  ucx-utils                          # ucx_info, ucx_perftest (UCX 1.13) on urdma's device view
  openmpi-bin libopenmpi-dev mpich libmpich-dev  # Open MPI 4.1 and MPICH 4.0 over UCX (tests/middleware)
  libfabric-bin                      # fi_pingpong, fi_info: libfabric's verbs provider on urdma
  systemd util-linux                 # systemd-socket-activate, systemd-analyze, setpriv: the system
                                     # daemon's tests (tests/security, the install test)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "urdma: installing ${missing[*]}" >&2
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
# tshark asks whether non-root users may capture; answer no without a prompt.
echo "wireshark-common wireshark-common/install-setuid boolean false" | $sudo debconf-set-selections
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
