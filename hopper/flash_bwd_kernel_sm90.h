// Main backward kernel (sm90a): persistent, warp-specialized.
//   WG0 warp 0: TMA producer (K/V once per tile; Q+LSE and dO+dPsum through 2-stage pipelines;
//               on the dynamic grid it also claims the CTA's next tile, tile_ring.hpp).
//   WG0 warp 1: dQ-store warp (each fresh dQ tile into the fp32 accumulator: the schedule's rank 0
//               stores, later ranks bulk reduce-add, behind per-(m, b, h) counters: in rank order in
//               deterministic mode, after rank 0 otherwise).
//   WG1, WG2  : MMA warpgroups (S^T, dP^T, P, dS, dV += P^T dO, dQ = dS K, dK += dS^T Q) + epilogue.
#pragma once
#include "mainloop_bwd_sm90.hpp"
#include "epilogue_bwd_sm90.hpp"
#include "bwd_schedule.hpp"
#include "semaphore.hpp"
#include "bulk_reduce.hpp"
#include "bwd_timeline.hpp"

namespace flash_dash {
namespace bwd {

template <class Traits>
struct BwdKernelParams {
    using Element = typename Traits::Element;
    using ShapeT = Shape<int32_t, int32_t, int32_t, int32_t>;            // (s, d, h, b)
    using StrideT = Stride<int64_t, _1, int64_t, int64_t>;
    using GTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeT{}, StrideT{}));
    using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GTensor{}, take<0, 2>(typename Traits::SmemLayoutQ{}),
                                        Shape<typename Traits::TileM, typename Traits::TileD>{}, _1{}));
    using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GTensor{}, typename Traits::SmemLayoutK{},
                                        Shape<typename Traits::TileN, typename Traits::TileD>{}, _1{}));
    TmaQ tma_q, tma_do;
    TmaK tma_k, tma_v;
    SchedShape sched;
    int head_dim, group;
    float softmax_scale, scale_log2;
    float* dq_accum;
    float* dpsum;
    float* lse_log2;
    int* dq_sem;
    int* tile_counter;  // dynamic grid: tiles claimed after the first G
    float* dk_accum;  // GQA only (nullptr otherwise)
    float* dv_accum;
    int* dkv_sem;
    Element* dk;
    Element* dv;
    int64_t dk_row, dk_head, dk_batch, dv_row, dv_head, dv_batch;
    int* order_trace;
    long long* timeline;  // FLASH_DASH_BWD_TIMELINE builds only (bwd_timeline.hpp)
};

