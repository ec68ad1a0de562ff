// FLASH_DASH_HD: functions shared by kernels and host code (the launchers, and the CPU tests that
// compile the schedulers as plain C++).
#pragma once

#ifndef FLASH_DASH_HD
#if defined(__CUDACC__)
#define FLASH_DASH_HD __host__ __device__ __forceinline__
#else
#define FLASH_DASH_HD inline
#endif
#endif
