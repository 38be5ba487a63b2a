// Small helpers shared by the CUDA kernels of sol_ext (csrc/cuda/*_kernel.cu).
#pragma once

#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>

#include <cstdint>

namespace sol_ext {
namespace cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Accumulation type: float for float16/bfloat16/float32, double for float64.
template <typename scalar_t>
using acc_type = at::opmath_type<scalar_t>;

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Sums P per-lane values (P a power of two, <= 32) over the 32 lanes of a warp with P + log2(32/P)
// shuffles instead of 5 P ("transposed" butterfly): each step hands half of the remaining values to
// the partner lane. Afterwards v[0] of lane L holds the warp total of value number
// L >> (5 - log2(P)), and the lanes L with (L & (32/P - 1)) == 0 are one owner per value.
// Every lane of the warp must call it. The summation order is fixed, so the result is reproducible.
template <int P, typename acc_t>
__device__ __forceinline__ void warp_transpose_reduce(acc_t (&v)[P], int lane) {
  static_assert(P >= 1 && P <= kWarpSize && (P & (P - 1)) == 0, "P must be a power of two <= 32");
  int offset = kWarpSize / 2;
#pragma unroll
  for (int count = P; count > 1; count /= 2) {
    const int half = count / 2;
    const bool upper = (lane & offset) != 0;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const acc_t keep = upper ? v[i + half] : v[i];
      const acc_t send = upper ? v[i] : v[i + half];
      v[i] = keep + __shfl_xor_sync(kFullMask, send, offset);
    }
    offset /= 2;
  }
  for (; offset >= 1; offset /= 2) v[0] += __shfl_xor_sync(kFullMask, v[0], offset);
}

template <int P>
__device__ __forceinline__ int transpose_reduce_value_index(int lane) {
  return lane / (kWarpSize / P);
}

template <int P>
__device__ __forceinline__ bool transpose_reduce_owner(int lane) {
  return lane % (kWarpSize / P) == 0;
}

} // namespace cuda
} // namespace sol_ext
