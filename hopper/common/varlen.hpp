// Packed (varlen) launches: where each sequence of a pack lies and the tile table the persistent grids walk.
//
// The offsets (cu_seqlens_*, seqused_*) stay on the device: the host sizes the grid and the workspace from shapes
// alone, and one prepare CTA, launched before the main kernel on the same stream, reads the offsets, checks them,
// writes each sequence's view (VarlenSeq) and a table of the pack's tiles (VarlenTile: sequence, block, head) and
// their count. A tile's coordinates are relative to its sequence, so a sequence runs the same tiles, masks and
// reduction orders as alone in a dense call: its bits do not depend on its neighbours.
//
// Bad offsets cannot raise before the launch without a device-to-host copy; the prepare CTA instead records the
// first error in a host-mapped status word (read by the next call on the host, flash_attn_dash/varlen_cuda.py),
// launches no tile (count 0) and fills the outputs it was given with NaN, so that no plausible wrong answer leaves.
#pragma once
#include <climits>
#include <cstdint>

#if defined(__CUDACC__)
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#endif

#include "common/host_device.hpp"

namespace flash_dash {

// Rows [q_start, q_start + len_q) of the packed q attend to rows [k_start, k_start + len_k) of k and v. The backward's
// per-tile workspace (dQ accumulators and counters, dPsum / LSE rows, GQA dK/dV accumulators) gives each sequence
// its own whole tiles: its query blocks start at tile m_start and its key blocks at tile n_start of a head's
// (VarlenTiling::q_rows / k_rows blocks; prefix sums over the sequences before it). `folded`: the backward runs the
// sequence GQA-folded, as its dense call does (varlen_folds): its tiles are (key block, K/V head), each walking the
// query heads that share the K/V head (schedule/sibling_walk.hpp).
struct alignas(16) VarlenSeq {
    int q_start, k_start, len_q, len_k;
    int m_start, n_start;
    int folded;
};

// One tile of the pack: `block` is its m block (forward) or n block (backward) within sequence `seq`.
struct alignas(8) VarlenTile {
    int seq, block_head;  // block_head = block * heads + head
};

// What went wrong with a pack (VarlenStatus::code); flash_attn_dash/varlen_cuda.py names the argument per code.
enum VarlenError : int {
    kVarlenOk = 0,
    kVarlenCuQStart = 1,      // cu_seqlens_q[0] != 0
    kVarlenCuQOrder = 2,      // cu_seqlens_q decreases
    kVarlenCuQEnd = 3,        // cu_seqlens_q[batch] != total_q
    kVarlenCuKStart = 4,
    kVarlenCuKOrder = 5,
    kVarlenCuKEnd = 6,
    kVarlenUsedQ = 7,         // seqused_q[i] outside [0, cu_seqlens_q[i+1] - cu_seqlens_q[i]]
    kVarlenUsedK = 8,
    kVarlenMaxQ = 9,          // a used query length above max_seqlen_q
    kVarlenMaxK = 10,
};

// Host-mapped (pinned) words the prepare CTA writes: the first error's code and the sequence index it names.
struct VarlenStatus {
    int code, seq;
};

// The pack as the binding hands it over (device pointers; seqused_* may be null).
struct VarlenArgs {
    int const* cu_seqlens_q;  // (batch + 1,)
    int const* cu_seqlens_k;
    int const* seqused_q;     // (batch,) or nullptr
    int const* seqused_k;
    int max_seqlen_q, max_seqlen_k;
    VarlenStatus* status;     // host-mapped
    void* workspace;          // varlen_workspace_bytes(...) bytes
    // What a rejected pack fills with NaN: contiguous outputs, 16-bit (forward: out; backward: dq, dk, dv) and fp32
    // (forward: lse; backward: dsink); nullptr: none.
    void* poison16[3];
    int64_t poison16_count[3];
    float* poison32;
    int64_t poison32_count;
};

// The binding sizes the tile table for blocks of at least this many rows (the launchers static_assert it: the
// backward's key blocks of hdim 256 have 48).
constexpr int kVarlenMinRows = 48;

// Tiles of a pack whose sequences' used lengths sum to at most `total` rows: each sequence's ceil(len / rows) is
// at most len / rows + 1 (checked in 64 bits by the binding: the count must fit in int32).
FLASH_DASH_HD int64_t varlen_tile_capacity(int64_t total, int64_t batch, int rows, int heads) {
    return (total / rows + batch) * heads;
}

// The workspace: the views, then the tile count and the forward's claim counter (tiles claimed after the grid's
// first, schedule/tile_ring.hpp) in one 16-byte slot, then the table (16-byte aligned parts).
struct VarlenWorkspace {
    VarlenSeq* seqs;
    int* num_tiles;
    int* claims;
    VarlenTile* tiles;
};

FLASH_DASH_HD int64_t varlen_round16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

FLASH_DASH_HD int64_t varlen_workspace_bytes(int64_t batch, int64_t capacity) {
    return varlen_round16(batch * int64_t(sizeof(VarlenSeq))) + 16 + capacity * int64_t(sizeof(VarlenTile));
}

FLASH_DASH_HD VarlenWorkspace varlen_workspace(void* base, int64_t batch) {
    char* p = static_cast<char*>(base);
    VarlenWorkspace w;
    w.seqs = reinterpret_cast<VarlenSeq*>(p);
    p += varlen_round16(batch * int64_t(sizeof(VarlenSeq)));
    w.num_tiles = reinterpret_cast<int*>(p);
    w.claims = w.num_tiles + 1;
    w.tiles = reinterpret_cast<VarlenTile*>(p + 16);
    return w;
}

// Heads per claim group of a sequence with num_m query tiles on a dynamic grid of `grid` CTAs (orders.py
// claim_group, the dense backward's rule): the largest power of two <= 4 grid / num_m, at least 1, at most `heads`.
FLASH_DASH_HD int varlen_claim_group(int num_m, int heads, int grid) {
    int want = 4 * grid / (num_m > 1 ? num_m : 1);
    want = want < heads ? want : heads;
    int group = 1;
    while (group * 2 <= want) { group *= 2; }
    return group;
}

// The order of a sequence's tiles in the table (tile j of a sequence with `blocks` blocks, `heads` query heads and
// `heads_k` K/V heads), as block * heads + head:
//   kVarlenHeadsOuter: heads outer, blocks inner (a head's blocks share its K/V in L2; full-mask forwards);
//   kVarlenLongestFirst: block descending, heads inner (a round of the grid runs tiles of one cost on different heads;
//     causal forwards, whose blocks' costs grow with the block index);
//   kVarlenKeyClaims: the backward's claims, as its dense call claims them (orders.py claimed_tiles, policies.hpp
//     DynamicPersistentGrid): blocks ascending within groups of `group` head slots, slot r being sibling r / heads_k of
//     K/V head r % heads_k (slot_head), so a tile's rank predecessor (n - 1, same head) and its GQA sibling
//     predecessor (same n, head h - 1, a smaller slot) come earlier.
enum VarlenTileOrder : int { kVarlenHeadsOuter = 0, kVarlenLongestFirst = 1, kVarlenKeyClaims = 2 };

FLASH_DASH_HD int varlen_tile_block_head(int j, int blocks, int heads, int heads_k, int order, int group = 1) {
    if (order == kVarlenHeadsOuter) {
        int const head = j / blocks;
        return (j - head * blocks) * heads + head;
    }
    if (order == kVarlenLongestFirst) {
        int const level = j / heads;
        return (blocks - 1 - level) * heads + (j - level * heads);
    }
    int const g = j / (group * blocks);
    int const first = g * group;
    int const size = group < heads - first ? group : heads - first;
    int const in_group = j - g * group * blocks;
    int const n = in_group / size;
    int const slot = first + in_group - n * size;
    return n * heads + (slot % heads_k) * (heads / heads_k) + slot / heads_k;
}

// What the table holds: forward tiles are query blocks (a sequence without keys still writes its rows), backward
// tiles key blocks (a sequence without queries still writes its dK/dV rows: zeros, from tiles of no step); `rows`
// per block. q_rows / k_rows: the blocks that VarlenSeq's
// m_start / n_start count.
struct VarlenTiling {
    int rows, heads, heads_k;
    bool key_blocks;
    int order;  // VarlenTileOrder
    int q_rows, k_rows;
    int grid;                   // kVarlenKeyClaims: the launched grid (claim groups use min(grid, tiles))
    // GQA-folded backward kernels: a sequence folds when its used lengths exceed both (where its own window bounds
    // both sides, flash_attn_dash.launch.varlen_fold_lengths); INT_MAX: no sequence does.
    int fold_min_len_q = INT_MAX, fold_min_len_k = INT_MAX;
};

// Whether sequence s runs GQA-folded.
FLASH_DASH_HD bool varlen_folds(VarlenSeq const& s, VarlenTiling const& t) {
    return s.len_q > t.fold_min_len_q && s.len_k > t.fold_min_len_k;
}

// The heads of a sequence's tiles: the K/V heads when it folds, else the query heads.
FLASH_DASH_HD int varlen_tile_heads(VarlenSeq const& s, VarlenTiling const& t) {
    return s.folded ? t.heads_k : t.heads;
}

// The claim group of a sequence with num_m query tiles and `heads` tile heads in a table of `tiles` tiles (1 but for
// key claims). Both modes group: head-major claims would leave a causal sequence's last head's longest tiles late.
FLASH_DASH_HD int varlen_group(VarlenTiling const& t, int num_m, int heads, int tiles) {
    if (t.order != kVarlenKeyClaims) { return 1; }
    return varlen_claim_group(num_m, heads, t.grid < tiles ? t.grid : tiles);
}

// The pack's first error at boundary i (0 .. batch) as seq * 16 + code (INT_MAX: none): the lowest such key over
// the pack names the first bad sequence, then the first rule it breaks, whichever thread finds it.
FLASH_DASH_HD int varlen_error_at(VarlenArgs const& a, int i, int batch, int total_q, int total_k) {
    int key = INT_MAX;
    auto fail = [&](int code, int seq) { key = seq * 16 + code < key ? seq * 16 + code : key; };
    int const q = a.cu_seqlens_q[i], k = a.cu_seqlens_k[i];
    if (i == 0) {
        if (q != 0) { fail(kVarlenCuQStart, 0); }
        if (k != 0) { fail(kVarlenCuKStart, 0); }
        return key;
    }
    int const len_q = q - a.cu_seqlens_q[i - 1], len_k = k - a.cu_seqlens_k[i - 1];
    if (len_q < 0) { fail(kVarlenCuQOrder, i - 1); }
    if (len_k < 0) { fail(kVarlenCuKOrder, i - 1); }
    if (i == batch && q != total_q) { fail(kVarlenCuQEnd, batch); }
    if (i == batch && k != total_k) { fail(kVarlenCuKEnd, batch); }
    int const used_q = a.seqused_q != nullptr ? a.seqused_q[i - 1] : len_q;
    int const used_k = a.seqused_k != nullptr ? a.seqused_k[i - 1] : len_k;
    if (a.seqused_q != nullptr && (used_q < 0 || used_q > len_q)) { fail(kVarlenUsedQ, i - 1); }
    if (a.seqused_k != nullptr && (used_k < 0 || used_k > len_k)) { fail(kVarlenUsedK, i - 1); }
    if (used_q > a.max_seqlen_q) { fail(kVarlenMaxQ, i - 1); }
    if (used_k > a.max_seqlen_k) { fail(kVarlenMaxK, i - 1); }
    return key;
}

// Sequence i of a checked pack (its workspace starts not yet set).
FLASH_DASH_HD VarlenSeq varlen_seq(VarlenArgs const& a, int i, VarlenTiling const& t) {
    VarlenSeq s{};
    s.q_start = a.cu_seqlens_q[i];
    s.k_start = a.cu_seqlens_k[i];
    s.len_q = a.seqused_q != nullptr ? a.seqused_q[i] : a.cu_seqlens_q[i + 1] - s.q_start;
    s.len_k = a.seqused_k != nullptr ? a.seqused_k[i] : a.cu_seqlens_k[i + 1] - s.k_start;
    s.folded = varlen_folds(s, t);
    return s;
}

// The blocks of a sequence's tiles (each has varlen_tile_heads tiles).
FLASH_DASH_HD int varlen_blocks(VarlenSeq const& s, VarlenTiling const& t) {
    int const len = t.key_blocks ? s.len_k : s.len_q;
    return (len + t.rows - 1) / t.rows;
}

// The work of one of a sequence's tiles, for the longest-first order of the table: a forward query block walks the
// sequence's keys, a backward key block its queries.
FLASH_DASH_HD int varlen_tile_cost(VarlenSeq const& s, VarlenTiling const& t) { return t.key_blocks ? s.len_q : s.len_k; }

// Position of sequence `index` (cost `cost`) when a chunk's sequences are sorted by cost, largest first, ties in
// pack order (a function of the lengths alone); `costs` holds the chunk's n costs.
FLASH_DASH_HD int varlen_rank(int const* costs, int n, int index, int cost) {
    int rank = 0;
    for (int r = 0; r < n; ++r) { rank += costs[r] > cost || (costs[r] == cost && r < index); }
    return rank;
}

// Position of slot `index` of a chunk whose first `in_chunk` slots hold sequences: those ranked by varlen_rank, the
// padding slots after them (cost -1, later in pack order) at their own index. Ranking only the sequences keeps a
// small pack's prepare CTA from looping over every slot of the chunk.
FLASH_DASH_HD int varlen_slot_rank(int const* costs, int in_chunk, int index, int cost) {
    return index < in_chunk ? varlen_rank(costs, in_chunk, index, cost) : index;
}

// The blocks VarlenSeq's m_start / n_start count.
FLASH_DASH_HD int varlen_m_blocks(VarlenSeq const& s, VarlenTiling const& t) { return (s.len_q + t.q_rows - 1) / t.q_rows; }
FLASH_DASH_HD int varlen_n_blocks(VarlenSeq const& s, VarlenTiling const& t) { return (s.len_k + t.k_rows - 1) / t.k_rows; }

// The largest r in [0, n) with prefix[r] <= j, for non-decreasing prefix with prefix[0] <= j < prefix[n]: the
// sequence of tile j (sequences without tiles are skipped).
FLASH_DASH_HD int varlen_find(int const* prefix, int n, int j) {
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        int const mid = (lo + hi) / 2;
        if (prefix[mid] <= j) { lo = mid; } else { hi = mid; }
    }
    return lo;
}

