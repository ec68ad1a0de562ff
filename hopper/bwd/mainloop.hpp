// Backward MMA role (warpgroups 1 and 2): per step S^T = K Q^T and dP^T = V dO^T, P and dS in registers,
// dV += P^T dO and dK += dS^T Q accumulated over the tile's steps, and a fresh dQ = dS K per step handed to the
// dQ-store warp; per tile the dK/dV epilogue. With swapped dK/dV (Traits::kSwapdKV) the same products transposed:
// S = Q K^T, dP = dO V^T, P and dS through shared memory, dV^T += dO^T P and dK^T += Q^T dS (bwd/operands.hpp).
// GQA-folded tiles run their steps once per sibling head (schedule/sibling_walk.hpp), dK/dV accumulating over all
// of them.
#pragma once
#include <cmath>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "bwd/barriers.hpp"
#include "bwd/dq_handoff.hpp"
#include "bwd/epilogue.hpp"
#include "bwd/kernel_params.hpp"
#include "bwd/operands.hpp"
#include "bwd/qdo_pipelines.hpp"
#include "bwd/roles.hpp"
#include "bwd/timeline.hpp"
#include "bwd/tile_mask.hpp"
#include "common/utils.hpp"
#include "schedule/sibling_walk.hpp"

namespace flash_dash {
namespace bwd {

// Is_local (with Is_causal): the kernels of sliding windows, which also mask the keys left of the window.
// Is_softcap: the kernels of softcaps. With t = tanh(S * softmax_scale / softcap) the score is softcap * t, so
// P = exp2(t * scale_log2 - lse_log2) and dS = P (dP - dPsum) (1 - t^2); softmax_scale then scales dK and dQ as in the
// other kernels (d(softcap * t)/dS = softmax_scale (1 - t^2)).
// GqaFold: one tile per (b, K/V head, n) walks every sibling head's steps (schedule/sibling_walk.hpp).
// Varlen: tiles of packed sequences (bwd/tiles.hpp), each masked on its sequence's lengths.
template <class Traits, bool Is_causal, bool Is_local, bool Is_softcap, bool Deterministic, class Policy, bool GqaFold,
          bool Varlen>
struct BwdMainloop {
    using Tiles = BwdTiles<Varlen, GqaFold>;
    using Walk = BwdTileWalk<Traits, Policy>;
    using Element = typename Traits::Element;
    using SharedStorage = typename Traits::SharedStorage;
    using PipelineQ = typename Traits::PipelineQ;
    using PipelinedO = typename Traits::PipelinedO;
    using Handoff = typename Traits::DqHandoffT;
    using ClusterTxBar = cutlass::arch::ClusterTransactionBarrier;

