// Torch binding: CUDA implementations of flash_attn_dash::fwd_out / bwd_out (schemas are defined in
// flash_attn_dash/ops.py); the kernels this build contains are listed in the generated kernel_table.h.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checks.h"
#include "kernel_table.h"

namespace flash_dash {
namespace {

// The kernel of (head_dim, head_dim_v): q/k's and v's head dims, which FLASH_DASH_HDIMS names 128 or 192v128.
template <typename Entry>
const Entry& find_entry(const std::vector<Entry>& table, int head_dim, int head_dim_v, at::ScalarType dtype,
                        const char* what) {
    for (const auto& e : table) {
        if (e.head_dim == head_dim && e.head_dim_v == head_dim_v && e.dtype == dtype) return e;
    }
    const std::string dims = head_dim == head_dim_v ? num(head_dim) : num(head_dim) + "v" + num(head_dim_v);
    TORCH_CHECK_VALUE(false, "no ", what, " kernel compiled for head_dim ", num(head_dim), ", head_dim_v ",
                      num(head_dim_v), " and dtype ", c10::toString(dtype), "; rebuild with FLASH_DASH_HDIMS including ",
                      dims, " and FLASH_DASH_DTYPES including it");
}

// Runs a kernel entry point: a std::invalid_argument (a launch the launcher refuses before launching) becomes
// a ValueError; afterwards, the launch status is checked.
template <typename Run>
void launch_checked(Run&& run) {
    try {
        run();
    } catch (const std::invalid_argument& e) {
        TORCH_CHECK_VALUE(false, e.what());
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

TensorStrides strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// The causal kernels' window from the op's (window_left, window_right) (-1 = unbounded): the causal mask is (-1, 0)
// and (-1, -1) with causal = true; the full-mask kernels take no window.
int window_side(int64_t side, const char* name) {
    TORCH_CHECK_VALUE(side >= -1 && side < kUnboundedWindow, name, " must be -1 (unbounded) or in [0, 2^30), got ",
                      num(side));
    return side < 0 ? kUnboundedWindow : static_cast<int>(side);
}

void set_fwd_params(FwdParams& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                    bool causal, int64_t sm_margin, int64_t window_left, int64_t window_right, double softcap) {
    check_attn_tensor(q, "q", q);
    check_attn_tensor(k, "k", q);
    check_attn_tensor(v, "v", q);
    check_sm90(q);
    TORCH_CHECK(k.size(0) == v.size(0) && k.size(1) == v.size(1) && k.size(2) == v.size(2),
                "v must match k in batch, seqlen and heads (its head_dim may differ)");
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
    p.head_dim_v = v.size(3);
    p.softmax_scale = static_cast<float>(scale);
    // 0 = off; the launchers refuse the combinations no softcap kernel is built for (common/softcap.hpp).
    TORCH_CHECK_VALUE(std::isfinite(softcap) && softcap >= 0 && std::isfinite(static_cast<float>(softcap)),
                      "softcap must be finite and >= 0 (0.0 = off), got ", std::to_string(softcap));
    p.softcap = static_cast<float>(softcap);
    p.is_causal = causal;
    TORCH_CHECK_VALUE(causal || (window_left == -1 && window_right == -1),
                      "a window runs on the causal kernels (causal=True), got causal=False with window (",
                      num(window_left), ", ", num(window_right), ")");
    // Every window bound the kernels form (i + sk - sq +- side, sides up to kUnboundedWindow = 2^30) stays inside
    // int32.
    TORCH_CHECK_VALUE(p.seqlen_q < kUnboundedWindow / 2 && p.seqlen_k < kUnboundedWindow / 2,
                      "seqlen_q and seqlen_k must be < 2^29, got ", num(p.seqlen_q), " and ", num(p.seqlen_k));
    p.window_left = window_side(window_left, "window_left");
    p.window_right = window_right == -1 && causal && window_left == -1 ? 0 : window_side(window_right, "window_right");
    p.num_sms = grid_size(q, sm_margin);
}

// An output (or dout) shaped like `like` but for its last dim, `cols` (out and dout: q's rows with v's head dim).
void check_output(const at::Tensor& t, const char* name, const at::Tensor& like, int64_t cols) {
    check_attn_tensor(t, name, like);
    std::vector<int64_t> shape = like.sizes().vec();
    shape.back() = cols;
    TORCH_CHECK(t.sizes() == at::IntArrayRef(shape), name, " must have shape ", shape_of(shape), ", got ", shape_of(t));
}

void check_output(const at::Tensor& t, const char* name, const at::Tensor& like) {
    check_output(t, name, like, like.size(-1));
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

// A (heads,) fp32 vector on q's device (the learnable sink and its gradient), checked before any launch.
float* heads_vector(const at::Tensor& t, const char* name, const at::Tensor& q) {
    TORCH_CHECK_VALUE(t.is_cuda() && t.device() == q.device() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
                          t.dim() == 1 && t.size(0) == q.size(2),
                      name, " must be a contiguous fp32 tensor of shape (heads,) = (", num(q.size(2)),
                      ",) on q's device");
    return t.data_ptr<float>();
}

void fwd_out(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse,
             double softmax_scale, bool causal, int64_t sm_margin, int64_t window_left, int64_t window_right,
             const c10::optional<at::Tensor>& sink, double softcap) {
    c10::cuda::CUDAGuard guard(q.device());
    FwdParams p{};
    set_fwd_params(p, q, k, v, softmax_scale, causal, sm_margin, window_left, window_right, softcap);
    if (sink.has_value()) {
        p.sink = heads_vector(*sink, "sink", q);
    }
    check_output(out, "out", q, p.head_dim_v);
    check_lse(lse, q);
    p.out = out.data_ptr();
    p.o_stride = strides_of(out);
    p.lse = lse.data_ptr<float>();
    const auto& entry = find_entry(fwd_kernels(), p.head_dim, p.head_dim_v, q.scalar_type(), "forward");
    launch_checked([&] { entry.run(p, c10::cuda::getCurrentCUDAStream()); });
}

// cu_seqlens_* (batch + 1,) and seqused_* (batch,): contiguous int32 on q's device (their values are checked on the
// device, common/varlen.hpp).
const int* offsets_of(const at::Tensor& t, const char* name, int64_t numel, const at::Tensor& q) {
    TORCH_CHECK_VALUE(t.is_cuda() && t.device() == q.device() && t.scalar_type() == at::kInt && t.is_contiguous() &&
                          t.dim() == 1 && t.numel() == numel,
                      name, " must be a contiguous int32 tensor of shape (", num(numel), ",) on q's device");
    return t.data_ptr<int>();
}

// What the prepare CTA fills with NaN when the offsets are bad (common/varlen.hpp): the contiguous outputs.
void poison_on_bad_offsets(VarlenArgs& a, std::initializer_list<const at::Tensor*> outputs16, const at::Tensor* out32) {
    int i = 0;
    for (const at::Tensor* t : outputs16) {
        if (t->is_contiguous()) {
            a.poison16[i] = t->data_ptr();
            a.poison16_count[i] = t->numel();
        }
        ++i;
    }
    if (out32 != nullptr && out32->is_contiguous()) {
        a.poison32 = out32->data_ptr<float>();
        a.poison32_count = out32->numel();
    }
}

// The packed tensors (total, heads, head_dim) as the one-batch 4-D views the dense checks take.
at::Tensor packed_view(const at::Tensor& t, const char* name) {
    TORCH_CHECK_VALUE(t.dim() == 3, name, " must be 3-D (total, heads, head_dim), got ", shape_of(t));
    return t.unsqueeze(0);
}

// A varlen op's packing arguments into p.varlen and p.batch (the number of sequences), after p's dense parameters
// were set from the one-batch views: the offsets' dtypes, devices and shapes, lse (heads, total_q) and the pinned
// status word the prepare CTA writes (VarlenStatus).
void set_varlen_args(FwdParams& p, const at::Tensor& q, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                     const c10::optional<at::Tensor>& seqused_q, const c10::optional<at::Tensor>& seqused_k,
                     int64_t max_seqlen_q, int64_t max_seqlen_k, const at::Tensor& lse, const at::Tensor& status) {
    const int64_t batch = cu_seqlens_q.numel() - 1;
    TORCH_CHECK_VALUE(batch >= 0 && batch < (int64_t(1) << 26), "cu_seqlens_q must have 1 to 2^26 elements, got ",
                      num(batch + 1));
    p.varlen.cu_seqlens_q = offsets_of(cu_seqlens_q, "cu_seqlens_q", batch + 1, q);
    p.varlen.cu_seqlens_k = offsets_of(cu_seqlens_k, "cu_seqlens_k", batch + 1, q);
    p.varlen.seqused_q = seqused_q.has_value() ? offsets_of(*seqused_q, "seqused_q", batch, q) : nullptr;
    p.varlen.seqused_k = seqused_k.has_value() ? offsets_of(*seqused_k, "seqused_k", batch, q) : nullptr;
    TORCH_CHECK_VALUE(max_seqlen_q >= 1 && max_seqlen_q <= INT32_MAX && max_seqlen_k >= 1 && max_seqlen_k <= INT32_MAX,
                      "max_seqlen_q and max_seqlen_k must be in [1, 2^31), got ", num(max_seqlen_q), " and ",
                      num(max_seqlen_k));
    p.varlen.max_seqlen_q = static_cast<int>(max_seqlen_q);
    p.varlen.max_seqlen_k = static_cast<int>(max_seqlen_k);
    TORCH_CHECK_VALUE(lse.is_cuda() && lse.device() == q.device() && lse.scalar_type() == at::kFloat &&
                          lse.is_contiguous() && lse.dim() == 2 && lse.size(0) == q.size(1) && lse.size(1) == q.size(0),
                      "lse must be a contiguous fp32 tensor of shape (heads, total_q) = (", num(q.size(1)), ", ",
                      num(q.size(0)), ") on q's device");
    TORCH_CHECK_VALUE(!status.is_cuda() && status.is_pinned() && status.scalar_type() == at::kInt &&
                          status.is_contiguous() && status.numel() == 2,
                      "status must be a pinned host int32 tensor of 2 elements");
    // Pinned host memory is mapped into the device's address space (unified addressing); the attribute names the
    // device address of this part of it.
    cudaPointerAttributes attr{};
    C10_CUDA_CHECK(cudaPointerGetAttributes(&attr, status.data_ptr()));
    TORCH_CHECK_VALUE(attr.type == cudaMemoryTypeHost && attr.devicePointer != nullptr,
                      "status must be pinned host memory mapped for the device");
    p.varlen.status = static_cast<VarlenStatus*>(attr.devicePointer);
    p.batch = static_cast<int>(batch);
}

// The packed forward: q (total_q, h, d), k (total_k, h_k, d), v (total_k, h_k, dv), out (total_q, h, dv), lse
// (h, total_q).
void varlen_fwd_out(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
                    const at::Tensor& cu_seqlens_k, const c10::optional<at::Tensor>& seqused_q,
                    const c10::optional<at::Tensor>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                    at::Tensor& out, at::Tensor& lse, at::Tensor& status, double softmax_scale, bool causal,
                    int64_t sm_margin, int64_t window_left, int64_t window_right,
                    const c10::optional<at::Tensor>& sink, double softcap) {
    c10::cuda::CUDAGuard guard(q.device());
    const at::Tensor q4 = packed_view(q, "q"), out4 = packed_view(out, "out");
    FwdParams p{};
    set_fwd_params(p, q4, packed_view(k, "k"), packed_view(v, "v"), softmax_scale, causal, sm_margin, window_left,
                   window_right, softcap);
    check_output(out4, "out", q4, p.head_dim_v);
    if (sink.has_value()) { p.sink = heads_vector(*sink, "sink", q4); }
    set_varlen_args(p, q, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, lse, status);
    p.out = out.data_ptr();
    p.o_stride = strides_of(out4);
    p.lse = lse.data_ptr<float>();
    poison_on_bad_offsets(p.varlen, {&out}, &lse);
    // Claims run past the table by up to a grid (schedule/tile_ring.hpp): they must stay in int32 too.
    const int64_t capacity = varlen_tile_capacity(q.size(0), p.batch, kVarlenMinRows, static_cast<int>(q.size(1)));
    TORCH_CHECK_VALUE(capacity + int64_t(p.num_sms) < INT32_MAX, "the pack has too many tiles for 32-bit tile "
                      "indices: (total_q / ", num(kVarlenMinRows), " + batch) * heads = ", num(capacity),
                      " must be < 2^31 - SM count");
    auto workspace = at::empty({varlen_workspace_bytes(p.batch, capacity)}, q.options().dtype(at::kByte));
    p.varlen.workspace = workspace.data_ptr();
    const auto& entry = find_entry(fwd_kernels(), p.head_dim, p.head_dim_v, q.scalar_type(), "forward");
    launch_checked([&] { entry.run(p, c10::cuda::getCurrentCUDAStream()); });
}

// The backward's own arguments (after set_fwd_params): the outputs, the resolved launch (schedule, grid, claim group,
// fold) and the sink with its gradient. Tensors are 4-D (dense, or the packed ones' one-batch views).
void set_bwd_args(BwdParams& p, const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& out, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, bool deterministic,
                  int64_t schedule, int64_t grid, int64_t claim_group, bool gqa_fold,
                  const c10::optional<at::Tensor>& sink, const c10::optional<at::Tensor>& dsink) {
    check_output(out, "out", q, v.size(3));
    check_output(dout, "dout", q, v.size(3));
    check_output(dq, "dq", q);
    check_output(dk, "dk", k);
    check_output(dv, "dv", v);
    TORCH_CHECK_VALUE(schedule >= 0 && schedule < kNumSchedules, "schedule id must be in [0, ", num(kNumSchedules),
                      "), got ", num(schedule));
    TORCH_CHECK_VALUE(grid >= 1 && grid <= p.num_sms, "grid must be in [1, ", num(p.num_sms),
                      "] (SM count - sm_margin), got ", num(grid));
    TORCH_CHECK_VALUE(claim_group >= 1 && claim_group <= INT32_MAX, "claim_group must be a positive int32, got ",
                      num(claim_group));
    p.out = out.data_ptr();
    p.o_stride = strides_of(out);
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
    p.grid = static_cast<int>(grid);
    p.claim_group = static_cast<int>(claim_group);
    p.gqa_fold = gqa_fold;  // the launcher checks it against the build and the heads
    TORCH_CHECK_VALUE(sink.has_value() == dsink.has_value(), "sink and dsink must be given together (the sink's "
                      "gradient is computed from the sink)");
    if (sink.has_value()) {
        p.sink = heads_vector(*sink, "sink", q);
        p.dsink = heads_vector(*dsink, "dsink", q);
    }
}

void run_bwd_entry(BwdParams const& p, const at::Tensor& q) {
    const auto& entry = find_entry(bwd_kernels(), p.head_dim, p.head_dim_v, q.scalar_type(), "backward");
    auto workspace = at::empty({static_cast<int64_t>(entry.workspace_bytes(p))}, q.options().dtype(at::kByte));
    launch_checked([&] { entry.run(p, workspace.data_ptr(), c10::cuda::getCurrentCUDAStream()); });
}

void bwd_out(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const at::Tensor& out, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
             const c10::optional<at::Tensor>& order_trace, double softmax_scale, bool causal, bool deterministic,
             int64_t schedule, int64_t grid, int64_t claim_group, int64_t sm_margin,
             const c10::optional<at::Tensor>& timeline, int64_t window_left, int64_t window_right, double softcap,
             bool gqa_fold, const c10::optional<at::Tensor>& sink, const c10::optional<at::Tensor>& dsink) {
    c10::cuda::CUDAGuard guard(q.device());
    BwdParams p{};
    set_fwd_params(p, q, k, v, softmax_scale, causal, sm_margin, window_left, window_right, softcap);
    check_lse(lse, q);
    set_bwd_args(p, dout, q, k, v, out, dq, dk, dv, deterministic, schedule, grid, claim_group, gqa_fold, sink, dsink);
    p.lse = lse.data_ptr<float>();
    p.order_trace = static_cast<int*>(debug_buffer(order_trace, at::kInt, 0, q,
        "order_trace must be a contiguous int32 CUDA tensor (batch, heads, m_tiles, n_tiles)"));
    p.timeline = static_cast<long long*>(debug_buffer(timeline, at::kLong, 5, q,
        "timeline must be a contiguous int64 CUDA tensor (batch, heads, m_tiles, n_tiles, 5)"));
    run_bwd_entry(p, q);
}

// The packed backward: writes every used row of dq/dk/dv (those of no query or key get zeros; rows past seqused_* are
// the caller's, flash_attn_dash.varlen_cuda.kernel_backward_into): tensors as for varlen_fwd_out, the
// launch resolved by flash_attn_dash.varlen_cuda (a portable order, or descending when not deterministic).
void varlen_bwd_out(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& cu_seqlens_q,
                    const at::Tensor& cu_seqlens_k, const c10::optional<at::Tensor>& seqused_q,
                    const c10::optional<at::Tensor>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                    at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, at::Tensor& status, double softmax_scale,
                    bool causal, bool deterministic, int64_t schedule, int64_t grid, int64_t sm_margin,
                    int64_t window_left, int64_t window_right, double softcap, const c10::optional<at::Tensor>& sink,
                    const c10::optional<at::Tensor>& dsink, bool gqa_fold, int64_t fold_min_len_q,
                    int64_t fold_min_len_k) {
    c10::cuda::CUDAGuard guard(q.device());
    const at::Tensor q4 = packed_view(q, "q"), k4 = packed_view(k, "k"), v4 = packed_view(v, "v");
    at::Tensor dq4 = packed_view(dq, "dq"), dk4 = packed_view(dk, "dk"), dv4 = packed_view(dv, "dv");
    BwdParams p{};
    set_fwd_params(p, q4, k4, v4, softmax_scale, causal, sm_margin, window_left, window_right, softcap);
    set_bwd_args(p, packed_view(dout, "dout"), q4, k4, v4, packed_view(out, "out"), dq4, dk4, dv4, deterministic,
                 schedule, grid, /*claim_group=*/1, gqa_fold, sink, dsink);
    // Lengths are int32 on the device; a bound at or above every length folds no sequence.
    p.fold_min_len_q = static_cast<int>(std::min<int64_t>(fold_min_len_q, INT32_MAX));
    p.fold_min_len_k = static_cast<int>(std::min<int64_t>(fold_min_len_k, INT32_MAX));
    set_varlen_args(p, q, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, lse, status);
    p.lse = lse.data_ptr<float>();
    poison_on_bad_offsets(p.varlen, {&dq, &dk, &dv}, dsink.has_value() ? &*dsink : nullptr);
    // Claims run past the table by up to two grids (schedule/tile_ring.hpp): they must stay in int32 too.
    const int64_t capacity = varlen_tile_capacity(k.size(0), p.batch, kVarlenMinRows, static_cast<int>(q.size(1)));
    TORCH_CHECK_VALUE(capacity + 2 * int64_t(p.num_sms) < INT32_MAX, "the pack has too many tiles for 32-bit tile "
                      "indices: (total_k / ", num(kVarlenMinRows), " + batch) * heads = ", num(capacity),
                      " must be < 2^31 - 2 * SM count");
    run_bwd_entry(p, q);
}

std::vector<std::string> instantiations() {
    std::vector<std::string> names;
    for (const auto& e : fwd_kernels()) names.emplace_back(e.name);
    for (const auto& e : bwd_kernels()) names.emplace_back(e.name);
    return names;
}

}  // namespace
}  // namespace flash_dash

TORCH_LIBRARY_IMPL(flash_attn_dash, CUDA, m) {
    m.impl("fwd_out", &flash_dash::fwd_out);
    m.impl("bwd_out", &flash_dash::bwd_out);
    m.impl("varlen_fwd_out", &flash_dash::varlen_fwd_out);
    m.impl("varlen_bwd_out", &flash_dash::varlen_bwd_out);
}

PYBIND11_MODULE(_C, m) {
    m.doc() = "flash-attn-dash CUDA kernels";
    m.def("instantiations", &flash_dash::instantiations, "names of the compiled kernel instantiations");
}
