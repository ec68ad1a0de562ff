// User named-barrier ids (0..7; cutlass::arch::NamedBarrier adds 8 to reach the hardware id).
#pragma once
#include <cutlass/arch/barrier.h>

namespace flash_dash {

enum class FwdNamedBarrier : uint32_t {
    kWarpSchedulerWG0 = 2,   // round robin: consumer WG c waits on kWarpSchedulerWG0 + c before issuing
    kWarpSchedulerWG1 = 3,   //   its GEMMs, then arrives on the next WG's barrier
    kWarpSchedulerWG2 = 4,   //   (third consumer WG, kBlockM = 192)
    kEpilogueWG0 = 5,        // O stores: consumer WG c's own epilogue barrier is
    kEpilogueWG1 = 6,        //   kEpilogueWG0 + c (its O block is free, then written)
    kEpilogueWG2 = 7,
};

template <class Id>
CUTE_DEVICE void named_barrier_sync(uint32_t num_threads, Id id) {
    cutlass::arch::NamedBarrier::sync(num_threads, static_cast<uint32_t>(id));
}
template <class Id>
CUTE_DEVICE void named_barrier_arrive(uint32_t num_threads, Id id) {
    cutlass::arch::NamedBarrier::arrive(num_threads, static_cast<uint32_t>(id));
}

}  // namespace flash_dash
