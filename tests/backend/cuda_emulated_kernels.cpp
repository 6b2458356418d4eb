// The CUDA backend's kernels and launchers (src/backend/cuda/*.cu), compiled for the CPU through
// cuda_emulation.h: with cuda_emulated_runtime.cpp they stand in for the GPU in weft_emulated.
#include "cuda_emulation.h"

#include "backend/cuda/attention.cu"
#include "backend/cuda/attention_hopper.cu"
#include "backend/cuda/attention_hopper_backward.cu"
#include "backend/cuda/attention_mma.cu"
#include "backend/cuda/cross_entropy.cu"
#include "backend/cuda/few_rows.cu"
#include "backend/cuda/kernels.cu"
#include "backend/cuda/paged.cu"
#include "backend/cuda/sampling.cu"
#include "backend/cuda/skinny.cu"
