// Hardware limits of sm90 that the kernel configurations are checked against.
#pragma once

namespace flash_dash {

// Opt-in dynamic shared memory per block (227 KB; cudaDevAttrMaxSharedMemoryPerBlockOptin on H100/H200).
constexpr int kMaxSmemPerBlock = 232448;
// Registers per SM: the setmaxnreg split of a warp-specialized CTA (one CTA per SM) must fit in what it launched with.
constexpr int kRegistersPerSm = 65536;

}  // namespace flash_dash
