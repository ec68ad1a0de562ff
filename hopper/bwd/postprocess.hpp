// Backward postprocess: dQ = softmax_scale * dq_accum converted to the input dtype (the accumulator
// tile is stored in the dQ-MMA accumulator order, see flash_bwd_kernel_sm90.h); GQA: dK/dV fp32
// accumulators converted to the input dtype.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "bwd/traits.hpp"

namespace flash_dash {
namespace bwd {

struct PostprocessParams {
    float const* dq_accum;
    void* dq;
    int64_t dq_row, dq_head, dq_batch;
    int batch, heads, seqlen_q, num_m;
    int first_m;  // Q tiles m < first_m see no key (above the causal mask or window, seqlen_q > seqlen_k + right):
                  // dQ = 0, accumulator unwritten
    float scale;
};

// The accumulator tile is read in its MMA order (coalesced float4 loads), transposed through shared
// memory into rows, and written as 4-element vectors (8 bytes per thread, whole rows per warp): the
// MMA-order 4-byte stores it replaces ran at ~1.2 TB/s (170 us of a 16k-token backward on an H200).
constexpr int kPostprocessThreads = 256;

template <class Traits>
__global__ void __launch_bounds__(kPostprocessThreads) bwd_postprocess_dq_kernel(PostprocessParams const p) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    // Row pitch + 8 floats: the float2 writes of a half-warp (4 rows x 8 columns) hit 32 distinct banks.
    constexpr int kPitch = kHeadDim + 8;
    __shared__ __align__(16) float tile[kBlockM * kPitch];
    int const m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    constexpr int kWG = Traits::DqHandoffT::kThreadsPerWG;
    int const tid = threadIdx.x, wg = tid / kWG, t = tid % kWG;
    typename Traits::TiledMmadQ mma;
    auto thr = mma.get_thread_slice(tid);
    Tensor c = make_identity_tensor(Shape<typename Traits::TileM, typename Traits::TileD>{});
    Tensor tc = thr.partition_C(c);
    static_assert(decltype(size(tc))::value == Traits::kdQFragSize);
    int64_t const bh = int64_t(b) * p.heads + h;
    static_assert(kPostprocessThreads == Traits::NumMmaThreads, "one thread per MMA thread of the tile");
    float const* acc = p.dq_accum + (bh * p.num_m + m) * int64_t(kBlockM * kHeadDim) + wg * Traits::kdQSliceFloats;
    bool const unwritten = m < p.first_m;  // block-uniform
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
    constexpr int kThreadsPerRow = kCols <= 16 ? 16 : 32;
    constexpr int kRowsPerPass = kPostprocessThreads / kThreadsPerRow;
    static_assert(kHeadDim % 4 == 0 && kCols <= 32 && kBlockM % kRowsPerPass == 0);
    int const col = (tid % kThreadsPerRow) * 4;
    Element* dq = static_cast<Element*>(p.dq) + b * p.dq_batch + h * p.dq_head + col;
    cutlass::NumericArrayConverter<Element, float, 4> cvt;
    CUTLASS_PRAGMA_UNROLL
    for (int r = tid / kThreadsPerRow; r < kBlockM; r += kRowsPerPass) {
        int const row = m * kBlockM + r;
        if (row < p.seqlen_q && col < kHeadDim) {
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
    float const* accum;  // (B, Hk, rows_padded, d)
    void* out;
    int64_t row, head, batch;
    int batch_size, heads_k, seqlen_k, rows_padded;
};

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
