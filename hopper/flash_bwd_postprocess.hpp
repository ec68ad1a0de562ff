// Backward postprocess: dQ = softmax_scale * dq_accum converted to the input dtype (the accumulator
// tile is stored in the dQ-MMA accumulator order, see flash_bwd_kernel_sm90.h); GQA: dK/dV fp32
// accumulators converted to the input dtype.
#pragma once
#include "mainloop_bwd_sm90.hpp"

namespace flash_dash {
namespace bwd {

struct PostprocessParams {
    float const* dq_accum;
    void* dq;
    int64_t dq_row, dq_head, dq_batch;
    int batch, heads, seqlen_q, num_m;
    float scale;
};

template <class Traits>
__global__ void __launch_bounds__(256) bwd_postprocess_dq_kernel(PostprocessParams const p) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    int const m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int const tid = threadIdx.x, wg = tid / 128, t = tid % 128;
    typename Traits::TiledMmadQ mma;
    auto thr = mma.get_thread_slice(tid);
    Tensor c = make_identity_tensor(Shape<typename Traits::TileM, typename Traits::TileD>{});
    Tensor tc = thr.partition_C(c);
    static_assert(decltype(size(tc))::value == Traits::kdQFragSize);
    int64_t const bh = int64_t(b) * p.heads + h;
    float const* acc = p.dq_accum + (bh * p.num_m + m) * int64_t(kBlockM * kHeadDim) + wg * Traits::kdQSliceFloats;
    Element* dq = static_cast<Element*>(p.dq) + b * p.dq_batch + h * p.dq_head;
    cutlass::NumericArrayConverter<Element, float, 2> cvt;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < Traits::kdQFragSize / 4; ++j) {
        float4 v = *reinterpret_cast<float4 const*>(acc + j * 512 + t * 4);
        float vals[4] = {v.x, v.y, v.z, v.w};
        CUTLASS_PRAGMA_UNROLL
        for (int q = 0; q < 4; q += 2) {
            int const row = m * kBlockM + get<0>(tc(4 * j + q));
            int const col = get<1>(tc(4 * j + q));
            if (row < p.seqlen_q) {
                cutlass::Array<float, 2> f;
                f[0] = vals[q] * p.scale;
                f[1] = vals[q + 1] * p.scale;
                *reinterpret_cast<cutlass::Array<Element, 2>*>(dq + row * p.dq_row + col) = cvt(f);
            }
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
__global__ void __launch_bounds__(256) bwd_postprocess_kv_kernel(PostprocessKVParams const p) {
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
