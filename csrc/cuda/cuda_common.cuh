// Small helpers shared by the CUDA kernels of sol_ext (csrc/cuda/*_kernel.cu).
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/macros/Macros.h>

#include <cstdint>
#include <cstdlib>
#include <string>

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

// Whether the environment variable `name` chooses a kernel's "fused" implementation over its
// "separate" one (the default, also when unset or empty); any other value is an error. Read at each call
// (a getenv is cheap beside a launch), so that tests and benchmarks can switch between the two.
inline bool fused_chosen(const char* name) {
  const char* text = std::getenv(name);
  const std::string value = text == nullptr ? "" : text;
  if (value.empty() || value == "separate") return false;
  TORCH_CHECK(value == "fused", name, " must be separate or fused, got '", value, "'");
  return true;
}

// The cached tables of tables.cpp live as long as the cache keeps them, which may end (cache.clear())
// before the kernels queued on `stream` have read them. Recording the use makes the caching allocator
// hold their memory back until those kernels are done, whichever stream allocated it.
inline void record_use(const at::Tensor& cached, c10::cuda::CUDAStream stream) {
  c10::cuda::CUDACachingAllocator::recordStream(cached.storage().data_ptr(), stream);
}

// One step of warp_transpose_reduce on the first Count values of v: lanes with (lane & offset) set keep
// the upper half and send the lower half to their partner, the others the reverse; then the next step on
// the first Count/2 values. Count is a template argument so that every index into v is a compile-time
// constant and v stays in registers, and the selects pick between values already loaded, never between
// v[i] and v[i + half] as lvalues (a select of two addresses puts the whole array in local memory).
template <int Count, int P, typename acc_t>
__device__ __forceinline__ void transpose_reduce_step(acc_t (&v)[P], int lane, int offset) {
  if constexpr (Count > 1) {
    constexpr int half = Count / 2;
    const bool upper = (lane & offset) != 0;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const acc_t lower_value = v[i];
      const acc_t upper_value = v[i + half];
      const acc_t keep = upper ? upper_value : lower_value;
      const acc_t send = upper ? lower_value : upper_value;
      v[i] = keep + __shfl_xor_sync(kFullMask, send, offset);
    }
    transpose_reduce_step<half>(v, lane, offset / 2);
  }
}

// Sums P per-lane values (P a power of two, <= 32) over the 32 lanes of a warp with P + log2(32/P)
// shuffles instead of 5 P ("transposed" butterfly): each step hands half of the remaining values to
// the partner lane. Afterwards v[0] of lane L holds the warp total of value number
// L >> (5 - log2(P)), and the lanes L with (L & (32/P - 1)) == 0 are one owner per value.
// Every lane of the warp must call it. The summation order is fixed, so the result is reproducible.
template <int P, typename acc_t>
__device__ __forceinline__ void warp_transpose_reduce(acc_t (&v)[P], int lane) {
  static_assert(P >= 1 && P <= kWarpSize && (P & (P - 1)) == 0, "P must be a power of two <= 32");
  transpose_reduce_step<P>(v, lane, kWarpSize / 2);
  // The log2(P) steps above used the offsets 16, 8, ..., 32/P; the remaining ones add v[0] only.
#pragma unroll
  for (int offset = kWarpSize / (2 * P); offset >= 1; offset /= 2) v[0] += __shfl_xor_sync(kFullMask, v[0], offset);
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
