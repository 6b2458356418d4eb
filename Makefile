# Thin wrapper over CMake.
BUILD ?= build
JOBS ?= $(shell nproc)
# CMake's generated makefiles recurse: without this every level says Entering/Leaving directory.
MAKEFLAGS += --no-print-directory

.PHONY: all test sanitize fuzz bench bench-gpu clean
all:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: all
	cd $(BUILD) && ctest --output-on-failure -j 2

sanitize:
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DWEFT_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -E 'default_job|resume|bpe'

# libFuzzer targets (tests/fuzz), built with clang into build-fuzz/ and run FUZZ_SECONDS each, or
# FUZZ_RUNS executions each if that comes first (the hardening run: FUZZ_RUNS=1000000
# FUZZ_SECONDS=1800); FUZZ_TARGETS picks some (default: all). Crash and leak inputs go to
# build-fuzz/crashes/.
FUZZ_SECONDS ?= 180
FUZZ_RUNS ?=
FUZZ_TARGETS ?=
fuzz:
	FUZZ_RUNS=$(FUZZ_RUNS) bash tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

bench: all
	/usr/bin/python3 bench/train_throughput.py --weft $(BUILD)/weft
	/usr/bin/python3 bench/generate_throughput.py --weft $(BUILD)/weft
	/usr/bin/python3 bench/speculative_decoding.py --weft $(BUILD)/weft
	/usr/bin/python3 bench/parallel_and_mtp.py --weft $(BUILD)/weft
	/usr/bin/python3 bench/context_parallel.py --weft $(BUILD)/weft
	/usr/bin/python3 bench/dynamic_context_parallel.py --weft $(BUILD)/weft
	/usr/bin/python3 bench/dcp_simulation.py --weft $(BUILD)/weft
	/usr/bin/python3 bench/rl_step.py --weft $(BUILD)/weft

# Needs an NVIDIA GPU and a CUDA build (nvcc found when CMake configured), and a Python whose torch
# sees the GPU: the first python3 on PATH unless GPU_PYTHON says otherwise.
GPU_PYTHON ?= python3
bench-gpu: all
	$(GPU_PYTHON) bench/gpu_attention.py --build $(BUILD)
	$(GPU_PYTHON) bench/gpu_train_throughput.py --weft $(BUILD)/weft
	$(GPU_PYTHON) bench/gpu_generate_throughput.py --weft $(BUILD)/weft

clean:
	rm -rf $(BUILD) build-asan build-fuzz
