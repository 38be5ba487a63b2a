// The CPU kernels for AVX2 with FMA: cpu_capability.h. Empty where setup.py's compiler cannot build them.
#include "prelude.h"

#if defined(SOL_EXT_CPU_AVX2)
#define SOL_EXT_CPU_NS AVX2
#define SOL_EXT_VECTOR_BYTES 32
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,bmi,bmi2,popcnt"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi,bmi2,popcnt")
#endif
#include "kernels.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
