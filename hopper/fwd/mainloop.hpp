// Forward mainloop: TMA producer (one thread) and the WGMMA/softmax consumer warpgroups.
#pragma once

#include <cmath>
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "common/utils.hpp"
#include "fwd/barriers.hpp"
#include "fwd/block_range.hpp"
#include "fwd/softmax.hpp"
#include "fwd/traits.h"
#include "schedule/fwd_tile_scheduler.hpp"

// The consumer's `step` and `flush` lambdas take O's accumulator by reference. At large head dims ptxas keeps them
// as calls and O goes through the stack (1.5 KB per thread at hdim 256), so the generated units of the head dims whose
// table entry sets `fwd_inline_steps` define FLASH_DASH_FWD_INLINE_STEPS and force them inline. The other head dims
// keep ptxas' choice: forcing it there changes their code (research/patches/fwd-inline.patch measures it).
#if defined(FLASH_DASH_FWD_INLINE_STEPS)
#define FLASH_DASH_FWD_STEP_INLINE CUTLASS_LAMBDA_FUNC_INLINE
#else
#define FLASH_DASH_FWD_STEP_INLINE
#endif

namespace flash_dash {

// kWindow: the kernel of sliding windows (a causal launch with a left side or a right side other than 0); the
// others compile without the window's bounds. kSink: the kernel of learnable sinks (Params::sink), whose rows'
// softmax denominators gain exp(sink[head]). kSoftcap: the kernel of softcaps, whose softmax sees
// tanh(S * softcap_prescale) in place of S (and softcap's units, Traits::Params), masked after the tanh. kVarlen:
// the kernel of packed sequences, whose tiles' rows and keys are relative to their sequence (Traits::seq_of).
// Sched: FwdTileScheduler, or FwdVarlenScheduler for kVarlen.
template <class Traits, bool kWindow, bool kSink, bool kSoftcap, bool kVarlen>
struct FwdMainloopSm90 {
    using Element = typename Traits::Element;
    using Params = typename Traits::Params;
    using SharedStorage = typename Traits::SharedStorage;
    using PipelineQ = typename Traits::PipelineQ;
    using PipelineKV = typename Traits::PipelineKV;
    using StateQ = typename PipelineQ::PipelineState;
    using StateKV = typename PipelineKV::PipelineState;
    using Seq = typename Traits::template Seq<kVarlen>;
    static constexpr int kBlockM = Traits::kBlockM;
    static constexpr int kBlockN = Traits::kBlockN;
    static constexpr int kHeadDim = Traits::kHeadDim;
    static constexpr int kHeadDimV = Traits::kHeadDimV;

    // Round robin between the kNumWG consumer warpgroups (wg = 0 .. kNumWG-1): WG c syncs on
    // barrier c before issuing its GEMMs and then arrives on barrier c+1 (mod kNumWG), so the token
    // goes 0, 1, [2,] 0, ... Every sync is matched by exactly one arrive of the previous WG: all WGs
    // work on the same tiles, so they make the same number of sync/arrive pairs (one per step of
    // consume()). WG kNumWG-1 pre-arrives once on barrier 0 so WG 0 goes first; its last arrive is left
    // pending when the CTA exits. A WG cannot arrive twice on a barrier before its owner synced:
    // its next arrive needs its own next sync, which needs the token to go round once.
    static constexpr int kNumWG = Traits::kNumMmaWarpGroups;
    CUTE_DEVICE static void scheduler_init(int wg) {
        if (wg == kNumWG - 1) {
            named_barrier_arrive(2 * 128, uint32_t(FwdNamedBarrier::kWarpSchedulerWG0));
        }
    }
    CUTE_DEVICE static void scheduler_sync(int wg) {
        named_barrier_sync(2 * 128, uint32_t(FwdNamedBarrier::kWarpSchedulerWG0) + wg);
    }
    CUTE_DEVICE static void scheduler_arrive(int wg) {
        int const next = wg + 1 == kNumWG ? 0 : wg + 1;
        named_barrier_arrive(2 * 128, uint32_t(FwdNamedBarrier::kWarpSchedulerWG0) + next);
    }

