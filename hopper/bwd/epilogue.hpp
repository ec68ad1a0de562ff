// dK/dV epilogue of the backward kernel: scale dK, then either store both in the input dtype
// (no GQA, or GQA-folded tiles, which hold every sibling's sum; rows >= sk are not written) or add them in fp32
// into the GQA accumulators (deterministic mode: in the order rank = h % group, one counter per (n, b, kv head)).
// It also hands the tile's K/V buffers back to the producer (barrier_kv_empty) once it is done with them.
// Stores go through shared memory (the P/dS buffers for plain layouts, the K/V buffers for swapped ones), then out
// in 16-byte row chunks: stored from the accumulators' layout (4-byte pieces, a row per lane quad; swapped dK/dV
// 2-byte ones), the writes kept the MMA warpgroups 5-12 us per K/V tile.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_conversion.h>

#include "bwd/barriers.hpp"
#include "bwd/semaphore.hpp"
#include "schedule/policies.hpp"
#include "bwd/tiles.hpp"

namespace flash_dash {
namespace bwd {

// Varlen: `sched` is the tile's sequence's grid and `seq` its view; its rows start at seq.k_start and its GQA
// accumulators and counters at its key tile seq.n_start of each K/V head's (unfolded sequences only).
template <class Traits, bool Deterministic, bool GqaFold, bool Varlen>
struct BwdEpilogue {
    // dK and dV have their own head dims (Traits::kHeadDim, kHeadDimV): one loop walks both accumulators, element i of
    // each (dV's may be the shorter), each at its own column. Element i of both has the same key: their GEMMs share
    // the key split and the accumulator's value layout up to the head-dim extent (plain: one 64 x d atom, keys on its
    // rows; swapped: one MMA, keys on its N), so one bound check covers both stores, as when they had one shape.
    using Element = typename Traits::Element;
    using ClusterBar = cutlass::arch::ClusterBarrier;
    static constexpr int kChunkElems = 16 / sizeof(Element);

    // A kRows x kCols row-major copy of a tile in shared memory, each row's 16-byte chunks rotated by the row (mod 8),
    // so that a warp's accumulator writes (8 rows, one chunk column) and its reads (consecutive chunks of a row) hit
    // distinct banks.
    template <int kCols>
    struct StagedRows {
        static constexpr int kChunks = kCols / kChunkElems;
        static_assert(kCols % kChunkElems == 0 && kChunks >= 8, "a row needs at least 8 chunks of 16 bytes");
        CUTLASS_DEVICE static int chunk_offset(int row, int chunk) {
            return row * kCols + ((chunk + (row & 7)) % kChunks) * kChunkElems;
        }
        CUTLASS_DEVICE static int offset(int row, int col) {
            return chunk_offset(row, col / kChunkElems) + col % kChunkElems;
        }
    };

    // Rows [n_base, seqlen_k) of a kBlockN x kCols tile to out (row stride `ld`), 16 bytes per store: the staged
    // copy, or zeros (kStaged false: `staged` unused).
    template <int kCols, bool kStaged = true>
    CUTLASS_DEVICE static void store_rows(Element const* staged, Element* out, int64_t ld, int n_base, int seqlen_k,
                                          int tid) {
        using Rows = StagedRows<kCols>;
        constexpr int kTotal = Traits::kBlockN * Rows::kChunks;
        CUTLASS_PRAGMA_UNROLL
        for (int idx = tid; idx < kTotal; idx += Traits::NumMmaThreads) {
            int const row = idx / Rows::kChunks, chunk = idx % Rows::kChunks;
            if (n_base + row < seqlen_k) {
                uint4 v{0, 0, 0, 0};
                if constexpr (kStaged) { v = *reinterpret_cast<uint4 const*>(staged + Rows::chunk_offset(row, chunk)); }
                *reinterpret_cast<uint4*>(out + (n_base + row) * ld + chunk * kChunkElems) = v;
            }
        }
    }

