#include "flash_fwd_launch_template.h"
template void flash_dash::run_fwd<flash_dash::fp16_t, 64>(flash_dash::FwdParams const&, cudaStream_t);