// The sequence whose workspace tiles (VarlenSeq::m_start on for query tiles of `rows` rows, n_start on for key tiles)
// hold tile x of a head's, or -1 past the pack's tiles. Sequences without such tiles share the next one's start, so
// the last sequence starting at or before x is the one.
FLASH_DASH_HD int varlen_seq_of_tile(VarlenSeq const* seqs, int batch, int x, int rows, bool keys) {
    if (batch <= 0) { return -1; }
    int lo = 0, hi = batch;
    while (hi - lo > 1) {
        int const mid = (lo + hi) / 2;
        if ((keys ? seqs[mid].n_start : seqs[mid].m_start) <= x) { lo = mid; } else { hi = mid; }
    }
    VarlenSeq const s = seqs[lo];
    int const start = keys ? s.n_start : s.m_start;
    int const len = keys ? s.len_k : s.len_q;
    return x >= start && x < start + (len + rows - 1) / rows ? lo : -1;
}

#if defined(__CUDACC__)

constexpr int kVarlenPrepareThreads = 1024;

// One CTA: checks the offsets (a bad pack: the status word, no tiles, empty views, NaN in the poisoned outputs), then
// writes the views, the claim counter (0) and the table, chunk by chunk (1024 sequences each, in pack order; within a
// chunk longest first, varlen_rank): a block-wide scan gives the chunk's tile offsets, and every thread writes table
// entries whose sequence it finds in the chunk's prefix sums in shared memory. A template on its block size, which
// also gives the one definition that a kernel defined in a header needs when several translation units launch it.
template <int kT>
__global__ void __launch_bounds__(kT, 1)
    varlen_prepare_kernel(VarlenArgs const a, int batch, int total_q, int total_k, VarlenTiling const tiling) {
    using Scan = cub::BlockScan<int, kT>;
    __shared__ typename Scan::TempStorage scan_storage;
    __shared__ int prefix[kT + 1];  // prefix[p]: tiles of the chunk's sequences before position p
    __shared__ int blocks_of[kT];   // the blocks of the sequence at position p
    __shared__ int cost_of[kT];     // the tile cost of the chunk's sequence r (-1: none)
    __shared__ int seq_at[kT];      // the chunk's sequence at position p
    __shared__ int group_of[kT];    // the claim group of the sequence at position p
    __shared__ int heads_of[kT];    // the tile heads of the sequence at position p
    using Reduce = cub::BlockReduce<int, kT>;
    __shared__ typename Reduce::TempStorage reduce_storage;
    __shared__ int first_error;
    VarlenWorkspace const w = varlen_workspace(a.workspace, batch);
    int const tid = int(threadIdx.x);
    if (tid == 0) { first_error = INT_MAX; }
    __syncthreads();
    // Every check first, over the whole pack: a bad pack gets no table entry.
    for (int i = tid; i <= batch; i += kT) {
        int const key = varlen_error_at(a, i, batch, total_q, total_k);
        if (key != INT_MAX) { atomicMin(&first_error, key); }
    }
    __syncthreads();
    if (first_error != INT_MAX) {
        if (tid == 0) {
            *w.num_tiles = 0;
            a.status->seq = first_error / 16;
            __threadfence_system();  // the host reads code first: seq must be there when code is
            a.status->code = first_error % 16;
        }
        // Empty views: the passes that read them (the backward's pre- and postprocess) find no sequence.
        for (int i = tid; i < batch; i += kT) { w.seqs[i] = VarlenSeq{}; }
        // 0x7fff is a NaN in bf16 and in fp16.
        for (int t = 0; t < 3; ++t) {
            for (int64_t i = tid; i < a.poison16_count[t]; i += kT) { static_cast<uint16_t*>(a.poison16[t])[i] = 0x7fff; }
        }
        for (int64_t i = tid; i < a.poison32_count; i += kT) { a.poison32[i] = __int_as_float(0x7fc00000); }
        return;
    }
    // The table's size first: the backward's claim groups depend on the grid the tiles keep busy.
    int total = 0;
    for (int c0 = 0; c0 < batch; c0 += kT) {
        int const i = c0 + tid;
        VarlenSeq const s = i < batch ? varlen_seq(a, i, tiling) : VarlenSeq{};
        int const tiles = i < batch ? varlen_blocks(s, tiling) * varlen_tile_heads(s, tiling) : 0;
        total += Reduce(reduce_storage).Sum(tiles);  // valid in thread 0
        __syncthreads();
    }
    if (tid == 0) { prefix[0] = total; }
    __syncthreads();
    total = prefix[0];
    __syncthreads();
    int base = 0, m_base = 0, n_base = 0;  // tiles, query blocks and key blocks of the chunks before
    for (int c0 = 0; c0 < batch; c0 += kT) {
        int const i = c0 + tid;
        int blocks = 0, m_blocks = 0, n_blocks = 0;
        VarlenSeq s{};
        if (i < batch) {
            s = varlen_seq(a, i, tiling);
            blocks = varlen_blocks(s, tiling);
            m_blocks = varlen_m_blocks(s, tiling);
            n_blocks = varlen_n_blocks(s, tiling);
        }
        int m_before = 0, m_chunk = 0, n_before = 0, n_chunk = 0;
        Scan(scan_storage).ExclusiveSum(m_blocks, m_before, m_chunk);
        __syncthreads();
        Scan(scan_storage).ExclusiveSum(n_blocks, n_before, n_chunk);
        __syncthreads();
        if (i < batch) {
            s.m_start = m_base + m_before;
            s.n_start = n_base + n_before;
            w.seqs[i] = s;
        }
        m_base += m_chunk;
        n_base += n_chunk;
        // The chunk's sequences longest first (the grids then start the longest tiles first and end on short ones).
        int const cost = i < batch && blocks > 0 ? varlen_tile_cost(s, tiling) : -1;  // no tiles: last
        cost_of[tid] = cost;
        __syncthreads();
        int const rank = varlen_slot_rank(cost_of, min(kT, batch - c0), tid, cost);
        seq_at[rank] = tid;
        blocks_of[rank] = blocks;
        heads_of[rank] = varlen_tile_heads(s, tiling);
        group_of[rank] = varlen_group(tiling, m_blocks, heads_of[rank], total);
        __syncthreads();
        int before = 0, chunk_tiles = 0;
        Scan(scan_storage).ExclusiveSum(blocks_of[tid] * heads_of[tid], before, chunk_tiles);
        prefix[tid] = before;
        if (tid == 0) { prefix[kT] = chunk_tiles; }
        __syncthreads();
        for (int j = tid; j < chunk_tiles; j += kT) {
            int const p = varlen_find(prefix, kT, j);
            w.tiles[base + j] = {c0 + seq_at[p], varlen_tile_block_head(j - prefix[p], blocks_of[p], heads_of[p],
                                                                        tiling.heads_k, tiling.order, group_of[p])};
        }
        base += chunk_tiles;
        __syncthreads();  // the shared arrays and the scan's storage are reused by the next chunk
    }
    if (tid == 0) {
        *w.num_tiles = base;
        *w.claims = 0;  // the kernel after this one on the stream claims from 0
    }
}

#endif  // __CUDACC__

}  // namespace flash_dash
