// Generic sm90 helpers shared by the forward and backward kernels.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/array.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

namespace flash_dash {

// K-major GMMA smem atom with the widest swizzle whose row fits the column count (16-bit types).
template <typename T, int kCols>
CUTE_HOST_DEVICE constexpr auto smem_atom_k_major() {
    using namespace cute;
    static_assert(sizeof(T) == 2, "16-bit element types only");
    if constexpr (kCols % 64 == 0) {
        return GMMA::Layout_K_SW128_Atom<T>{};
    } else if constexpr (kCols % 32 == 0) {
        return GMMA::Layout_K_SW64_Atom<T>{};
    } else {
        static_assert(kCols % 16 == 0, "head dim must be a multiple of 16");
        return GMMA::Layout_K_SW32_Atom<T>{};
    }
}

// GMMA accumulator layout ((2, 2, N/8), MMA_M, MMA_N) viewed as (rows, cols):
// ((2, MMA_M), (2, N/8, MMA_N)). Mode (0,1) of the value tuple is the +8 row step,
// modes (0,0) and (0,2) walk the columns.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_layout_rowcol(Layout const& acc) {
    using namespace cute;
    static_assert(decltype(rank(acc))::value == 3);
    static_assert(decltype(rank(get<0>(acc)))::value == 3);
    return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                       make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

template <class Tensor>
CUTE_HOST_DEVICE auto make_rowcol_view(Tensor&& t) {
    return cute::make_tensor(t.data(), acc_layout_rowcol(t.layout()));
}

// Accumulator layout ((2, 2, N/8), MMA_M, MMA_N) re-viewed as the RS A-operand layout
// ((2, 2, 2), MMA_M, N/16 * MMA_N): CLayout_64xN and ALayout_64x16 coincide, so the values of
// accumulator columns [16j, 16j+16) are the 16-bit A fragment of k-block j.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_layout_to_a_operand(Layout const& l) {
    using namespace cute;
    auto d = logical_divide(get<0, 2>(l), Tile<_2>{});  // ((2, N/16))
    return make_layout(make_layout(get<0, 0>(l), get<0, 1>(l), get<0, 0>(d)), get<1>(l),
                       coalesce(make_layout(get<0, 1>(d), get<2>(l))));
}

// Elementwise conversion of a register fragment through cutlass' packed converters.
template <class EngineIn, class LayoutIn, class EngineOut, class LayoutOut>
CUTE_DEVICE void convert_fragment(cute::Tensor<EngineIn, LayoutIn> const& src,
                                  cute::Tensor<EngineOut, LayoutOut>& dst) {
    using From = typename EngineIn::value_type;
    using To = typename EngineOut::value_type;
    constexpr int N = decltype(cute::size(src))::value;
    static_assert(N == decltype(cute::size(dst))::value);
    cutlass::NumericArrayConverter<To, From, N> conv;
    *reinterpret_cast<cutlass::Array<To, N>*>(dst.data()) =
        conv(*reinterpret_cast<cutlass::Array<From, N> const*>(src.data()));
}

// Warpgroup GEMM: loops over the K mode itself (cute::gemm on a rank-3 fragment never resets the
// accumulate flag). kZeroInit overwrites the accumulator. kWait >= 0 waits for that many
// outstanding wgmma groups; -1 returns right after the commit.
template <bool kZeroInit, int kWait, class TiledMma, class TA, class TB, class TC>
CUTE_DEVICE void wg_gemm(TiledMma& mma, TA const& tA, TB const& tB, TC& tC) {
    using namespace cute;
    // RS when A is a register fragment (value type is the element), SS when it holds smem descriptors.
    constexpr bool kARegs =
        !cute::is_same_v<cute::remove_cvref_t<typename TA::value_type>, cute::GmmaDescriptor>;
    if constexpr (kARegs) { warpgroup_fence_operand(const_cast<TA&>(tA)); }
    warpgroup_fence_operand(tC);
    warpgroup_arrive();
    if constexpr (kZeroInit) { mma.accumulate_ = GMMA::ScaleOut::Zero; }
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < size<2>(tA); ++k) {
        cute::gemm(mma, tA(_, _, k), tB(_, _, k), tC);
        mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    if constexpr (kWait >= 0) { warpgroup_wait<kWait>(); }
    warpgroup_fence_operand(tC);
    if constexpr (kARegs) { warpgroup_fence_operand(const_cast<TA&>(tA)); }
}

// tanh on the MUFU (tanh.approx.f32: relative error about 2^-11, one instruction where tanhf is a polynomial
// sequence). The softcap kernels apply it to every score.
CUTE_DEVICE float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Quad (4 lanes sharing a GMMA accumulator row) reductions.
CUTE_DEVICE float quad_allreduce_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
    return x;
}
CUTE_DEVICE float quad_allreduce_sum(float x) {
    x += __shfl_xor_sync(0xffffffff, x, 1);
    x += __shfl_xor_sync(0xffffffff, x, 2);
    return x;
}

}  // namespace flash_dash
