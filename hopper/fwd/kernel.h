// The persistent, warp-specialised sm90a forward kernel: warpgroup 0 is the producer (one thread issues every
// TMA load, FwdMainloopSm90::load), the other warpgroups consume (FwdMainloopSm90::consume) and store
// (FwdEpilogueSm90).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "fwd/epilogue.hpp"
#include "fwd/mainloop.hpp"
#include "fwd/o_handoff.hpp"
#include "fwd/softmax.hpp"
#include "fwd/traits.h"
#include "schedule/fwd_tile_scheduler.hpp"

namespace flash_dash {

// kWindow: the kernel of sliding windows; kSink: of learnable sinks; kSoftcap: of softcaps; kVarlen: of packed
// sequences, whose tiles come from the prepare CTA's table by dynamic claims (FwdVarlenScheduler).
template <class Traits, bool kWindow, bool kSink, bool kSoftcap, bool kVarlen>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    flash_fwd_kernel_sm90(CUTE_GRID_CONSTANT typename Traits::Params const params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using namespace cute;
    using Mainloop = FwdMainloopSm90<Traits, kWindow, kSink, kSoftcap, kVarlen>;
    using Epilogue = FwdEpilogueSm90<Traits, kVarlen>;
    using SharedStorage = typename Traits::SharedStorage;
    using PipelineQ = typename Traits::PipelineQ;
    using PipelineKV = typename Traits::PipelineKV;
    static constexpr int kBlockM = Traits::kBlockM;
    static constexpr int kHeadDimV = Traits::kHeadDimV;

    extern __shared__ char smem_buf[];
    SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_buf);

    int const warp_idx = cutlass::canonical_warp_idx_sync();
    int const warp_group_idx = cutlass::canonical_warp_group_idx();
    bool const is_producer = warp_group_idx == 0;

    if (warp_idx == 0 && cute::elect_one_sync()) {
        prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
        prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
        prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
        prefetch_tma_descriptor(params.tma_o.get_tma_descriptor());
    }

    // Warp 0 initialises every barrier; all threads construct the pipeline objects.
    typename PipelineQ::Params pq;
    pq.transaction_bytes = Traits::kTmaBytesQ;
    pq.role = is_producer ? PipelineQ::ThreadCategory::Producer : PipelineQ::ThreadCategory::Consumer;
    pq.is_leader = threadIdx.x == 0;
    pq.num_consumers = Traits::kNumMmaThreads;
    typename PipelineKV::Params pkv;
    pkv.transaction_bytes = Traits::kTmaBytesK;
    pkv.role = is_producer ? PipelineKV::ThreadCategory::Producer : PipelineKV::ThreadCategory::Consumer;
    pkv.is_leader = threadIdx.x == 0;
    pkv.num_consumers = Traits::kNumMmaThreads;
    PipelineQ pipe_q(ss.pipeline_q, pq, Shape<_1, _1, _1>{});
    typename PipelineKV::Params pv = pkv;  // V's blocks have their own head dim
    pv.transaction_bytes = Traits::kTmaBytesV;
    PipelineKV pipe_k(ss.pipeline_k, pkv, Shape<_1, _1, _1>{});
    PipelineKV pipe_v(ss.pipeline_v, pv, Shape<_1, _1, _1>{});
    constexpr bool kCopyWarps = kVarlen && Traits::kStagedO && OHandoff<Traits>::kUsed;
    // Varlen: the consumers and the O copy warps read the producer's claims.
    using VarlenSched = FwdVarlenScheduler<Traits::kNumMmaThreads + (kCopyWarps ? Traits::kOParts * 32 : 0)>;
    if constexpr (kCopyWarps) {
        if (threadIdx.x == 0) { OHandoff<Traits>::init(ss.o_handoff); }
    }
    if constexpr (kVarlen) {
        if (threadIdx.x == 0) {
            VarlenSched::init(ss.varlen_claims);
            cutlass::arch::fence_barrier_init();
        }
    }
    __syncthreads();

    auto const sched = [&] {
        if constexpr (kVarlen) {
            return VarlenSched{params.varlen_tiles, *params.varlen_num_tiles, params.num_heads, int(gridDim.x),
                               params.varlen_claims, &ss.varlen_claims};
        } else {
            return FwdTileScheduler(params.num_m_blocks, params.num_heads, params.batch, params.is_causal,
                                    int(gridDim.x));
        }
    }();

    if (is_producer) {
        cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
        if (threadIdx.x == 0) { Mainloop::load(params, ss, sched, pipe_q, pipe_k, pipe_v); }
        if constexpr (kCopyWarps) {
            // Warps 1 .. kOParts of the producer warpgroup, idle otherwise: one O copy warp per part.
            if (warp_idx >= 1 && warp_idx <= Traits::kOParts) {
                OHandoff<Traits>::copy_warp(params, ss.smem_o.data(), ss.o_handoff, sched,
                                            [&](FwdTile const& tile) { return Mainloop::seq_of(params, tile); },
                                            warp_idx - 1, int(threadIdx.x) % 32);
            }
        }
    } else {
        cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
        int const tid = int(threadIdx.x) - 128;
        typename Traits::TiledMmaPV mma_pv;
        Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kHeadDimV>>{});
        clear(tOrO);
        constexpr int kNRows = decltype(size<0>(make_rowcol_view(tOrO)))::value;
        OnlineSoftmax<kNRows> softmax(params.scale_log2);
        Mainloop::scheduler_init(tid / 128);
        // A finished tile (its O in tOrO): normalise O, convert it to the output type, store it with its LSE.
        auto tile_done = [&](FwdTile const& tile, float const (&inv_sum)[kNRows], float const (&lse)[kNRows]) {
            Tensor tO_rc = make_rowcol_view(tOrO);
            rescale_rows(tO_rc, inv_sum);
            Tensor rO = make_tensor_like<typename Traits::Element>(tOrO);
            convert_fragment(tOrO, rO);
            Epilogue::store(params, ss, rO, lse, tile, Mainloop::seq_of(params, tile), tid);
        };
        Mainloop::consume(params, ss, sched, pipe_q, pipe_k, pipe_v, tid, tOrO, softmax, tile_done);
        Epilogue::finish(tid);
    }
#endif
}

}  // namespace flash_dash
