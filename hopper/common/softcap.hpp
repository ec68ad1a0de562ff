// Which softcap calls have kernels (plain C++, shared by the forward and backward launchers).
#pragma once
#include <cmath>

#include "generated/features.h"

namespace flash_dash {

// Why no kernel runs a call with this softcap, or nullptr. The softcap kernels (the tanh compiled in) exist for the
// full and causal masks, with a sliding window or a learnable sink only where the variant table says so
// (variants.SOFTCAP_WITH, generated/features.h); flash_attn_dash.features refuses the other combinations first,
// naming the argument. sliding_window: a causal launch whose window is not the causal mask (is_sliding_window).
inline char const* softcap_error(float softcap, bool sliding_window, bool sink) {
    if (!(std::isfinite(softcap) && softcap >= 0.f)) { return "flash_dash: softcap must be finite and >= 0"; }
    if (softcap == 0.f) { return nullptr; }
    if (sliding_window && !kSoftcapWithWindow) {
        return "flash_dash: no softcap kernel is built for a sliding window (window_size)";
    }
    if (sink && !kSoftcapWithSink) { return "flash_dash: no softcap kernel is built for a learnable_sink"; }
    return nullptr;
}

}  // namespace flash_dash
