# Thin wrapper over CMake.
BUILD ?= build
JOBS ?= $(shell nproc)
# CMake's generated makefiles recurse: without this every level says Entering/Leaving directory.
MAKEFLAGS += --no-print-directory

.PHONY: all test sanitize sanitize-kernels fuzz bench bench-gpu clean
all:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: all
	cd $(BUILD) && ctest --output-on-failure -j 2

sanitize:
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DWEFT_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -E 'default_job|resume|bpe'

# The CUDA kernels' emulated tests (C++) under AddressSanitizer, in their own release build:
# out-of-bounds global or shared memory in a kernel. 23 minutes on 2 cores run one at a time.
ASAN_FLAGS = -fsanitize=address -fno-omit-frame-pointer
EMULATED_KERNEL_TESTS = backend_test_cuda_kernels_match_reference \
	backend_test_cuda_attention_kernels_match_reference backend_test_cuda_ops_match_cpu_emulated
sanitize-kernels:
	@cmake -S . -B build-asan-kernels -DCMAKE_BUILD_TYPE=Release "-DCMAKE_C_FLAGS=$(ASAN_FLAGS)" \
		"-DCMAKE_CXX_FLAGS=$(ASAN_FLAGS)" -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address >/dev/null
	@cmake --build build-asan-kernels -j $(JOBS) --target $(EMULATED_KERNEL_TESTS)
	cd build-asan-kernels && ASAN_OPTIONS=detect_leaks=0 ctest -j 2 --output-on-failure \
		-R 'cuda_(attention_)?kernels_match_reference|cuda_ops_match_cpu_emulated'

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
	rm -rf $(BUILD) build-asan build-asan-kernels build-fuzz
