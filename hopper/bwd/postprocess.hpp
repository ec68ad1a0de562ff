// Backward postprocess: dQ = softmax_scale * dq_accum converted to the input dtype (the accumulator
// tile is stored in the dQ-MMA accumulator order, see flash_bwd_kernel_sm90.h); GQA: dK/dV fp32
// accumulators converted to the input dtype.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "bwd/traits.hpp"
#include "common/varlen.hpp"
#include "schedule/policies.hpp"

namespace flash_dash {
namespace bwd {

struct PostprocessParams {
    float const* dq_accum;
    void* dq;
    int64_t dq_row, dq_head, dq_batch;
    int batch, heads, seqlen_q, num_m;  // a pack: batch sequences, num_m query tiles per head (m_cap)
    int first_m;  // Q tiles m < first_m see no key (above the causal mask or window, seqlen_q > seqlen_k + right):
                  // dQ = 0, accumulator unwritten (a pack: per sequence, from `sched`)
    float scale;
    VarlenSeq const* varlen_seqs;  // a pack: the prepare CTA's views, else nullptr
    SchedShape sched;              // a pack: the grid of the main kernel (its mask and tile sizes)
};

// The accumulator tile is read in its MMA order (coalesced float4 loads), transposed through shared
// memory into rows, and written as 4-element vectors (8 bytes per thread, whole rows per warp): the
// MMA-order 4-byte stores it replaces ran at ~1.2 TB/s (170 us of a 16k-token backward on an H200).
constexpr int kPostprocessThreads = 256;

// The dQ postprocess's shared-memory tile (kBlockM rows, row pitch + 8 floats: the float2 writes of a half-warp,
// 4 rows x 8 columns, hit 32 distinct banks): static up to 48 KB, else dynamic (hdim 192 and 256; the launcher opts in
// to kBytes).
template <class Traits>
struct DqPostprocessTile {
    static constexpr int kPitch = Traits::kHeadDim + 8;
    static constexpr int kBytes = Traits::kBlockM * kPitch * int(sizeof(float));
    static constexpr bool kDynamic = kBytes > 48 * 1024;
    static constexpr int kDynamicBytes = kDynamic ? kBytes : 0;
};

// Grid (M, H, B), or for a pack (m_cap, H, 1) over each head's workspace tiles.
template <class Traits, bool Varlen>
__global__ void __launch_bounds__(kPostprocessThreads) bwd_postprocess_dq_kernel(PostprocessParams const p) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    using Tile = DqPostprocessTile<Traits>;
    constexpr int kPitch = Tile::kPitch;
    float* tile;
    if constexpr (Tile::kDynamic) {
        extern __shared__ float4 dq_tile_dynamic[];
        tile = reinterpret_cast<float*>(dq_tile_dynamic);
    } else {
        __shared__ __align__(16) float dq_tile[kBlockM * kPitch];
        tile = dq_tile;
    }
    int const h = blockIdx.y;
    // The tile: its query block m, its workspace tile, its valid rows, its dQ rows (from row 0 of the batch or the
    // sequence) and whether no key tile wrote it.
    int m, rows;
    int64_t acc_tile;
    Element* dq = static_cast<Element*>(p.dq) + h * p.dq_head;
    bool unwritten;  // block-uniform
    if constexpr (Varlen) {
        int const x = blockIdx.x;
        int const i = varlen_seq_of_tile(p.varlen_seqs, p.batch, x, kBlockM, /*keys=*/false);
        if (i < 0) { return; }
        VarlenSeq const s = p.varlen_seqs[i];
        SchedShape seq = p.sched;
        seq.seqlen_q = s.len_q;
        seq.seqlen_k = s.len_k;
        seq.num_m = (s.len_q + kBlockM - 1) / kBlockM;
        seq.num_n = (s.len_k + Traits::kBlockN - 1) / Traits::kBlockN;
        m = x - s.m_start;
        acc_tile = int64_t(h) * p.num_m + x;
        rows = s.len_q;
        dq += s.q_start * p.dq_row;
        unwritten = s.len_k == 0 || m < m_min_of(seq, 0);
    } else {
        m = blockIdx.x;
        int const b = blockIdx.z;
        acc_tile = (int64_t(b) * p.heads + h) * p.num_m + m;
        rows = p.seqlen_q;
        dq += b * p.dq_batch;
        unwritten = m < p.first_m;
    }
    constexpr int kWG = Traits::DqHandoffT::kThreadsPerWG;
    int const tid = threadIdx.x, wg = tid / kWG, t = tid % kWG;
    typename Traits::TiledMmadQ mma;
    auto thr = mma.get_thread_slice(tid);
    Tensor c = make_identity_tensor(Shape<typename Traits::TileM, typename Traits::TileD>{});
    Tensor tc = thr.partition_C(c);
    static_assert(decltype(size(tc))::value == Traits::kdQFragSize);
    static_assert(kPostprocessThreads == Traits::NumMmaThreads, "one thread per MMA thread of the tile");
    float const* acc = p.dq_accum + acc_tile * int64_t(kBlockM * kHeadDim) + wg * Traits::kdQSliceFloats;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < Traits::kdQFragSize / 4; ++j) {
        float4 const v = unwritten ? make_float4(0.f, 0.f, 0.f, 0.f)
                                   : *reinterpret_cast<float4 const*>(Traits::DqHandoffT::float4_at(acc, j, t));
        // Accumulator elements (2i, 2i+1) are adjacent columns of one row.
        *reinterpret_cast<float2*>(&tile[get<0>(tc(4 * j)) * kPitch + get<1>(tc(4 * j))]) = make_float2(v.x, v.y);
        *reinterpret_cast<float2*>(&tile[get<0>(tc(4 * j + 2)) * kPitch + get<1>(tc(4 * j + 2))]) = make_float2(v.z, v.w);
    }
    __syncthreads();
    // Threads per row, 4 columns each, rounded up to a power of two (a head dim that is not one leaves the last
    // threads of a row idle).
    constexpr int kCols = kHeadDim / 4;
    constexpr int kThreadsPerRow = kCols <= 16 ? 16 : (kCols <= 32 ? 32 : 64);
    constexpr int kRowsPerPass = kPostprocessThreads / kThreadsPerRow;
    static_assert(kHeadDim % 4 == 0 && kCols <= 64 && kBlockM % kRowsPerPass == 0);
    int const col = (tid % kThreadsPerRow) * 4;
    dq += col;
    cutlass::NumericArrayConverter<Element, float, 4> cvt;
    CUTLASS_PRAGMA_UNROLL
    for (int r = tid / kThreadsPerRow; r < kBlockM; r += kRowsPerPass) {
        int const row = m * kBlockM + r;
        if (row < rows && col < kHeadDim) {
            float4 const v = *reinterpret_cast<float4 const*>(&tile[r * kPitch + col]);
            cutlass::Array<float, 4> f;
            f[0] = v.x * p.scale; f[1] = v.y * p.scale; f[2] = v.z * p.scale; f[3] = v.w * p.scale;
            // One 8-byte store (16-byte aligned base and strides, checked by the binding; col a multiple of
            // 4): storing the 2-byte-aligned cutlass::Array gave two 4-byte stores.
            auto const out = cvt(f);
            *reinterpret_cast<uint2*>(dq + row * p.dq_row) = *reinterpret_cast<uint2 const*>(&out);
        }
    }
}

