// The sliding window of the causal kernels: row i sees keys [i + sk - sq - left, i + sk - sq + right].
#pragma once

namespace flash_dash {

// A window side that clips nothing: larger than any key distance (the host keeps seqlens below 2^29, so every
// bound formed with it stays inside int32). The causal mask is (kUnboundedWindow, 0).
constexpr int kUnboundedWindow = 1 << 30;

// Whether a causal launch's window is a sliding window (its kernels compile the window's bounds in), not the causal
// mask (left unbounded, right 0).
constexpr bool is_sliding_window(int left, int right) { return left < kUnboundedWindow || right != 0; }

}  // namespace flash_dash
