// Host side of the backward: workspace layout, the check of the resolved launch, mode/policy dispatch and the
// preprocess, main and postprocess launches.
#pragma once
#include <algorithm>
#include <stdexcept>
#include <string>
#include <cuda_runtime.h>

#include "bwd/kernel.h"
#include "bwd/postprocess.hpp"
#include "bwd/preprocess.hpp"
#include "bwd/sink_grad.hpp"
#include "common/flash_params.h"
#include "common/launch_utils.h"
#include "common/softcap.hpp"
#include "generated/schedules.h"
#include "schedule/sibling_walk.hpp"

namespace flash_dash {
namespace bwd {

inline size_t align_up(size_t x, size_t a = 256) { return (x + a - 1) / a * a; }

// Workspace layout (byte offsets, 256-aligned), per query tile (B*H*M of them; a pack: H * m_cap, each head's
// sequences' tiles in pack order from VarlenSeq::m_start) and per key tile (B*Hk*N; a pack: Hk * n_cap):
//   dq_accum  fp32 (query tiles, kBlockM*d)   per tile: kBlockM*d floats in dQ-MMA accumulator order
//   dpsum     fp32 (query tiles, kBlockM)
//   lse_log2  fp32 (query tiles, kBlockM)
//   dq_sem    int32 (M, B, H), a pack (H, m_cap)
//   tile_counter int32: tiles claimed after the first G (dynamic grid; zeroed by the preprocess)
//   GQA only, unless a dense call folds (a folded tile stores its dK/dV itself; a pack's unfolded sequences use them):
//   dk_accum, dv_accum fp32 (key tiles, kBlockN, d), d: dK's or dV's head dim
//   row-major; dkv_sem int32 (N, B, Hk), a pack (Hk, n_cap)
//   a pack only: the prepare CTA's views and table (common/varlen.hpp)
struct WorkspaceLayout {
    size_t dq_accum, dpsum, lse_log2, dq_sem, tile_counter, dk_accum, dv_accum, dkv_sem, varlen, total;
    bool gqa;  // dK/dV go through the fp32 accumulators
    int64_t m_cap, n_cap;  // a pack: query / key tiles per head the workspace holds (bounds of the pack's)
};

inline bool is_varlen(BwdParams const& p) { return p.varlen.cu_seqlens_q != nullptr; }

template <class Traits>
WorkspaceLayout workspace_layout(BwdParams const& p) {
    WorkspaceLayout w{};
    bool const varlen = is_varlen(p);
    int64_t const M = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
    int64_t const N = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
    w.m_cap = varlen ? p.seqlen_q / Traits::kBlockM + p.batch : M;
    w.n_cap = varlen ? p.seqlen_k / Traits::kBlockN + p.batch : N;
    int64_t const q_tiles = (varlen ? 1 : int64_t(p.batch)) * p.num_heads * w.m_cap;
    int64_t const k_tiles = (varlen ? 1 : int64_t(p.batch)) * p.num_heads_k * w.n_cap;
    size_t off = 0;
    w.dq_accum = off; off = align_up(off + size_t(q_tiles * Traits::kBlockM * Traits::kHeadDim) * 4);
    w.dpsum = off;    off = align_up(off + size_t(q_tiles * Traits::kBlockM) * 4);
    w.lse_log2 = off; off = align_up(off + size_t(q_tiles * Traits::kBlockM) * 4);
    w.dq_sem = off;   off = align_up(off + size_t(q_tiles) * 4);
    w.tile_counter = off; off = align_up(off + 4);
    w.gqa = p.num_heads_k != p.num_heads && !(p.gqa_fold && !varlen);
    if (w.gqa) {
        w.dk_accum = off; off = align_up(off + size_t(k_tiles * Traits::kBlockN * Traits::kHeadDim) * 4);
        w.dv_accum = off; off = align_up(off + size_t(k_tiles * Traits::kBlockN * Traits::kHeadDimV) * 4);
        w.dkv_sem = off;  off = align_up(off + size_t(k_tiles) * 4);
    }
    w.varlen = off;
    if (varlen) { off = align_up(off + size_t(varlen_workspace_bytes(p.batch, p.num_heads * w.n_cap))); }
    w.total = off;
    return w;
}

template <class Traits, bool Is_causal, bool Is_local, bool Is_softcap, bool Deterministic, class Policy, bool GqaFold,
          bool Varlen = false>
void launch_main(BwdKernelParams<Traits> const& kp, int grid, cudaStream_t stream) {
    constexpr auto kernel = &bwd_kernel_sm90<Traits, Is_causal, Is_local, Is_softcap, Deterministic, Policy, GqaFold,
                                             Varlen>;
    allow_dynamic_smem<kernel>(Traits::kSmemBytes);
    kernel<<<grid, Traits::NumThreads, Traits::kSmemBytes, stream>>>(kp);
    check_launch("backward main kernel launch");
}

// The orders a varlen backward runs (bwd/tiles.hpp: the dynamic-grid ones; flash_attn_dash.launch
// VARLEN_KERNEL_ORDERS): the portable ones when deterministic, descending otherwise; split and diagonal on causal packs without a window
// only (kUpWalks: the host sends other packs that ask for them to the per-sequence path). Calls f(PolicyTag<P>{}) and
// returns true, or returns false.
template <bool Deterministic, bool kUpWalks, class F>
bool with_varlen_policy(Schedule s, F&& f) {
    if (s == Schedule::kDescending) {
        f(PolicyTag<Descending>{});
        return true;
    }
    if constexpr (Deterministic) {
        if (s == Schedule::kAscending) {
            f(PolicyTag<Ascending>{});
            return true;
        }
        if constexpr (kUpWalks) {
            if (s == Schedule::kSplit) {
                f(PolicyTag<Split>{});
                return true;
            }
            if (s == Schedule::kDiagonal) {
                f(PolicyTag<Diagonal>{});
                return true;
            }
        }
    }
    return false;
}

// Launches the main kernel of the call's mask, mode, policy and fold; launch_error has checked that it is
// instantiated (generated/schedules.h says which policies are; sliding windows and softcaps instantiate their mask's
// policies; the GQA-folded kernels exist for sliding windows; packs run with_varlen_policy's).
template <class Traits, bool Is_causal, bool Is_local, bool Is_softcap, bool Deterministic>
void launch_policy(Schedule policy, bool gqa_fold, bool varlen, BwdKernelParams<Traits> const& kp, int grid,
                   cudaStream_t stream) {
    if (varlen) {
        with_varlen_policy<Deterministic, Is_causal && !Is_local>(policy, [&](auto tag) {
            using Policy = typename decltype(tag)::type;
            if constexpr (Is_local) {
                if (gqa_fold) {
                    launch_main<Traits, Is_causal, Is_local, Is_softcap, Deterministic, Policy, true, true>(kp, grid,
                                                                                                           stream);
                    return;
                }
            }
            launch_main<Traits, Is_causal, Is_local, Is_softcap, Deterministic, Policy, false, true>(kp, grid, stream);
        });
        return;
    }
    with_policy<Traits, Is_causal, Deterministic>(policy, [&](auto tag) {
        using Policy = typename decltype(tag)::type;
        if constexpr (Is_local) {
            if (gqa_fold) {
                launch_main<Traits, Is_causal, Is_local, Is_softcap, Deterministic, Policy, true>(kp, grid, stream);
                return;
            }
        }
        launch_main<Traits, Is_causal, Is_local, Is_softcap, Deterministic, Policy, false>(kp, grid, stream);
    });
}

// The main kernel of the call's mode for one mask.
template <class Traits, bool Is_causal, bool Is_local, bool Is_softcap>
void launch_mode(BwdParams const& p, BwdKernelParams<Traits> const& kp, cudaStream_t stream) {
    bool const varlen = is_varlen(p);
    if (p.deterministic) {
        launch_policy<Traits, Is_causal, Is_local, Is_softcap, true>(p.schedule, p.gqa_fold, varlen, kp, p.grid, stream);
    } else {
        launch_policy<Traits, Is_causal, Is_local, Is_softcap, false>(p.schedule, p.gqa_fold, varlen, kp, p.grid,
                                                                      stream);
    }
}

// Whether the backward of Traits instantiates `policy` for this mask and mode.
template <class Traits>
bool instantiated(Schedule policy, bool causal, bool deterministic) {
    auto none = [](auto) {};
    if (causal) {
        return deterministic ? with_policy<Traits, true, true>(policy, none) : with_policy<Traits, true, false>(policy, none);
    }
    return deterministic ? with_policy<Traits, false, true>(policy, none) : with_policy<Traits, false, false>(policy, none);
}

// Why the resolved launch (policy, grid, claim group, GQA fold from flash_attn_dash/launch.py) cannot run this shape,
// or nullptr: the launcher's check of the Python decision, before anything is launched. `s` is the grid the policies
// walk (its heads are the K/V heads when folded); `local`: a sliding window (the causal kernels with a window other
// than the causal mask).
template <class Traits>
char const* launch_error(BwdParams const& p, SchedShape const& s, bool local) {
    if (p.gqa_fold && p.num_heads == p.num_heads_k) {
        return "flash_dash bwd: gqa_fold needs num_heads != num_heads_k (without GQA there are no siblings to fold)";
    }
    if (p.gqa_fold && !local) {
        return "flash_dash bwd: gqa_fold runs on sliding windows only (causal=true with a window other than the causal "
               "mask); full and causal masks have no folded kernels";
    }
    if (is_varlen(p)) {
        if (p.gqa_fold && (p.fold_min_len_q < 0 || p.fold_min_len_k < 0)) {
            return "flash_dash bwd: a folded pack's fold_min_len_q / fold_min_len_k must be >= 0";
        }
        if (p.order_trace != nullptr || p.timeline != nullptr) {
            return "flash_dash bwd: packed (varlen) backwards record no order trace or timeline";
        }
        if (p.grid < 1 || p.grid > p.num_sms) { return "flash_dash bwd: grid must be in [1, SM count - sm_margin]"; }
        auto none = [](auto) {};
        bool const up_walks = p.is_causal && !local;
        bool const runs = !p.deterministic ? with_varlen_policy<false, false>(p.schedule, none)
                          : up_walks       ? with_varlen_policy<true, true>(p.schedule, none)
                                           : with_varlen_policy<true, false>(p.schedule, none);
        return runs ? nullptr
                    : "flash_dash bwd: packed (varlen) backwards run ascending or descending when deterministic (split "
                      "and diagonal too on causal packs without a window), descending otherwise";
    }
    int64_t const units = p.schedule == Schedule::kSymmetricShift ? int64_t(s.batch) * s.heads * (s.num_n / 2)
                                                                   : int64_t(s.batch) * s.heads * s.num_n;
    if (p.grid < 1 || p.grid > p.num_sms || p.grid > units) {
        return "flash_dash bwd: grid must be in [1, min(SM count - sm_margin, work units)]";
    }
    if (p.claim_group < 1 || int64_t(p.claim_group) > int64_t(s.batch) * s.heads) {
        return "flash_dash bwd: claim_group must be in [1, batch * heads of the grid (heads_k when gqa_fold)]";
    }
    if (!tile_count_fits(int64_t(s.batch) * s.heads * s.num_n, p.grid)) {
        return "flash_dash bwd: too many tiles (batch * heads * K/V tiles must stay below 2^31 - 2 * grid)";
    }
    if (!instantiated<Traits>(p.schedule, p.is_causal, p.deterministic)) {
        return p.deterministic ? "flash_dash bwd: no deterministic kernel runs this schedule"
                               : "flash_dash bwd: no non-deterministic kernel runs this schedule (flash_attn_dash.launch "
                                 "picks one of variants.NONDETERMINISTIC_WALKS)";
    }
    // Deterministic backwards instantiate every order defined for the mask.
    char const* why = nullptr;
    auto check = [&](auto tag) { why = decltype(tag)::type::unsupported(s); };
    if (p.is_causal) { with_policy<Traits, true, true>(p.schedule, check); }
    else { with_policy<Traits, false, true>(p.schedule, check); }
    return why;
}

template <class Traits>
void run_bwd(BwdParams const& p, void* workspace, cudaStream_t stream) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
    constexpr int kHeadDimV = Traits::kHeadDimV;
    if (int(p.schedule) < 0 || int(p.schedule) >= kNumSchedules) {
        throw std::invalid_argument("flash_dash bwd: unknown schedule id " + std::to_string(int(p.schedule)));
    }
    if (char const* why = mask_mismatch(p.schedule, p.is_causal)) { throw std::invalid_argument(why); }
    bool const local = p.is_causal && is_sliding_window(p.window_left, p.window_right);
    if (char const* why = softcap_error(p.softcap, local, p.sink != nullptr)) { throw std::invalid_argument(why); }
    if (p.head_dim != kHeadDim || p.head_dim_v != kHeadDimV) {
        throw std::invalid_argument("flash_dash bwd: head_dim / head_dim_v mismatch");
    }
    if (p.num_heads_k <= 0 || p.num_heads % p.num_heads_k != 0) {
        throw std::invalid_argument("flash_dash bwd: num_heads must be a multiple of num_heads_k");
    }
    if (p.batch <= 0 || p.num_heads <= 0 || p.seqlen_q <= 0 || p.seqlen_k <= 0) { return; }
    bool const varlen = is_varlen(p);
    WorkspaceLayout const w = workspace_layout<Traits>(p);
    char* ws = static_cast<char*>(workspace);
    // A pack: its tiles' grids are the sequences' (bwd/tiles.hpp); M and N are the workspace's tiles per head and the
    // shape below holds the packed rows as one batch.
    int const M = int(w.m_cap);
    int const N = int(w.n_cap);
    SchedShape s{};
    s.batch = varlen ? 1 : p.batch; s.heads = p.num_heads; s.heads_k = p.num_heads_k;
    if (p.gqa_fold && !varlen) { s = folded_grid(s); }  // a pack's tiles fold per sequence (bwd/tiles.hpp)
    s.seqlen_q = p.seqlen_q; s.seqlen_k = p.seqlen_k;
    s.block_m = kBlockM; s.block_n = kBlockN; s.num_m = M; s.num_n = N;
    s.grid = p.grid; s.causal = p.is_causal;
    s.window_left = p.window_left; s.window_right = p.window_right;
    s.claim_group = p.claim_group;
    if (char const* why = launch_error<Traits>(p, s, local)) { throw std::invalid_argument(why); }

