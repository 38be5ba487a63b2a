// Discriminative loss (docs/math.md §4) on CUDA. The loss is linear in D (sol_math.h for_each_disc_term),
// so both passes are one small kernel each: one thread per sample forward, one thread per element of
// grad_D backward. No atomics, no shared state: deterministic.
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../sol_ext.h"
#include "../sol_math.h"
#include "cuda_common.cuh"

namespace sol_ext {
namespace {

constexpr int kThreads = 256;

// losses[x] = sum_k coef_k (D[x, k] - D[x, r]) (the coefficients sum to 0), accumulated in float64
// like the CPU kernel. Subtracting D[x, r] first makes the label's own terms vanish exactly, so the
// result does not depend on whether the compiler fuses the multiply-adds (n = 1 gives exactly 0).
template <typename scalar_t>
__global__ void disc_loss_forward_kernel(
    const scalar_t* __restrict__ D,
    const int64_t* __restrict__ labels,
    int64_t B,
    int64_t n,
    int64_t T,
    scalar_t* __restrict__ out) {
  const int64_t x = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (x >= B) return;
  const int64_t r = labels[x];
  CUDA_KERNEL_ASSERT(r >= 0 && r < n);
  const scalar_t* row = D + x * n;
  const double own = static_cast<double>(row[r]);
  double total = 0.0;
  for_each_disc_term<double>(r, n, T, [&](int64_t k, double coef) {
    total += coef * (static_cast<double>(row[k]) - own);
  });
  out[x] = static_cast<scalar_t>(total);
}

// grad_D[x, k] = grad[x] * (sum of the coefficients of the terms of sample x at rank k). One thread
// per element, so that no zero-fill pass and no read-modify-write are needed.
template <typename scalar_t>
__global__ void disc_loss_backward_kernel(
    const scalar_t* __restrict__ grad,
    int64_t grad_stride,
    const int64_t* __restrict__ labels,
    int64_t B,
    int64_t n,
    int64_t T,
    scalar_t* __restrict__ out) {
  using acc_t = cuda::acc_type<scalar_t>;
  const int64_t total = B * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t x = i / n, q = i % n;
    const int64_t r = labels[x];
    CUDA_KERNEL_ASSERT(r >= 0 && r < n);
    acc_t coef_sum = acc_t(0);  // integer coefficients: the sum is exact
    for_each_disc_term<acc_t>(r, n, T, [&](int64_t k, acc_t coef) {
      if (k == q) coef_sum += coef;
    });
    out[i] = static_cast<scalar_t>(coef_sum * static_cast<acc_t>(grad[x * grad_stride]));
  }
}

at::Tensor disc_loss_cuda(const at::Tensor& D_in, const at::Tensor& labels_in, int64_t T) {
  const DiscLossProblem problem = prepare_disc_loss(D_in, labels_in, T);
  const at::Tensor &D = problem.D, &labels = problem.labels;
  const int64_t B = problem.B, n = problem.n;
  TORCH_CHECK(D.is_cuda(), "D must be a CUDA tensor, got ", D.device());
  c10::cuda::CUDAGuard device_guard(D.device());
  at::Tensor losses = at::empty({B}, D.options());
  if (B == 0) return losses;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t blocks = cuda::ceil_div(B, kThreads);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, D.scalar_type(), "disc_loss_cuda", [&] {
    disc_loss_forward_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
        D.data_ptr<scalar_t>(), labels.data_ptr<int64_t>(), B, n, T, losses.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return losses;
}

at::Tensor disc_loss_backward_cuda(const at::Tensor& grad, const at::Tensor& labels_in, int64_t n, int64_t T) {
  const DiscLossBackwardProblem problem = prepare_disc_loss_backward(grad, labels_in, n, T);
  TORCH_CHECK(grad.is_cuda(), "grad_losses must be a CUDA tensor, got ", grad.device());
  const int64_t B = problem.B;
  const at::Tensor& labels = problem.labels;
  c10::cuda::CUDAGuard device_guard(grad.device());
  at::Tensor grad_D = at::empty({B, n}, grad.options().memory_format(at::MemoryFormat::Contiguous));
  if (B == 0) return grad_D;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  // A stride-0 gradient (the backward of a mean) is read in place, never materialized.
  const int64_t blocks = std::min<int64_t>(cuda::ceil_div(B * n, kThreads), 65535);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "disc_loss_backward_cuda", [&] {
    disc_loss_backward_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
        grad.data_ptr<scalar_t>(), grad.stride(0), labels.data_ptr<int64_t>(), B, n, T,
        grad_D.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad_D;
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CUDA, m) {
  m.impl("disc_loss", &disc_loss_cuda);
  m.impl("_disc_loss_backward", &disc_loss_backward_cuda);
}

} // namespace sol_ext
