#!/usr/bin/env bash
# Builds urdma and runs the whole test suite, the way CI does. Every test runs once (a failed
# test of the plain and middleware stages once more on its own: run_ctest --rerun), in one of
# these stages (each builds only what its tests need; ctest labels say which tests run where):
#   1. plain build (RelWithDebInfo, line tables only: -g1; -Werror): the process tests (label
#      process), the full simulation seed sweeps and the replay check (sim) and the benchmark
#      smoke tests (bench);
#   2. ASan+UBSan build (clang, -O1 -g1, assertions on; no process tests): every other test —
#      the unit tests, the simulation's unit tests, a tenth of each seed sweep (sim_subset), the
#      cross-checks and the fuzz seed replays;
#   3. TSan build (-O1 -g1): the provider, engine and runtime unit tests again;
#   4. libFuzzer build (clang): every target labelled fuzz for URDMA_FUZZ_SECONDS (default 30)
#      each;
#   5. as root: the live interop suite against Linux rxe in a qemu guest on the plain build
#      (scripts/interop.sh; URDMA_INTEROP=0 skips it). Its host tools and guest image are made
#      in the background from the start (scripts/interop.sh --prepare), while the compilers run.
# Prints each stage's wall time as it ends and a table of them at the end, then one line
# "urdma: N passed, M failed", after the names of the tests that failed or were flaky. Exit
# status is non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc)
fuzz_seconds=${URDMA_FUZZ_SECONDS:-30}
passed=0
failed=0
stage_name=""
stage_start=0
stage_times=()

# stage NAME: ends the stage that runs (printing its wall time) and starts the next.
stage() {
  local now
  now=$(date +%s)
  if [ -n "$stage_name" ]; then
    echo "== $stage_name: $((now - stage_start)) s"
    stage_times+=("$(printf '%6d s  %s' $((now - stage_start)) "$stage_name")")
  fi
  stage_name=$1
  stage_start=$now
  [ -n "$stage_name" ] && echo "== $stage_name"
  return 0
}

