// Hand-off of each step's dQ tile from the two MMA warpgroups to the dQ-store warp, through one shared-memory
// buffer. Each warpgroup writes its slice (half the tile); the store warp bulk-adds both slices into the
// fp32 accumulator and gives the slices back at the start of its next step, after the previous step's add
// completed. Named barriers dQFull/dQEmpty per warpgroup, so neither warpgroup waits for the other's slice.
// (Two buffers on alternate steps measured no better: named barriers shared by both warpgroups, non-det
// -3-4%; an mbarrier pair per (buffer, warpgroup), det shift full 16k 562 vs 575 TFLOP/s;
// benchmarks/results/NOTES.md sessions 5 and 6.)
#pragma once
#include <cstdint>
#include <cutlass/arch/barrier.h>

namespace flash_dash {
namespace bwd {

// Named barrier ids (user ids 0..7; NamedBarrier adds 8). dQFull0/1 and dQEmpty0/1 belong to MMA
// warpgroup 0 and 1.
enum class BwdBarrier : uint32_t { PdS = 0, dQFull0 = 1, dQFull1 = 2, dQEmpty0 = 3, dQEmpty1 = 4, Epilogue = 5 };

template <int kNumWG, int kSliceFloats>
struct DqHandoff {
    static_assert(kNumWG == 2, "BwdBarrier holds two MMA warpgroups");
    static constexpr uint32_t kNamedBarThreads = 128 + 32;  // one MMA warpgroup + the store warp

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
    static __device__ __forceinline__ void store_begin() {  // the previous step's add has completed
        cutlass::arch::NamedBarrier::arrive(kNamedBarThreads, empty(0));
        cutlass::arch::NamedBarrier::arrive(kNamedBarThreads, empty(1));
    }
    static __device__ __forceinline__ void store_wait(int wg) { cutlass::arch::NamedBarrier::sync(kNamedBarThreads, full(wg)); }
};

}  // namespace bwd
}  // namespace flash_dash
