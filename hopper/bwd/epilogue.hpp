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
    // dK and dV have their own head dims (Traits::kHeadDim, kHeadDimV): one loop walks both accumulators, element i of
    // each (dV's may be the shorter), each at its own column. Element i of both has the same key: their GEMMs share
    // the key split and the accumulator's value layout up to the head-dim extent (plain: one 64 x d atom, keys on its
    // rows; swapped: one MMA, keys on its N), so one bound check covers both stores, as when they had one shape.
    template <class Params, class TiledMmaK, class TiledMmaV, class AccK, class AccV>
    CUTLASS_DEVICE static void store(Params const& params, SchedShape const& sched, TileCtx const& c,
                                     VarlenSeq const& seq, int tid, TiledMmaK& mma_dk, TiledMmaV& mma_dv,
                                     AccK& tdKacc, AccV& tdVacc) {
        using namespace cute;
        using Element = typename Traits::Element;
        constexpr int kBlockN = Traits::kBlockN;
        constexpr int kHeadDim = Traits::kHeadDim, kHeadDimV = Traits::kHeadDimV;
        Tensor tcK = mma_dk.get_thread_slice(tid).partition_C(make_identity_tensor(typename Traits::ShapedK{}));
        Tensor tcV = mma_dv.get_thread_slice(tid).partition_C(make_identity_tensor(typename Traits::ShapedV{}));
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
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < kElems; i += kVec) {
                int const row = n_base + (i < kElemsK ? key_of(tcK, i) : key_of(tcV, i));
                if (row < sched.seqlen_k) {
                    cutlass::NumericArrayConverter<Element, float, kVec> cvt;
                    cutlass::Array<float, kVec> k2, v2;
                    if (i < kElemsK) {
                        k2[0] = tdKacc(i);
                        if constexpr (kVec == 2) { k2[1] = tdKacc(i + 1); }
                    }
                    if (i < kElemsV) {
                        v2[0] = tdVacc(i);
                        if constexpr (kVec == 2) { v2[1] = tdVacc(i + 1); }
                    }
                    auto ko = cvt(k2);
                    auto vo = cvt(v2);
                    if (i < kElemsK) {
                        *reinterpret_cast<cutlass::Array<Element, kVec>*>(dk + row * params.dk_row + col_of(tcK, i)) = ko;
                    }
                    if (i < kElemsV) {
                        *reinterpret_cast<cutlass::Array<Element, kVec>*>(dv + row * params.dv_row + col_of(tcV, i)) = vo;
                    }
                }
            }
        } else {
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
