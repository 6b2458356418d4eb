#!/bin/bash
# Builds weft's libFuzzer targets with clang (CMake option WEFT_FUZZ) and runs each for SECONDS
# seconds, at the lowest CPU priority, over its seed corpus (tests/fuzz/corpus/<target>, read only)
# and a working corpus in the build directory, which keeps what the fuzzer finds.
#   [FUZZ_RUNS=N] tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]
# With FUZZ_RUNS, each target stops after N executions, or SECONDS seconds if that comes first.
# A process runs at most FUZZ_CHUNK (50000) inputs; the next one goes on from the working corpus.
# Exit status: 0, 1 when a target crashed, leaked or reported undefined behaviour (its input lands
# in BUILD_DIR/crashes/), 77 without clang. A summary line per target gives executions, seconds,
# crashes, leaks and UB reports, and the harness bodies accepted and rejected (its log:
# BUILD_DIR/<target>.log).
# Clean errors (weft_fatal) are not crashes, and what an input that ends in one allocated is not a
# leak; a leak on an accepted input's path is one (tests/fuzz/fuzz.h).
set -u
ASAN_OPTIONS=${ASAN_OPTIONS:-}
FUZZ_RUNS=${FUZZ_RUNS:-}
chunk=${FUZZ_CHUNK:-50000}
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
mkdir -p "$build/crashes"
status=0
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t"
  log="$build/$t.log"
  : >"$log"
  before=$(ls "$build/crashes" | grep -c "^$t-")
  start=$(date +%s) runs=0 rc=0
  # One process runs at most FUZZ_CHUNK inputs: what the inputs rejected with an error allocated
  # stays allocated (a real run exits there), some 15 KB each (the YAML parser's buffers), so a
  # process that ran 1,000,000 would pass the 4 GB limit. The working corpus carries over.
  while :; do
    left=$(( seconds - ($(date +%s) - start) ))
    n=$chunk
    [ -z "$FUZZ_RUNS" ] || [ $(( FUZZ_RUNS - runs )) -ge "$n" ] || n=$(( FUZZ_RUNS - runs ))
    [ "$left" -gt 0 ] && [ "$n" -gt 0 ] || break
    # -detect_leaks=0: libFuzzer's own per-input check counts rejected inputs' allocations and
    # turns itself off after 1,000 of them; the harness checks accepted inputs, and LeakSanitizer
    # the whole process at exit. detect_leaks=1 goes last so a caller's detect_leaks=0 (make
    # sanitize sets one) does not turn both off.
    ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 nice -n 19 \
      "$build/fuzz/$t" -max_total_time="$left" -runs="$n" -detect_leaks=0 \
      -close_fd_mask=2 -timeout=20 -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="$build/crashes/$t-" "$build/corpus/$t" "$src/tests/fuzz/corpus/$t" \
      >"$log.part" 2>&1
    rc=$?
    ran=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log.part" | grep -o '[0-9]*$')
    cat "$log.part" >>"$log" && rm "$log.part"
    runs=$(( runs + ${ran:-0} ))
    [ $rc -eq 0 ] && [ "${ran:-0}" -gt 0 ] || break
  done
  elapsed=$(( $(date +%s) - start ))
  crashes=$(( $(ls "$build/crashes" | grep -c "^$t-") - before ))
  leaks=$(grep -c 'ERROR: LeakSanitizer' "$log")
  ub=$(grep -c 'runtime error:' "$log")
  # The harness's exit line per process: bodies rejected and accepted, leak checks run.
  read -r rejected accepted checks < <(grep '^weft fuzz: ' "$log" |
    awk '{r += $3; a += $5; c += $7} END {print r + 0, a + 0, c + 0}')
  echo "$t: $runs executions in $elapsed s, exit $rc, $crashes crash input(s)," \
    "$leaks leak(s), $ub UB report(s); $accepted accepted (leak-tracked), $rejected rejected," \
    "$checks leak checks"
  if [ $rc -ne 0 ] || [ "$leaks" -ne 0 ] || [ "$ub" -ne 0 ]; then
    status=1
    grep -A15 -m1 "ERROR\|runtime error" "$log"
  fi
done
exit $status