template <class Traits, bool Is_causal, bool Deterministic, class Policy>
__global__ void __launch_bounds__(384, 1) bwd_kernel_sm90(CUTE_GRID_CONSTANT BwdKernelParams<Traits> const params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr int kStages = Traits::kStages;
    constexpr int NumMmaThreads = Traits::NumMmaThreads;
    using SharedStorage = typename Traits::SharedStorage;
    using PipelineQ = typename Traits::PipelineQ;
    using ClusterTxBar = cutlass::arch::ClusterTransactionBarrier;
    using ClusterBar = cutlass::arch::ClusterBarrier;
    using Handoff = typename Traits::DqHandoffT;

    extern __shared__ __align__(1024) char smem_buf[];
    SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_buf);

    int const warp_idx = cutlass::canonical_warp_idx_sync();
    int const warp_group_idx = cutlass::canonical_warp_group_idx();
    int const lane = threadIdx.x % 32;
    static_assert(Policy::kMask == kAnyMask || (Policy::kMask == kCausalOnly) == Is_causal,
                  "schedule policy instantiated for the wrong mask (shift: full only, symmetric_shift: causal only)");
    SchedShape const& sched = params.sched;  // stays in the param bank (no registers)
    // Units walked by every role: tiles t on the static grid, 2*chunk + stage on the pair grid
    // (SymmetricShift runs only with N even, so both ranges are [0, B*H*N)).
    int const num_tiles = sched.num_tiles();
    // Every role's next tile: the static policies compute it; on the dynamic grid the producer
    // claims and publishes it (k = how many it published before), the other roles read it.
    using Ring = TileRing<NumMmaThreads + 32>;
    auto next_claimed = [&](int t, int k) {
        if constexpr (Policy::kDynamic) { return Ring::publish(ss.tile_ring, k, params.tile_counter, sched.grid); }
        else { return Policy::next_tile(sched, t); }
    };
    auto next_read = [&](int t, int k) {
        if constexpr (Policy::kDynamic) { return Ring::consume(ss.tile_ring, k); }
        else { return Policy::next_tile(sched, t); }
    };

    if (warp_idx == 0 && lane == 0) {
        prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
        prefetch_tma_descriptor(params.tma_do.get_tma_descriptor());
        prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
        prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
        ClusterTxBar::init(&ss.barrier_kv, 1);
        ClusterBar::init(&ss.barrier_kv_empty, NumMmaThreads);
        if constexpr (Policy::kDynamic) { Ring::init(ss.tile_ring); }
    }

    typename PipelineQ::Params pq;
    pq.role = warp_group_idx == 0 ? PipelineQ::ThreadCategory::Producer : PipelineQ::ThreadCategory::Consumer;
    pq.is_leader = threadIdx.x == 0;
    pq.num_consumers = NumMmaThreads;
    pq.transaction_bytes = Traits::kTmaBytesQ + kBlockM * sizeof(float);
    PipelineQ pipeline_q(ss.pipeline_q, pq, Shape<_1, _1, _1>{});
    PipelineQ pipeline_do(ss.pipeline_do, pq, Shape<_1, _1, _1>{});
    cutlass::arch::fence_barrier_init();
    __syncthreads();

    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdO{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});

    if (warp_group_idx == 0) {
        cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
        int const warp_in_wg = warp_idx % 4;
        if (warp_in_wg == 0) {
            // ---------------- TMA producer ----------------
            if (lane == 0) {
                auto shape_q = make_shape(sched.seqlen_q, params.head_dim, sched.heads, sched.batch);
                auto shape_k = make_shape(sched.seqlen_k, params.head_dim, sched.heads_k, sched.batch);
                Tensor mQ = params.tma_q.get_tma_tensor(shape_q);
                Tensor mdO = params.tma_do.get_tma_tensor(shape_q);
                Tensor mK = params.tma_k.get_tma_tensor(shape_k);
                Tensor mV = params.tma_v.get_tma_tensor(shape_k);
                cutlass::PipelineState<kStages> pipe_write = cutlass::make_producer_start_state<PipelineQ>();
                int kv_iter = 0;
                int claimed = 0;
                for (int t = Policy::first_tile(sched, blockIdx.x); t < num_tiles; t = next_claimed(t, claimed++)) {
                    TileCtx const c = Policy::make_ctx(sched, t);
                    auto const st = Policy::init(sched, c);
                    int const steps = Policy::num_steps(sched, c, st);
                    if (steps <= 0) continue;
                    int const hk = c.h / params.group;
                    Tensor gQ = local_tile(mQ(_, _, c.h, c.b), Shape<typename Traits::TileM, typename Traits::TileD>{}, make_coord(_, _0{}));
                    Tensor gdO = local_tile(mdO(_, _, c.h, c.b), Shape<typename Traits::TileM, typename Traits::TileD>{}, make_coord(_, _0{}));
                    Tensor gK = local_tile(mK(_, _, hk, c.b), Shape<typename Traits::TileN, typename Traits::TileD>{}, make_coord(c.n, _0{}));
                    Tensor gV = local_tile(mV(_, _, hk, c.b), Shape<typename Traits::TileN, typename Traits::TileD>{}, make_coord(c.n, _0{}));
                    auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
                    auto [tdOgdO, tdOsdO] = tma_partition(params.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
                    auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
                    auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
                    int64_t const row_base = int64_t(c.b * sched.heads + c.h) * sched.num_m * kBlockM;
                    float const* lse_tile = params.lse_log2 + row_base;
                    float const* dpsum_tile = params.dpsum + row_base;

                    ClusterTxBar::arrive_and_expect_tx(&ss.barrier_kv, 2 * Traits::kTmaBytesK);
                    copy(params.tma_k.with(ss.barrier_kv), tKgK, tKsK);
                    copy(params.tma_v.with(ss.barrier_kv), tVgV, tVsV);
                    // Not unrolled: one thread issuing TMA gains nothing from it, and unrolling made the
                    // 24-register warps (hdim 64) spill inside this loop.
                    #pragma unroll 1
                    for (int step = 0; step < steps; ++step) {
                        int const m = Policy::m_block(sched, c, st, step);
                        int const s = pipe_write.index();
                        pipeline_q.producer_acquire(pipe_write);
                        uint64_t* bq = pipeline_q.producer_get_barrier(pipe_write);
                        copy(params.tma_q.with(*bq, 0, TMA::CacheHintSm90::EVICT_LAST), tQgQ(_, m), tQsQ(_, s));
                        bulk_load_g2s(&ss.smem_lse[s * kBlockM], lse_tile + m * kBlockM,
                                      kBlockM * sizeof(float), bq);
                        pipeline_do.producer_acquire(pipe_write);
                        uint64_t* bdo = pipeline_do.producer_get_barrier(pipe_write);
                        copy(params.tma_do.with(*bdo, 0, TMA::CacheHintSm90::EVICT_LAST), tdOgdO(_, m), tdOsdO(_, s));
                        bulk_load_g2s(&ss.smem_dpsum[s * kBlockM], dpsum_tile + m * kBlockM,
                                      kBlockM * sizeof(float), bdo);
                        ++pipe_write;
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
                pipeline_do.producer_tail(pipe_write);
            }
        } else if (warp_in_wg == 1) {
            // ---------------- dQ store warp ----------------
            constexpr uint32_t kSliceBytes = Traits::kdQSliceFloats * sizeof(float);
            int read = 0;
            for (int t = Policy::first_tile(sched, blockIdx.x); t < num_tiles; t = next_read(t, read++)) {
                TileCtx const c = Policy::make_ctx(sched, t);
                auto const st = Policy::init(sched, c);
                int const steps = Policy::num_steps(sched, c, st);
                int64_t const bh = int64_t(c.b) * sched.heads + c.h;
                #pragma unroll 1  // see the producer loop
                for (int step = 0; step < steps; ++step) {
                    int const m = Policy::m_block(sched, c, st, step);
                    float* gacc = params.dq_accum + (bh * sched.num_m + m) * int64_t(kBlockM * kHeadDim);
                    int* sem = params.dq_sem + (int64_t(m) * sched.batch + c.b) * sched.heads + c.h;
                    // One buffer: the slices go back to the MMA WGs here, after the previous step's
                    // completion wait, not right after its read: releasing earlier measured no gain
                    // (2026-11-30-0329-profile-deferred-release-ab.txt) and det hdim 128 full 16k 535 vs
                    // 588 TFLOP/s in the same call (2026-11-30-session5-gpu-tests-649b71d.txt).
                    Handoff::store_begin();
                    // The first contribution (rank 0) stores, so the accumulator needs no zero fill.
                    // Deterministic: rank r waits for ranks 0..r-1; otherwise only for rank 0 (adds
                    // after the first are unordered). Fewer waits than the proven-deadlock-free
                    // deterministic order, hence deadlock-free too.
                    int const rank = Policy::rank(sched, c, st, m);
                    StepTimeline timeline(params.timeline, (bh * sched.num_m + m) * sched.num_n + rank);
                    if (lane == 0) {
                        if constexpr (Deterministic) { wait_eq(sem, rank); }
                        else if (rank > 0) { wait_ge(sem, 1); }
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
                        if (Deterministic || rank == 0) {
                            bulk_wait_group_0();          // reductions COMPLETED, not just smem read
                            fence_proxy_async_global();
                            pos = rank;
                            red_release_add(sem, 1);
                        } else {
                            bulk_wait_group_read_0();
                            pos = params.order_trace != nullptr ? atomicAdd(sem, 1) : 0;
                        }
                        if (params.order_trace != nullptr && pos < sched.num_n) {
                            params.order_trace[(bh * sched.num_m + m) * sched.num_n + pos] = c.n;
                        }
                        timeline.done(int(blockIdx.x), step);
                    }
                    __syncwarp();
                }
            }
            if (lane == 0) { bulk_wait_group_0(); }
        }
    } else {
        cutlass::arch::warpgroup_reg_alloc<Traits::kMmaRegs>();
        // ---------------- MMA warpgroups ----------------
        int const tid = threadIdx.x - 128;
        int const wg = tid / 128;
        Tensor sQt = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQt{});
        Tensor sdOt = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdOt{});
        Tensor sKt = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutKt{});
        Tensor sdS = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutdS{});
        Tensor sdSt = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutdSt{});

        typename Traits::TiledMmaSdP mma_sdp;
        typename Traits::TiledMmadKV mma_dkv;
        typename Traits::TiledMmadQ mma_dq;
        auto thr_sdp = mma_sdp.get_thread_slice(tid);
        auto thr_dkv = mma_dkv.get_thread_slice(tid);
        auto thr_dq = mma_dq.get_thread_slice(tid);

        Tensor tSrK = thr_sdp.partition_fragment_A(sK);
        Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);
        Tensor tdPrV = thr_sdp.partition_fragment_A(sV);
        Tensor tdPrdO = thr_sdp.partition_fragment_B(sdO);
        Tensor tdVrdO = thr_dkv.partition_fragment_B(sdOt);
        Tensor tdKrQ = thr_dkv.partition_fragment_B(sQt);
        Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
        Tensor tdQrK = thr_dq.partition_fragment_B(sKt);

        auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
        auto thr_r2s = r2s.get_thread_slice(tid);
        Tensor tdSsdS = thr_r2s.partition_D(as_position_independent_swizzle_tensor(sdSt));

        Tensor cS = make_identity_tensor(Shape<typename Traits::TileN, typename Traits::TileM>{});
        Tensor tScS = thr_sdp.partition_C(cS);

        cutlass::PipelineState<kStages> pipe_read;
        int kv_iter = 0;
        int ds_stage = 0;
        int const off = sched.seqlen_k - sched.seqlen_q;
        int const t_in_wg = tid % 128;

        int read = 0;
        for (int t = Policy::first_tile(sched, blockIdx.x); t < num_tiles; t = next_read(t, read++)) {
            TileCtx const c = Policy::make_ctx(sched, t);
            auto const st = Policy::init(sched, c);
            int const steps = Policy::num_steps(sched, c, st);
            Tensor tdKacc = partition_fragment_C(mma_dkv, Shape<typename Traits::TileN, typename Traits::TileD>{});
            Tensor tdVacc = partition_fragment_C(mma_dkv, Shape<typename Traits::TileN, typename Traits::TileD>{});
            clear(tdKacc);
            clear(tdVacc);
            int const n_base = c.n * kBlockN;
            if (steps > 0) {
                ClusterTxBar::wait(&ss.barrier_kv, kv_iter & 1);
                for (int step = 0; step < steps; ++step) {
                    int const m = Policy::m_block(sched, c, st, step);
                    int const m_base = m * kBlockM;
                    int const s = pipe_read.index();
                    Tensor tSacc = partition_fragment_C(mma_sdp, Shape<typename Traits::TileN, typename Traits::TileM>{});
                    Tensor tdPacc = partition_fragment_C(mma_sdp, Shape<typename Traits::TileN, typename Traits::TileM>{});
                    pipeline_q.consumer_wait(pipe_read);
                    wg_gemm<true, -1>(mma_sdp, tSrK, tSrQ(_, _, _, s), tSacc);
                    pipeline_do.consumer_wait(pipe_read);
                    wg_gemm<true, -1>(mma_sdp, tdPrV, tdPrdO(_, _, _, s), tdPacc);
                    warpgroup_wait<1>();
                    float const* slse = &ss.smem_lse[s * kBlockM];
                    bool const need_mask = (m_base + kBlockM > sched.seqlen_q) || (n_base + kBlockN > sched.seqlen_k) ||
                                           (Is_causal && n_base + kBlockN - 1 > m_base + off);
                    if (need_mask) {
                        CUTLASS_PRAGMA_UNROLL
                        for (int i = 0; i < size(tSacc); ++i) {
                            int const row = n_base + get<0>(tScS(i));  // key
                            int const col = m_base + get<1>(tScS(i));  // query
                            bool const masked = row >= sched.seqlen_k || col >= sched.seqlen_q || (Is_causal && row > col + off);
                            tSacc(i) = masked ? -INFINITY : tSacc(i);
                        }
                    }
                    float const scale_log2 = params.scale_log2;
                    CUTLASS_PRAGMA_UNROLL
                    for (int i = 0; i < size(tSacc); ++i) {
                        tSacc(i) = exp2f(tSacc(i) * scale_log2 - slse[get<1>(tScS(i))]);
                    }
                    warpgroup_wait<0>();
                    float const* sdpsum = &ss.smem_dpsum[s * kBlockM];
                    CUTLASS_PRAGMA_UNROLL
                    for (int i = 0; i < size(tdPacc); ++i) {
                        tdPacc(i) = tSacc(i) * (tdPacc(i) - sdpsum[get<1>(tScS(i))]);
                    }
                    Tensor rP = make_tensor_like<Element>(tSacc);
                    Tensor rdS = make_tensor_like<Element>(tdPacc);
                    convert_fragment(tSacc, rP);
                    convert_fragment(tdPacc, rdS);
                    // dS^T -> smem (read back as dS by the dQ GEMM of both WGs).
                    copy(r2s, thr_r2s.retile_S(rdS), tdSsdS(_, _, _, ds_stage));
                    cutlass::arch::fence_view_async_shared();
                    cutlass::arch::NamedBarrier::sync(NumMmaThreads, uint32_t(BwdBarrier::PdS));

                    Tensor tdVrP = make_tensor(rP.data(), acc_layout_to_a_operand(rP.layout()));
                    Tensor tdKrdS = make_tensor(rdS.data(), acc_layout_to_a_operand(rdS.layout()));
                    wg_gemm<false, -1>(mma_dkv, tdVrP, tdVrdO(_, _, _, s), tdVacc);
                    Tensor tdQacc = partition_fragment_C(mma_dq, Shape<typename Traits::TileM, typename Traits::TileD>{});
                    wg_gemm<true, -1>(mma_dq, tdQrdS(_, _, _, ds_stage), tdQrK, tdQacc);
                    wg_gemm<false, -1>(mma_dkv, tdKrdS, tdKrQ(_, _, _, s), tdKacc);
                    warpgroup_wait<1>();  // dV and dQ retired
                    pipeline_do.consumer_release(pipe_read);
                    // Hand the dQ tile to the store warp (accumulator order, float4 per thread).
                    float* const sdq = Handoff::slice(ss.smem_dqacc, wg);
                    Handoff::mma_acquire(wg);
                    CUTLASS_PRAGMA_UNROLL
                    for (int j = 0; j < Traits::kdQFragSize / 4; ++j) {
                        float4 v = make_float4(tdQacc(4 * j), tdQacc(4 * j + 1), tdQacc(4 * j + 2), tdQacc(4 * j + 3));
                        *reinterpret_cast<float4*>(&sdq[j * 512 + t_in_wg * 4]) = v;
                    }
                    cutlass::arch::fence_view_async_shared();
                    Handoff::mma_commit(wg);
                    warpgroup_wait<0>();
                    pipeline_q.consumer_release(pipe_read);
                    ++pipe_read;
                    ds_stage ^= 1;
                }
                // All wgmma reading sK/sV retired: the producer may load the next tile's K/V.
                ClusterBar::arrive(&ss.barrier_kv_empty);
                ++kv_iter;
            }
            epilogue_dkdv<Traits, Deterministic>(params, sched, c, tid, mma_dkv, tdKacc, tdVacc);
        }
    }
#endif
}

}  // namespace bwd
}  // namespace flash_dash
