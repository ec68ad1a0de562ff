// Torch-free parameter blocks shared by the binding (csrc/) and the kernels (hopper/).
// Tensors are (batch, seqlen, heads, head_dim) with the last dim contiguous (packed: (rows, heads, head_dim)); strides
// are in elements. q and k have head_dim columns, v and out head_dim_v (equal but for MLA-shaped calls).
#pragma once
#include <cstdint>

#include "common/varlen.hpp"
#include "common/window.hpp"
#include "generated/schedule_ids.h"

namespace flash_dash {

struct TensorStrides {
    int64_t batch, row, head;
};

struct FwdParams {
    const void* q;
    const void* k;
    const void* v;
    void* out;   // (b, sq, h, dv), input dtype
    float* lse;  // (b, h, sq) fp32, natural log; -inf for rows that see no key
    TensorStrides q_stride, k_stride, v_stride, o_stride;
    int batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim, head_dim_v;
    float softmax_scale;
    // 0 (off) or > 0: the scores are softcap * tanh(softmax_scale * q.k / softcap) (the softcap kernels; full and causal
    // masks only, without a sink).
    float softcap;
    bool is_causal;  // aligned bottom-right when seqlen_q != seqlen_k; also every sliding window (see window_*)
    // The band of the causal kernels: row i sees keys [i + sk - sq - window_left, i + sk - sq + window_right]
    // (both >= 0; the causal mask is (kUnboundedWindow, 0)). Ignored by the full-mask kernels.
    int window_left, window_right;
    const float* sink;  // (heads,) fp32 learnable sink logits (gpt-oss), or nullptr (lse includes it)
    int num_sms;     // CTAs the persistent grid may use: SM count - sm_margin
    // A packed launch where varlen.cu_seqlens_q is set: batch is then the number of sequences, seqlen_q / seqlen_k
    // the packed rows (q, out: (total_q, h, d); k, v: (total_k, h_k, d); batch strides unused), lse (h, total_q).
    VarlenArgs varlen;
};

struct BwdParams : FwdParams {
    const void* dout;  // (b, sq, h, dv)
    void* dq;          // (b, sq, h, d)
    void* dk;          // (b, sk, h_k, d)
    void* dv;          // (b, sk, h_k, dv)
    TensorStrides do_stride, dq_stride, dk_stride, dv_stride;
    bool deterministic;
    float* dsink;      // (heads,) fp32: the sink's gradient (bwd/sink_grad.hpp) where `sink` is set, else nullptr
    // The resolved launch (flash_attn_dash/launch.py decides it, the launcher checks it): the policy that runs,
    // its persistent grid size and, on the dynamic grid, the heads per claim group; gqa_fold: one tile per K/V head
    // runs every query head sharing it (schedule/sibling_walk.hpp; sliding windows only). A pack folds the sequences
    // whose used lengths exceed fold_min_len_q and fold_min_len_k (where their own window bounds both sides), each
    // as its dense call would.
    Schedule schedule;
    int grid;
    int claim_group;
    bool gqa_fold;
    int fold_min_len_q, fold_min_len_k;
    // Debug only (nullptr otherwise): per dQ tile (b, h, m), the K/V tile indices n in arrival order.
    int* order_trace;
    // Diagnostic only (nullptr otherwise; kernels built with FLASH_DASH_BWD_TIMELINE=1 fill it, others
    // ignore it): StepTimeline records (bwd/timeline.hpp), int64 (b, h, M, N, 5).
    long long* timeline;
};

}  // namespace flash_dash
