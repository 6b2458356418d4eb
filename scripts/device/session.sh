#!/usr/bin/env bash
# The GPU session's one entry point, run THERE in the repo root (carry .devkit):
#   bash scripts/device/session.sh all            # build ops parity rollout rl attention bench-small bench-1b generate speculative profile
#   bash scripts/device/session.sh ops parity     # or any steps by name
# Each step's log goes to $OUT/<step>.log when $OUT is set, the benches' JSON beside them (all:
# 11 logs + 4 JSON files, more than the 8 files the tool returns: name fewer steps when the JSON
# must come back). Steps go on after a failure; a summary table (step, exit code, seconds)
# comes last. SESSION_BUDGET (default 570 s) caps the whole run so the summary always prints
# inside the tool's 10 minutes; each step also has its own limit.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export PYTHONUNBUFFERED=1
BUDGET=${SESSION_BUDGET:-570}
START=$SECONDS
LOGDIR=${OUT:-}
[ -n "$LOGDIR" ] && mkdir -p "$LOGDIR"
declare -A LIMIT=([build]=420 [ops]=120 [parity]=240 [rollout]=240 [rl]=240 [attention]=150 [bench-small]=120 [bench-1b]=420 [generate]=360 [speculative]=300 [profile]=180 [mpi]=60)

info() {
  echo "== $(date -u +%FT%TZ) $(uname -srm); $(. /etc/os-release && echo "$PRETTY_NAME"); $(nproc) cores"
  nvidia-smi -L || echo "nvidia-smi failed"
  local nv; nv=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  "$nv" --version | tail -2 || echo "no nvcc"
  echo "python3: $(command -v python3)"
  python3 -c 'import torch, numpy; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "numpy", numpy.__version__)' || echo "python3 cannot import torch/numpy"
  cmake --version | head -1
}

# Where a bench writes its JSON: beside the logs when $OUT is set, so that what a bench wrote
# before a step limit cut it off still comes back (the benches rewrite their JSON as they go).
results() { echo "${LOGDIR:-runs}/$1"; }

# Runs each Python test on build/weft; fails if any failed, after running them all.
py_tests() {
  local t rc=0
  for t in "$@"; do
    PYTHONPATH=tests${PYTHONPATH:+:$PYTHONPATH} python3 "$t" --weft build/weft || rc=1
  done
  return $rc
}

# Runs the command; if it fails, runs it again with WEFT_CUDA_EARLY_LAUNCH=0 (each kernel launched
# after the last ends, kernels.h) and says whether that passes, so a failure is pinned on early
# launch or not in the same session. Fails either way: the default must pass.
with_early_launch_check() {
  "$@" && return 0
  echo "== failed with early launch (the default); again with WEFT_CUDA_EARLY_LAUNCH=0:"
  if WEFT_CUDA_EARLY_LAUNCH=0 "$@"; then
    echo "== passes with WEFT_CUDA_EARLY_LAUNCH=0: early launch is what fails"
  else
    echo "== fails with WEFT_CUDA_EARLY_LAUNCH=0 too: not early launch alone"
  fi
  return 1
}

ensure_env() { # the kit's exports (each step is its own process; setup.sh is idempotent)
  source scripts/device/setup.sh >/dev/null || true
}

