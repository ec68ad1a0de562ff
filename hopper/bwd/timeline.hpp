// Diagnostic build only (FLASH_DASH_BWD_TIMELINE=1): the dQ-store warp records, per dQ contribution,
// where its time goes, to tell rank-chain stalls from everything else. With the knob off (default) the
// recorder is empty and the kernels compile to the same code.
// Record layout (int64 x kFields at ((b*H + h)*M + m)*N + rank):
//   [0] %globaltimer (ns) when the predecessor's count was seen   [1] cycles waiting for it
//   [2] cycles then waiting for the MMA warpgroups' dQ tile        [3] cycles from the bulk copy to the increment
//   [4] (CTA << 32) | step within the K/V tile
#pragma once
#include <cstdint>

#include "schedule/policies.hpp"

#ifndef FLASH_DASH_BWD_TIMELINE
#define FLASH_DASH_BWD_TIMELINE 0
#endif

namespace flash_dash {
namespace bwd {

#if FLASH_DASH_BWD_TIMELINE && defined(__CUDA_ARCH__)  // device code only (the host pass has no clock64)
__device__ inline long long global_ns() {
    uint64_t ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return static_cast<long long>(ns);
}
#endif

struct StepTimeline {
    static constexpr int kFields = 5;
#if FLASH_DASH_BWD_TIMELINE && defined(__CUDA_ARCH__)
    long long* rec;
    long long t;
    __device__ StepTimeline(long long* base, int64_t index)
        : rec(base == nullptr ? nullptr : base + index * kFields), t(clock64()) {}
    __device__ void acquired() {
        if (rec == nullptr) return;
        rec[0] = global_ns();
        long long const now = clock64();
        rec[1] = now - t;
        t = now;
    }
    __device__ void ready() {
        if (rec == nullptr) return;
        long long const now = clock64();
        rec[2] = now - t;
        t = now;
    }
    __device__ void done(int cta, int step) {
        if (rec == nullptr) return;
        rec[3] = clock64() - t;
        rec[4] = (static_cast<long long>(cta) << 32) | step;
    }
#else
    __device__ StepTimeline(long long*, int64_t) {}
    __device__ void acquired() {}
    __device__ void ready() {}
    __device__ void done(int, int) {}
#endif
};

// The MMA warpgroups' side of each K/V tile (thread 0 records), after the dQ records (one per (b, query head, m tile,
// rank), StepTimeline::kFields each): int64 x kFields at dq_records * StepTimeline::kFields + t * kFields for the
// policy's tile t:
//   [0] %globaltimer (ns) when the wait for the tile's K/V began   [1] cycles of that wait
//   [2] cycles then waiting for its first Q/dO stage                 [3] cycles of its dK/dV epilogue   [4] CTA
//   [5] [6] [7] cycles, summed over the tile's steps, waiting for Q (the first step's included), for dO, and for the dQ
//   hand-off buffer (the store warp's release)                       [8] cycles of the step loop   [9] steps
// (the waits tell the step's stalls on the rank chain, through the hand-off buffer, from those on the loads).
struct TileTimeline {
    static constexpr int kFields = 10;
    enum Wait { kQ = 5, kdO = 6, kAcquire = 7 };
#if FLASH_DASH_BWD_TIMELINE && defined(__CUDA_ARCH__)
    long long* rec;
    long long t = 0;
    long long wait_start = 0;
    long long waited[3] = {0, 0, 0};
    int steps = 0;
    __device__ TileTimeline(long long* base, SchedShape const& sched, int query_heads, int tile, bool leader)
        : rec(base == nullptr || !leader
                  ? nullptr
                  : base + int64_t(sched.batch) * query_heads * sched.num_m * sched.num_n * StepTimeline::kFields +
                        int64_t(tile) * kFields) {}
    __device__ void kv_wait() {
        if (rec == nullptr) return;
        rec[0] = global_ns();
        t = clock64();
    }
    __device__ void kv_ready() {
        if (rec == nullptr) return;
        long long const now = clock64();
        rec[1] = now - t;
        t = now;
    }
    __device__ void first_q_ready() {
        if (rec != nullptr) rec[2] = clock64() - t;
    }
    // Around a wait of the step loop: its cycles are added to field `wait`.
    __device__ void wait_begin() {
        if (rec != nullptr) wait_start = clock64();
    }
    __device__ void wait_end(Wait wait) {
        if (rec != nullptr) waited[wait - kQ] += clock64() - wait_start;
    }
    __device__ void step_done() { ++steps; }
    __device__ void epilogue_begin() {
        if (rec == nullptr) return;
        long long const now = clock64();
        rec[8] = steps > 0 ? now - t : 0;  // t: kv_ready's
        t = now;
    }
    __device__ void epilogue_end(int cta) {
        if (rec == nullptr) return;
        rec[3] = clock64() - t;
        rec[4] = cta;
        for (int i = 0; i < 3; ++i) { rec[kQ + i] = waited[i]; }
        rec[9] = steps;
    }
#else
    __device__ TileTimeline(long long*, SchedShape const&, int, int, bool) {}
    __device__ void kv_wait() {}
    __device__ void kv_ready() {}
    __device__ void first_q_ready() {}
    __device__ void wait_begin() {}
    __device__ void wait_end(Wait) {}
    __device__ void step_done() {}
    __device__ void epilogue_begin() {}
    __device__ void epilogue_end(int) {}
#endif
};

}  // namespace bwd
}  // namespace flash_dash
