// Host helpers shared by the forward and backward launchers.
#pragma once
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <cuda_runtime.h>

namespace flash_dash {

inline void check_cuda(cudaError_t e, char const* what) {
    if (e != cudaSuccess) {
        throw std::runtime_error(std::string("flash_dash: ") + what + ": " + cudaGetErrorString(e));
    }
}

inline void check_launch(char const* what) { check_cuda(cudaGetLastError(), what); }

// Opts `Kernel` in to `bytes` of dynamic shared memory on the current device, once per device and kernel (the
// attribute is per device context; calling it once also keeps it out of CUDA-graph captures after the first launch).
// The kernel is a template argument, not a parameter: kernels of one signature must not share the flags.
template <auto Kernel>
void allow_dynamic_smem(int bytes) {
    static std::atomic<uint64_t> done{0};  // one bit per device ordinal < 64
    int dev = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    uint64_t const bit = dev < 64 ? uint64_t(1) << dev : 0;
    if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) { return; }
    check_cuda(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "smem attribute");
    done.fetch_or(bit, std::memory_order_release);
}

}  // namespace flash_dash