run_step() {
  case $1 in
    build) info; bash scripts/device/build.sh ;;
    ops) ensure_env; with_early_launch_check ./build/tests/backend_test_cuda_ops_match_cpu build/weft ;;
    parity) # device=cuda against device=cpu, and against itself: two runs of one job, every bit
      # equal; and a wait for a GPU whose work never ends ends the job (device_timeout, ~15 s)
      ensure_env
      with_early_launch_check py_tests tests/backend/test_cuda_matches_cpu_backend.py \
               tests/backend/test_cuda_training_repeats_bit_for_bit.py &&
        py_tests tests/backend/test_cuda_stuck_gpu_ends_the_job.py ;;
    rollout) # generation on the GPU: decode steps replayed from CUDA graphs equal launching every
      # kernel, generated log-probs equal the trainer's (device draws, speculation included),
      # rollout.batch_invariant's output is the same bytes whatever the batching, and a decode
      # step waits for the GPU once
      ensure_env
      py_tests tests/rollout/test_graph_replayed_decode_equals_kernel_by_kernel.py \
               tests/rollout/test_generated_logprobs_equal_trainer_logprobs.py \
               tests/rollout/test_batch_invariant_cuda_generate_is_invariant.py \
               tests/rollout/test_cuda_decode_waits_for_the_gpu_once_per_step.py ;;
    rl) # the RL loop on the GPU: rollout/trainer log-prob mismatch, the trainer's memory
      # offloaded during rollout (pinned host copies, exact byte accounting), TIS weights
      ensure_env
      py_tests tests/rl/test_rl_rollout_logprobs_equal_trainer_logprobs.py \
               tests/rl/test_rl_offload_frees_training_state_during_rollout.py \
               tests/rl/test_rl_truncated_importance_sampling_weighs_the_mismatch.py ;;
    bench-small|bench-1b)
      ensure_env
      local m=${1#bench-}
      python3 bench/gpu_train_throughput.py --weft build/weft --model "$m" --out "$(results "gpu_train_throughput_$m.json")" ;;
    attention) # the attention kernels alone against PyTorch's SDPA, on the 1B bench's shape
      ensure_env
      python3 bench/gpu_attention.py --build build --out "$(results gpu_attention.json)" ;;
    generate) # weft generate against transformers generate and the bandwidth bound, 1B model;
      # a transformers run past 90 s (the static cache compiling at batch 256 was, on an H100) is
      # reported unavailable; the JSON is rewritten after every run, so a step its limit cuts
      # (on the H200 the static cache's compiles at batch 64 still ran past 300 s) keeps the rest
      ensure_env
      python3 bench/gpu_generate_throughput.py --weft build/weft --peer-timeout 90 --json "$(results gpu_generate_throughput.json)" ;;
    speculative) # MTP speculative decoding on vs off on the GPU (issue 19's table): trains the
      # small MTP model on the GPU first (its own cache), fewer prompts and repeats than the CPU's
      ensure_env
      python3 bench/speculative_decoding.py --weft build/weft --device cuda --prompts 32 --repeats 2 --json "$(results gpu_speculative_decoding.json)" ;;
    profile) # weft's GPU time per op on the 1B step (no PyTorch run): where the step goes
      ensure_env
      python3 bench/gpu_train_throughput.py --weft build/weft --model 1b --steps 3 --profile --out runs/gpu_profile_1b.json ;;
    mpi) # MPI sanity on the CPU: 2 ranks must give the single process's losses
      ensure_env
      local t=(model.hidden_size=32 model.intermediate_size=64 model.num_layers=1 model.num_heads=2
               model.num_kv_heads=1 train.global_batch_size=8 data.synthetic_documents=64 train.steps=4)
      rm -rf /tmp/weft_mpi1 /tmp/weft_mpi2
      ./build/weft train "${t[@]}" train.output_dir=/tmp/weft_mpi1 | tail -1 &&
        mpirun --allow-run-as-root --oversubscribe -np 2 ./build/weft train "${t[@]}" train.output_dir=/tmp/weft_mpi2 | tail -1 &&
        python3 -c 'import json, sys
a, b = (json.loads(open(f"/tmp/weft_mpi{i}/metrics.jsonl").read().splitlines()[-1])["loss"] for i in (1, 2))
print(f"mpi: last loss 1 rank {a!r}, 2 ranks {b!r}"); sys.exit(abs(a - b) > 1e-6 * abs(a))' ;;
  esac
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
[ "${steps[*]}" = all ] && steps=(build ops parity rollout rl attention bench-small bench-1b generate speculative profile)
for s in "${steps[@]}"; do
  [ -n "${LIMIT[$s]:-}" ] || { echo "unknown step $s (all, ${!LIMIT[*]})" >&2; exit 2; }
done
rows=()
built_ok=1
export -f run_step info ensure_env results py_tests with_early_launch_check
export LOGDIR
for s in "${steps[@]}"; do
  left=$((BUDGET - (SECONDS - START)))
  lim=${LIMIT[$s]}
  [ "$lim" -gt $((left - 5)) ] && lim=$((left - 5))
  t0=$SECONDS
  if [ "$lim" -le 0 ]; then rc=124; echo "== $s: skipped, session budget spent"
  elif [ $built_ok = 0 ]; then rc=125; echo "== $s: skipped, build failed"
  else
    echo "== $s (limit ${lim}s)"
    timeout -k 10 "$lim" bash -c "run_step $s" 2>&1 | tee ${LOGDIR:+"$LOGDIR/$s.log"}
    rc=${PIPESTATUS[0]}
    [ "$s" = build ] && [ "$rc" != 0 ] && built_ok=0
  fi
  rows+=("$(printf '%-12s %5s %7s' "$s" "$rc" $((SECONDS - t0)))")
done

echo
echo "step          exit seconds   (124: step limit hit; 125: skipped after a failed build)"
printf '%s\n' "${rows[@]}"
for r in "${rows[@]}"; do [ "$(echo "$r" | awk '{print $2}')" = 0 ] || exit 1; done
