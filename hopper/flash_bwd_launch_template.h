// Host side of the backward: workspace layout, schedule/mode dispatch, kernel launches.
#pragma once
#include <stdexcept>
#include <string>
#include <algorithm>
#include <cuda_runtime.h>
#include "kernel_api.h"
#include "flash_bwd_kernel_sm90.h"
#include "flash_bwd_preprocess.hpp"
#include "flash_bwd_postprocess.hpp"

namespace flash_dash {
namespace bwd {

template <class Tag> struct ElementOf;
template <> struct ElementOf<bf16_t> { using type = cutlass::bfloat16_t; };
template <> struct ElementOf<fp16_t> { using type = cutlass::half_t; };

inline size_t align_up(size_t x, size_t a = 256) { return (x + a - 1) / a * a; }

// Workspace layout (byte offsets, 256-aligned):
//   dq_accum  fp32 (B, H, M*kBlockM, d)   per tile m: kBlockM*d floats in dQ-MMA accumulator order
//   dpsum     fp32 (B, H, M*kBlockM)
//   lse_log2  fp32 (B, H, M*kBlockM)
//   dq_sem    int32 (M, B, H)
//   tile_counter int32: tiles claimed after the first G (dynamic grid; zeroed by the preprocess)
//   GQA only: dk_accum, dv_accum fp32 (B, Hk, N*kBlockN, d) row-major; dkv_sem int32 (N, B, Hk)
struct WorkspaceLayout {
    size_t dq_accum, dpsum, lse_log2, dq_sem, tile_counter, dk_accum, dv_accum, dkv_sem, total;
    bool gqa;
};

template <class Traits>
WorkspaceLayout workspace_layout(BwdParams const& p) {
    WorkspaceLayout w{};
    int64_t const M = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
    int64_t const N = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
    int64_t const bh = int64_t(p.batch) * p.num_heads;
    int64_t const bhk = int64_t(p.batch) * p.num_heads_k;
    size_t off = 0;
    w.dq_accum = off; off = align_up(off + size_t(bh * M * Traits::kBlockM * Traits::kHeadDim) * 4);
    w.dpsum = off;    off = align_up(off + size_t(bh * M * Traits::kBlockM) * 4);
    w.lse_log2 = off; off = align_up(off + size_t(bh * M * Traits::kBlockM) * 4);
    w.dq_sem = off;   off = align_up(off + size_t(M * bh) * 4);
    w.tile_counter = off; off = align_up(off + 4);
    w.gqa = p.num_heads_k != p.num_heads;
    if (w.gqa) {
        w.dk_accum = off; off = align_up(off + size_t(bhk * N * Traits::kBlockN * Traits::kHeadDim) * 4);
        w.dv_accum = off; off = align_up(off + size_t(bhk * N * Traits::kBlockN * Traits::kHeadDim) * 4);
        w.dkv_sem = off;  off = align_up(off + size_t(N * bhk) * 4);
    }
    w.total = off;
    return w;
}

inline void check_cuda(cudaError_t e, char const* what) {
    if (e != cudaSuccess) { throw std::runtime_error(std::string("flash_dash bwd: ") + what + ": " + cudaGetErrorString(e)); }
}

template <class Traits, bool Is_causal, bool Deterministic, class Policy>
void launch_main(BwdKernelParams<Traits> const& kp, int grid, cudaStream_t stream) {
    auto kernel = bwd_kernel_sm90<Traits, Is_causal, Deterministic, Policy>;
    constexpr int smem = Traits::kSmemBytes;
    // Once per process and instantiation (also keeps the call out of CUDA-graph capture after warm-up).
    static cudaError_t const attr_status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    check_cuda(attr_status, "smem attribute");
    kernel<<<grid, Traits::NumThreads, smem, stream>>>(kp);
    check_cuda(cudaGetLastError(), "main kernel launch");
}

// Instantiates only what can run (keeps compile time flat): non-deterministic full -> Shift,
// non-deterministic causal -> SymmetricShift (choose_launch's balanced pair grid) and Descending;
// deterministic full -> Ascending, Descending, Shift; deterministic causal -> Ascending, Descending,
// SymmetricShift<kBlockN / kBlockM> (when kBlockN % kBlockM == 0; otherwise choose_launch always
// falls back).
template <class Traits, bool Is_causal, bool Deterministic>
void dispatch_policy(Schedule used, BwdKernelParams<Traits> const& kp, int grid, cudaStream_t stream) {
#ifdef FLASH_DASH_BWD_DEV_ONE
    launch_main<Traits, Is_causal, Deterministic, Ascending>(kp, grid, stream); return;
#endif
    switch (used) {
        case Schedule::kAscending:
            if constexpr (Deterministic) { launch_main<Traits, Is_causal, true, Ascending>(kp, grid, stream); return; }
            break;
        case Schedule::kDescending:
            if constexpr (Deterministic || Is_causal) { launch_main<Traits, Is_causal, Deterministic, Descending>(kp, grid, stream); return; }
            break;
        case Schedule::kShift:
            if constexpr (!Is_causal) { launch_main<Traits, false, Deterministic, Shift>(kp, grid, stream); return; }
            break;
        case Schedule::kSymmetricShift:
            if constexpr (Is_causal && Traits::kBlockN % Traits::kBlockM == 0) {
                launch_main<Traits, true, Deterministic, SymmetricShift<Traits::kBlockN / Traits::kBlockM>>(kp, grid, stream);
                return;
            }
            break;
    }
    // choose_launch never gets here (mask mismatches are rejected before, fallbacks resolved).
    throw std::invalid_argument("flash_dash bwd: internal error: no kernel for schedule " + std::to_string(int(used)));
}

template <class Traits>
void run_bwd_impl(BwdParams const& p, void* workspace, cudaStream_t stream) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
    if (int(p.schedule) < int(Schedule::kAscending) || int(p.schedule) > int(Schedule::kSymmetricShift)) {
        throw std::invalid_argument("flash_dash bwd: unknown schedule value " + std::to_string(int(p.schedule)));
    }
    if (char const* why = mask_mismatch(p.schedule, p.is_causal)) { throw std::invalid_argument(why); }
    if (p.head_dim != kHeadDim) { throw std::invalid_argument("flash_dash bwd: head_dim mismatch"); }
    if (p.num_heads_k <= 0 || p.num_heads % p.num_heads_k != 0) {
        throw std::invalid_argument("flash_dash bwd: num_heads must be a multiple of num_heads_k");
    }
    if (p.batch <= 0 || p.num_heads <= 0 || p.seqlen_q <= 0 || p.seqlen_k <= 0) { return; }
    WorkspaceLayout const w = workspace_layout<Traits>(p);
    char* ws = static_cast<char*>(workspace);
    int const M = (p.seqlen_q + kBlockM - 1) / kBlockM;
    int const N = (p.seqlen_k + kBlockN - 1) / kBlockN;
    // Policy and grid, exactly as the model's build_orders decides them (plan.schedule_used, num_ctas):
    // symmetric_shift falls back to descending when sq != sk, kBlockN % kBlockM != 0 or N is odd, and
    // runs on the pair grid G = min(num_sms, B*H*N/2); everything else on G = min(num_sms, B*H*N).
    int64_t const num_tiles64 = int64_t(p.batch) * p.num_heads * N;
    LaunchChoice const choice = choose_launch(p.schedule, p.deterministic, p.is_causal, p.seqlen_q, p.seqlen_k,
                                              kBlockM, kBlockN, N, int64_t(p.batch) * p.num_heads, p.num_sms);
    if (!tile_count_fits(num_tiles64, choice.grid)) { throw std::invalid_argument("flash_dash bwd: too many tiles (B*H*N must stay below 2^31 - 2*grid)"); }
    int const grid = choice.grid;