# run_ctest [--rerun] DIR [ctest args]: runs the tests of one build and adds up its counts; the
# names of failed tests are kept for the summary. With --rerun (the stages of real processes on
# a loaded 2-core machine: plain and middleware), a test that failed runs once more on its own:
# if it passes then, it counts as passed and is listed as flaky in the summary, so that a timing
# flake is seen but does not hide the rest of the run. The sanitizer, unit and fuzz stages run
# every test exactly once.
failed_names=()
flaky_names=()
run_ctest() {
  local rerun=0
  [ "$1" = --rerun ] && rerun=1 && shift
  local dir=$1
  shift
  local log
  log=$(mktemp)
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" "$@" 2>&1 | tee "$log"
  local total fails
  total=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2/p' "$log" | tail -1)
  fails=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -1)
  if [ -z "$total" ]; then  # ctest itself failed (no tests found, build missing)
    failed=$((failed + 1))
    failed_names+=("$dir: ctest $*")
    rm -f "$log"
    return
  fi
  # ctest's own list: "  123 - name (Failed)".
  local names=()
  mapfile -t names < <(sed -n '/The following tests FAILED:/,$ s/^[[:space:]]*[0-9]* - \([^ ]*\) .*/\1/p' "$log")
  rm -f "$log"
  passed=$((passed + total - fails))
  local name
  for name in "${names[@]}"; do
    if [ "$rerun" = 1 ] && {
         echo "== once more on its own: $name"
         ctest --test-dir "$dir" --output-on-failure -R "^${name//./[.]}\$" 2>&1 | tail -40 |
           grep -q '100% tests passed'
       }; then
      passed=$((passed + 1))
      flaky_names+=("$name")
    else
      failed=$((failed + 1))
      failed_names+=("$name")
    fi
  done
  # A count ctest gave without names (it always lists them) is still a failure.
  [ "${#names[@]}" -lt "$fails" ] && failed=$((failed + fails - ${#names[@]}))
  return 0
}

# build DIR [cmake args] [-- targets]: configures and builds (every target, or the ones after
# --); a failed build counts as one failure.
build() {
  local dir=$1
  shift
  local args=() targets=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && shift && targets=(--target "$@")
  if cmake -S . -B "$dir" -G Ninja -DURDMA_WERROR=ON "${args[@]}" >/dev/null &&
     cmake --build "$dir" -j"$jobs" "${targets[@]}"; then
    return 0
  fi
  echo "urdma: build in $dir failed" >&2
  failed=$((failed + 1))
  failed_names+=("build in $dir")
  return 1
}

stage "dependencies (apt)"
./scripts/deps.sh || exit 1

# The interop suite's host tools (apt) and guest image (debootstrap: downloads and disk, little
# CPU) are made in the background while the builds run; the interop stage waits for them. In a
# session of its own, so that an early exit can stop all of it.
interop=skip
if [ "${URDMA_INTEROP:-1}" = 0 ]; then
  interop_why="skipped (URDMA_INTEROP=0)"
elif [ "$(id -u)" != 0 ]; then
  interop_why="skipped (needs root: a network namespace, a tap device, debootstrap)"
else
  interop=run
  prepare_log=$(mktemp)
  nice -n 10 setsid ./scripts/interop.sh --prepare > "$prepare_log" 2>&1 < /dev/null &
  prepare_pid=$!
  trap 'kill -TERM -- -"$prepare_pid" 2>/dev/null' EXIT
fi

# Plain: what the process tests, the sweeps, the benchmark tests and the interop suite run.
stage "plain build"
build build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DURDMA_DEBUG_INFO=-g1 \
  -- src/all tools/all examples/all tests/process/all tests/security/all tests/middleware/all \
  bench/all urdma-sim
plain_built=$?
stage "plain tests: process, simulation sweeps, benchmarks"
[ "$plain_built" -eq 0 ] && run_ctest --rerun build -L '^(process|sim|bench)$'

# Middleware on urdma (tests/middleware, in the plain build): Open MPI and MPICH over UCX, Open
# MPI over libfabric, rdma-core's own tests.
stage "middleware: MPI over UCX and libfabric, rdma-core's tests"
[ "$plain_built" -eq 0 ] && run_ctest --rerun build -L '^middleware$'

# The sanitizer builds compile at -O1 with line tables only (-g1: what a report's stack needs),
# in less than half the time of -O2 -g, and the unit-test files at -O0 (URDMA_TEST_OPT: the
# code under test stays at -O1); assertions stay on.
sanitize_flags=(-DCMAKE_BUILD_TYPE=Sanitize -DCMAKE_C_FLAGS_SANITIZE="-O1 -g1"
                -DCMAKE_CXX_FLAGS_SANITIZE="-O1 -g1" -DURDMA_TEST_OPT=-O0 -DURDMA_BENCH=OFF)

# ASan+UBSan: every test the plain stage does not run. Compiled by clang, which builds it in
# three quarters of gcc's time (a unit-test file at -O0 in about half). The TSan build stays
# with gcc: clang builds it no faster, and under clang's TSan one runtime test's count of the
# engine thread's naps fell short of its bound in one run of four.
stage "ASan+UBSan build"
CC=clang CXX=clang++ build build-asan "${sanitize_flags[@]}" -DURDMA_SANITIZE=address,undefined \
  -DURDMA_PROCESS_TESTS=OFF
asan_built=$?
stage "ASan+UBSan tests: unit, simulation (unit tests, sweep subsets), cross-checks, replays"
[ "$asan_built" -eq 0 ] && run_ctest build-asan -LE '^(process|sim|bench)$'

stage "TSan: the provider, engine and runtime tests"
build build-tsan "${sanitize_flags[@]}" -DURDMA_SANITIZE=thread \
  -- urdma_provider_tests urdma_engine_tests urdma_runtime_tests &&
  run_ctest build-tsan -R '^(provider|engine|runtime)[.]'

stage "libFuzzer (${fuzz_seconds}s per target)"
CC=clang CXX=clang++ build build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DURDMA_DEBUG_INFO=-g1 \
  -DURDMA_FUZZ=ON -DURDMA_FUZZ_SECONDS="$fuzz_seconds" -DURDMA_SANITIZE=address,undefined,fuzzer-no-link \
  -DURDMA_BENCH=OFF && run_ctest build-fuzz -L '^fuzz$'

stage "interop with Linux rxe (qemu)"
if [ "$interop" != run ]; then
  echo "interop: $interop_why"
else
  wait "$prepare_pid"
  prepare_rc=$?
  trap - EXIT
  echo "interop: host tools and guest image made in the background (exit $prepare_rc):"
  cat "$prepare_log"
  rm -f "$prepare_log"
  # The plain stage's build/; each case is one test. A stuck run is killed, never waited on.
  log=$(mktemp)
  URDMA_BUILD=$PWD/build timeout -k 30 1200 ./scripts/interop.sh 2>&1 | tee "$log"
  counts=$(sed -n 's/^interop: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$log" | tail -1)
  if [ -n "$counts" ]; then
    passed=$((passed + ${counts% *}))
    failed=$((failed + ${counts#* }))
    mapfile -t -O "${#failed_names[@]}" failed_names < <(sed -n 's/^fail \(.*[^ ]\) \+[0-9]\+s$/interop: \1/p' "$log")
  else
    echo "interop: no result (the suite did not finish)" >&2
    failed=$((failed + 1))
    failed_names+=("interop: no result")
  fi
  rm -f "$log"
fi

stage ""
echo "== stage times (wall)"
printf '%s\n' "${stage_times[@]}"
[ "${#flaky_names[@]}" -gt 0 ] && printf 'urdma: flaky (failed, then passed on its own): %s\n' "${flaky_names[@]}"
[ "${#failed_names[@]}" -gt 0 ] && printf 'urdma: FAILED: %s\n' "${failed_names[@]}"
echo "urdma: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
