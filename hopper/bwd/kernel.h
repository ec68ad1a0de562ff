// The persistent, warp-specialized sm90a backward kernel: it sets up shared memory, barriers and pipelines and
// hands each warp its role.
//   WG0 warp 0: producer (bwd/load.hpp): TMA loads; on the dynamic grid it also claims the CTA's next tile.
//   WG0 warps 1 and 2 (alternate steps): dQ store (bwd/dq_store.hpp): each fresh dQ tile into the fp32 accumulator,
//   in the schedule's order.
//   WG1, WG2  : MMA (bwd/mainloop.hpp) and the dK/dV epilogue (bwd/epilogue.hpp).
// Which K/V tiles a CTA runs, in which Q-tile order and with which dQ ranks is the schedule policy's
// (schedule/policies.hpp). GqaFold: a tile is (b, K/V head, n) and runs every query head sharing it
// (schedule/sibling_walk.hpp); dK/dV leave once per tile with plain stores.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "bwd/dq_store.hpp"
#include "bwd/kernel_params.hpp"
#include "bwd/load.hpp"
#include "bwd/mainloop.hpp"
#include "bwd/qdo_pipelines.hpp"
#include "bwd/roles.hpp"
#include "bwd/tiles.hpp"
#include "bwd/traits.hpp"

namespace flash_dash {
namespace bwd {

// Varlen: the kernel of packs, whose tiles come from the prepare CTA's table (bwd/tiles.hpp).
template <class Traits, bool Is_causal, bool Is_local, bool Is_softcap, bool Deterministic, class Policy, bool GqaFold,
          bool Varlen>
__global__ void __launch_bounds__(Traits::NumThreads, 1)
    bwd_kernel_sm90(CUTE_GRID_CONSTANT BwdKernelParams<Traits> const params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using namespace cute;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int NumMmaThreads = Traits::NumMmaThreads;
    using SharedStorage = typename Traits::SharedStorage;
    using PipelineQ = typename Traits::PipelineQ;
    using PipelinedO = typename Traits::PipelinedO;
    using ClusterTxBar = cutlass::arch::ClusterTransactionBarrier;
    using ClusterBar = cutlass::arch::ClusterBarrier;
    static_assert(Policy::kMask == kAnyMask || (Policy::kMask == kCausalOnly) == Is_causal,
                  "schedule policy instantiated for the wrong mask (shift: full only, symmetric_shift: causal only)");

    extern __shared__ __align__(1024) char smem_buf[];
    SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_buf);

    int const warp_idx = cutlass::canonical_warp_idx_sync();
    int const warp_group_idx = cutlass::canonical_warp_group_idx();
    int const lane = threadIdx.x % 32;
    // Units every role walks: tiles t on the static and dynamic grids, 2 * chunk + stage on the pair grid
    // (SymmetricShift runs only with N even, so both ranges are [0, B*H*N)).
    int const num_tiles = BwdTiles<Varlen>::count(params);

    if (warp_idx == 0 && lane == 0) {
        prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
        prefetch_tma_descriptor(params.tma_do.get_tma_descriptor());
        prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
        prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
        ClusterTxBar::init(&ss.barrier_kv, 1);
        ClusterBar::init(&ss.barrier_kv_empty, NumMmaThreads);
        if constexpr (Policy::kDynamic) { BwdTileWalk<Traits, Policy>::Ring::init(ss.tile_ring); }
        BwdDqStore<Traits, Deterministic, Policy, GqaFold, Varlen>::init_turns(ss);
    }

    typename PipelineQ::Params pq;
    pq.role = warp_group_idx == 0 ? PipelineQ::ThreadCategory::Producer : PipelineQ::ThreadCategory::Consumer;
    pq.is_leader = threadIdx.x == 0;
    pq.num_consumers = NumMmaThreads;
    pq.transaction_bytes = Traits::kTmaBytesQ + kBlockM * sizeof(float);
    PipelineQ pipeline_q(ss.pipeline_q, pq, Shape<_1, _1, _1>{});
    PipelinedO pipeline_do(ss.pipeline_do, dO_pipeline_params<PipelinedO>(pq, Traits::kTmaBytesdO + kBlockM * sizeof(float)),
                           Shape<_1, _1, _1>{});
    cutlass::arch::fence_barrier_init();
    __syncthreads();

    if (warp_group_idx == 0) {
        cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
        int const warp_in_wg = warp_idx % 4;
        if (warp_in_wg == 0) {
            if (lane == 0) {
                BwdLoad<Traits, Policy, GqaFold, Varlen>::run(params, ss, pipeline_q, pipeline_do, num_tiles);
            }
        } else if (warp_in_wg <= kDqStoreWarps) {
            BwdDqStore<Traits, Deterministic, Policy, GqaFold, Varlen>::run(params, ss, lane, num_tiles, warp_in_wg - 1);
        }
    } else {
        cutlass::arch::warpgroup_reg_alloc<Traits::kMmaRegs>();
        BwdMainloop<Traits, Is_causal, Is_local, Is_softcap, Deterministic, Policy, GqaFold, Varlen>::run(
            params, ss, pipeline_q, pipeline_do, int(threadIdx.x) - 128, num_tiles);
    }
#endif
}

}  // namespace bwd
}  // namespace flash_dash
