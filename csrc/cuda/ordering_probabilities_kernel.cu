// Ordering probabilities (docs/math.md §5, §10.2) on CUDA: a gather from the [n,n,3] float64 table, which
// ordering_table() computes once on the CPU and caches on each device. The values are those of the CPU
// kernel exactly (the same float64 entries, cast to `dtype`).
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../sol_ext.h"
#include "cuda_common.cuh"

namespace sol_ext {
namespace {

constexpr int kThreads = 256;

// One thread per output element (m, k). Ranks are validated in Python (a device-side check here
// would synchronize); an out-of-range rank trips the kernel assert instead of reading out of bounds.
template <typename out_t>
__global__ void ordering_probabilities_kernel(
    const int64_t* __restrict__ r_x,
    const int64_t* __restrict__ r_y,
    const double* __restrict__ table,
    int64_t M,
    int64_t n,
    out_t* __restrict__ out) {
  const int64_t total = 3 * M;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / 3, k = i % 3;
    const int64_t a = r_x[m], b = r_y[m];
    CUDA_KERNEL_ASSERT(a >= 0 && a < n && b >= 0 && b < n);
    out[i] = static_cast<out_t>(table[(a * n + b) * 3 + k]);
  }
}

at::Tensor ordering_probabilities_cuda(
    const at::Tensor& r_x_in,
    const at::Tensor& r_y_in,
    int64_t n,
    double sigma,
    int64_t tau,
    c10::string_view convention,
    at::ScalarType dtype) {
  check_ordering_probability_inputs(r_x_in, r_y_in, dtype);
  c10::cuda::CUDAGuard device_guard(r_x_in.device());
  const at::Tensor r_x = r_x_in.contiguous();
  const at::Tensor r_y = r_y_in.contiguous();
  const int64_t M = r_x.size(0);
  // Parses the convention and checks n, sigma and tau even when M == 0.
  const at::Tensor table = ordering_table(n, sigma, tau, parse_convention(convention), at::kDouble, r_x.device());
  at::Tensor out = at::empty({M, 3}, r_x.options().dtype(dtype));
  if (M == 0) return out;
  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  cuda::record_use(table, stream);
  const int64_t blocks = std::min<int64_t>(cuda::ceil_div(3 * M, kThreads), 65535);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "ordering_probabilities_cuda", [&] {
    ordering_probabilities_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
        r_x.data_ptr<int64_t>(), r_y.data_ptr<int64_t>(), table.data_ptr<double>(), M, n,
        out.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CUDA, m) {
  m.impl("ordering_probabilities", &ordering_probabilities_cuda);
}

} // namespace sol_ext
