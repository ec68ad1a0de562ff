// Parameters of the backward main kernel (built by bwd/launch.h, read by every role).
#pragma once
#include <cstdint>
#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>

#include "common/varlen.hpp"
#include "schedule/policies.hpp"

namespace flash_dash {
namespace bwd {

template <class Traits>
struct BwdKernelParams {
    using Element = typename Traits::Element;
    using ShapeT = cute::Shape<int32_t, int32_t, int32_t, int32_t>;  // (s, d, h, b)
    using StrideT = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
    using GTensor = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeT{},
                                               StrideT{}));
    using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GTensor{},
                                              cute::take<0, 2>(typename Traits::SmemLayoutQ{}),
                                              cute::Shape<typename Traits::TileM, typename Traits::TileD>{}, cute::_1{}));
    using TmadO = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GTensor{},
                                               cute::take<0, 2>(typename Traits::SmemLayoutdO{}),
                                               cute::Shape<typename Traits::TileM, typename Traits::TileDV>{}, cute::_1{}));
    using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GTensor{}, typename Traits::SmemLayoutK{},
                                              cute::Shape<typename Traits::TileN, typename Traits::TileD>{}, cute::_1{}));
    using TmaV = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GTensor{}, typename Traits::SmemLayoutV{},
                                              cute::Shape<typename Traits::TileN, typename Traits::TileDV>{}, cute::_1{}));
    TmaQ tma_q;
    TmadO tma_do;
    TmaK tma_k;
    TmaV tma_v;
    SchedShape sched;
    int head_dim, group;
    // softmax_scale scales dK and dQ; scale_log2 turns the scores the softmax sees into exp2 units: softmax_scale *
    // log2 e, or in the softcap kernels (whose softmax sees tanh(S * softcap_prescale)) softcap * log2 e.
    float softmax_scale, scale_log2;
    float* dq_accum;
    float* dpsum;
    float* lse_log2;
    int* dq_sem;
    int* tile_counter;  // dynamic grid: tiles claimed after the first G
    float* dk_accum;    // GQA only (nullptr otherwise)
    float* dv_accum;
    int* dkv_sem;
    Element* dk;
    Element* dv;
    int64_t dk_row, dk_head, dk_batch, dv_row, dv_head, dv_batch;
    int* order_trace;
    long long* timeline;  // FLASH_DASH_BWD_TIMELINE builds only (bwd/timeline.hpp)
    // Softcap kernels: softmax_scale / softcap (after the others, so their parameter offsets do not move).
    float softcap_prescale;
    // Varlen kernels (bwd/tiles.hpp): the prepare CTA's views, table and tile count, and the tiles per head of the
    // query-block and key-block workspace (upper bounds of the pack's; sched then holds the packed rows, batch 1).
    VarlenSeq const* varlen_seqs;
    VarlenTile const* varlen_tiles;
    int const* varlen_num_tiles;
    int varlen_m_cap, varlen_n_cap;
};

}  // namespace bwd
}  // namespace flash_dash
