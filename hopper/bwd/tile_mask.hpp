// Whether a backward (K/V tile n, Q tile m) step needs the element mask. Plain C++ (host-compilable):
// tests/test_bwd_tile_mask.py checks it against every element of random tiles.
#pragma once
#include "common/host_device.hpp"
#include "schedule/policies.hpp"

namespace flash_dash {
namespace bwd {

// Keys [n_base, n_base + kBlockN) x queries [m_base, m_base + kBlockM): true if the tile straddles seqlen_q,
// seqlen_k or a side of the mask (query i sees keys up to i + sk - sq (causal), or
// [i + sk - sq - left, i + sk - sq + right] (local: a sliding window on the causal kernels)).
template <int kBlockM, int kBlockN, bool Is_causal, bool Is_local>
FLASH_DASH_HD bool tile_needs_mask(SchedShape const& s, int m_base, int n_base) {
    int const off = s.seqlen_k - s.seqlen_q;
    int const right = Is_local ? s.window_right : 0;
    return (m_base + kBlockM > s.seqlen_q) || (n_base + kBlockN > s.seqlen_k) ||
           (Is_causal && n_base + kBlockN - 1 > m_base + off + right) ||
           (Is_local && n_base < m_base + kBlockM - 1 + off - s.window_left);
}

}  // namespace bwd
}  // namespace flash_dash