struct PostprocessKVParams {
    float const* accum;  // (B, Hk, rows_padded, d); a pack: (Hk, rows_padded, d), each sequence from its n_start tile
    void* out;
    int64_t row, head, batch;
    int batch_size, heads_k, seqlen_k, rows_padded;  // a pack: batch_size sequences, seqlen_k = total_k
    VarlenSeq const* varlen_seqs;  // a pack: the prepare CTA's views, else nullptr
    int block_n;                   // a pack: rows per key tile
};

// A pack: grid (n_cap, Hk), one key tile of a head per block, its rows inside its sequence.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kPostprocessThreads) bwd_postprocess_kv_varlen_kernel(PostprocessKVParams const p) {
    constexpr int kVec = 8;
    constexpr int kPerRow = kHeadDim / kVec;
    int const x = blockIdx.x, hk = blockIdx.y;
    int const i = varlen_seq_of_tile(p.varlen_seqs, p.batch_size, x, p.block_n, /*keys=*/true);
    if (i < 0) { return; }
    VarlenSeq const s = p.varlen_seqs[i];
    if (s.folded) { return; }  // its tiles stored dK/dV themselves
    int const row0 = (x - s.n_start) * p.block_n;
    cutlass::NumericArrayConverter<Element, float, kVec> cvt;
    for (int e = threadIdx.x; e < p.block_n * kPerRow; e += kPostprocessThreads) {
        int const r = e / kPerRow, v = e - r * kPerRow;
        if (row0 + r >= s.len_k) { break; }  // rows grow with e
        float const* src = p.accum + ((int64_t(hk) * p.rows_padded + int64_t(x) * p.block_n + r) * kHeadDim) + v * kVec;
        cutlass::Array<float, kVec> f;
        *reinterpret_cast<float4*>(&f[0]) = *reinterpret_cast<float4 const*>(src);
        *reinterpret_cast<float4*>(&f[4]) = *reinterpret_cast<float4 const*>(src + 4);
        Element* dst = static_cast<Element*>(p.out) + hk * p.head + int64_t(s.k_start + row0 + r) * p.row + v * kVec;
        *reinterpret_cast<cutlass::Array<Element, kVec>*>(dst) = cvt(f);
    }
}

template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kPostprocessThreads) bwd_postprocess_kv_kernel(PostprocessKVParams const p) {
    constexpr int kVec = 8;
    constexpr int kPerRow = kHeadDim / kVec;
    int64_t const total = int64_t(p.batch_size) * p.heads_k * p.seqlen_k * kPerRow;
    cutlass::NumericArrayConverter<Element, float, kVec> cvt;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        int const v = int(i % kPerRow);
        int64_t r = i / kPerRow;
        int const row = int(r % p.seqlen_k);
        r /= p.seqlen_k;
        int const hk = int(r % p.heads_k);
        int const b = int(r / p.heads_k);
        float const* src = p.accum + ((int64_t(b) * p.heads_k + hk) * p.rows_padded + row) * kHeadDim + v * kVec;
        cutlass::Array<float, kVec> f;
        *reinterpret_cast<float4*>(&f[0]) = *reinterpret_cast<float4 const*>(src);
        *reinterpret_cast<float4*>(&f[4]) = *reinterpret_cast<float4 const*>(src + 4);
        Element* dst = static_cast<Element*>(p.out) + b * p.batch + hk * p.head + row * p.row + v * kVec;
        *reinterpret_cast<cutlass::Array<Element, kVec>*>(dst) = cvt(f);
    }
}

}  // namespace bwd
}  // namespace flash_dash
