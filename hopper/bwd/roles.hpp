// The backward CTA's warp roles that depend on the mode: how many dQ-store warps it runs, and so how many threads
// read the dynamic grid's tile ring (every role walks the same tiles: schedule/tile_walk.hpp).
#pragma once
#include "schedule/tile_walk.hpp"

namespace flash_dash {
namespace bwd {

// dQ-store warps: deterministic kernels run two on alternate steps, so that one waits for its step's reductions to
// complete (the release the next rank waits for) while the other takes the next step's hand-off; a
// non-deterministic store does not wait for completion after rank 0 and keeps one.
template <bool Deterministic>
constexpr int kDqStoreWarps = Deterministic ? 2 : 1;

// Threads that read the dynamic grid's tile ring: the MMA warpgroups and the dQ-store warps.
template <class Traits, bool Deterministic>
constexpr int kTileRingReaders = Traits::NumMmaThreads + 32 * kDqStoreWarps<Deterministic>;

// How every role of a CTA walks its tiles.
template <class Traits, class Policy, bool Deterministic>
using BwdTileWalk = TileWalk<Policy, kTileRingReaders<Traits, Deterministic>>;

}  // namespace bwd
}  // namespace flash_dash