    static constexpr auto kHintQ = cute::TMA::CacheHintSm90::EVICT_NORMAL;
    static constexpr auto kHintKV = cute::TMA::CacheHintSm90::EVICT_NORMAL;

    // The K/V blocks the m-block visits: [n_block_min, n_block_max); none (max <= min) when no row sees a key
    // (fwd/block_range.hpp).
    using Blocks = FwdBlockRange<kBlockM, kBlockN, kWindow>;
    CUTE_DEVICE static FwdMaskShape mask_shape(Params const& p, Seq const& seq) {
        return {seq.seqlen_q(), seq.seqlen_k(), p.is_causal, p.window_left, p.window_right};
    }
    CUTE_DEVICE static int n_block_max(Params const& p, Seq const& seq, int m_block) {
        return Blocks::n_max(mask_shape(p, seq), Traits::first_row(seq, m_block));
    }
    CUTE_DEVICE static int n_block_min(Params const& p, Seq const& seq, int m_block) {
        return Blocks::n_min(mask_shape(p, seq), Traits::first_row(seq, m_block));
    }
    CUTE_DEVICE static Seq seq_of(Params const& p, FwdTile const& tile) {
        return Traits::template seq_of<kVarlen>(p, tile.batch);
    }

    // Producer: a single thread (threadIdx.x == 0, the pipelines' leader) issues every TMA load.
    // Order per tile: Q, K[n_max-1], then (K[n-1], V[n]) for n = n_max-1 .. 0, matching the
    // consumer, which needs S_{n-1} = Q K[n-1]^T before O += P_n V[n]. With two Q buffers the next
    // tile's Q is issued early, after this tile's second K. Varlen: it also claims the CTA's tiles
    // (FwdVarlenScheduler), once this tile's loads are out, or where the Q or the L2 prefetch look ahead.
    template <class Sched>
    CUTE_DEVICE static void load(Params const& p, SharedStorage& ss, Sched const& sched, PipelineQ& pipe_q,
                                 PipelineKV& pipe_k, PipelineKV& pipe_v) {
        using namespace cute;
        Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
        Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
        Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
        Tensor mQ = p.tma_q.get_tma_tensor(make_shape(p.seqlen_q, int(kHeadDim), p.num_heads, p.batch));
        Tensor mK = p.tma_k.get_tma_tensor(make_shape(p.seqlen_k, int(kHeadDim), p.num_heads_k, p.batch));
        Tensor mV = p.tma_v.get_tma_tensor(make_shape(p.seqlen_k, int(kHeadDimV), p.num_heads_k, p.batch));

        // Locals: .with() binds the hint by reference, which device code cannot do to a static member.
        cute::TMA::CacheHintSm90 const hint_q = kHintQ;
        cute::TMA::CacheHintSm90 const hint_kv = kHintKV;
        StateQ st_q = cutlass::make_producer_start_state<PipelineQ>();
        StateKV st_k = cutlass::make_producer_start_state<PipelineKV>();
        StateKV st_v = cutlass::make_producer_start_state<PipelineKV>();

        auto loads = [&](int t) {
            FwdTile const tile = sched.decode(t);
            Seq const seq = seq_of(p, tile);
            return n_block_max(p, seq, tile.m_block) > n_block_min(p, seq, tile.m_block);
        };
        // The CTA's tile after t.
        auto next_tile = [&](int t) {
            if constexpr (kVarlen) { return sched.claim_next(); }
            else { return sched.next_tile(t); }
        };
        // The CTA's next tile after t that loads anything (>= sched.total: none). Varlen: the next tile, claimed
        // now, if it loads; one claim ahead at most (the ring has two slots, which the other roles free only as
        // they go through the tiles before, whose last waits for this tile's loads).
        auto next_loading_tile = [&](int t) {
            if constexpr (kVarlen) {
                int const next = sched.peek_next();
                return next < sched.total && loads(next) ? next : sched.total;
            } else {
                for (t = sched.next_tile(t); t < sched.total; t = sched.next_tile(t)) {
                    if (loads(t)) { break; }
                }
                return t;
            }
        };
        auto load_q = [&](FwdTile const& tile) {
            Seq const seq = seq_of(p, tile);
            Tensor gQ = local_tile(Traits::rows_from_first_block(seq, mQ(_, _, tile.head, seq.batch())),
                                   Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(tile.m_block, _0{}));
            auto [tQgQ, tQsQ] = tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                              group_modes<0, 2>(gQ));
            pipe_q.producer_acquire(st_q);
            copy(p.tma_q.with(*pipe_q.producer_get_barrier(st_q), 0, hint_q), tQgQ, tQsQ(_, st_q.index()));
            ++st_q;
        };
        // With Traits::kL2Prefetch and p.l2_prefetch_next, once a tile's first K and V went out: the next tile's Q and first two
        // K/V blocks into L2 (no smem: the stages are full). With equal tiles (full masks) the CTAs cross
        // tile boundaries in lockstep, so without it every CTA asks DRAM for a new Q (and the heads of the
        // next round their K/V) within the ~2 blocks its loads run ahead.
        auto prefetch_l2 = [&](FwdTile const& tile) {
            Seq const seq = seq_of(p, tile);
            int const n_max = n_block_max(p, seq, tile.m_block);
            int const n_min = n_block_min(p, seq, tile.m_block);
            int const head_k = tile.head / p.head_ratio;
            Tensor gQ = local_tile(Traits::rows_from_first_block(seq, mQ(_, _, tile.head, seq.batch())),
                                   Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(tile.m_block, _0{}));
            Tensor gK = local_tile(Traits::keys_of(seq, mK(_, _, head_k, seq.batch())),
                                   Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
            Tensor gV = local_tile(Traits::keys_of(seq, mV(_, _, head_k, seq.batch())),
                                   Shape<Int<kBlockN>, Int<kHeadDimV>>{}, make_coord(_, _0{}));
            cute::prefetch(p.tma_q, get<0>(tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                                         group_modes<0, 2>(gQ))));
            Tensor pK = get<0>(tma_partition(p.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                             group_modes<0, 2>(gK)));
            Tensor pV = get<0>(tma_partition(p.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                             group_modes<0, 2>(gV)));
            for (int n = n_max - 1; n >= n_min && n >= n_max - 2; --n) {
                cute::prefetch(p.tma_k, pK(_, n));
                cute::prefetch(p.tma_v, pV(_, n));
            }
        };
        int q_ahead = -1;  // the tile whose Q already went out during the tile before it