    if (w.gqa) { check_cuda(cudaMemsetAsync(ws + w.dk_accum, 0, w.total - w.dk_accum, stream), "memset dkv accum"); }

    PreprocessParams pre{};
    pre.dout = p.dout; pre.out = p.out; pre.lse = p.lse;
    pre.do_row = p.do_stride.row; pre.do_head = p.do_stride.head; pre.do_batch = p.do_stride.batch;
    pre.o_row = p.o_stride.row; pre.o_head = p.o_stride.head; pre.o_batch = p.o_stride.batch;
    pre.batch = p.batch; pre.heads = p.num_heads; pre.seqlen_q = p.seqlen_q; pre.num_m = M;
    pre.dpsum = reinterpret_cast<float*>(ws + w.dpsum);
    pre.lse_log2 = reinterpret_cast<float*>(ws + w.lse_log2);
    pre.dq_sem = reinterpret_cast<int*>(ws + w.dq_sem);
    pre.tile_counter = reinterpret_cast<int*>(ws + w.tile_counter);
    bwd_preprocess_kernel<Element, kBlockM, kHeadDim><<<dim3(M, p.num_heads, p.batch), 256, 0, stream>>>(pre);
    check_cuda(cudaGetLastError(), "preprocess launch");

    using KP = BwdKernelParams<Traits>;
    KP kp{};
    auto mk = [](void const* ptr, int s, int h, int b, TensorStrides const& st, int d) {
        return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)), make_shape(s, d, h, b),
                           make_stride(st.row, _1{}, st.head, st.batch));
    };
    kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mk(p.q, p.seqlen_q, p.num_heads, p.batch, p.q_stride, kHeadDim),
                             take<0, 2>(typename Traits::SmemLayoutQ{}), Shape<typename Traits::TileM, typename Traits::TileD>{}, _1{});
    kp.tma_do = make_tma_copy(SM90_TMA_LOAD{}, mk(p.dout, p.seqlen_q, p.num_heads, p.batch, p.do_stride, kHeadDim),
                              take<0, 2>(typename Traits::SmemLayoutQ{}), Shape<typename Traits::TileM, typename Traits::TileD>{}, _1{});
    kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, mk(p.k, p.seqlen_k, p.num_heads_k, p.batch, p.k_stride, kHeadDim),
                             typename Traits::SmemLayoutK{}, Shape<typename Traits::TileN, typename Traits::TileD>{}, _1{});
    kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, mk(p.v, p.seqlen_k, p.num_heads_k, p.batch, p.v_stride, kHeadDim),
                             typename Traits::SmemLayoutK{}, Shape<typename Traits::TileN, typename Traits::TileD>{}, _1{});
    SchedShape& s = kp.sched;
    s.batch = p.batch; s.heads = p.num_heads; s.heads_k = p.num_heads_k;
    s.seqlen_q = p.seqlen_q; s.seqlen_k = p.seqlen_k;
    s.block_m = kBlockM; s.block_n = kBlockN; s.num_m = M; s.num_n = N;
    s.grid = grid; s.causal = p.is_causal;
    s.claim_group = choice.claim_group;
    kp.head_dim = kHeadDim;
    kp.group = p.num_heads / p.num_heads_k;
    kp.softmax_scale = p.softmax_scale;
    kp.scale_log2 = p.softmax_scale * float(M_LOG2E);
    kp.dq_accum = reinterpret_cast<float*>(ws + w.dq_accum); kp.dpsum = pre.dpsum; kp.lse_log2 = pre.lse_log2; kp.dq_sem = pre.dq_sem;
    kp.tile_counter = pre.tile_counter;
    kp.dk_accum = w.gqa ? reinterpret_cast<float*>(ws + w.dk_accum) : nullptr;
    kp.dv_accum = w.gqa ? reinterpret_cast<float*>(ws + w.dv_accum) : nullptr;
    kp.dkv_sem = w.gqa ? reinterpret_cast<int*>(ws + w.dkv_sem) : nullptr;
    kp.dk = static_cast<Element*>(p.dk); kp.dv = static_cast<Element*>(p.dv);
    kp.dk_row = p.dk_stride.row; kp.dk_head = p.dk_stride.head; kp.dk_batch = p.dk_stride.batch;
    kp.dv_row = p.dv_stride.row; kp.dv_head = p.dv_stride.head; kp.dv_batch = p.dv_stride.batch;
    kp.order_trace = p.order_trace;
    kp.timeline = p.timeline;

