// Named barrier ids of the backward kernel (user ids 0..7; cutlass::arch::NamedBarrier adds 8).
#pragma once
#include <cstdint>

namespace flash_dash {
namespace bwd {

// PdS: both MMA warpgroups' dS^T (swapped dK/dV: P and dS) is in smem. dQFull0/1, dQEmpty0/1: the dQ hand-off of MMA
// warpgroup 0 and 1 (dq_handoff.hpp). Epilogue: the MMA warpgroups' GQA dK/dV ordered add. PdSEmpty (swapped dK/dV,
// one P and one dS buffer): both warpgroups' GEMMs of the previous step have read them.
enum class BwdBarrier : uint32_t {
    PdS = 0, dQFull0 = 1, dQFull1 = 2, dQEmpty0 = 3, dQEmpty1 = 4, Epilogue = 5, PdSEmpty = 6
};

}  // namespace bwd
}  // namespace flash_dash
