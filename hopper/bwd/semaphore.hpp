// Ordered-add helpers for the backward's dQ accumulation: global int32 counters with acquire/release.
#pragma once
#include <cstdint>

namespace flash_dash {
namespace bwd {

__device__ __forceinline__ int ld_acquire(int const* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Spin (one thread) until *p == val.
__device__ __forceinline__ void wait_eq(int const* p, int val) {
    while (ld_acquire(p) != val) { __nanosleep(32); }
}

// Spin (one thread) until *p >= val.
__device__ __forceinline__ void wait_ge(int const* p, int val) {
    while (ld_acquire(p) < val) { __nanosleep(32); }
}

__device__ __forceinline__ void red_release_add(int* p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;" ::: "memory");
}

}  // namespace bwd
}  // namespace flash_dash
