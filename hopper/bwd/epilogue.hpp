// dK/dV epilogue of the backward kernel: scale dK, then either store both in the input dtype
// (no GQA, or GQA-folded tiles, which hold every sibling's sum; rows >= sk are not written) or add them in fp32
// into the GQA accumulators (deterministic mode: in the order rank = h % group, one counter per (n, b, kv head)).
// Swapped dK/dV (Traits::kSwapdKV) hold dK^T and dV^T: the same writes, element by element (an accumulator's
// neighbours are then adjacent keys, not adjacent columns).
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
    template <class Params, class TiledMma, class Acc>
    CUTLASS_DEVICE static void store(Params const& params, SchedShape const& sched, TileCtx const& c,
                                     VarlenSeq const& seq, int tid, TiledMma& mma_dkv, Acc& tdKacc, Acc& tdVacc) {
        using namespace cute;
        using Element = typename Traits::Element;
        constexpr int kBlockN = Traits::kBlockN;
        constexpr int kHeadDim = Traits::kHeadDim;
        auto thr = mma_dkv.get_thread_slice(tid);
        Tensor cKV = make_identity_tensor(typename Traits::ShapedKV{});
        Tensor tcKV = thr.partition_C(cKV);
        // Accumulator element i's key (within the tile) and column; kVec elements from i on are adjacent columns.
        auto key_of = [&](int i) { return int(get<Traits::kKeyMode>(tcKV(i))); };
        auto col_of = [&](int i) { return int(get<1 - Traits::kKeyMode>(tcKV(i))); };
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
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < size(tdKacc); i += kVec) {
                int const row = n_base + key_of(i);
                int const col = col_of(i);
                if (row < sched.seqlen_k) {
                    cutlass::NumericArrayConverter<Element, float, kVec> cvt;
                    cutlass::Array<float, kVec> k2, v2;
                    k2[0] = tdKacc(i);
                    if constexpr (kVec == 2) { k2[1] = tdKacc(i + 1); }
                    v2[0] = tdVacc(i);
                    if constexpr (kVec == 2) { v2[1] = tdVacc(i + 1); }
                    auto ko = cvt(k2);
                    auto vo = cvt(v2);
                    *reinterpret_cast<cutlass::Array<Element, kVec>*>(dk + row * params.dk_row + col) = ko;
                    *reinterpret_cast<cutlass::Array<Element, kVec>*>(dv + row * params.dv_row + col) = vo;
                }
            }
        } else {
            // GQA: fp32 accumulators (B, Hk, N*kBlockN, d) row-major, padded rows (no bounds check).
            int64_t const tile = Varlen ? int64_t(hk) * params.varlen_n_cap + seq.n_start + c.n
                                        : (int64_t(c.b) * sched.heads_k + hk) * sched.num_n + c.n;
            int64_t const base = tile * int64_t(kBlockN * kHeadDim);
            float* dk = params.dk_accum + base;
            float* dv = params.dv_accum + base;
            int* sem = params.dkv_sem + (Varlen ? tile : (int64_t(c.n) * sched.batch + c.b) * sched.heads_k + hk);
            if constexpr (Deterministic) {
                cutlass::arch::NamedBarrier::sync(Traits::NumMmaThreads, uint32_t(BwdBarrier::Epilogue));
                if (tid == 0) { wait_eq(sem, c.h % params.group); }
                cutlass::arch::NamedBarrier::sync(Traits::NumMmaThreads, uint32_t(BwdBarrier::Epilogue));
            }
            // Pairs of adjacent columns as one 8-byte reduction (REDG.F32x2): half the atomics of scalar adds.
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < size(tdKacc); i += kVec) {
                int const off = key_of(i) * kHeadDim + col_of(i);
                if constexpr (kVec == 2) {
                    atomicAdd(reinterpret_cast<float2*>(dk + off), make_float2(tdKacc(i), tdKacc(i + 1)));
                    atomicAdd(reinterpret_cast<float2*>(dv + off), make_float2(tdVacc(i), tdVacc(i + 1)));
                } else {
                    atomicAdd(dk + off, tdKacc(i));
                    atomicAdd(dv + off, tdVacc(i));
                }
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