    if (w.gqa) { check_cuda(cudaMemsetAsync(ws + w.dk_accum, 0, w.varlen - w.dk_accum, stream), "memset dkv accum"); }
    VarlenWorkspace vw{};
    if (varlen) {
        static_assert(kBlockN >= kVarlenMinRows, "the binding checks a pack's tile count for kVarlenMinRows-row blocks");
        // The tiles are the sequences' key blocks; the views count query and key tiles for the workspace layout.
        vw = varlen_workspace(ws + w.varlen, p.batch);
        VarlenArgs a = p.varlen;
        a.workspace = ws + w.varlen;
        VarlenTiling tiling{kBlockN, p.num_heads, p.num_heads_k, /*key_blocks=*/true, kVarlenKeyClaims, kBlockM,
                            kBlockN, p.grid};
        if (p.gqa_fold) {
            tiling.fold_min_len_q = p.fold_min_len_q;
            tiling.fold_min_len_k = p.fold_min_len_k;
        }
        varlen_prepare_kernel<kVarlenPrepareThreads><<<1, kVarlenPrepareThreads, 0, stream>>>(a, p.batch, p.seqlen_q, p.seqlen_k, tiling);
        check_launch("varlen prepare kernel");
    }

    PreprocessParams pre{};
    pre.dout = p.dout; pre.out = p.out; pre.lse = p.lse;
    pre.do_row = p.do_stride.row; pre.do_head = p.do_stride.head; pre.do_batch = p.do_stride.batch;
    pre.o_row = p.o_stride.row; pre.o_head = p.o_stride.head; pre.o_batch = p.o_stride.batch;
    pre.batch = p.batch; pre.heads = p.num_heads; pre.seqlen_q = p.seqlen_q; pre.num_m = M;
    pre.dpsum = reinterpret_cast<float*>(ws + w.dpsum);
    pre.lse_log2 = reinterpret_cast<float*>(ws + w.lse_log2);
    pre.dq_sem = reinterpret_cast<int*>(ws + w.dq_sem);
    pre.tile_counter = reinterpret_cast<int*>(ws + w.tile_counter);
    pre.varlen_seqs = vw.seqs;
    // dPsum = rowsum(dO * O): over V's head dim.
    if (varlen) {
        bwd_preprocess_kernel<Element, kBlockM, kHeadDimV, true><<<dim3(M, p.num_heads, 1), kPreprocessThreads, 0,
                                                                   stream>>>(pre);
    } else {
        bwd_preprocess_kernel<Element, kBlockM, kHeadDimV, false><<<dim3(M, p.num_heads, p.batch), kPreprocessThreads,
                                                                    0, stream>>>(pre);
    }
    check_launch("preprocess launch");
    if (p.dsink != nullptr) {
        SinkGradParams sg{};
        sg.sink = p.sink; sg.lse = p.lse; sg.dpsum = pre.dpsum; sg.dsink = p.dsink;
        sg.batch = p.batch; sg.heads = p.num_heads; sg.seqlen_q = p.seqlen_q;
        sg.padded_rows = int64_t(M) * kBlockM;
        sg.varlen_seqs = vw.seqs;
        sg.block_m = kBlockM;
        sg.status = p.varlen.status;
        constexpr int kSinkGradThreads = 256;
        if (varlen) {
            bwd_sink_grad_kernel<kSinkGradThreads, true><<<p.num_heads, kSinkGradThreads, 0, stream>>>(sg);
        } else {
            bwd_sink_grad_kernel<kSinkGradThreads, false><<<p.num_heads, kSinkGradThreads, 0, stream>>>(sg);
        }
        check_launch("sink gradient launch");
    }

