// The backward CTA's warp roles: how many dQ-store warps it runs, and so how many threads read the dynamic grid's
// tile ring (every role walks the same tiles: schedule/tile_walk.hpp).
#pragma once
#include "schedule/tile_walk.hpp"

namespace flash_dash {
namespace bwd {

// dQ-store warps: two, on alternate steps, so that one waits for its step's reductions to complete (the release the
// next rank waits for: every rank's when deterministic, rank 0's otherwise) while the other takes the next step's
// hand-off.
constexpr int kDqStoreWarps = 2;

// Threads that read the dynamic grid's tile ring: the MMA warpgroups and the dQ-store warps.
template <class Traits>
constexpr int kTileRingReaders = Traits::NumMmaThreads + 32 * kDqStoreWarps;

// How every role of a CTA walks its tiles.
template <class Traits, class Policy>
using BwdTileWalk = TileWalk<Policy, kTileRingReaders<Traits>>;

}  // namespace bwd
}  // namespace flash_dash
