// The CPU kernels for AVX-512 (F, BW, DQ, VL): cpu_capability.h. Empty where setup.py's compiler cannot
// build them. 512-bit vectors throughout (GCC would otherwise prefer 256-bit ones on some tunings).
#include "prelude.h"

#if defined(SOL_EXT_CPU_AVX512)
#define SOL_EXT_CPU_NS AVX512
#define SOL_EXT_VECTOR_BYTES 64
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi,bmi2,popcnt"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi,bmi2,popcnt,prefer-vector-width=512")
#endif
#include "kernels.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
