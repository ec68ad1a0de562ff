// Entry points the torch binding calls. Each (dtype, head_dim) pair lives in its own
// instantiation file under hopper/instantiations/, compiled by nvcc without torch headers.
#pragma once
#include <cstddef>
#include <cuda_runtime.h>
#include "flash_params.h"

namespace flash_dash {

// Element type tags keep this header free of cutlass includes.
struct bf16_t {};
struct fp16_t {};

template <typename Element, int kHeadDim>
void run_fwd(FwdParams const& params, cudaStream_t stream);

// Bytes of device scratch the backward needs (fp32 dQ/dK/dV accumulators, dPsum, LSE log2,
// semaphores, debug trace); the caller passes an allocation of at least this size.
template <typename Element, int kHeadDim>
size_t bwd_workspace_bytes(BwdParams const& params);

template <typename Element, int kHeadDim>
void run_bwd(BwdParams const& params, void* workspace, cudaStream_t stream);

}  // namespace flash_dash
