// Hand-off of each step's dQ tile from the two MMA warpgroups to the dQ-store warp, through shared memory.
// Each warpgroup writes its slice (half the tile) of buffer `buffer(iter)`; the store warp bulk-adds both
// slices into the fp32 accumulator and then gives the buffer back. `iter` counts the steps of the CTA
// (every role walks the same steps, so the counts agree).
//   kStages 1 (default): one buffer, named barriers dQFull/dQEmpty per warpgroup; the store warp gives
//     the slices back at the start of its next step, after the previous step's add completed.
//   kStages 2 (FLASH_DASH_BWD_DQ_STAGES=2): two buffers used on alternate steps, one mbarrier pair per
//     (buffer, warpgroup), so a warpgroup may run a step further ahead of a store warp that waits for its
//     rank predecessor, and neither warpgroup waits for the other's slice.
#pragma once
#include <cstdint>
#include <cutlass/arch/barrier.h>
#include "tile_ring.hpp"

namespace flash_dash {
namespace bwd {

// Named barrier ids (user ids 0..7; NamedBarrier adds 8). dQFull0/1 and dQEmpty0/1 belong to MMA
// warpgroup 0 and 1 (one dQ buffer).
enum class BwdBarrier : uint32_t { PdS = 0, dQFull0 = 1, dQFull1 = 2, dQEmpty0 = 3, dQEmpty1 = 4, Epilogue = 5 };

template <int kStages>
struct DqHandoffStorage {  // one buffer: named barriers only
};
template <>
struct DqHandoffStorage<2> {
    alignas(8) uint64_t full[2][2];   // [buffer][warpgroup]: the warpgroup's 128 threads wrote their slice
    alignas(8) uint64_t empty[2][2];  // [buffer][warpgroup]: the store warp is done reading the slice
};

// Two buffers are a two-slot ring per warpgroup (tile_ring.hpp's slot/phase arithmetic).
template <int kStages, int kNumWG, int kSliceFloats>
struct DqHandoff {
    static_assert(kStages == 1 || kStages == 2, "FLASH_DASH_BWD_DQ_STAGES must be 1 or 2");
    static_assert(kNumWG == 2, "BwdBarrier and DqHandoffStorage hold two MMA warpgroups");
    static constexpr uint32_t kNamedBarThreads = 128 + 32;  // one MMA warpgroup + the store warp
    using Bar = cutlass::arch::ClusterBarrier;
    using Storage = DqHandoffStorage<kStages>;

    static __device__ __forceinline__ int buffer(int iter) { return kStages == 1 ? 0 : ring2_slot(iter); }
    static __device__ __forceinline__ uint32_t phase(int iter) { return ring2_phase(iter); }
    static __device__ __forceinline__ float* slice(float* smem_dq, int iter, int wg) {
        return smem_dq + (buffer(iter) * kNumWG + wg) * kSliceFloats;
    }

    static __device__ __forceinline__ void init(Storage& s) {  // one thread, before the CTA-wide sync
        if constexpr (kStages == 2) {
            for (int b = 0; b < 2; ++b) {
                for (int w = 0; w < kNumWG; ++w) {
                    Bar::init(&s.full[b][w], 128);
                    Bar::init(&s.empty[b][w], 1);
                }
            }
        }
    }

    // ---- MMA warpgroup `wg` (all 128 threads) ----
    static __device__ __forceinline__ void mma_acquire(Storage& s, int iter, int wg) {
        if constexpr (kStages == 1) {
            cutlass::arch::NamedBarrier::sync(kNamedBarThreads, uint32_t(wg == 0 ? BwdBarrier::dQEmpty0 : BwdBarrier::dQEmpty1));
        } else {
            Bar::wait(&s.empty[buffer(iter)][wg], phase(iter) ^ 1u);  // a buffer's first use passes at once
        }
    }
    // After the slice is written and fenced for the async proxy.
    static __device__ __forceinline__ void mma_commit(Storage& s, int iter, int wg) {
        if constexpr (kStages == 1) {
            cutlass::arch::NamedBarrier::arrive(kNamedBarThreads, uint32_t(wg == 0 ? BwdBarrier::dQFull0 : BwdBarrier::dQFull1));
        } else {
            Bar::arrive(&s.full[buffer(iter)][wg]);
        }
    }

    // ---- dQ-store warp (all 32 lanes) ----
    static __device__ __forceinline__ void store_begin() {  // the previous step's add has completed
        if constexpr (kStages == 1) {
            cutlass::arch::NamedBarrier::arrive(kNamedBarThreads, uint32_t(BwdBarrier::dQEmpty0));
            cutlass::arch::NamedBarrier::arrive(kNamedBarThreads, uint32_t(BwdBarrier::dQEmpty1));
        }
    }
    static __device__ __forceinline__ void store_wait(Storage& s, int iter, int wg) {  // slice `wg` written
        if constexpr (kStages == 1) {
            cutlass::arch::NamedBarrier::sync(kNamedBarThreads, uint32_t(wg == 0 ? BwdBarrier::dQFull0 : BwdBarrier::dQFull1));
        } else {
            Bar::wait(&s.full[buffer(iter)][wg], phase(iter));
        }
    }
    // This step's add has completed (or, non-deterministic, read its source): the buffer may be rewritten.
    static __device__ __forceinline__ void store_end(Storage& s, int iter, int lane) {
        if constexpr (kStages == 2) {
            if (lane == 0) {
                for (int w = 0; w < kNumWG; ++w) { Bar::arrive(&s.empty[buffer(iter)][w]); }
            }
        }
    }
};

}  // namespace bwd
}  // namespace flash_dash
