// Non-tensor bulk copies (CUTLASS 4.2 has no non-tensor cp.reduce.async.bulk atom): inline PTX.
#pragma once
#include <cstdint>

namespace flash_dash {
namespace bwd {

__device__ __forceinline__ uint32_t smem_u32(void const* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// gmem[0:bytes) += smem[0:bytes) (fp32), async bulk group. bytes multiple of 16, both 16B aligned.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, float const* smem, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
                 :: "l"(gmem), "r"(smem_u32(smem)), "r"(bytes) : "memory");
}

// gmem[0:bytes) = smem[0:bytes), async bulk group (same alignment rules).
__device__ __forceinline__ void bulk_store(void* gmem, void const* smem, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                 :: "l"(gmem), "r"(smem_u32(smem)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Source shared memory of all committed groups has been read.
__device__ __forceinline__ void bulk_wait_group_read_0() {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// All committed groups have COMPLETED (global writes / reductions performed).
__device__ __forceinline__ void bulk_wait_group_0() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// smem[0:bytes) <- gmem[0:bytes), completing `bytes` transactions on the mbarrier.
__device__ __forceinline__ void bulk_load_g2s(void* smem, void const* gmem, uint32_t bytes, uint64_t* mbar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        :: "r"(smem_u32(smem)), "l"(gmem), "r"(bytes), "r"(smem_u32(mbar)) : "memory");
}

}  // namespace bwd
}  // namespace flash_dash
