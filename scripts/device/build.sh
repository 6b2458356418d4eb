#!/usr/bin/env bash
# Run THERE, in the repo root or anywhere:  bash scripts/device/build.sh
# Sets up the dependencies (setup.sh), configures and builds weft into build/ and fails if
# build/weft or the CUDA plugin it opens (build/libweft_cuda.so) has an unresolved library or
# the plugin does not open. WEFT_CUDA=OFF builds without CUDA (the chroot test);
# CUDA_ARCH (default 90a: H100/H200, with the arch-specific instructions of the Hopper
# attention forward) picks the GPU architecture.
set -euo pipefail
cd "$(dirname "$0")/../.."
export WEFT_CUDA=${WEFT_CUDA:-ON}
# shellcheck source=setup.sh
source scripts/device/setup.sh || { echo "build.sh: a dependency is MISSING (see above)" >&2; exit 1; }

args=(-S . -B build -DCMAKE_BUILD_TYPE=Release -DWEFT_CUDA="$WEFT_CUDA")
[ "$WEFT_CUDA" != OFF ] && args+=(-DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90a}")
command -v python3 >/dev/null && args+=(-DWEFT_PYTHON="$(command -v python3)") # ctest's Python
[ ! -e build/CMakeCache.txt ] && command -v ninja >/dev/null && args+=(-G Ninja)
read -ra extra <<<"${WEFT_CMAKE_ARGS:-}"
echo "+ cmake ${args[*]} ${extra[*]}"
cmake "${args[@]}" "${extra[@]}"
cmake --build build -j "${JOBS:-16}" 2>&1 | tee /tmp/weft_build.log
grep -i "spill" /tmp/weft_build.log && echo "build.sh: WARNING: kernels above spill registers to local memory (slow)"

plugin=$([ -e build/libweft_cuda.so ] && echo build/libweft_cuda.so || true)
echo "ldd build/weft $plugin (kit, MPI, BLAS, NCCL, CUDA libraries):"
ldd build/weft $plugin | grep -E "${WEFT_KIT_PREFIX:-/opt/weftkit}|mpi|blas|nccl|cuda|cublas|gomp|jansson|yaml|pcre2" || true
if ldd build/weft $plugin build/tests/* | grep "not found"; then
  echo "build.sh: FAILED: unresolved libraries above" >&2
  exit 1
fi
# Opens the plugin the way weft does (and checks that a CPU backend loads no CUDA library).
if [ -n "$plugin" ] && ! ./build/tests/backend_test_cpu_jobs_never_load_cuda_libraries; then
  echo "build.sh: FAILED: the CUDA plugin does not open (above)" >&2
  exit 1
fi
echo "build.sh: OK"