    using KP = BwdKernelParams<Traits>;
    KP kp{};
    auto mk = [](void const* ptr, int s, int h, int b, TensorStrides const& st, int d) {
        return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)), make_shape(s, d, h, b),
                           make_stride(st.row, _1{}, st.head, st.batch));
    };
    int const batch = s.batch;  // the descriptors': a pack is one batch of packed rows
    kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mk(p.q, p.seqlen_q, p.num_heads, batch, p.q_stride, kHeadDim),
                             take<0, 2>(typename Traits::SmemLayoutQ{}), Shape<typename Traits::TileM, typename Traits::TileD>{}, _1{});
    kp.tma_do = make_tma_copy(SM90_TMA_LOAD{}, mk(p.dout, p.seqlen_q, p.num_heads, batch, p.do_stride, kHeadDimV),
                              take<0, 2>(typename Traits::SmemLayoutdO{}), Shape<typename Traits::TileM, typename Traits::TileDV>{}, _1{});
    kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, mk(p.k, p.seqlen_k, p.num_heads_k, batch, p.k_stride, kHeadDim),
                             typename Traits::SmemLayoutK{}, Shape<typename Traits::TileN, typename Traits::TileD>{}, _1{});
    kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, mk(p.v, p.seqlen_k, p.num_heads_k, batch, p.v_stride, kHeadDimV),
                             typename Traits::SmemLayoutV{}, Shape<typename Traits::TileN, typename Traits::TileDV>{}, _1{});
    kp.sched = s;
    kp.head_dim = kHeadDim;
    kp.group = p.num_heads / p.num_heads_k;
    kp.softmax_scale = p.softmax_scale;
    // Softcap kernels: P = exp2(tanh(S * softcap_prescale) * softcap * log2 e - lse * log2 e).
    kp.scale_log2 = (p.softcap > 0.f ? p.softcap : p.softmax_scale) * float(M_LOG2E);
    kp.softcap_prescale = p.softcap > 0.f ? float(double(p.softmax_scale) / double(p.softcap)) : 0.f;
    kp.dq_accum = reinterpret_cast<float*>(ws + w.dq_accum); kp.dpsum = pre.dpsum; kp.lse_log2 = pre.lse_log2; kp.dq_sem = pre.dq_sem;
    kp.tile_counter = pre.tile_counter;
    kp.dk_accum = w.gqa ? reinterpret_cast<float*>(ws + w.dk_accum) : nullptr;
    kp.dv_accum = w.gqa ? reinterpret_cast<float*>(ws + w.dv_accum) : nullptr;
    kp.dkv_sem = w.gqa ? reinterpret_cast<int*>(ws + w.dkv_sem) : nullptr;
    kp.dk = static_cast<Element*>(p.dk); kp.dv = static_cast<Element*>(p.dv);
    kp.dk_row = p.dk_stride.row; kp.dk_head = p.dk_stride.head; kp.dk_batch = p.dk_stride.batch;
    kp.dv_row = p.dv_stride.row; kp.dv_head = p.dv_stride.head; kp.dv_batch = p.dv_stride.batch;
    kp.order_trace = p.order_trace;
    kp.timeline = p.timeline;
    kp.varlen_seqs = vw.seqs;
    kp.varlen_tiles = vw.tiles;
    kp.varlen_num_tiles = vw.num_tiles;
    kp.varlen_m_cap = M;
    kp.varlen_n_cap = N;

    // softcap_error above: a softcap with a sliding window only where the variant table builds it.
    if (p.softcap > 0.f) {
        if (local) {
            if constexpr (kSoftcapWithWindow) { launch_mode<Traits, true, true, true>(p, kp, stream); }
        } else if (p.is_causal) {
            launch_mode<Traits, true, false, true>(p, kp, stream);
        } else {
            launch_mode<Traits, false, false, true>(p, kp, stream);
        }
    } else if (local) {
        launch_mode<Traits, true, true, false>(p, kp, stream);
    } else if (p.is_causal) {
        launch_mode<Traits, true, false, false>(p, kp, stream);
    } else {
        launch_mode<Traits, false, false, false>(p, kp, stream);
    }

    PostprocessParams post{};
    post.dq_accum = kp.dq_accum; post.dq = p.dq;
    post.dq_row = p.dq_stride.row; post.dq_head = p.dq_stride.head; post.dq_batch = p.dq_stride.batch;
    post.batch = p.batch; post.heads = p.num_heads; post.seqlen_q = p.seqlen_q; post.num_m = M;
    post.first_m = m_min_of(kp.sched, 0);
    post.scale = p.softmax_scale;
    post.varlen_seqs = vw.seqs;
    post.sched = kp.sched;
    constexpr int kPostSmem = DqPostprocessTile<Traits>::kDynamicBytes;
    if (varlen) {
        if constexpr (kPostSmem > 0) { allow_dynamic_smem<&bwd_postprocess_dq_kernel<Traits, true>>(kPostSmem); }
        bwd_postprocess_dq_kernel<Traits, true><<<dim3(M, p.num_heads, 1), kPostprocessThreads, kPostSmem, stream>>>(post);
    } else {
        if constexpr (kPostSmem > 0) { allow_dynamic_smem<&bwd_postprocess_dq_kernel<Traits, false>>(kPostSmem); }
        bwd_postprocess_dq_kernel<Traits, false><<<dim3(M, p.num_heads, p.batch), kPostprocessThreads, kPostSmem,
                                                   stream>>>(post);
    }
    check_launch("postprocess dq launch");
    if (w.gqa) {
        PostprocessKVParams kv{};
        kv.batch_size = p.batch; kv.heads_k = p.num_heads_k; kv.seqlen_k = p.seqlen_k; kv.rows_padded = N * kBlockN;
        kv.varlen_seqs = vw.seqs;
        kv.block_n = kBlockN;
        // One accumulator of kCols columns (dK's or dV's head dim).
        auto convert = [&](auto cols) {
            constexpr int kCols = decltype(cols)::value;
            if (varlen) {
                bwd_postprocess_kv_varlen_kernel<Element, kCols><<<dim3(N, p.num_heads_k), kPostprocessThreads, 0,
                                                                   stream>>>(kv);
            } else {
                int64_t const total = int64_t(p.batch) * p.num_heads_k * p.seqlen_k * (kCols / 8);
                int const blocks = int(std::min<int64_t>((total + kPostprocessThreads - 1) / kPostprocessThreads, 65535));
                bwd_postprocess_kv_kernel<Element, kCols><<<blocks, kPostprocessThreads, 0, stream>>>(kv);
            }
        };
        kv.accum = kp.dk_accum; kv.out = p.dk; kv.row = p.dk_stride.row; kv.head = p.dk_stride.head; kv.batch = p.dk_stride.batch;
        convert(Int<kHeadDim>{});
        kv.accum = kp.dv_accum; kv.out = p.dv; kv.row = p.dv_stride.row; kv.head = p.dv_stride.head; kv.batch = p.dv_stride.batch;
        convert(Int<kHeadDimV>{});
        check_launch("postprocess dk/dv launch");
    }
}

}  // namespace bwd
}  // namespace flash_dash