    // tid: thread index within the MMA warpgroups (0 .. NumMmaThreads - 1).
    CUTLASS_DEVICE static void run(BwdKernelParams<Traits> const& params, SharedStorage& ss, PipelineQ& pipeline_q,
                                   PipelinedO& pipeline_do, int tid, int num_tiles) {
        using namespace cute;
        constexpr int kBlockM = Traits::kBlockM;
        constexpr int kBlockN = Traits::kBlockN;
        constexpr int NumMmaThreads = Traits::NumMmaThreads;
        constexpr bool kSwap = Traits::kSwapdKV;
        SchedShape const& sched = params.sched;
        int const wg = tid / 128;
        Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
        Tensor sdO = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdO{});
        Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
        Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
        Tensor sQt = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQt{});
        Tensor sdOt = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdOt{});
        Tensor sKt = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutKt{});
        Tensor sdS = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutdS{});
        Tensor sdSt = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutdSt{});

        typename Traits::TiledMmaSdP mma_sdp;
        typename Traits::TiledMmadK mma_dk;
        typename Traits::TiledMmadV mma_dv;
        typename Traits::TiledMmadQ mma_dq;
        auto thr_sdp = mma_sdp.get_thread_slice(tid);
        auto thr_dk = mma_dk.get_thread_slice(tid);
        auto thr_dv = mma_dv.get_thread_slice(tid);
        auto thr_dq = mma_dq.get_thread_slice(tid);

        // The K/V side is the A operand of S^T and dP^T, the B operand of S and dP (swapped); the Q/dO side of the
        // dK/dV GEMMs the other way round.
        Tensor tSrK = operand_fragment<kSwap>(thr_sdp, sK);
        Tensor tSrQ = operand_fragment<!kSwap>(thr_sdp, sQ);
        Tensor tdPrV = operand_fragment<kSwap>(thr_sdp, sV);
        Tensor tdPrdO = operand_fragment<!kSwap>(thr_sdp, sdO);
        Tensor tdVrdO = operand_fragment<!kSwap>(thr_dv, sdOt);
        Tensor tdKrQ = operand_fragment<!kSwap>(thr_dk, sQt);
        Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
        Tensor tdQrK = thr_dq.partition_fragment_B(sKt);

        auto r2s = make_tiled_copy_C(Copy_Atom<typename Traits::R2SAtomPdS, Element>{}, mma_sdp);
        auto thr_r2s = r2s.get_thread_slice(tid);
        Tensor tdSsdS = thr_r2s.partition_D(as_position_independent_swizzle_tensor(
            make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutPdSAcc{})));

        Tensor cS = make_identity_tensor(typename Traits::ShapeS{});
        Tensor tScS = thr_sdp.partition_C(cS);
        // The key and the query of accumulator element i of S (or S^T).
        auto key_of = [&](int i) { return int(get<Traits::kKeyMode>(tScS(i))); };
        auto query_of = [&](int i) { return int(get<1 - Traits::kKeyMode>(tScS(i))); };

        cutlass::PipelineState<Traits::kStagesQ> pipe_read;
        using DoStates = DoState<Traits::kStagesQ, Traits::kStagesdO>;
        [[maybe_unused]] typename DoStates::type pipe_read_do{};  // dO's own (bwd/qdo_pipelines.hpp)
        int kv_iter = 0;
        int ds_stage = Traits::kFirstBufdS;  // the P/dS buffer dS goes to
        int const dense_off = sched.seqlen_k - sched.seqlen_q;  // every dense tile's
        int const t_in_wg = tid % 128;

        int read = 0;
        for (int t = Policy::first_tile(sched, blockIdx.x); t < num_tiles;
             t = Walk::read_next(ss.tile_ring, sched, t, read++)) {
            TileCtx c;
            SchedShape seq_shape{};
            VarlenSeq seq{};
            SchedShape const& shape = Tiles::template at<Policy>(params, t, c, seq_shape, seq);
            auto const st = Policy::init(shape, c);
            int const steps = Policy::num_steps(shape, c, st);
            int const off = Varlen ? shape.seqlen_k - shape.seqlen_q : dense_off;
            Tensor tdKacc = partition_fragment_C(mma_dk, typename Traits::ShapedK{});
            Tensor tdVacc = partition_fragment_C(mma_dv, typename Traits::ShapedV{});
            clear(tdKacc);
            clear(tdVacc);
            int const n_base = c.n * kBlockN;
            TileTimeline tile_timeline(params.timeline, sched, Tiles::grid_siblings(params.group).query_heads(sched), t,
                                       tid == 0);
            if (steps > 0) {
                tile_timeline.kv_wait();
                ClusterTxBar::wait(&ss.barrier_kv, kv_iter & 1);
                tile_timeline.kv_ready();
                // The tile's steps over all its siblings (SiblingWalk; the operands arrive in shared memory, so the MMA
                // needs no head). A plain loop: the step loop inside the walk's lambda made ptxas spill at hdim 128.
                typename SiblingWalk<GqaFold>::Cursor cursor{};
                int const walk_steps = Tiles::tile_siblings(params.group, seq).num_steps(steps);
                for (int k = 0; k < walk_steps; ++k) {
                    int const step = cursor.step(k);
                    int const m = Policy::m_block(shape, c, st, step);
                    int const m_base = m * kBlockM;
                    int const s = pipe_read.index();
                    int sdo = s;
                    if constexpr (DoStates::kOwnState) { sdo = pipe_read_do.index(); }
                    Tensor tSacc = partition_fragment_C(mma_sdp, typename Traits::ShapeS{});
                    Tensor tdPacc = partition_fragment_C(mma_sdp, typename Traits::ShapeS{});
                    tile_timeline.wait_begin();
                    pipeline_q.consumer_wait(pipe_read);
                    tile_timeline.wait_end(TileTimeline::kQ);
                    if (k == 0) { tile_timeline.first_q_ready(); }
                    gemm_ab<true, kSwap>(mma_sdp, tSrK, tSrQ(_, _, _, s), tSacc);
                    tile_timeline.wait_begin();
                    if constexpr (DoStates::kOwnState) { pipeline_do.consumer_wait(pipe_read_do); }
                    else { pipeline_do.consumer_wait(pipe_read); }
                    tile_timeline.wait_end(TileTimeline::kdO);
                    gemm_ab<true, kSwap>(mma_sdp, tdPrV, tdPrdO(_, _, _, sdo), tdPacc);
                    warpgroup_wait<1>();
                    if constexpr (Is_softcap) {  // before the mask: a masked score stays -inf
                        float const prescale = params.softcap_prescale;
                        CUTLASS_PRAGMA_UNROLL
                        for (int i = 0; i < size(tSacc); ++i) { tSacc(i) = tanh_approx(tSacc(i) * prescale); }
                    }
                    float const* slse = &ss.smem_lse[s * kBlockM];
                    bool const need_mask = tile_needs_mask<kBlockM, kBlockN, Is_causal, Is_local>(shape, m_base, n_base);
                    if (need_mask && Is_local) {
                        // Each bound is one compare of an element's compile-time offset from the thread's first
                        // element (key dr, query dc) with a per-step scalar: per-element bounds made ptxas spill.
                        int const r0 = key_of(0), c0 = query_of(0);
                        int const above = m_base - n_base + off + sched.window_right - (r0 - c0);  // dr - dc > above
                        int const below = m_base - n_base + off - sched.window_left - (r0 - c0);  // dr - dc < below
                        int const keys = shape.seqlen_k - n_base - r0, queries = shape.seqlen_q - m_base - c0;
                        CUTLASS_PRAGMA_UNROLL
                        for (int i = 0; i < size(tSacc); ++i) {
                            int const dr = key_of(i) - r0, dc = query_of(i) - c0;
                            bool const masked = dr >= keys || dc >= queries || dr - dc > above || dr - dc < below;
                            tSacc(i) = masked ? -INFINITY : tSacc(i);
                        }
                    } else if (need_mask) {
                        CUTLASS_PRAGMA_UNROLL
                        for (int i = 0; i < size(tSacc); ++i) {
                            int const row = n_base + key_of(i);
                            int const col = m_base + query_of(i);
                            bool const masked = row >= shape.seqlen_k || col >= shape.seqlen_q ||
                                                (Is_causal && row > col + off);
                            tSacc(i) = masked ? -INFINITY : tSacc(i);
                        }
                    }
                    float const scale_log2 = params.scale_log2;
                    if constexpr (Is_softcap) {
                        // dP first (the tanh above ran beside its GEMM), then P and dS = P (1 - t^2) (dP - dPsum) in
                        // one pass, so t's derivative needs no registers of its own (at hdim 64, P kept in 16 bits
                        // through the dP wait spilled 32-136 B). max(., 0): a masked t = -inf gives P = 0 and 0, not
                        // 0 * -inf.
                        warpgroup_wait<0>();
                        float const* sdpsum = &ss.smem_dpsum[sdo * kBlockM];
                        CUTLASS_PRAGMA_UNROLL
                        for (int i = 0; i < size(tSacc); ++i) {
                            float const t = tSacc(i);
                            int const query = query_of(i);
                            float const p = exp2f(t * scale_log2 - slse[query]);
                            tdPacc(i) = p * fmaxf(fmaf(-t, t, 1.f), 0.f) * (tdPacc(i) - sdpsum[query]);
                            tSacc(i) = p;
                        }
                    } else {
                        CUTLASS_PRAGMA_UNROLL
                        for (int i = 0; i < size(tSacc); ++i) {
                            tSacc(i) = exp2f(tSacc(i) * scale_log2 - slse[query_of(i)]);
                        }
                        warpgroup_wait<0>();
                        float const* sdpsum = &ss.smem_dpsum[sdo * kBlockM];
                        CUTLASS_PRAGMA_UNROLL
                        for (int i = 0; i < size(tdPacc); ++i) {
                            tdPacc(i) = tSacc(i) * (tdPacc(i) - sdpsum[query_of(i)]);
                        }
                    }
                    Tensor rP = make_tensor_like<Element>(tSacc);
                    Tensor rdS = make_tensor_like<Element>(tdPacc);
                    convert_fragment(tSacc, rP);
                    convert_fragment(tdPacc, rdS);
                    // dS^T -> smem (read back as dS by the dQ GEMM of both WGs). Swapped: P and dS -> their one
                    // buffer each, once both WGs' GEMMs of the previous step have read them.
                    if constexpr (kSwap) {
                        cutlass::arch::NamedBarrier::sync(NumMmaThreads, uint32_t(BwdBarrier::PdSEmpty));
                        copy(r2s, thr_r2s.retile_S(rP), tdSsdS(_, _, _, Int<Traits::kBufP>{}));
                    }
                    copy(r2s, thr_r2s.retile_S(rdS), tdSsdS(_, _, _, ds_stage));
                    cutlass::arch::fence_view_async_shared();
                    cutlass::arch::NamedBarrier::sync(NumMmaThreads, uint32_t(BwdBarrier::PdS));

                    // The dK/dV GEMMs' P and dS: registers (RS) or the buffers just written (SS).
                    auto pds_operand = [&](auto const& thr, auto& r, int buf) {
                        if constexpr (kSwap) {
                            return operand_fragment<true>(thr, sdSt)(_, _, _, buf);
                        } else {
                            return make_tensor(r.data(), acc_layout_to_a_operand(r.layout()));
                        }
                    };
                    Tensor tdVrP = pds_operand(thr_dv, rP, int(Traits::kBufP));
                    Tensor tdKrdS = pds_operand(thr_dk, rdS, int(Traits::kBufdS));
                    // With one Q stage the next step's Q loads only once this step's last Q read (dK) retired, so
                    // dK goes first and Q is released while dQ and dV run, dQ second so that its hand-off overlaps
                    // dV; with more, dK last (dQ hands off sooner).
                    constexpr bool kReleaseQFirst = Traits::kStagesQ == 1;
                    Tensor tdQacc = partition_fragment_C(mma_dq, Shape<typename Traits::TileM, typename Traits::TileD>{});
                    auto release_do = [&] {
                        if constexpr (DoStates::kOwnState) { pipeline_do.consumer_release(pipe_read_do); }
                        else { pipeline_do.consumer_release(pipe_read); }
                    };
                    if constexpr (kReleaseQFirst) {
                        gemm_ab<false, kSwap>(mma_dk, tdKrdS, tdKrQ(_, _, _, s), tdKacc);
                        wg_gemm<true, -1>(mma_dq, tdQrdS(_, _, _, ds_stage), tdQrK, tdQacc);
                        gemm_ab<false, kSwap>(mma_dv, tdVrP, tdVrdO(_, _, _, sdo), tdVacc);
                        warpgroup_wait<2>();  // dK retired
                        pipeline_q.consumer_release(pipe_read);
                        warpgroup_wait<1>();  // dQ retired
                    } else {
                        gemm_ab<false, kSwap>(mma_dv, tdVrP, tdVrdO(_, _, _, sdo), tdVacc);
                        wg_gemm<true, -1>(mma_dq, tdQrdS(_, _, _, ds_stage), tdQrK, tdQacc);
                        gemm_ab<false, kSwap>(mma_dk, tdKrdS, tdKrQ(_, _, _, s), tdKacc);
                        warpgroup_wait<1>();  // dV and dQ retired
                        release_do();
                    }
                    // Hand the dQ tile to the store warp (accumulator order, float4 per thread).
                    float* const sdq = Handoff::slice(ss.smem_dqacc, wg);
                    tile_timeline.wait_begin();
                    Handoff::mma_acquire(wg);
                    tile_timeline.wait_end(TileTimeline::kAcquire);
                    CUTLASS_PRAGMA_UNROLL
                    for (int j = 0; j < Traits::kdQFragSize / 4; ++j) {
                        float4 v = make_float4(tdQacc(4 * j), tdQacc(4 * j + 1), tdQacc(4 * j + 2), tdQacc(4 * j + 3));
                        *reinterpret_cast<float4*>(&sdq[Handoff::float4_offset(j, t_in_wg)]) = v;
                    }
                    cutlass::arch::fence_view_async_shared();
                    Handoff::mma_commit(wg);
                    warpgroup_wait<0>();
                    if constexpr (kReleaseQFirst) {
                        release_do();  // dV retired
                    } else {
                        pipeline_q.consumer_release(pipe_read);  // dK retired
                    }
                    ++pipe_read;
                    if constexpr (DoStates::kOwnState) { ++pipe_read_do; }
                    if constexpr (!kSwap) { ds_stage ^= 1; }
                    cursor.advance(steps);
                    tile_timeline.step_done();
                }
                ++kv_iter;
            }
            // (The epilogue hands sK/sV back to the producer once it is done with them.)
            tile_timeline.epilogue_begin();
            BwdEpilogue<Traits, Deterministic, GqaFold, Varlen>::store(params, shape, c, seq, tid, mma_dk, mma_dv,
                                                                       tdKacc, tdVacc, ss, steps > 0);
            tile_timeline.epilogue_end(int(blockIdx.x));
        }
    }
};

}  // namespace bwd
}  // namespace flash_dash
