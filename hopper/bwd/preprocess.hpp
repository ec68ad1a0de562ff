// Backward preprocess: dPsum = rowsum(dO * O) (fp32), LSE in log2 units (-inf -> 0; padded rows 0),
// zeroed dQ semaphore (the main kernel's first contribution to a dQ tile stores, so the fp32
// accumulator needs no zero fill) and tile counter. Grid (M, H, B), kPreprocessThreads threads.
#pragma once
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/array.h>
#include <cstdint>

#include "common/varlen.hpp"

namespace flash_dash {
namespace bwd {

struct PreprocessParams {
    void const* dout;
    void const* out;
    float const* lse;  // (b, h, sq) contiguous; a pack: (h, total_q)
    int64_t do_row, do_head, do_batch, o_row, o_head, o_batch;
    int batch, heads, seqlen_q, num_m;  // a pack: seqlen_q = total_q, num_m = query tiles per head (m_cap)
    float* dpsum;
    float* lse_log2;
    int* dq_sem;
    int* tile_counter;
    VarlenSeq const* varlen_seqs;  // a pack: the prepare CTA's views (batch of them), else nullptr
};

constexpr int kPreprocessThreads = 256;

// Grid (M, H, B), or for a pack (m_cap, H, 1) over each head's workspace tiles.
template <class Element, int kBlockM, int kHeadDim, bool Varlen>
__global__ void __launch_bounds__(kPreprocessThreads) bwd_preprocess_kernel(PreprocessParams const p) {
    // Threads per row, 8 elements each; a power of two so a row's threads reduce with xor shuffles (for a head dim
    // that is not one, the last threads of a row load nothing).
    constexpr int kCols = kHeadDim / 8;
    constexpr int kTPR = kCols <= 8 ? 8 : (kCols <= 16 ? 16 : 32);
    constexpr int kRPP = kPreprocessThreads / kTPR;     // rows per pass
    static_assert(kHeadDim % 8 == 0 && kCols <= 32);
    int const h = blockIdx.y;
    int const tr = threadIdx.x / kTPR, tc = threadIdx.x % kTPR;
    // The tile: its query block m, its rows' sources (from row 0 of the batch or sequence), its valid rows and its
    // workspace tile.
    int m, rows;
    int64_t tile, sem;
    Element const* dO = static_cast<Element const*>(p.dout) + h * p.do_head;
    Element const* O = static_cast<Element const*>(p.out) + h * p.o_head;
    float const* lse_src;
    if constexpr (Varlen) {
        int const x = blockIdx.x;
        tile = sem = int64_t(h) * p.num_m + x;
        if (threadIdx.x == 0) { p.dq_sem[sem] = 0; }
        if (threadIdx.x == 0 && x == 0 && h == 0) { *p.tile_counter = 0; }
        int const i = varlen_seq_of_tile(p.varlen_seqs, p.batch, x, kBlockM, /*keys=*/false);
        if (i < 0) { return; }
        VarlenSeq const s = p.varlen_seqs[i];
        m = x - s.m_start;
        rows = s.len_q;
        dO += s.q_start * p.do_row;
        O += s.q_start * p.o_row;
        lse_src = p.lse + int64_t(h) * p.seqlen_q + s.q_start;
    } else {
        m = blockIdx.x;
        int const b = blockIdx.z;
        int64_t const bh = int64_t(b) * p.heads + h;
        tile = bh * p.num_m + m;
        sem = (int64_t(m) * p.batch + b) * p.heads + h;
        rows = p.seqlen_q;
        dO += b * p.do_batch;
        O += b * p.o_batch;
        lse_src = p.lse + bh * p.seqlen_q;
        if (threadIdx.x == 0) { p.dq_sem[sem] = 0; }
        if (threadIdx.x == 0 && m == 0 && h == 0 && b == 0) { *p.tile_counter = 0; }
    }
    cutlass::NumericArrayConverter<float, Element, 8> cvt;
    for (int r = tr; r < kBlockM; r += kRPP) {
        int const row = m * kBlockM + r;
        float acc = 0.f;
        if (row < rows && tc < kCols) {
            auto a = *reinterpret_cast<cutlass::Array<Element, 8> const*>(dO + row * p.do_row + tc * 8);
            auto o = *reinterpret_cast<cutlass::Array<Element, 8> const*>(O + row * p.o_row + tc * 8);
            auto af = cvt(a);
            auto of = cvt(o);
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < 8; ++i) { acc += af[i] * of[i]; }
        }
        CUTLASS_PRAGMA_UNROLL
        for (int s = kTPR / 2; s > 0; s /= 2) { acc += __shfl_xor_sync(0xffffffffu, acc, s); }
        if (tc == 0) {
            int64_t const idx = tile * kBlockM + r;
            p.dpsum[idx] = acc;
            float l = 0.f;
            if (row < rows) {
                float const v = lse_src[row];
                l = (v == -INFINITY) ? 0.f : v * float(M_LOG2E);
            }
            p.lse_log2[idx] = l;
        }
    }
}

}  // namespace bwd
}  // namespace flash_dash
