// Argument checks for the CUDA ops. The Python layer (flash_attn_dash/checks.py) reports the same
// problems with friendlier messages first; these guard direct torch.ops calls.
#pragma once
#include <string>
#include <cuda_runtime.h>
#include <torch/extension.h>

namespace flash_dash {

// Numbers in error messages go through std::to_string: streaming an integer into torch's message builder crashed
// inside the extension on the H200 image (a segfault in ostream::_M_insert<long>, seen in test_bwd_gpu).
inline std::string num(int64_t v) { return std::to_string(v); }

inline std::string shape_of(at::IntArrayRef sizes) {
    std::string out = "(";
    for (size_t d = 0; d < sizes.size(); ++d) { out += (d ? ", " : "") + num(sizes[d]); }
    return out + ")";
}

inline std::string shape_of(const at::Tensor& t) { return shape_of(t.sizes()); }

inline void check_attn_tensor(const at::Tensor& t, const char* name, const at::Tensor& ref) {
    TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
    TORCH_CHECK(t.device() == ref.device(), name, " must be on the same device as q");
    TORCH_CHECK(t.dim() == 4, name, " must be 4-D (batch, seqlen, heads, head_dim)");
    TORCH_CHECK(t.scalar_type() == ref.scalar_type(), name, " must have q's dtype");
    TORCH_CHECK(t.stride(-1) == 1, name, " must have a contiguous last dimension");
    const int64_t elem = t.element_size();
    for (int d = 0; d < 3; ++d) {
        TORCH_CHECK(t.size(d) <= 1 || (t.stride(d) * elem) % 16 == 0, name, ".stride(", num(d),
                    ") must be a multiple of 16 bytes (TMA)");
    }
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name, " must be 16-byte aligned");
    TORCH_CHECK(t.numel() <= INT32_MAX, name, " is too large for 32-bit indexing");
}

inline int device_attribute(const at::Tensor& t, cudaDeviceAttr attr) {
    int value = 0;
    TORCH_CHECK(cudaDeviceGetAttribute(&value, attr, t.device().index()) == cudaSuccess,
                "cudaDeviceGetAttribute failed");
    return value;
}

inline void check_sm90(const at::Tensor& q) {
    const int major = device_attribute(q, cudaDevAttrComputeCapabilityMajor);
    const int minor = device_attribute(q, cudaDevAttrComputeCapabilityMinor);
    TORCH_CHECK(major == 9 && minor == 0, "flash_attn_dash kernels need an sm90 GPU, got sm", num(major), num(minor));
}

inline int grid_size(const at::Tensor& q, int64_t sm_margin) {
    const int sms = device_attribute(q, cudaDevAttrMultiProcessorCount);
    TORCH_CHECK(sm_margin >= 0 && sm_margin < sms, "sm_margin must be in [0, ", num(sms), "), got ", num(sm_margin));
    return sms - static_cast<int>(sm_margin);
}

}  // namespace flash_dash
