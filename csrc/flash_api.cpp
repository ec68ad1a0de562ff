// Torch binding: CUDA implementations of flash_attn_dash::fwd_out / bwd_out (schemas are defined in
// flash_attn_dash/ops.py) and the table of kernel instantiations this build contains.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "checks.h"
#include "kernel_api.h"

namespace flash_dash {
namespace {

struct FwdEntry {
    const char* name;
    int head_dim;
    at::ScalarType dtype;
    void (*run)(FwdParams const&, cudaStream_t);
};

struct BwdEntry {
    const char* name;
    int head_dim;
    at::ScalarType dtype;
    size_t (*workspace_bytes)(BwdParams const&);
    void (*run)(BwdParams const&, void*, cudaStream_t);
};

// FLASH_DASH_HAS_* come from setup.py, one per compiled file in hopper/instantiations/.
#define FD_FWD(D, TAG, DT) {"fwd_hdim" #D "_" #TAG, D, DT, &run_fwd<TAG##_t, D>},
#define FD_BWD(D, TAG, DT) {"bwd_hdim" #D "_" #TAG, D, DT, &bwd_workspace_bytes<TAG##_t, D>, &run_bwd<TAG##_t, D>},

const std::vector<FwdEntry> kFwd = {
#ifdef FLASH_DASH_HAS_FWD_HDIM64_BF16
    FD_FWD(64, bf16, at::kBFloat16)
#endif
#ifdef FLASH_DASH_HAS_FWD_HDIM64_FP16
    FD_FWD(64, fp16, at::kHalf)
#endif
#ifdef FLASH_DASH_HAS_FWD_HDIM128_BF16
    FD_FWD(128, bf16, at::kBFloat16)
#endif
#ifdef FLASH_DASH_HAS_FWD_HDIM128_FP16
    FD_FWD(128, fp16, at::kHalf)
#endif
};

const std::vector<BwdEntry> kBwd = {
#ifdef FLASH_DASH_HAS_BWD_HDIM64_BF16
    FD_BWD(64, bf16, at::kBFloat16)
#endif
#ifdef FLASH_DASH_HAS_BWD_HDIM64_FP16
    FD_BWD(64, fp16, at::kHalf)
#endif
#ifdef FLASH_DASH_HAS_BWD_HDIM128_BF16
    FD_BWD(128, bf16, at::kBFloat16)
#endif
#ifdef FLASH_DASH_HAS_BWD_HDIM128_FP16
    FD_BWD(128, fp16, at::kHalf)
#endif
};

template <typename Entry>
const Entry& find_entry(const std::vector<Entry>& table, int head_dim, at::ScalarType dtype, const char* what) {
    for (const auto& e : table) {
        if (e.head_dim == head_dim && e.dtype == dtype) return e;
    }
    TORCH_CHECK(false, "no ", what, " kernel compiled for head_dim ", head_dim, " and dtype ", dtype,
                "; rebuild with FLASH_DASH_HDIMS / FLASH_DASH_DTYPES including it");
}

TensorStrides strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

void set_fwd_params(FwdParams& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                    bool causal, int64_t sm_margin) {
    check_attn_tensor(q, "q", q);
    check_attn_tensor(k, "k", q);
    check_attn_tensor(v, "v", q);
    check_sm90(q);
    TORCH_CHECK(k.sizes() == v.sizes(), "k and v must have the same shape");
    TORCH_CHECK(k.size(0) == q.size(0) && k.size(3) == q.size(3), "k must match q in batch and head_dim");
    TORCH_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, "q heads must be a multiple of k/v heads");
    p.q = q.data_ptr();
    p.k = k.data_ptr();
    p.v = v.data_ptr();
    p.q_stride = strides_of(q);
    p.k_stride = strides_of(k);
    p.v_stride = strides_of(v);
    p.batch = q.size(0);
    p.seqlen_q = q.size(1);
    p.seqlen_k = k.size(1);
    p.num_heads = q.size(2);
    p.num_heads_k = k.size(2);
    p.head_dim = q.size(3);
    p.softmax_scale = static_cast<float>(scale);
    p.is_causal = causal;
    p.is_bf16 = q.scalar_type() == at::kBFloat16;
    p.num_sms = grid_size(q, sm_margin);
}

void check_output(const at::Tensor& t, const char* name, const at::Tensor& like) {
    check_attn_tensor(t, name, like);
    TORCH_CHECK(t.sizes() == like.sizes(), name, " must have shape ", like.sizes());
}

// Optional debug output of the backward (nullptr when absent): a contiguous CUDA tensor of `type` shaped
// (batch, heads, m_tiles, n_tiles), plus a last dimension of `fields` per record when fields > 0.
void* debug_buffer(const c10::optional<at::Tensor>& t, at::ScalarType type, int64_t fields, const at::Tensor& q,
                   const char* what) {
    if (!t.has_value()) return nullptr;
    TORCH_CHECK(t->is_cuda() && t->scalar_type() == type && t->is_contiguous() && t->dim() == (fields > 0 ? 5 : 4) &&
                    t->size(0) == q.size(0) && t->size(1) == q.size(2) && (fields == 0 || t->size(4) == fields),
                what);
    return t->data_ptr();
}

void check_lse(const at::Tensor& lse, const at::Tensor& q) {
    TORCH_CHECK(lse.is_cuda() && lse.scalar_type() == at::kFloat && lse.is_contiguous(),
                "lse must be a contiguous fp32 CUDA tensor");
    TORCH_CHECK(lse.dim() == 3 && lse.size(0) == q.size(0) && lse.size(1) == q.size(2) && lse.size(2) == q.size(1),
                "lse must have shape (batch, heads, seqlen_q)");
}

void fwd_out(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse,
             double softmax_scale, bool causal, int64_t sm_margin) {
    c10::cuda::CUDAGuard guard(q.device());
    FwdParams p{};
    set_fwd_params(p, q, k, v, softmax_scale, causal, sm_margin);
    check_output(out, "out", q);
    check_lse(lse, q);
    p.out = out.data_ptr();
    p.o_stride = strides_of(out);
    p.lse = lse.data_ptr<float>();
    const auto& entry = find_entry(kFwd, p.head_dim, q.scalar_type(), "forward");
    try {  // the launch refuses a bad FLASH_DASH_FWD_L2_PREFETCH before launching
        entry.run(p, c10::cuda::getCurrentCUDAStream());
    } catch (const std::invalid_argument& e) {
        TORCH_CHECK_VALUE(false, e.what());
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void bwd_out(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const at::Tensor& out, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
             const c10::optional<at::Tensor>& order_trace, double softmax_scale, bool causal, bool deterministic,
             int64_t schedule, int64_t sm_margin, const c10::optional<at::Tensor>& timeline) {
    c10::cuda::CUDAGuard guard(q.device());
    BwdParams p{};
    set_fwd_params(p, q, k, v, softmax_scale, causal, sm_margin);
    check_output(out, "out", q);
    check_output(dout, "dout", q);
    check_output(dq, "dq", q);
    check_output(dk, "dk", k);
    check_output(dv, "dv", v);
    check_lse(lse, q);
    TORCH_CHECK(schedule >= 0 && schedule <= static_cast<int64_t>(Schedule::kSymmetricShift),
                "schedule id must be in [0, 3], got ", schedule);
    p.out = out.data_ptr();
    p.o_stride = strides_of(out);
    p.lse = lse.data_ptr<float>();
    p.dout = dout.data_ptr();
    p.do_stride = strides_of(dout);
    p.dq = dq.data_ptr();
    p.dk = dk.data_ptr();
    p.dv = dv.data_ptr();
    p.dq_stride = strides_of(dq);
    p.dk_stride = strides_of(dk);
    p.dv_stride = strides_of(dv);
    p.deterministic = deterministic;
    p.schedule = static_cast<Schedule>(schedule);
    p.order_trace = static_cast<int*>(debug_buffer(order_trace, at::kInt, 0, q,
        "order_trace must be a contiguous int32 CUDA tensor (batch, heads, m_tiles, n_tiles)"));
    p.timeline = static_cast<long long*>(debug_buffer(timeline, at::kLong, 5, q,
        "timeline must be a contiguous int64 CUDA tensor (batch, heads, m_tiles, n_tiles, 5)"));
    const auto& entry = find_entry(kBwd, p.head_dim, q.scalar_type(), "backward");
    auto workspace = at::empty({static_cast<int64_t>(entry.workspace_bytes(p))}, q.options().dtype(at::kByte));
    try {
        entry.run(p, workspace.data_ptr(), c10::cuda::getCurrentCUDAStream());
    } catch (const std::invalid_argument& e) {
        TORCH_CHECK_VALUE(false, e.what());
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

std::vector<std::string> instantiations() {
    std::vector<std::string> names;
    for (const auto& e : kFwd) names.emplace_back(e.name);
    for (const auto& e : kBwd) names.emplace_back(e.name);
    return names;
}

}  // namespace
}  // namespace flash_dash

TORCH_LIBRARY_IMPL(flash_attn_dash, CUDA, m) {
    m.impl("fwd_out", &flash_dash::fwd_out);
    m.impl("bwd_out", &flash_dash::bwd_out);
}

PYBIND11_MODULE(_C, m) {
    m.doc() = "flash-attn-dash CUDA kernels";
    m.def("instantiations", &flash_dash::instantiations, "names of the compiled kernel instantiations");
}
