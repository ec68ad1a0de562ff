// How each role of a backward CTA walks its K/V tiles (the same sequence for every role). Static grids compute the
// next tile from the policy; on the dynamic grid the producer claims it from the global counter and publishes it
// through the shared-memory ring (tile_ring.hpp), and the other roles read what it published.
#pragma once
#include "schedule/policies.hpp"
#include "schedule/tile_ring.hpp"

namespace flash_dash {
namespace bwd {

// kReaders: the threads that read the ring (every thread of the roles other than the producer).
template <class Policy, int kReaders>
struct TileWalk {
    using Ring = TileRing<kReaders>;

    // Producer: the tile after t; `k` counts the tiles it published before.
    static __device__ __forceinline__ int claim_next(TileRingStorage& ring, SchedShape const& s, int* counter, int t,
                                                     int k) {
        if constexpr (Policy::kDynamic) { return Ring::publish(ring, k, counter, s.grid); }
        else { return Policy::next_tile(s, t); }
    }

    // Every other role: the tile after t; `k` counts the tiles it read before.
    static __device__ __forceinline__ int read_next(TileRingStorage& ring, SchedShape const& s, int t, int k) {
        if constexpr (Policy::kDynamic) { return Ring::consume(ring, k); }
        else { return Policy::next_tile(s, t); }
    }
};

}  // namespace bwd
}  // namespace flash_dash
