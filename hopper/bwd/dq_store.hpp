// Backward dQ-store role (warps 1 and 2 of warpgroup 0): each step's fresh dQ tile, handed
// over by the MMA warpgroups through shared memory (dq_handoff.hpp), goes into the fp32 accumulator: the schedule's
// rank 0 stores (cp.async.bulk), every later rank bulk reduce-adds, behind a per-(m tile, batch, head) counter.
// Deterministic: rank r waits until the counter is r; otherwise only until rank 0's store landed (counter >= 1).
// GQA-folded tiles walk their steps once per sibling head, each into that head's dQ tiles (schedule/sibling_walk.hpp).
// Two store warps take the CTA's steps alternately: the owner of step g waits for its turn (the owner of step g - 1
// has read its slices: the buffer is free, and no other warp waits on the hand-off barriers), takes the hand-off,
// passes the turn once its copies have read the slices, and only then waits for them to complete and releases.
#pragma once
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>

#include "bwd/bulk_copy.hpp"
#include "bwd/kernel_params.hpp"
#include "bwd/roles.hpp"
#include "bwd/semaphore.hpp"
#include "bwd/tiles.hpp"
#include "bwd/timeline.hpp"
#include "schedule/sibling_walk.hpp"

namespace flash_dash {
namespace bwd {

template <class Traits, bool Deterministic, class Policy, bool GqaFold, bool Varlen>
struct BwdDqStore {
    using Tiles = BwdTiles<Varlen, GqaFold>;
    using Walk = BwdTileWalk<Traits, Policy>;
    static constexpr int kWarps = kDqStoreWarps;
    using SharedStorage = typename Traits::SharedStorage;
    using Handoff = typename Traits::DqHandoffT;
    using TurnBar = cutlass::arch::ClusterBarrier;
    // Non-deterministic: how many of the ranks before it a contribution may run ahead of.
    static constexpr int kNondetSlack = 2;

    // The turns (lane 0): an mbarrier per store warp (count 1) completes a phase each time the turn is passed to that
    // warp. Passes to a warp alternate with its waits, so the owner of step g (> 0) waits for pass (g - 1) / kWarps.
    static __device__ __forceinline__ void init_turns(SharedStorage& ss) {
        for (int w = 0; w < kWarps; ++w) { TurnBar::init(&ss.dq_turn[w], 1); }
    }
    static __device__ __forceinline__ void wait_turn(SharedStorage& ss, int g) {
        if (g > 0) { TurnBar::wait(&ss.dq_turn[g % kWarps], uint32_t((g - 1) / kWarps) & 1u); }
    }
    static __device__ __forceinline__ void pass_turn(SharedStorage& ss, int g) {
        TurnBar::arrive(&ss.dq_turn[(g + 1) % kWarps]);
    }

    // All 32 lanes of the warp; lane 0 issues the copies and owns the counters.
    // `warp`: this store warp's index in [0, kWarps): it owns the CTA's steps g with g % kWarps == warp.
    CUTLASS_DEVICE static void run(BwdKernelParams<Traits> const& params, SharedStorage& ss, int lane, int num_tiles,
                                   int warp) {
        constexpr int kBlockM = Traits::kBlockM;
        constexpr int kHeadDim = Traits::kHeadDim;
        constexpr uint32_t kSliceBytes = Traits::kdQSliceFloats * sizeof(float);
        SchedShape const& sched = params.sched;
        auto const siblings = Tiles::grid_siblings(params.group);
        int read = 0;
        int step_of_cta = 0;  // g: the CTA's steps so far, over its tiles and siblings
        for (int t = Policy::first_tile(sched, blockIdx.x); t < num_tiles;
             t = Walk::read_next(ss.tile_ring, sched, t, read++)) {
            TileCtx c;
            SchedShape seq_shape{};
            VarlenSeq seq{};
            SchedShape const& shape = Tiles::template at<Policy>(params, t, c, seq_shape, seq);
            auto const st = Policy::init(shape, c);
            int const steps = Policy::num_steps(shape, c, st);
            auto head = [&](int h) CUTLASS_LAMBDA_FUNC_INLINE {
                return cute::make_tuple(h, int64_t(c.b) * siblings.query_heads(sched) + h);
            };
            // Not unrolled (for_each_step): see the producer loop (load.hpp).
            Tiles::tile_siblings(params.group, seq).for_each_step(c, steps, head, [&](auto const& hb, int step) CUTLASS_LAMBDA_FUNC_INLINE {
                auto const& [h, bh] = hb;
                int const g = step_of_cta++;
                if (g % kWarps != warp) { return; }
                int const m = Policy::m_block(shape, c, st, step);
                // The dQ tile's accumulator and counter: (b, h, m)'s, or tile m of the sequence's tiles of head h.
                int64_t const tile = Varlen ? int64_t(h) * params.varlen_m_cap + seq.m_start + m : bh * sched.num_m + m;
                float* gacc = params.dq_accum + tile * int64_t(kBlockM * kHeadDim);
                int* sem = params.dq_sem + (Varlen ? tile : (int64_t(m) * sched.batch + c.b) * siblings.query_heads(sched) + h);
                // One buffer: the slices go back to the MMA WGs here, once the previous step's owner has read them
                // (its turn).
                if (lane == 0) { wait_turn(ss, g); }
                __syncwarp();
                Handoff::store_begin();
                // The first contribution (rank 0) stores, so the accumulator needs no zero fill.
                // Deterministic: rank r waits for ranks 0..r-1. Otherwise for rank 0 and for any r - kNondetSlack
                // of the others (adds after the first are unordered): the waits keep the CTAs near the schedule's
                // stagger, where without them they drift onto the same dQ tiles. Fewer waits than the
                // proven-deadlock-free deterministic order, hence deadlock-free too.
                int const rank = Policy::rank(shape, c, st, m);
                StepTimeline timeline(params.timeline, (bh * sched.num_m + m) * sched.num_n + rank);
                if (lane == 0) {
                    if constexpr (Deterministic) { wait_eq(sem, rank); }
                    else if (rank > 0) { wait_ge(sem, rank > kNondetSlack ? rank - kNondetSlack : 1); }
                    fence_proxy_async_global();
                    timeline.acquired();
                }
                __syncwarp();
                auto add_slice = [&](int slice) {
                    float* dst = gacc + slice * Traits::kdQSliceFloats;
                    float const* src = Handoff::slice(ss.smem_dqacc, slice);
                    if (rank == 0) { bulk_store(dst, src, kSliceBytes); }
                    else { bulk_reduce_add_f32(dst, src, kSliceBytes); }
                };
                Handoff::store_wait(0);
                if (lane == 0) { add_slice(0); }
                Handoff::store_wait(1);
                if (lane == 0) {
                    timeline.ready();
                    add_slice(1);
                    bulk_commit_group();
                    int pos;
                    bulk_wait_group_read_0();
                    pass_turn(ss, g);
                    if (Deterministic || rank == 0) {
                        bulk_wait_group_0();          // reductions COMPLETED, not just smem read
                        fence_proxy_async_global();
                        pos = rank;
                        red_release_add(sem, 1);
                    } else {
                        pos = atomicAdd(sem, 1);
                    }
                    if (params.order_trace != nullptr && pos < sched.num_n) {
                        params.order_trace[(bh * sched.num_m + m) * sched.num_n + pos] = c.n;
                    }
                    timeline.done(int(blockIdx.x), step);
                }
                __syncwarp();
            });
        }
        if (lane == 0) { bulk_wait_group_0(); }
    }
};

}  // namespace bwd
}  // namespace flash_dash
