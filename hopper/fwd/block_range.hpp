// Which K/V blocks a forward Q tile visits and which of them need the element mask. Plain C++ (host-compilable):
// tests/test_fwd_block_range.py checks it against every element of random tiles.
//
// A tile covers query rows [row0, row0 + kBlockM) (row0 < 0 for the shifted first tile of a causal launch; rows
// outside [0, seqlen_q) do not exist). Causal masks and windows are aligned bottom-right: row i sees key j iff
// i + sk - sq - left <= j <= i + sk - sq + right (the causal mask: left unbounded, right 0; kWindow compiles the
// left side in). The consumers walk the blocks from n_max - 1 down to n_min; those the right side or seqlen_k cut come
// first, those the left side cuts (below unmasked_min) last.
#pragma once
#include "common/host_device.hpp"
#include "common/window.hpp"

namespace flash_dash {

struct FwdMaskShape {
    int seqlen_q, seqlen_k;
    bool causal;                 // the causal kernels: the causal mask or a window
    int window_left, window_right;
};

template <int kBlockM, int kBlockN, bool kWindow>
struct FwdBlockRange {
    // One past the last block a row of the tile sees (0: none).
    FLASH_DASH_HD static int n_max(FwdMaskShape const& s, int row0) {
        int n = (s.seqlen_k + kBlockN - 1) / kBlockN;
        if (s.causal) {
            int const row_end = s.seqlen_q < row0 + kBlockM ? s.seqlen_q : row0 + kBlockM;
            int const col_end = row_end + s.seqlen_k - s.seqlen_q + (kWindow ? s.window_right : 0);  // exclusive
            int const last = col_end <= 0 ? 0 : (col_end + kBlockN - 1) / kBlockN;
            n = n < last ? n : last;
        }
        return n;
    }
    // The first block a row of the tile sees (a tile with n_max <= n_min sees none).
    FLASH_DASH_HD static int n_min(FwdMaskShape const& s, int row0) {
        if (!kWindow) { return 0; }
        int const col0 = (row0 > 0 ? row0 : 0) + s.seqlen_k - s.seqlen_q - s.window_left;
        return col0 <= 0 ? 0 : col0 / kBlockN;
    }
    // Whether block n needs the element mask: it straddles seqlen_k or a side of the mask for some row of the tile.
    FLASH_DASH_HD static bool needs_mask(FwdMaskShape const& s, int row0, int n) {
        int const col0 = n * kBlockN;
        int const offset = s.seqlen_k - s.seqlen_q;
        if (kWindow) {
            return col0 + kBlockN > s.seqlen_k || col0 + kBlockN > row0 + offset + s.window_right + 1 ||
                   col0 < row0 + kBlockM - 1 + offset - s.window_left;
        }
        return col0 + kBlockN > s.seqlen_k || (s.causal && col0 + kBlockN > row0 + offset + 1);
    }
    // The blocks below this one are cut by the window's left side (n_min without a window).
    FLASH_DASH_HD static int unmasked_min(FwdMaskShape const& s, int row0, int n_lo) {
        if (!kWindow) { return n_lo; }
        int const left_cut = row0 + kBlockM - 1 + s.seqlen_k - s.seqlen_q - s.window_left;  // keys below it are cut
        return left_cut > n_lo * kBlockN ? (left_cut + kBlockN - 1) / kBlockN : n_lo;
    }
};

}  // namespace flash_dash