#ifdef FLASH_DASH_BWD_DEV_ONE  // compile-time smoke build: one kernel only
    dispatch_policy<Traits, true, true>(choice.used, kp, grid, stream);
#else
    if (p.is_causal) {
        if (p.deterministic) dispatch_policy<Traits, true, true>(choice.used, kp, grid, stream);
        else dispatch_policy<Traits, true, false>(choice.used, kp, grid, stream);
    } else {
        if (p.deterministic) dispatch_policy<Traits, false, true>(choice.used, kp, grid, stream);
        else dispatch_policy<Traits, false, false>(choice.used, kp, grid, stream);
    }
#endif

    PostprocessParams post{};
    post.dq_accum = kp.dq_accum; post.dq = p.dq;
    post.dq_row = p.dq_stride.row; post.dq_head = p.dq_stride.head; post.dq_batch = p.dq_stride.batch;
    post.batch = p.batch; post.heads = p.num_heads; post.seqlen_q = p.seqlen_q; post.num_m = M;
    post.first_m = m_min_of(kp.sched, 0);
    post.scale = p.softmax_scale;
    bwd_postprocess_dq_kernel<Traits><<<dim3(M, p.num_heads, p.batch), 256, 0, stream>>>(post);
    check_cuda(cudaGetLastError(), "postprocess dq launch");
    if (w.gqa) {
        PostprocessKVParams kv{};
        kv.batch_size = p.batch; kv.heads_k = p.num_heads_k; kv.seqlen_k = p.seqlen_k; kv.rows_padded = N * kBlockN;
        int64_t const total = int64_t(p.batch) * p.num_heads_k * p.seqlen_k * (kHeadDim / 8);
        int const blocks = int(std::min<int64_t>((total + 255) / 256, 65535));
        kv.accum = kp.dk_accum; kv.out = p.dk; kv.row = p.dk_stride.row; kv.head = p.dk_stride.head; kv.batch = p.dk_stride.batch;
        bwd_postprocess_kv_kernel<Element, kHeadDim><<<blocks, 256, 0, stream>>>(kv);
        kv.accum = kp.dv_accum; kv.out = p.dv; kv.row = p.dv_stride.row; kv.head = p.dv_stride.head; kv.batch = p.dv_stride.batch;
        bwd_postprocess_kv_kernel<Element, kHeadDim><<<blocks, 256, 0, stream>>>(kv);
        check_cuda(cudaGetLastError(), "postprocess dk/dv launch");
    }
}

}  // namespace bwd

template <typename Element, int kHeadDim>
size_t bwd_workspace_bytes(BwdParams const& params) {
    using Traits = bwd::BwdTraits<typename bwd::ElementOf<Element>::type, kHeadDim>;
    return bwd::workspace_layout<Traits>(params).total;
}

template <typename Element, int kHeadDim>
void run_bwd(BwdParams const& params, void* workspace, cudaStream_t stream) {
    using Traits = bwd::BwdTraits<typename bwd::ElementOf<Element>::type, kHeadDim>;
    bwd::run_bwd_impl<Traits>(params, workspace, stream);
}

}  // namespace flash_dash
