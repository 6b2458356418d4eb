#!/bin/bash
# Builds weft's libFuzzer targets with clang (CMake option WEFT_FUZZ) and runs each for SECONDS
# seconds, at the lowest CPU priority, over its seed corpus (tests/fuzz/corpus/<target>, read only)
# and a working corpus in the build directory, which keeps what the fuzzer finds.
#   [FUZZ_RUNS=N] tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]
# With FUZZ_RUNS, each target stops after N executions, or SECONDS seconds if that comes first.
# Exit status: 0, 1 when a target crashed, leaked or reported undefined behaviour (its input lands
# in BUILD_DIR/crashes/), 77 without clang. A summary line per target gives executions, seconds,
# crashes, leaks and UB reports (its log: BUILD_DIR/<target>.log).
# Clean errors (weft_fatal) are not crashes, and what an input that ends in one allocated is not a
# leak; a leak on an accepted input's path is one (tests/fuzz/fuzz.h).
set -u
ASAN_OPTIONS=${ASAN_OPTIONS:-}
FUZZ_RUNS=${FUZZ_RUNS:-}
build=$1 seconds=$2
shift 2
src=$(cd "$(dirname "$0")/../.." && pwd)
command -v clang >/dev/null || { echo "clang not found: skipping the fuzz targets"; exit 77; }
cmake -S "$src" -B "$build" -DCMAKE_C_COMPILER=clang -DWEFT_FUZZ=ON -DWEFT_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 1
cmake --build "$build" --target fuzz_targets -j "$(nproc)" >"$build/fuzz_build.log" 2>&1 ||
  { tail -20 "$build/fuzz_build.log"; exit 1; }
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=($(cd "$build/fuzz" && ls fuzz_*))
runs_flag=()
[ -z "$FUZZ_RUNS" ] || runs_flag=(-runs="$FUZZ_RUNS")
mkdir -p "$build/crashes"
status=0
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t"
  log="$build/$t.log"
  before=$(ls "$build/crashes" | grep -c "^$t-")
  start=$(date +%s)
  # -detect_leaks=0: libFuzzer's own per-input check counts rejected inputs' allocations and turns
  # itself off after 1,000 of them; the harness checks accepted inputs, and LeakSanitizer the
  # whole process at exit. detect_leaks=1 goes last so a caller's detect_leaks=0 (make sanitize
  # sets one) does not turn both off.
  ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 nice -n 19 \
    "$build/fuzz/$t" -max_total_time="$seconds" "${runs_flag[@]}" -detect_leaks=0 \
    -close_fd_mask=2 -timeout=20 -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$build/crashes/$t-" "$build/corpus/$t" "$src/tests/fuzz/corpus/$t" \
    >"$log" 2>&1
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  crashes=$(( $(ls "$build/crashes" | grep -c "^$t-") - before ))
  leaks=$(grep -c 'ERROR: LeakSanitizer' "$log")
  ub=$(grep -c 'runtime error:' "$log")
  echo "$t: ${runs:-?} executions in $elapsed s, exit $rc, $crashes crash input(s)," \
    "$leaks leak(s), $ub UB report(s)"
  if [ $rc -ne 0 ] || [ "$leaks" -ne 0 ] || [ "$ub" -ne 0 ]; then
    status=1
    grep -A15 -m1 "ERROR\|runtime error" "$log"
  fi
done
exit $status
