#include "flash_fwd_launch_template.h"
template void flash_dash::run_fwd<flash_dash::bf16_t, 128>(flash_dash::FwdParams const&, cudaStream_t);
