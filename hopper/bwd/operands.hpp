// The MMA warpgroups' GEMM operands in the backward's two layouts (bwd/traits.hpp, kSwapdKV), which compute the same
// products with A and B exchanged: S^T = K Q^T or S = Q K^T, dV = P^T dO or dV^T = dO^T P, and so on.
#pragma once
#include <cute/tensor.hpp>

#include "common/utils.hpp"

namespace flash_dash {
namespace bwd {

// A thread's fragment of the smem tensor `t` as the B operand (kB) or the A operand of its GEMM.
template <bool kB, class ThrMma, class T>
CUTE_DEVICE auto operand_fragment(ThrMma const& thr, T const& t) {
    if constexpr (kB) {
        return thr.partition_fragment_B(t);
    } else {
        return thr.partition_fragment_A(t);
    }
}

// The warpgroup GEMM c (+)= x y^T, or c (+)= y x^T when kSwapAB (x is then the B operand), issued without a wait.
template <bool kZeroInit, bool kSwapAB, class TiledMma, class TX, class TY, class TC>
CUTE_DEVICE void gemm_ab(TiledMma& mma, TX const& x, TY const& y, TC& c) {
    if constexpr (kSwapAB) {
        wg_gemm<kZeroInit, -1>(mma, y, x, c);
    } else {
        wg_gemm<kZeroInit, -1>(mma, x, y, c);
    }
}

}  // namespace bwd
}  // namespace flash_dash
