// Hand-off of each step's dQ tile from the two MMA warpgroups to the dQ-store warp that owns the step, through one
// shared-memory buffer. Each warpgroup writes its slice (half the tile); the store warp bulk-adds both slices into
// the fp32 accumulator and gives the slices back at the start of the step, once the previous step's copies have read
// them (the store warps' turns: bwd/dq_store.hpp). Named barriers dQFull/dQEmpty per warpgroup, so neither warpgroup
// waits for the other's slice; they see one store warp at a time. (Two buffers on alternate steps measured no better in two designs.)
#pragma once
#include <cstdint>
#include <cutlass/arch/barrier.h>

#include "bwd/barriers.hpp"

namespace flash_dash {
namespace bwd {

// kFragFloats: fp32 dQ accumulator values per MMA thread.
template <int kNumWG, int kFragFloats>
struct DqHandoff {
    static_assert(kNumWG == 2, "BwdBarrier holds two MMA warpgroups");
    static_assert(kFragFloats % 4 == 0);
    static constexpr int kThreadsPerWG = 128;
    static constexpr int kSliceFloats = kFragFloats * kThreadsPerWG;  // one warpgroup's half of the tile
    static constexpr uint32_t kNamedBarThreads = kThreadsPerWG + 32;  // one MMA warpgroup + the store warp

    // Where float4 j of thread t lies in a slice (and in the fp32 accumulator tile, which keeps this order): the
    // threads' j-th float4s are adjacent, so a warpgroup's stores and the postprocess's loads are contiguous.
    static __host__ __device__ __forceinline__ constexpr int float4_offset(int j, int t) {
        return j * (kThreadsPerWG * 4) + t * 4;
    }
    template <class T>
    static __host__ __device__ __forceinline__ T* float4_at(T* slice, int j, int t) {
        return slice + j * (kThreadsPerWG * 4) + t * 4;
    }

    static __device__ __forceinline__ float* slice(float* smem_dq, int wg) { return smem_dq + wg * kSliceFloats; }
    static __device__ __forceinline__ uint32_t full(int wg) {
        return uint32_t(wg == 0 ? BwdBarrier::dQFull0 : BwdBarrier::dQFull1);
    }
    static __device__ __forceinline__ uint32_t empty(int wg) {
        return uint32_t(wg == 0 ? BwdBarrier::dQEmpty0 : BwdBarrier::dQEmpty1);
    }

    // ---- MMA warpgroup `wg` (all 128 threads) ----
    static __device__ __forceinline__ void mma_acquire(int wg) { cutlass::arch::NamedBarrier::sync(kNamedBarThreads, empty(wg)); }
    // After the slice is written and fenced for the async proxy.
    static __device__ __forceinline__ void mma_commit(int wg) { cutlass::arch::NamedBarrier::arrive(kNamedBarThreads, full(wg)); }

    // ---- dQ-store warp (all 32 lanes) ----
    static __device__ __forceinline__ void store_begin() {  // the previous step's copies have read the slices
        cutlass::arch::NamedBarrier::arrive(kNamedBarThreads, empty(0));
        cutlass::arch::NamedBarrier::arrive(kNamedBarThreads, empty(1));
    }
    static __device__ __forceinline__ void store_wait(int wg) { cutlass::arch::NamedBarrier::sync(kNamedBarThreads, full(wg)); }
};

}  // namespace bwd
}  // namespace flash_dash
