// dK/dV epilogue of the backward kernel: scale dK, then either store both in the input dtype
// (no GQA, or GQA-folded tiles, which hold every sibling's sum; rows >= sk are not written) or add them in fp32
// into the GQA accumulators (deterministic mode: in the order rank = h % group, one counter per (n, b, kv head)).
// It also hands the tile's K/V buffers back to the producer (barrier_kv_empty) once it is done with them.
// Stores go through shared memory (the P/dS buffers for plain layouts, the K/V buffers for swapped ones), then out
// in 16-byte row chunks: stored from the accumulators' layout (4-byte pieces, a row per lane quad; swapped dK/dV
// 2-byte ones), the writes kept the MMA warpgroups 5-12 us per K/V tile. The GQA adds likewise (fp32 rows in the
// K/V buffers, 16-byte reductions), instead of 8-byte atomics from the accumulators' layout.
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
    // dK and dV have their own head dims (Traits::kHeadDim, kHeadDimV): each is staged with its own element
    // coordinates and row length.
    using Element = typename Traits::Element;
    using ClusterBar = cutlass::arch::ClusterBarrier;
    static constexpr int kChunkElems = 16 / sizeof(Element);

    // A row-major copy of a tile in shared memory (kCols elements of type T per row), each row's 16-byte chunks
    // rotated by the row (mod 8), so that a warp's accumulator writes (8 rows, one or two chunk columns) and its reads
    // (consecutive chunks of a row) hit distinct banks.
    template <class T, int kCols>
    struct StagedRows {
        static constexpr int kChunkElems = 16 / sizeof(T);
        static constexpr int kChunks = kCols / kChunkElems;
        static_assert(kCols % kChunkElems == 0 && kChunks >= 8, "a row needs at least 8 chunks of 16 bytes");
        CUTLASS_DEVICE static int chunk_offset(int row, int chunk) {
            return row * kCols + ((chunk + (row & 7)) % kChunks) * kChunkElems;
        }
        CUTLASS_DEVICE static int offset(int row, int col) {
            return chunk_offset(row, col / kChunkElems) + col % kChunkElems;
        }
        // f(row, chunk) for every 16-byte chunk of rows [0, kRows), spread over the MMA threads.
        template <int kRows, class F>
        CUTLASS_DEVICE static void for_each_chunk(int tid, F&& f) {
            CUTLASS_PRAGMA_UNROLL
            for (int idx = tid; idx < kRows * kChunks; idx += Traits::NumMmaThreads) { f(idx / kChunks, idx % kChunks); }
        }
    };

    // Rows [n_base, seqlen_k) of a kBlockN x kCols tile to out (row stride `ld`), 16 bytes per store: the staged
    // copy, or zeros (kStaged false: `staged` unused).
    template <int kCols, bool kStaged = true>
    CUTLASS_DEVICE static void store_rows(Element const* staged, Element* out, int64_t ld, int n_base, int seqlen_k,
                                          int tid) {
        using Rows = StagedRows<Element, kCols>;
        Rows::template for_each_chunk<Traits::kBlockN>(tid, [&](int row, int chunk) {
            if (n_base + row < seqlen_k) {
                uint4 v{0, 0, 0, 0};
                if constexpr (kStaged) { v = *reinterpret_cast<uint4 const*>(staged + Rows::chunk_offset(row, chunk)); }
                *reinterpret_cast<uint4*>(out + (n_base + row) * ld + chunk * kChunkElems) = v;
            }
        });
    }

    // GQA: one half of a key tile's fp32 dK or dV (the keys of 8-key groups of parity `round`, staged row r holding
    // key (r / 8) * 16 + round * 8 + r % 8) added to its accumulator rows (row-major, kCols floats), 16 bytes per
    // reduction.
    template <int kCols>
    CUTLASS_DEVICE static void add_rows(float const* staged, float* out, int round, int tid) {
        using Rows = StagedRows<float, kCols>;
        Rows::template for_each_chunk<Traits::kBlockN / 2>(tid, [&](int row, int chunk) {
            int const key = (row >> 3) * 16 + round * 8 + (row & 7);
            float4 const v = *reinterpret_cast<float4 const*>(staged + Rows::chunk_offset(row, chunk));
            atomicAdd(reinterpret_cast<float4*>(out + key * kCols + chunk * 4), v);
        });
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
                using Rows = StagedRows<Element, decltype(cols)::value>;
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
            // GQA: fp32 accumulators (B, Hk, N*kBlockN, d) row-major (d: dK's or dV's head dim), padded rows (no
            // bounds check).
            int64_t const tile = Varlen ? int64_t(hk) * params.varlen_n_cap + seq.n_start + c.n
                                        : (int64_t(c.b) * sched.heads_k + hk) * sched.num_n + c.n;
            float* dk = params.dk_accum + tile * int64_t(kBlockN * kHeadDim);
            float* dv = params.dv_accum + tile * int64_t(kBlockN * kHeadDimV);
            int* sem = params.dkv_sem + (Varlen ? tile : (int64_t(c.n) * sched.batch + c.b) * sched.heads_k + hk);
            // Deterministic: this head's adds land after those of the heads before it in its group.
            auto wait_turn = [&] {
                if (tid == 0) { wait_eq(sem, c.h % params.group); }
                cutlass::arch::NamedBarrier::sync(Traits::NumMmaThreads, uint32_t(BwdBarrier::Epilogue));
            };
            if (kv_loaded) {  // (a tile without steps has nothing to add)
                // Staged in fp32 in the K/V buffers, twice a bf16 row's bytes: two rounds, the 8-key groups of one
                // parity each (dK's rows in K's buffer, dV's in V's), then added row by row.
                static_assert(kBlockN % 16 == 0 && kBlockN * kHeadDim <= cute::cosize_v<typename Traits::SmemLayoutK> &&
                              kBlockN * kHeadDimV <= cute::cosize_v<typename Traits::SmemLayoutV>);
                float* sk = reinterpret_cast<float*>(ss.smem_k.data());
                float* sv = reinterpret_cast<float*>(ss.smem_v.data());
                auto stage = [&](auto const& acc, auto const& tc, float* buf, auto cols, int round) {
                    using Rows = StagedRows<float, decltype(cols)::value>;
                    CUTLASS_PRAGMA_UNROLL
                    for (int i = 0; i < decltype(size(acc))::value; i += kVec) {
                        int const key = key_of(tc, i);
                        if (((key >> 3) & 1) == round) {
                            float* dst = buf + Rows::offset((key >> 4) * 8 + (key & 7), col_of(tc, i));
                            if constexpr (kVec == 2) {
                                *reinterpret_cast<float2*>(dst) = make_float2(acc(i), acc(i + 1));
                            } else {
                                *dst = acc(i);
                            }
                        }
                    }
                };
                CUTLASS_PRAGMA_UNROLL
                for (int round = 0; round < 2; ++round) {
                    // Round 0: both warpgroups' last GEMMs (S, dP and dQ read K/V) have retired; round 1: round 0's
                    // rows have been read.
                    cutlass::arch::NamedBarrier::sync(Traits::NumMmaThreads, uint32_t(BwdBarrier::Epilogue));
                    stage(tdKacc, tcK, sk, Int<kHeadDim>{}, round);
                    stage(tdVacc, tcV, sv, Int<kHeadDimV>{}, round);
                    cutlass::arch::NamedBarrier::sync(Traits::NumMmaThreads, uint32_t(BwdBarrier::Epilogue));
                    if (Deterministic && round == 0) { wait_turn(); }
                    add_rows<kHeadDim>(sk, dk, round, tid);
                    add_rows<kHeadDimV>(sv, dv, round, tid);
                }
                // This thread's reads of the buffers are done: the producer may refill them.
                cutlass::arch::fence_view_async_shared();
                ClusterBar::arrive(&ss.barrier_kv_empty);
            } else if constexpr (Deterministic) {
                wait_turn();
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