        for (int t = blockIdx.x; t < sched.total; t = next_tile(t)) {
            FwdTile const tile = sched.decode(t);
            Seq const seq = seq_of(p, tile);
            int const n_max = n_block_max(p, seq, tile.m_block);
            int const n_min = n_block_min(p, seq, tile.m_block);
            if (n_max <= n_min) { continue; }  // consumers write zeros / -inf without loading
            int const head_k = tile.head / p.head_ratio;

            Tensor gK = local_tile(Traits::keys_of(seq, mK(_, _, head_k, seq.batch())),
                                   Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (N, d, n_blocks)
            Tensor gV = local_tile(Traits::keys_of(seq, mV(_, _, head_k, seq.batch())),
                                   Shape<Int<kBlockN>, Int<kHeadDimV>>{}, make_coord(_, _0{}));
            auto [tKgK, tKsK] = tma_partition(p.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                              group_modes<0, 2>(gK));
            auto [tVgV, tVsV] = tma_partition(p.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                              group_modes<0, 2>(gV));

            if (Traits::kQStages == 1 || q_ahead != t) { load_q(tile); }

            int n = n_max - 1;
            pipe_k.producer_acquire(st_k);
            copy(p.tma_k.with(*pipe_k.producer_get_barrier(st_k), 0, hint_kv), tKgK(_, n), tKsK(_, st_k.index()));
            ++st_k;
            for (; n >= n_min; --n) {
                if (n > n_min) {
                    pipe_k.producer_acquire(st_k);
                    copy(p.tma_k.with(*pipe_k.producer_get_barrier(st_k), 0, hint_kv), tKgK(_, n - 1),
                         tKsK(_, st_k.index()));
                    ++st_k;
                }
                pipe_v.producer_acquire(st_v);
                copy(p.tma_v.with(*pipe_v.producer_get_barrier(st_v), 0, hint_kv), tVgV(_, n), tVsV(_, st_v.index()));
                ++st_v;
                if constexpr (Traits::kQStages == 2) {
                    // Two Q buffers: the next tile's Q goes out once this tile's second K block has a stage,
                    // i.e. once the consumers are in this tile's first step, where they released the Q of the
                    // tile before (so the acquire does not wait): a tile ahead instead of ~2 blocks ahead. After
                    // this tile's first V, which the consumers need first (a varlen claim and its table reads
                    // would otherwise sit in front of it).
                    if (n == n_max - 1 && n > n_min) {
                        q_ahead = next_loading_tile(t);
                        if (q_ahead < sched.total) { load_q(sched.decode(q_ahead)); }
                    }
                }
                if constexpr (Traits::kL2Prefetch) {
                    if (p.l2_prefetch_next && n == n_max - 1) {
                        int const tn = next_loading_tile(t);
                        if (tn < sched.total) { prefetch_l2(sched.decode(tn)); }
                    }
                }
            }
        }
    }

