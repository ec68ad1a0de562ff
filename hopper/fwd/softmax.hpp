// Online softmax over GMMA accumulators (fp32, exp2 with the scale folded in).
#pragma once

#include <cmath>
#include <cute/tensor.hpp>
#include "common/utils.hpp"

namespace flash_dash {

// kNRows: accumulator rows owned by one thread (2 for a 64-row warpgroup tile).
// Every exponential goes to the MUFU (ex2.approx): the softmax is issue-bound, and moving some of them to the
// FMA pipe as a polynomial measured slower at both head dims.
template <int kNRows>
struct OnlineSoftmax {
    float row_max[kNRows];  // raw (unscaled) running max of S, -inf if the row has seen no key
    float row_sum[kNRows];  // thread-partial running sum (quad-reduced only at the end)
    float scale_log2;       // softmax_scale * log2(e)

    CUTE_DEVICE explicit OnlineSoftmax(float scale_log2_) : scale_log2(scale_log2_) { reset(); }

    CUTE_DEVICE void reset() {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kNRows; ++r) {
            row_max[r] = -INFINITY;
            row_sum[r] = 0.f;
        }
    }

    // S (rows, cols) in-place -> unnormalised P = exp2(S*scale_log2 - max*scale_log2).
    // o_scale[r]: factor to apply to the running O accumulator (0 when the old max was -inf).
    template <class TensorS>
    CUTE_DEVICE void online(TensorS& s, float (&o_scale)[kNRows]) {
        using namespace cute;
        static_assert(decltype(size<0>(s))::value == kNRows);
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kNRows; ++r) {
            float m = row_max[r];
            CUTLASS_PRAGMA_UNROLL
            for (int c = 0; c < size<1>(s); ++c) { m = fmaxf(m, s(r, c)); }
            m = quad_allreduce_max(m);
            // A row with no visible key so far keeps max -inf: use 0 as the offset so exp2(-inf) = 0.
            float const m_scaled = (m == -INFINITY) ? 0.f : m * scale_log2;
            o_scale[r] = exp2f(row_max[r] * scale_log2 - m_scaled);
            row_max[r] = m;
            float sum = 0.f;
            CUTLASS_PRAGMA_UNROLL
            for (int c = 0; c < size<1>(s); ++c) {
                float const x = fmaf(s(r, c), scale_log2, -m_scaled);
                float const p = exp2f(x);
                s(r, c) = p;
                sum += p;
            }
            row_sum[r] = fmaf(row_sum[r], o_scale[r], sum);
        }
    }

    // o_scale[r] = 1/sum (0 for rows without a visible key); lse[r] natural-log LSE (-inf likewise).
    CUTE_DEVICE void finalize(float softmax_scale, float (&o_scale)[kNRows], float (&lse)[kNRows]) {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kNRows; ++r) {
            float const sum = quad_allreduce_sum(row_sum[r]);
            bool const empty = (sum == 0.f) || (sum != sum);
            o_scale[r] = empty ? 0.f : 1.f / sum;
            lse[r] = empty ? -INFINITY : row_max[r] * softmax_scale + logf(sum);
        }
    }

    // finalize with a learnable sink (gpt-oss): the row's softmax denominator gains exp(sink), a logit in natural
    // units that takes no value, so O is scaled by exp(a - M) / (sum exp(a - M) + exp(sink - M)) with a the row's
    // scaled max and M = max(a, sink); lse includes the sink (a row without a visible key: O = 0, lse = sink).
    CUTE_DEVICE void finalize_with_sink(float softmax_scale, float sink, float (&o_scale)[kNRows],
                                        float (&lse)[kNRows]) {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kNRows; ++r) {
            float const sum = quad_allreduce_sum(row_sum[r]);
            bool const empty = (sum == 0.f) || (sum != sum);
            float const a = empty ? -INFINITY : row_max[r] * softmax_scale;
            float const m = fmaxf(a, sink);
            float const share = empty ? 0.f : expf(a - m);
            float const total = fmaf(sum, share, expf(sink - m));
            o_scale[r] = share / total;
            lse[r] = m + logf(total);
        }
    }
};

template <int kNRows, class TensorO>
CUTE_DEVICE void rescale_rows(TensorO& o, float const (&scale)[kNRows]) {
    using namespace cute;
    static_assert(decltype(size<0>(o))::value == kNRows);
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kNRows; ++r) {
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(o); ++c) { o(r, c) *= scale[r]; }
    }
}

}  // namespace flash_dash
