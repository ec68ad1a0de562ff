// The learnable sink's gradient: every row's output is scaled by 1 - p_sink with p_sink = exp(sink[h] - lse), so
// dsink[h] = -sum over batch and rows of exp(sink[h] - lse) * dPsum, from the preprocess's fp32 dPsum. One CTA per
// head; rows are dealt to threads in a fixed order and reduced by a fixed tree, so the bits repeat run to run.
#pragma once
#include <cutlass/cutlass.h>
#include <cstdint>

#include "common/varlen.hpp"

namespace flash_dash {
namespace bwd {

struct SinkGradParams {
    float const* sink;   // (heads,) logits
    float const* lse;    // (b, h, sq) contiguous, natural log, includes the sink; a pack: (h, total_q)
    float const* dpsum;  // (b, h, rows) with rows = padded_rows (the preprocess's layout); a pack: (h, padded_rows)
    float* dsink;        // (heads,)
    int batch, heads, seqlen_q;  // a pack: batch sequences, seqlen_q = total_q
    int64_t padded_rows;
    VarlenSeq const* varlen_seqs;  // a pack: the prepare CTA's views, else nullptr
    int block_m;                   // a pack: rows per query tile of the dPsum layout (VarlenSeq::m_start's)
    VarlenStatus const* status;    // a pack: the prepare CTA's status word (a rejected pack keeps its NaN dsink)
};

// Varlen: the sequences' rows in pack order (each from its own dPsum tiles).
template <int kThreads, bool Varlen>
__global__ void __launch_bounds__(kThreads) bwd_sink_grad_kernel(SinkGradParams const p) {
    static_assert((kThreads & (kThreads - 1)) == 0, "the tree reduction halves a power of two");
    __shared__ float partial[kThreads];
    int const h = blockIdx.x;
    if constexpr (Varlen) {
        if (p.status->code != 0) { return; }
    }
    float const sink = p.sink[h];
    float acc = 0.f;
    for (int b = 0; b < p.batch; ++b) {
        float const* lse;
        float const* dpsum;
        int rows;
        if constexpr (Varlen) {
            VarlenSeq const s = p.varlen_seqs[b];
            lse = p.lse + int64_t(h) * p.seqlen_q + s.q_start;
            dpsum = p.dpsum + int64_t(h) * p.padded_rows + int64_t(s.m_start) * p.block_m;
            rows = s.len_q;
        } else {
            int64_t const bh = int64_t(b) * p.heads + h;
            lse = p.lse + bh * p.seqlen_q;
            dpsum = p.dpsum + bh * p.padded_rows;
            rows = p.seqlen_q;
        }
        for (int r = threadIdx.x; r < rows; r += kThreads) { acc += expf(sink - lse[r]) * dpsum[r]; }
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int width = kThreads / 2; width > 0; width /= 2) {
        if (threadIdx.x < width) { partial[threadIdx.x] += partial[threadIdx.x + width]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) { p.dsink[h] = -partial[0]; }
}

}  // namespace bwd
}  // namespace flash_dash