    // Consumer: walks the CTA's tiles (the scheduler's read_next) block by block, n = n_max-1 .. 0 per
    // tile. Every step issues S = Q K[n]^T of the current block together with O += P V of the block
    // before it (FA3's intra-warpgroup overlap; with Traits::kOverlapPvSoftmax the softmax of S runs
    // while the PV wgmma is in flight), and the step does not stop at tile boundaries: a tile's first
    // QK^T goes out with the previous tile's last PV, whose epilogue, tile_done(tile, inv_sum, lse),
    // then runs while the other warpgroups use the tensor cores. tOrO (zero on entry) is cleared again after each tile_done.
    // Tiles without a visible key (n_max == 0, causal with seqlen_q > seqlen_k) get tile_done with
    // O = 0, inv_sum = 0 and lse = -inf. Every consumer WG makes the same steps, so the round robin
    // sees one sync/arrive pair per step from each.
    template <class Sched, class TensorO, class Softmax, class TileDone>
    CUTE_DEVICE static void consume(Params const& p, SharedStorage& ss, Sched const& sched,
                                    PipelineQ& pipe_q, PipelineKV& pipe_k, PipelineKV& pipe_v, int tid,
                                    TensorO& tOrO, Softmax& softmax, TileDone&& tile_done) {
        using namespace cute;
        typename Traits::TiledMmaQK mma_qk;
        typename Traits::TiledMmaPV mma_pv;
        auto thr_qk = mma_qk.get_thread_slice(tid);
        auto thr_pv = mma_pv.get_thread_slice(tid);

        Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
        Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
        Tensor sVt = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutVt{});
        Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, MMA_M, MMA_K, q_stages)
        Tensor tSrK = thr_qk.partition_fragment_B(sK);  // (MMA, MMA_N, MMA_K, stages)
        Tensor tOrV = thr_pv.partition_fragment_B(sVt); // (MMA, MMA_N, MMA_K, stages)

        Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
        Tensor tS_rc = make_rowcol_view(tSrS);
        Tensor rP = make_tensor_like<Element>(tSrS);
        Tensor tOrP = make_tensor(rP.data(), acc_layout_to_a_operand(rP.layout()));
        Tensor tO_rc = make_rowcol_view(tOrO);

        Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
        Tensor tScS = thr_qk.partition_C(cS);
        Tensor tScS_rc = make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));

        // Mask keys >= seqlen_k and, if causal or windowed, keys outside [i + offset - left, i + offset + right]
        // (offset = seqlen_k - seqlen_q of the tile's sequence). Only blocks that straddle a boundary need it; the
        // steps pick a masking or a plain body before issuing their GEMMs.
        // The current tile's mask: a dense call's from the parameters (the same for every tile, so the lambdas below
        // read the parameter bank as they did before packs), a packed sequence's lengths and offset set per tile (the
        // rest from the parameters: few registers, which the 160-register warpgroups of hdim 64 lack).
        int offset = p.seqlen_k - p.seqlen_q;
        int tile_len_q = p.seqlen_q, tile_len_k = p.seqlen_k;
        auto current_mask = [&]() {
            if constexpr (kVarlen) { return FwdMaskShape{tile_len_q, tile_len_k, p.is_causal, p.window_left, p.window_right}; }
            else { return FwdMaskShape{p.seqlen_q, p.seqlen_k, p.is_causal, p.window_left, p.window_right}; }
        };
        auto needs_mask = [&](int row0, int n_block) { return Blocks::needs_mask(current_mask(), row0, n_block); };
        auto apply_mask = [&](int row0, int n_block) {
            int const col0 = n_block * kBlockN;
            CUTLASS_PRAGMA_UNROLL
            for (int r = 0; r < size<0>(tS_rc); ++r) {
                int const row = row0 + get<0>(tScS_rc(r, 0));
                int limit = kVarlen ? tile_len_k : p.seqlen_k;
                if constexpr (kWindow) {
                    limit = min(limit, row + offset + p.window_right + 1) - col0;
                    int const first = row + offset - p.window_left - col0;
                    CUTLASS_PRAGMA_UNROLL
                    for (int c = 0; c < size<1>(tS_rc); ++c) {
                        int const col = int(get<1>(tScS_rc(r, c)));
                        if (col >= limit || col < first) { tS_rc(r, c) = -INFINITY; }
                    }
                } else {
                    if (p.is_causal) { limit = min(limit, row + offset + 1); }
                    limit -= col0;
                    CUTLASS_PRAGMA_UNROLL
                    for (int c = 0; c < size<1>(tS_rc); ++c) {
                        if (int(get<1>(tScS_rc(r, c))) >= limit) { tS_rc(r, c) = -INFINITY; }
                    }
                }
            }
        };

        // Softcap kernels: S -> tanh(S * softmax_scale / softcap) before the mask (a masked score stays -inf) and
        // the row max; the softmax's scale_log2 (softcap * log2 e) then turns it into softcap * tanh in exp2 units.
        auto apply_softcap = [&]() {
            float const prescale = p.softcap_prescale;
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < size(tSrS); ++i) { tSrS(i) = tanh_approx(tSrS(i) * prescale); }
        };

        // The smem stage of a pipeline state, for the GEMMs' operand descriptors. In the varlen kernel the loops'
        // bounds come from the pack's tables (memory); with the pinned step's two loops ptxas then keeps the states
        // per thread and builds every descriptor in vector registers, moved (R2UR) before each GMMA: the index is
        // broadcast from lane 0. (The three-warpgroup kernels' one loop keeps them uniform; above hdim 128 the
        // descriptors overflow the uniform register file anyway, so there the shuffle would only add work.)
        auto stage = [](auto const& st) {
            if constexpr (kVarlen && Traits::kOverlapPvSoftmax && kHeadDim <= 128) {
                return __shfl_sync(0xffffffff, int(st.index()), 0);
            } else {
                return int(st.index());
            }
        };

        constexpr int kNRows = decltype(size<0>(tS_rc))::value;
        float o_scale[kNRows], inv_sum[kNRows], lse[kNRows];
        int const wg = tid / 128;
        StateQ st_q;
        StateKV st_k, st_v;
        bool pv_pending = false;  // rP holds P of the previous block, not yet multiplied by its V
        FwdTile pv_tile{};        // the tile that block belongs to

        // Whether O *= o_scale (the factor of the latest softmax) changes anything in this warp. exp2(0) == 1
        // exactly, so skipping a multiply by 1 is bitwise neutral; the vote keeps the branch warp-uniform.
        auto rescale_needed = [&]() {
            bool moved = false;
            CUTLASS_PRAGMA_UNROLL
            for (int r = 0; r < kNRows; ++r) { moved |= o_scale[r] != 1.f; }
            return __any_sync(0xffffffffu, moved) != 0;
        };

        // The row stats of a finished tile: inv_sum and lse.
        auto finalize = [&](FwdTile const& t) {
            if constexpr (kSink) {
                softmax.finalize_with_sink(p.softmax_scale, p.sink[t.head], inv_sum, lse);
            } else {
                softmax.finalize(p.softmax_scale, inv_sum, lse);
            }
        };

        // O += P V for the pending block alone, then its tile's epilogue (before an empty tile, and
        // after the last tile).
        auto flush = [&]() FLASH_DASH_FWD_STEP_INLINE {
            pipe_v.consumer_wait(st_v);
            scheduler_sync(wg);
            wg_gemm<false, -1>(mma_pv, tOrP, tOrV(_, _, _, stage(st_v)), tOrO);
            scheduler_arrive(wg);
            warpgroup_wait<0>();
            warpgroup_fence_operand(tOrO);
            pipe_v.consumer_release(st_v);
            ++st_v;
            finalize(pv_tile);
            tile_done(pv_tile, inv_sum, lse);
            clear(tOrO);
            pv_pending = false;
        };

        int read = 0;  // varlen: the claims read so far
        for (int t = blockIdx.x; t < sched.total; t = sched.read_next(t, read++)) {
            FwdTile const tile = sched.decode(t);
            Seq const seq = seq_of(p, tile);
            int const n_max = n_block_max(p, seq, tile.m_block);
            int const n_min = n_block_min(p, seq, tile.m_block);
            if constexpr (kVarlen) {
                tile_len_q = seq.seqlen_q();
                tile_len_k = seq.seqlen_k();
                offset = tile_len_k - tile_len_q;
            }
            if (n_max <= n_min) {
                if (pv_pending) { flush(); }
                softmax.reset();
                finalize(tile);  // no key: inv_sum 0, lse -inf (the sink with one)
                tile_done(tile, inv_sum, lse);
                continue;
            }
            int const row0 = Traits::first_row(seq, tile.m_block);
            int n = n_max - 1;
            pipe_q.consumer_wait(st_q);
            if (!pv_pending) {  // the CTA's first block, or the first after a flush: S alone
                pipe_k.consumer_wait(st_k);
                scheduler_sync(wg);
                wg_gemm</*zero_init=*/true, /*wait=*/-1>(mma_qk, tSrQ(_, _, _, stage(st_q)),
                                                          tSrK(_, _, _, stage(st_k)), tSrS);
                scheduler_arrive(wg);
                warpgroup_wait<0>();
                warpgroup_fence_operand(tSrS);
                pipe_k.consumer_release(st_k);
                ++st_k;
                if (n == n_min) {
                    pipe_q.consumer_release(st_q);
                    ++st_q;
                }
                softmax.reset();
                if constexpr (kSoftcap) { apply_softcap(); }
                // (written out: defining masked_if_needed below before this block changed hdim 64's SASS)
                if (needs_mask(row0, n)) { apply_mask(row0, n); }
                softmax.online(tS_rc, o_scale);  // O is zero: no rescale
                convert_fragment(tSrS, rP);
                pv_pending = true;
                pv_tile = tile;
                --n;
            }
            // One step with a pending PV; `mask(n)` is applied to S before the softmax.
            // kPin (Traits::kOverlapPvSoftmax): the body between issuing the GEMMs and waiting for the PV
            // is branch-free, since ptxas ends the wgmma pipeline at any control-flow join in there (it
            // put the PV wait before the softmax when the mask was a branch); the masking and the
            // tile-start work are chosen outside that window. Without it the step keeps the order that
            // measured best with 3 consumer WGs.
            constexpr bool kPin = Traits::kOverlapPvSoftmax;
            auto step = [&](auto const& mask, bool first) FLASH_DASH_FWD_STEP_INLINE {
                // On a tile's first step the pending PV is the previous tile's last: its row stats are final.
                auto finalize_previous = [&]() {
                    finalize(pv_tile);
                    softmax.reset();
                };
                if (kPin && first) { finalize_previous(); }
                pipe_k.consumer_wait(st_k);
                scheduler_sync(wg);
                wg_gemm<true, -1>(mma_qk, tSrQ(_, _, _, stage(st_q)), tSrK(_, _, _, stage(st_k)), tSrS);
                // V is loaded after K: wait for it only once QK^T is on its way.
                pipe_v.consumer_wait(st_v);
                wg_gemm<false, -1>(mma_pv, tOrP, tOrV(_, _, _, stage(st_v)), tOrO);
                scheduler_arrive(wg);
                warpgroup_wait<1>();  // S done (groups retire in order), PV may still run
                warpgroup_fence_operand(tSrS);
                if constexpr (kSoftcap && kPin) { apply_softcap(); }  // part of the softmax that overlaps the PV
                pipe_k.consumer_release(st_k);
                // Q goes as soon as the tile's last QK^T retired, before its softmax: with one Q buffer
                // the producer only then loads the next tile's Q.
                if constexpr (kPin) {  // a predicated arrive, not a branch
                    ss.pipeline_q.empty_barrier_[st_q.index()].arrive(0, n == n_min);
                } else {
                    ++st_k;
                    if (n == n_min) {
                        pipe_q.consumer_release(st_q);
                        ++st_q;
                    }
                    if (first) { finalize_previous(); }
                    if constexpr (kSoftcap) {
                        // ptxas waits for the PV before the softmax here anyway (at the mask's branch); the tanh
                        // waits there too, or it runs while the PV's P and O hold their registers (228 B of spills
                        // at hdim 64).
                        warpgroup_wait<0>();
                        apply_softcap();
                    }
                }
                mask(n);
                softmax.online(tS_rc, o_scale);
                if constexpr (kPin) {
                    // The PV wait sits in both arms of a branch: the basic-block boundary keeps ptxas from
                    // hoisting it into the softmax (it schedules the wait as if it were free, and the warp
                    // then idles through its own PV). The condition must be warpgroup-uniform (wgmma.wait
                    // is .aligned; a per-warp vote here failed synccheck). A first step's o_scale belongs
                    // to the new tile (whose O is still zero), not to the O its PV just finished.
                    if (!first) {
                        warpgroup_wait<0>();  // PV done: V stage and the P registers are free
                        if (rescale_needed()) { rescale_rows(tO_rc, o_scale); }
                    } else {
                        warpgroup_wait<0>();
                    }
                } else {
                    warpgroup_wait<0>();
                }
                warpgroup_fence_operand(tOrO);
                warpgroup_fence_operand(rP);
                pipe_v.consumer_release(st_v);
                if constexpr (kPin) {
                    ++st_k;
                    ++st_v;
                    if (n == n_min) { ++st_q; }
                } else {
                    ++st_v;
                }
                if (first) {  // O of the previous tile is complete
                    tile_done(pv_tile, inv_sum, lse);
                    clear(tOrO);
                } else if constexpr (!kPin) {
                    if (rescale_needed()) { rescale_rows(tO_rc, o_scale); }
                }
                convert_fragment(tSrS, rP);
                pv_tile = tile;
            };
            // What a step does to S before its softmax.
            auto masked = [&](int n_block) { apply_mask(row0, n_block); };
            auto unmasked = [](int) {};
            auto masked_if_needed = [&](int n_block) {
                if (needs_mask(row0, n_block)) { apply_mask(row0, n_block); }
            };
            if constexpr (kPin) {
                // Masked blocks (those straddling seqlen_k or the diagonal) come first in the walk; a window's
                // left edge cuts the last ones (below n_unmasked_min), which the masked loop then runs again
                // (a third copy of the step made ptxas spill).
                int const n_unmasked_min = Blocks::unmasked_min(current_mask(), row0, n_min);
                do {
                    CUTLASS_PRAGMA_NO_UNROLL
                    for (; n >= n_min && needs_mask(row0, n); --n) { step(masked, n == n_max - 1); }
                    CUTLASS_PRAGMA_NO_UNROLL
                    for (; n >= n_unmasked_min; --n) { step(unmasked, n == n_max - 1); }
                } while (kWindow && n >= n_min);
            } else {
                CUTLASS_PRAGMA_NO_UNROLL
                for (; n >= n_min; --n) { step(masked_if_needed, n == n_max - 1); }
            }
        }
        if (pv_pending) { flush(); }
    }
};

}  // namespace flash_dash
