// Extended GMMA N (not 64/96/128/192/256) must be enabled before any CuTe header, and only in the
// translation units that need it (front-end cost): see FwdTileConfig's knobs.
#define FD_NEEDS_EXT(n) ((n) % 64 != 0 && (n) != 96)
#if (defined(FLASH_DASH_FWD_HDIM64_BLOCK_N) && FD_NEEDS_EXT(FLASH_DASH_FWD_HDIM64_BLOCK_N)) || \
    (defined(FLASH_DASH_FWD_HDIM64_CAUSAL_BLOCK_N) && FD_NEEDS_EXT(FLASH_DASH_FWD_HDIM64_CAUSAL_BLOCK_N))
#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif
#endif
#undef FD_NEEDS_EXT
#include "flash_fwd_launch_template.h"
template void flash_dash::run_fwd<flash_dash::bf16_t, 64>(flash_dash::FwdParams const&, cudaStream_t);
