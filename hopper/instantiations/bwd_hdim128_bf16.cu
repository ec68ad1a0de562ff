#include "flash_bwd_launch_template.h"

template size_t flash_dash::bwd_workspace_bytes<flash_dash::bf16_t, 128>(flash_dash::BwdParams const&);
template void flash_dash::run_bwd<flash_dash::bf16_t, 128>(flash_dash::BwdParams const&, void*, cudaStream_t);