    // kv_loaded: the tile ran steps, so its K/V are in the buffers (a tile without steps loads none, and the
    // producer may already be loading the next tile's there: its dK = dV = 0 go out from registers).
    template <class Params, class TiledMmaK, class TiledMmaV, class AccK, class AccV>
    CUTLASS_DEVICE static void store(Params const& params, SchedShape const& sched, TileCtx const& c,
                                     VarlenSeq const& seq, int tid, TiledMmaK& mma_dk, TiledMmaV& mma_dv,
                                     AccK& tdKacc, AccV& tdVacc, typename Traits::SharedStorage& ss, bool kv_loaded) {
        using namespace cute;
        constexpr int kBlockN = Traits::kBlockN;
        constexpr int kHeadDim = Traits::kHeadDim, kHeadDimV = Traits::kHeadDimV;
        // The thread's element coordinates (and the addresses made from them) are computed here, per tile: hoisted
        // out of the tile loop by the compiler, they were held across the step loop and spilled.
        int tile_tid;
        asm volatile("mov.b32 %0, %1;" : "=r"(tile_tid) : "r"(tid));
        Tensor tcK = mma_dk.get_thread_slice(tile_tid).partition_C(make_identity_tensor(typename Traits::ShapedK{}));
        Tensor tcV = mma_dv.get_thread_slice(tile_tid).partition_C(make_identity_tensor(typename Traits::ShapedV{}));
        // Accumulator element i's key (within the tile) and column; kVec elements from i on are adjacent columns.
        auto key_of = [&](auto const& tc, int i) { return int(get<Traits::kKeyMode>(tc(i))); };
        auto col_of = [&](auto const& tc, int i) { return int(get<1 - Traits::kKeyMode>(tc(i))); };
        constexpr int kVec = Traits::kSwapdKV ? 1 : 2;
        constexpr int kElemsK = decltype(size(tdKacc))::value, kElemsV = decltype(size(tdVacc))::value;
        constexpr int kElems = kElemsK > kElemsV ? kElemsK : kElemsV;
        float const scale = params.softmax_scale;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(tdKacc); ++i) { tdKacc(i) *= scale; }
        auto const walk = BwdTiles<Varlen, GqaFold>::tile_siblings(params.group, seq);
        int const hk = walk.kv_head(c);
        int const n_base = c.n * kBlockN;
        // Folded tiles (every sibling's dK/dV in these registers) and MHA store; unfolded GQA tiles add in head order.
        if (walk.folded() || params.dk_accum == nullptr) {
            Element* dk = params.dk + (Varlen ? seq.k_start * params.dk_row : c.b * params.dk_batch) + hk * params.dk_head;
            Element* dv = params.dv + (Varlen ? seq.k_start * params.dv_row : c.b * params.dv_batch) + hk * params.dv_head;
            if (!kv_loaded) {  // no steps: zeros (no smem of this tile to stage in)
                store_rows<kHeadDim, false>(nullptr, dk, params.dk_row, n_base, sched.seqlen_k, tid);
                store_rows<kHeadDimV, false>(nullptr, dv, params.dv_row, n_base, sched.seqlen_k, tid);
                return;
            }
            // Staged in the P/dS buffers where they hold dK or dV (plain layouts: their last readers are this tile's
            // dQ GEMMs), so the K/V buffers go back to the producer at once and the next tile's K/V load overlaps the
            // epilogue; dK and dV together when both fit, else one after the other. Swapped layouts: in the K/V
            // buffers (dK's and dV's shapes), handed back after the copy-out.
            constexpr int kDsElems = cute::cosize_v<typename Traits::SmemLayoutdS>;
            constexpr bool kInDs = !Traits::kSwapdKV && kBlockN * kHeadDim <= kDsElems && kBlockN * kHeadDimV <= kDsElems;
            constexpr bool kOneRound = !kInDs || kBlockN * (kHeadDim + kHeadDimV) <= kDsElems;
            static_assert(kInDs || (kBlockN * kHeadDim <= cute::cosize_v<typename Traits::SmemLayoutK> &&
                                    kBlockN * kHeadDimV <= cute::cosize_v<typename Traits::SmemLayoutV>));
            Element* sk = kInDs ? ss.smem_ds.data() : ss.smem_k.data();
            Element* sv = kInDs ? (kOneRound ? sk + kBlockN * kHeadDim : sk) : ss.smem_v.data();
            if constexpr (kInDs) { ClusterBar::arrive(&ss.barrier_kv_empty); }
            cutlass::NumericArrayConverter<Element, float, kVec> cvt;
            // Accumulator -> its staged rows (kCols: its head dim).
            auto stage = [&](auto const& acc, auto const& tc, Element* buf, auto cols) {
                using Rows = StagedRows<decltype(cols)::value>;
                CUTLASS_PRAGMA_UNROLL
                for (int i = 0; i < decltype(size(acc))::value; i += kVec) {
                    cutlass::Array<float, kVec> x;
                    x[0] = acc(i);
                    if constexpr (kVec == 2) { x[1] = acc(i + 1); }
                    *reinterpret_cast<cutlass::Array<Element, kVec>*>(buf + Rows::offset(key_of(tc, i), col_of(tc, i))) = cvt(x);
                }
            };
            // Both warpgroups' last GEMMs (dQ reads dS and K) have retired before either overwrites a buffer.
            cutlass::arch::NamedBarrier::sync(Traits::NumMmaThreads, uint32_t(BwdBarrier::Epilogue));
            stage(tdKacc, tcK, sk, Int<kHeadDim>{});
            if constexpr (kOneRound) { stage(tdVacc, tcV, sv, Int<kHeadDimV>{}); }
            cutlass::arch::NamedBarrier::sync(Traits::NumMmaThreads, uint32_t(BwdBarrier::Epilogue));
            store_rows<kHeadDim>(sk, dk, params.dk_row, n_base, sched.seqlen_k, tid);
            if constexpr (!kOneRound) {
                cutlass::arch::NamedBarrier::sync(Traits::NumMmaThreads, uint32_t(BwdBarrier::Epilogue));
                stage(tdVacc, tcV, sv, Int<kHeadDimV>{});
                cutlass::arch::NamedBarrier::sync(Traits::NumMmaThreads, uint32_t(BwdBarrier::Epilogue));
            }
            store_rows<kHeadDimV>(sv, dv, params.dv_row, n_base, sched.seqlen_k, tid);
            if constexpr (kInDs) {
                // The next tile's first dS goes where these rows were read.
                cutlass::arch::NamedBarrier::sync(Traits::NumMmaThreads, uint32_t(BwdBarrier::Epilogue));
            } else {
                // This thread's reads of the buffers are done (their values are in registers): the producer may
                // refill them (its TMA writes are the async proxy's; order this thread's generic writes before them).
                cutlass::arch::fence_view_async_shared();
                ClusterBar::arrive(&ss.barrier_kv_empty);
            }
        } else {
            if (kv_loaded) { ClusterBar::arrive(&ss.barrier_kv_empty); }  // the adds below read registers only
            // GQA: fp32 accumulators (B, Hk, N*kBlockN, d) row-major (d: dK's or dV's head dim), padded rows (no
            // bounds check).
            int64_t const tile = Varlen ? int64_t(hk) * params.varlen_n_cap + seq.n_start + c.n
                                        : (int64_t(c.b) * sched.heads_k + hk) * sched.num_n + c.n;
            float* dk = params.dk_accum + tile * int64_t(kBlockN * kHeadDim);
            float* dv = params.dv_accum + tile * int64_t(kBlockN * kHeadDimV);
            int* sem = params.dkv_sem + (Varlen ? tile : (int64_t(c.n) * sched.batch + c.b) * sched.heads_k + hk);
            if constexpr (Deterministic) {
                cutlass::arch::NamedBarrier::sync(Traits::NumMmaThreads, uint32_t(BwdBarrier::Epilogue));
                if (tid == 0) { wait_eq(sem, c.h % params.group); }
                cutlass::arch::NamedBarrier::sync(Traits::NumMmaThreads, uint32_t(BwdBarrier::Epilogue));
            }
            // Pairs of adjacent columns as one 8-byte reduction (REDG.F32x2): half the atomics of scalar adds.
            auto add = [&](auto const& acc, auto const& tc, float* out, int head_dim, int i) {
                int const off = key_of(tc, i) * head_dim + col_of(tc, i);
                if constexpr (kVec == 2) {
                    atomicAdd(reinterpret_cast<float2*>(out + off), make_float2(acc(i), acc(i + 1)));
                } else {
                    atomicAdd(out + off, acc(i));
                }
            };
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < kElems; i += kVec) {
                if (i < kElemsK) { add(tdKacc, tcK, dk, kHeadDim, i); }
                if (i < kElemsV) { add(tdVacc, tcV, dv, kHeadDimV, i); }
            }
            if constexpr (Deterministic) {
                __threadfence();
                cutlass::arch::NamedBarrier::sync(Traits::NumMmaThreads, uint32_t(BwdBarrier::Epilogue));
                if (tid == 0) { fence_acq_rel_gpu(); red_release_add(sem, 1); }
            }
        }
    }
};

}  // namespace bwd
}  // namespace flash_dash
