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

// Turns between the warps of one CTA (a shared-memory word): wait until it reads `val`, or hand it `val`.
__device__ __forceinline__ void wait_turn(int const* p, int val) {
    uint32_t const a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    int v;
    while (true) {
        asm volatile("ld.acquire.cta.shared.b32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
        if (v == val) { return; }
        __nanosleep(16);
    }
}

__device__ __forceinline__ void pass_turn(int* p, int val) {
    uint32_t const a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    asm volatile("st.release.cta.shared.b32 [%0], %1;" :: "r"(a), "r"(val) : "memory");
}

__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;" ::: "memory");
}

}  // namespace bwd
}  // namespace flash_dash
