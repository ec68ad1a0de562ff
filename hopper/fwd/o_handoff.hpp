// Varlen forward: the O blocks that straddle a packed sequence's ends (a TMA box would write the neighbours' rows) are
// copied row by row by an idle warp of the producer warpgroup, one per O part, so the copy's registers stay out of the
// consumers' step loop (inlined there, it made the 160-register warpgroups of hdim 64 spill); kUsed says where.
//
// Pacing, per part, by two mbarriers (Traits::OHandoffBarriers): after the consumers' own barrier (the block is
// staged) one of them arrives on "staged"; the copy warp waits on it, copies the block if it straddles, and all its
// lanes arrive on "free", which that consumer thread waits on before the part stages its next block. mbarrier phases,
// not a named barrier shared with the consumers: a named barrier counts arrivals without generations (an arrive then
// a sync of the copy warp could land in one and release the consumers early), and synccheck reports one generation
// waited on at different instructions. The copy overlaps the part's next tile.
#pragma once
#include <cstdint>
#include <cute/tensor.hpp>

#include <cutlass/arch/barrier.h>

namespace flash_dash {

template <class Traits>
struct OHandoff {
    using Element = typename Traits::Element;
    static constexpr int kRows = Traits::kORows;
    static constexpr int kHeadDimV = Traits::kHeadDimV;  // O's columns
    // Where the copy warps run: the three-consumer configurations (160 registers each), where the consumers' own copy
    // spilled (hdim 64: 146-206 B). With two consumers (240 registers) the consumers copy at no spill, and the copy
    // warps measured worse there (hdim 96 softcap: a 1344 B stack frame in the step loop).
    static constexpr bool kUsed = Traits::kNumMmaWarpGroups == 3;

    // Whether the part's block starting at the sequence's row block_row meets the sequence's rows without lying
    // inside them: the blocks the copy warp stores (the consumers store the others by TMA, or not at all).
    CUTE_DEVICE static bool straddles(int block_row, int seqlen_q) {
        bool const inside = block_row >= 0 && block_row + kRows <= seqlen_q;
        bool const meets = block_row < seqlen_q && block_row + kRows > 0;
        return meets && !inside;
    }

    // A staged block's rows inside its sequence (dst: the sequence's row 0 of the block's head; block_row: the block's
    // first row in the sequence, negative rows before it), by kThreads threads (thread t), 16 bytes per step: every
    // swizzle keeps 8-element chunks of a row together and repeats within 8 rows, so a thread's chunk (row r0 < 8,
    // column c) moves by a fixed offset from one 8-row group to the next. Rolled, with running pointers: few registers.
    template <int kThreads, class TensorS>
    CUTE_DEVICE static void copy_rows(TensorS const& sO, Element* dst, int64_t row_stride, int block_row,
                                      int seqlen_q, int t) {
        constexpr int kChunks = kHeadDimV / 8;
        int const skip = block_row < 0 ? -block_row : 0;  // rows before the sequence's first
        int const end = seqlen_q - block_row;             // rows from here on are past its last
#pragma unroll 1
        for (int k = t; k < 8 * kChunks; k += kThreads) {
            int const r0 = k / kChunks, c = (k - r0 * kChunks) * 8;
            Element const* src = &sO(r0, c);
            int const src_step = int(&sO(r0 + 8, c) - src);
            Element* out = dst + int64_t(block_row + r0) * row_stride + c;
#pragma unroll 1
            for (int r = r0; r < kRows; r += 8) {
                if (r >= skip && r < end) { *reinterpret_cast<uint4*>(out) = *reinterpret_cast<uint4 const*>(src); }
                src += src_step;
                out += 8 * row_stride;
            }
        }
    }

    using Barriers = typename Traits::OHandoffBarriers;
    using Mbarrier = cutlass::arch::ClusterBarrier;

    // By one thread, before the CTA's __syncthreads (fence_barrier_init orders the inits for the other threads).
    CUTE_DEVICE static void init(Barriers& b) {
        for (int part = 0; part < Traits::kOParts; ++part) {
            Mbarrier::init(&b.staged[part], 1);
            Mbarrier::init(&b.free[part], 32);
            b.free_phase[part] = 1;  // the fresh barrier's "previous" phase: the first tile does not wait
        }
        cutlass::arch::fence_barrier_init();
    }
    // Consumers, one thread of the part: before the part stages a block, the copy warp is done with the last one.
    CUTE_DEVICE static void wait_free(Barriers& b, int part) {
        uint32_t const phase = b.free_phase[part];
        Mbarrier::wait(&b.free[part], phase);
        b.free_phase[part] = phase ^ 1u;
    }
    // Consumers, the same thread, once the part's threads synced on the staged block.
    CUTE_DEVICE static void signal_staged(Barriers& b, int part) { Mbarrier::arrive(&b.staged[part]); }

    // The copy warp of part `part`: the CTA's tiles in the consumers' order (the scheduler's read_next); a straddling
    // block's rows inside its sequence (copy_rows; the copy warps have 24-32 registers).
    template <class Params, class Sched, class SeqOf>
    CUTE_DEVICE static void copy_warp(Params const& p, Element* smem_o, Barriers& b, Sched const& sched,
                                      SeqOf&& seq_of, int part, int lane) {
        using namespace cute;
        Tensor sO = make_tensor(make_smem_ptr(smem_o), typename Traits::SmemLayoutO{})(_, _, part);
        uint32_t phase = 0;
        int read = 0;
#pragma unroll 1
        for (int t = blockIdx.x; t < sched.total; t = sched.read_next(t, read++)) {
            auto const tile = sched.decode(t);
            auto const seq = seq_of(tile);
            int const block_row = Traits::first_row(seq, tile.m_block) + part * kRows;
            Mbarrier::wait(&b.staged[part], phase);
            phase ^= 1u;
            if (straddles(block_row, seq.seqlen_q())) {
                copy_rows<32>(sO, p.o_ptr + int64_t(tile.head) * p.o_head_stride + int64_t(seq.q_start()) * p.o_row_stride,
                              p.o_row_stride, block_row, seq.seqlen_q(), lane);
            }
            Mbarrier::arrive(&b.free[part]);  // every lane, after its own reads
        }
    }
};

}  // namespace flash_dash
