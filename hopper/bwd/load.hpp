// Backward producer role (warp 0 of warpgroup 0, one thread): TMA loads of K/V once per tile and of Q+LSE and
// dO+dPsum per step through their pipelines (bwd/qdo_pipelines.hpp; per sibling head when GQA-folded); on the dynamic
// grid it also claims the CTA's next tile.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "bwd/bulk_copy.hpp"
#include "bwd/kernel_params.hpp"
#include "bwd/qdo_pipelines.hpp"
#include "bwd/roles.hpp"
#include "bwd/tiles.hpp"
#include "schedule/sibling_walk.hpp"

namespace flash_dash {
namespace bwd {

template <class Traits, class Policy, bool GqaFold, bool Varlen>
struct BwdLoad {
    using Tiles = BwdTiles<Varlen, GqaFold>;
    using Walk = BwdTileWalk<Traits, Policy>;
    using SharedStorage = typename Traits::SharedStorage;
    using PipelineQ = typename Traits::PipelineQ;
    using PipelinedO = typename Traits::PipelinedO;
    using ClusterTxBar = cutlass::arch::ClusterTransactionBarrier;
    using ClusterBar = cutlass::arch::ClusterBarrier;

    // The CTA's loads, tile by tile in the policy's order; issued by one thread.
    CUTLASS_DEVICE static void run(BwdKernelParams<Traits> const& params, SharedStorage& ss, PipelineQ& pipeline_q,
                                   PipelinedO& pipeline_do, int num_tiles) {
        using namespace cute;
        constexpr int kBlockM = Traits::kBlockM;
        SchedShape const& sched = params.sched;  // stays in the param bank (no registers)
        auto const siblings = Tiles::grid_siblings(params.group);
        Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
        Tensor sdO = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdO{});
        Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
        Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
        auto shape_q = make_shape(sched.seqlen_q, params.head_dim, siblings.query_heads(sched), sched.batch);
        auto shape_k = make_shape(sched.seqlen_k, params.head_dim, sched.heads_k, sched.batch);
        // dO and V: their own head dim (shape_q / shape_k's otherwise).
        auto shape_do = make_shape(sched.seqlen_q, int(Traits::kHeadDimV), siblings.query_heads(sched), sched.batch);
        auto shape_v = make_shape(sched.seqlen_k, int(Traits::kHeadDimV), sched.heads_k, sched.batch);
        Tensor mQ = params.tma_q.get_tma_tensor(shape_q);
        Tensor mdO = params.tma_do.get_tma_tensor(shape_do);
        Tensor mK = params.tma_k.get_tma_tensor(shape_k);
        Tensor mV = params.tma_v.get_tma_tensor(shape_v);
        cutlass::PipelineState<Traits::kStagesQ> pipe_write = cutlass::make_producer_start_state<PipelineQ>();
        using DoStates = DoState<Traits::kStagesQ, Traits::kStagesdO>;
        [[maybe_unused]] typename DoStates::type pipe_write_do{};  // dO's own (bwd/qdo_pipelines.hpp)
        if constexpr (DoStates::kOwnState) { pipe_write_do = cutlass::make_producer_start_state<PipelinedO>(); }
        // The (global, shared) TMA partitions of tile c's K and V rows (K/V head hk).
        auto kv_partitions = [&](int hk, TileCtx const& c, VarlenSeq const& seq) CUTLASS_LAMBDA_FUNC_INLINE {
            Tensor gK = local_tile(Tiles::rows(mK, hk, c.b, seq.k_start), Shape<typename Traits::TileN, typename Traits::TileD>{}, make_coord(c.n, _0{}));
            Tensor gV = local_tile(Tiles::rows(mV, hk, c.b, seq.k_start), Shape<typename Traits::TileN, typename Traits::TileDV>{}, make_coord(c.n, _0{}));
            auto k = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
            auto v = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
            return cute::make_tuple(get<0>(k), get<1>(k), get<0>(v), get<1>(v));
        };
        int kv_iter = 0;
        int claimed = 0;
        for (int t = Policy::first_tile(sched, blockIdx.x); t < num_tiles;
             t = Walk::claim_next(ss.tile_ring, sched, params.tile_counter, t, claimed++)) {
            TileCtx c;
            SchedShape seq_shape{};
            VarlenSeq seq{};
            SchedShape const& shape = Tiles::template at<Policy>(params, t, c, seq_shape, seq);
            auto const st = Policy::init(shape, c);
            int const steps = Policy::num_steps(shape, c, st);
            if (steps <= 0) continue;
            auto const walk = Tiles::tile_siblings(params.group, seq);
            auto [tKgK, tKsK, tVgV, tVsV] = kv_partitions(walk.kv_head(c), c, seq);

            ClusterTxBar::arrive_and_expect_tx(&ss.barrier_kv, Traits::kTmaBytesK + Traits::kTmaBytesV);
            copy(params.tma_k.with(ss.barrier_kv), tKgK, tKsK);
            copy(params.tma_v.with(ss.barrier_kv), tVgV, tVsV);
            auto head = [&](int h) CUTLASS_LAMBDA_FUNC_INLINE {
                Tensor gQ = local_tile(Tiles::rows(mQ, h, c.b, seq.q_start), Shape<typename Traits::TileM, typename Traits::TileD>{}, make_coord(_, _0{}));
                Tensor gdO = local_tile(Tiles::rows(mdO, h, c.b, seq.q_start), Shape<typename Traits::TileM, typename Traits::TileDV>{}, make_coord(_, _0{}));
                auto q = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
                auto dO = tma_partition(params.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
                // The tile's LSE / dPsum rows: (b, h)'s, or the sequence's tiles of head h.
                int64_t const row_base = Varlen ? (int64_t(h) * params.varlen_m_cap + seq.m_start) * kBlockM
                                                : int64_t(c.b * siblings.query_heads(sched) + h) * sched.num_m * kBlockM;
                return cute::make_tuple(get<0>(q), get<1>(q), get<0>(dO), get<1>(dO), params.lse_log2 + row_base,
                                        params.dpsum + row_base);
            };
            // Not unrolled (for_each_step): one thread issuing TMA gains nothing from it, and unrolling made the
            // 24-register warps (hdim 64) spill inside this loop.
            walk.for_each_step(c, steps, head, [&](auto const& ht, int step) CUTLASS_LAMBDA_FUNC_INLINE {
                auto const& [tQgQ, tQsQ, tdOgdO, tdOsdO, lse_tile, dpsum_tile] = ht;
                int const m = Policy::m_block(shape, c, st, step);
                int const sq = pipe_write.index();
                pipeline_q.producer_acquire(pipe_write);
                uint64_t* bq = pipeline_q.producer_get_barrier(pipe_write);
                copy(params.tma_q.with(*bq, 0, TMA::CacheHintSm90::EVICT_LAST), tQgQ(_, m), tQsQ(_, sq));
                bulk_load_g2s(&ss.smem_lse[sq * kBlockM], lse_tile + m * kBlockM, kBlockM * sizeof(float), bq);
                int sdo = sq;
                uint64_t* bdo;
                if constexpr (DoStates::kOwnState) {
                    sdo = pipe_write_do.index();
                    pipeline_do.producer_acquire(pipe_write_do);
                    bdo = pipeline_do.producer_get_barrier(pipe_write_do);
                } else {
                    pipeline_do.producer_acquire(pipe_write);
                    bdo = pipeline_do.producer_get_barrier(pipe_write);
                }
                copy(params.tma_do.with(*bdo, 0, TMA::CacheHintSm90::EVICT_LAST), tdOgdO(_, m), tdOsdO(_, sdo));
                bulk_load_g2s(&ss.smem_dpsum[sdo * kBlockM], dpsum_tile + m * kBlockM, kBlockM * sizeof(float), bdo);
                ++pipe_write;
                if constexpr (DoStates::kOwnState) { ++pipe_write_do; }
            });
            // The static and pair grids know the CTA's next tile already: its K/V go into L2 while this tile's last
            // steps run, so their load below (after the wait) hits L2 instead of DRAM. (The dynamic grid claims late
            // on purpose, see below.)
            if constexpr (!Policy::kDynamic) {
                int const t_next = Policy::next_tile(sched, t);
                if (t_next < num_tiles) {
                    TileCtx const c_next = Policy::make_ctx(sched, t_next);
                    auto const next = kv_partitions(walk.kv_head(c_next), c_next, seq);
                    cute::prefetch(params.tma_k, get<0>(next));
                    cute::prefetch(params.tma_v, get<2>(next));
                }
            }
            // Wait until the MMA warpgroups are done with this tile's K/V before moving on: the next
            // tile's K/V load needs the buffer, and on the dynamic grid the CTA must not claim its next
            // tile before it is about to run it (a short tile's loads are issued long before its
            // MMAs, which may be waiting on other CTAs; a claim there would stall the claimed
            // tile's successors on this CTA).
            ClusterBar::wait(&ss.barrier_kv_empty, kv_iter & 1);
            ++kv_iter;
        }
        pipeline_q.producer_tail(pipe_write);
        if constexpr (DoStates::kOwnState) { pipeline_do.producer_tail(pipe_write_do); }
        else { pipeline_do.producer_tail(pipe_write); }
    }
};

}  // namespace bwd
}  // namespace flash_dash
