// Dynamic tile assignment of a persistent grid (the backward's dynamic policies, the varlen forward): CTA g starts
// with tile g; afterwards its producer claims the next unclaimed tile from a global counter (tiles are handed out in
// increasing order, whichever CTA frees up first) and passes it to the CTA's other roles through a 2-slot ring
// in shared memory. Two slots let the producer publish tile j+1 while the consumers still work on
// tile j; it waits only for slot reuse (tile j-1 read by every consumer).
#pragma once
#include <cstdint>
#include <cutlass/arch/barrier.h>

namespace flash_dash {

struct TileRingStorage {
    alignas(8) uint64_t full[2];
    alignas(8) uint64_t empty[2];
    int tile[2];
};

// kConsumerThreads: every thread that reads the ring arrives on `empty` once per tile.
template <int kConsumerThreads>
struct TileRing {
    using Bar = cutlass::arch::ClusterBarrier;

    static __device__ __forceinline__ void init(TileRingStorage& r) {  // one thread, before the CTA-wide sync
        for (int i = 0; i < 2; ++i) {
            Bar::init(&r.full[i], 1);
            Bar::init(&r.empty[i], kConsumerThreads);
        }
    }

    // Producer (one thread): claims the CTA's next tile, publishes it as publication number `k`
    // (0, 1, 2, ... per CTA) and returns it. `grid` tiles were handed out statically (one per CTA).
    static __device__ __forceinline__ int publish(TileRingStorage& r, int k, int* counter, int grid) {
        int const slot = k & 1;
        Bar::wait(&r.empty[slot], ((k >> 1) & 1) ^ 1);  // first use of a slot passes at once
        int const t = grid + atomicAdd(counter, 1);
        r.tile[slot] = t;
        Bar::arrive(&r.full[slot]);
        return t;
    }

    // Every consumer thread: reads publication number `k`.
    static __device__ __forceinline__ int consume(TileRingStorage& r, int k) {
        int const slot = k & 1;
        Bar::wait(&r.full[slot], (k >> 1) & 1);
        int const t = r.tile[slot];
        Bar::arrive(&r.empty[slot]);
        return t;
    }
};

}  // namespace flash_dash
