// Stochastic dissimilarity (docs/math.md §3) on CUDA, forward and backward.
//
// With nu = P mu, a = P 1 and c = P ||mu||^2 (smooth_centroids() in tables.cpp):
//   D[x,q] = a_q ||h_x||^2 - 2 h_x . nu_q + c_q
// so the forward pass is one cuBLAS product (at::mm) followed by a fused epilogue kernel (row norms
// of h plus the rank-one terms), exactly as the CPU kernel does.
//
// Both passes work on h and mu centered on the centroids (center_on_centroids, sol_ext.h): D is a
// difference of large terms when the embeddings lie far from the origin, and centering makes those
// terms as small as D itself. The centered h is one [B,d] copy in the compute dtype.
//
// float16/bfloat16: h, mu (and grad_D) are upcast to float32, and every product, norm and
// accumulation runs in float32 (cuBLAS SGEMM); only the outputs are rounded to the input dtype. That
// keeps D far more accurate than a half-precision GEMM would.
//
// TF32: every float32 product here runs in full float32 under at::NoTF32Guard, whatever
// torch.backends.cuda.matmul.allow_tf32 or torch.set_float32_matmul_precision say: TF32 keeps 10
// mantissa bits, and the losses compare entries of D that differ by far less than that resolves.
//
// Deterministic: cuBLAS products and the warp reductions below have a fixed summation order.
//
// The centroid side of both passes (the centering shift, mu - shift, and nu, a, c) is about 11 torch
// operations per pass, each a launch whose host cost dominates a small batch. SOL_EXT_CUDA_DISSIMILARITY
// chooses (read at each call): "separate" (the default), those operations; "fused", two kernels
// (center_centroids_kernel, smooth_centroids_kernel: plain loops, used up to kFusedCentroidsMaxSteps
// per thread, else the operations). "fused" becomes the only one once it has run on a GPU
// (benchmarks/gpu_check.sh's tests cover both, its sweep times it).
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "../sol_ext.h"
#include "cuda_common.cuh"

namespace sol_ext {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * cuda::kWarpSize;

// Sum over the 32 lanes of a warp, in a fixed order; every lane gets the total.
template <typename acc_t>
__device__ __forceinline__ acc_t warp_sum(acc_t value) {
  for (int offset = cuda::kWarpSize / 2; offset >= 1; offset /= 2) {
    value += __shfl_xor_sync(cuda::kFullMask, value, offset);
  }
  return value;
}

// One warp per row x: D[x,q] = a_q ||h_x||^2 - 2 G[x,q] + c_q, with h centered and G = h nu^T, both in
// acc_t. `out` may alias `G` (each element is read and then written by the same thread).
template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kThreads) dissimilarity_epilogue_kernel(
    const acc_t* __restrict__ h,
    const acc_t* G,
    const acc_t* __restrict__ a,
    const acc_t* __restrict__ c,
    int64_t B,
    int64_t d,
    int64_t n,
    scalar_t* out) {
  const int lane = threadIdx.x % cuda::kWarpSize;
  const int64_t x = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / cuda::kWarpSize;
  if (x >= B) return;  // whole warps leave together
  const acc_t* h_row = h + x * d;
  acc_t squared_norm = acc_t(0);
  for (int64_t k = lane; k < d; k += cuda::kWarpSize) {
    const acc_t value = h_row[k];
    squared_norm += value * value;
  }
  squared_norm = warp_sum(squared_norm);
  for (int64_t q = lane; q < n; q += cuda::kWarpSize) {
    out[x * n + q] = static_cast<scalar_t>(a[q] * squared_norm - acc_t(2) * G[x * n + q] + c[q]);
  }
}

// One warp per row x: grad_h[x,k] = 2 (sum_q grad_D[x,q] a_q) h[x,k] - 2 Gh[x,k], Gh = grad_D nu, with h
// centered, in acc_t. `out` may alias `Gh`.
template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kThreads) dissimilarity_grad_h_epilogue_kernel(
    const acc_t* __restrict__ grad_D,
    const acc_t* __restrict__ h,
    const acc_t* Gh,
    const acc_t* __restrict__ a,
    int64_t B,
    int64_t d,
    int64_t n,
    scalar_t* out) {
  const int lane = threadIdx.x % cuda::kWarpSize;
  const int64_t x = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / cuda::kWarpSize;
  if (x >= B) return;
  acc_t weight = acc_t(0);  // sum_q grad_D[x,q] a_q
  for (int64_t q = lane; q < n; q += cuda::kWarpSize) weight += grad_D[x * n + q] * a[q];
  const acc_t scale = acc_t(2) * warp_sum(weight);
  for (int64_t k = lane; k < d; k += cuda::kWarpSize) {
    const int64_t i = x * d + k;
    out[i] = static_cast<scalar_t>(scale * h[i] - acc_t(2) * Gh[i]);
  }
}

// ---- the centroid side, fused (see the top of the file) ---------------------------------------------

constexpr int kCentroidThreads = 256;
// smooth_centroids_kernel's longest loop, n ceil(d / kCentroidThreads) multiply-adds per thread; beyond
// it (many ranks, or very wide embeddings) cuBLAS's product is the faster.
constexpr int64_t kFusedCentroidsMaxSteps = 1024;

// x * 0.5 rounded on its own: nvcc would otherwise fuse one of centering_shift's two halves into the
// addition (an FMA), which rounds differently when the half is subnormal.
__device__ __forceinline__ float half_of(float x) { return __fmul_rn(x, 0.5f); }
__device__ __forceinline__ double half_of(double x) { return __dmul_rn(x, 0.5); }

// Per column k of mu [n,d] (n >= 1): shift[k] = min_j mu[j,k] / 2 + max_j mu[j,k] / 2 (centering_shift's
// halves; a NaN in the column gives a NaN, as torch's amin/amax do) and mu_c[j,k] = mu[j,k] - shift[k].
template <typename acc_t>
__global__ void center_centroids_kernel(const acc_t* __restrict__ mu, int64_t n, int64_t d, acc_t* __restrict__ shift,
                                        acc_t* __restrict__ mu_c) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < d;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc_t lowest = mu[k], highest = mu[k];
    for (int64_t j = 1; j < n; ++j) {
      const acc_t value = mu[j * d + k];
      if (isnan(value) || value < lowest) lowest = isnan(lowest) ? lowest : value;
      if (isnan(value) || value > highest) highest = isnan(highest) ? highest : value;
    }
    const acc_t center = half_of(lowest) + half_of(highest);
    shift[k] = center;
    for (int64_t j = 0; j < n; ++j) mu_c[j * d + k] = mu[j * d + k] - center;
  }
}

// One block per rank q: nu[q,k] = sum_j P[q,j] mu_c[j,k], a[q] = sum_j P[q,j] and
// c[q] = sum_k sum_j P[q,j] mu_c[j,k]^2 (= sum_j P[q,j] ||mu_c[j]||^2), every sum in a fixed order (the
// threads' parts of a and c by a tree in shared memory).
template <typename acc_t>
__global__ void __launch_bounds__(kCentroidThreads) smooth_centroids_kernel(
    const acc_t* __restrict__ P, const acc_t* __restrict__ mu_c, int64_t n, int64_t d, acc_t* __restrict__ nu,
    acc_t* __restrict__ a, acc_t* __restrict__ c) {
  __shared__ acc_t row_sums[kCentroidThreads], squares[kCentroidThreads];
  const int64_t q = blockIdx.x;
  const acc_t* P_row = P + q * n;
  acc_t row_sum = acc_t(0), square_sum = acc_t(0);
  for (int64_t j = threadIdx.x; j < n; j += kCentroidThreads) row_sum += P_row[j];
  for (int64_t k = threadIdx.x; k < d; k += kCentroidThreads) {
    acc_t total = acc_t(0), column_squares = acc_t(0);
    for (int64_t j = 0; j < n; ++j) {
      const acc_t weight = P_row[j], value = mu_c[j * d + k];
      total += weight * value;
      column_squares += weight * (value * value);
    }
    nu[q * d + k] = total;
    square_sum += column_squares;
  }
  row_sums[threadIdx.x] = row_sum;
  squares[threadIdx.x] = square_sum;
  __syncthreads();
  for (int stride = kCentroidThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      row_sums[threadIdx.x] += row_sums[threadIdx.x + stride];
      squares[threadIdx.x] += squares[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    a[q] = row_sums[0];
    c[q] = squares[0];
  }
}

bool fused_centroids_chosen(int64_t n, int64_t d) {
  return cuda::fused_chosen("SOL_EXT_CUDA_DISSIMILARITY") && n >= 1 && d >= 1 &&
         n * cuda::ceil_div(d, int64_t(kCentroidThreads)) <= kFusedCentroidsMaxSteps;
}

// The centroid side of both passes: the shift s [1,d] (centering_shift), mu - s [n,d] and
// smooth_centroids(mu - s), from mu in the compute dtype.
struct CentroidSide {
  at::Tensor shift, mu;
  SmoothedCentroids s;
};

CentroidSide centroid_side(const at::Tensor& mu_acc, double sigma, cudaStream_t stream) {
  const int64_t n = mu_acc.size(0), d = mu_acc.size(1);
  if (!fused_centroids_chosen(n, d)) {
    const at::Tensor shift = centering_shift(mu_acc);
    const at::Tensor mu = (mu_acc - shift).contiguous();
    return {shift, mu, smooth_centroids(mu, sigma)};
  }
  const at::Tensor mu = mu_acc.contiguous();
  const at::Tensor P = noise_kernel(n, sigma, mu.scalar_type(), mu.device());
  at::Tensor shift = at::empty({1, d}, mu.options()), centered = at::empty({n, d}, mu.options());
  at::Tensor nu = at::empty({n, d}, mu.options()), a = at::empty({n}, mu.options()), c = at::empty({n}, mu.options());
  AT_DISPATCH_FLOATING_TYPES(mu.scalar_type(), "centroid_side", [&] {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(cuda::ceil_div(d, kCentroidThreads), 65535));
    center_centroids_kernel<scalar_t><<<blocks, kCentroidThreads, 0, stream>>>(
        mu.data_ptr<scalar_t>(), n, d, shift.data_ptr<scalar_t>(), centered.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    smooth_centroids_kernel<scalar_t><<<static_cast<unsigned>(n), kCentroidThreads, 0, stream>>>(
        P.data_ptr<scalar_t>(), centered.data_ptr<scalar_t>(), n, d, nu.data_ptr<scalar_t>(), a.data_ptr<scalar_t>(),
        c.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {shift, centered, SmoothedCentroids{P, nu, a, c}};
}

// The dtype every product runs in: float32 for float16/bfloat16 inputs, else the input dtype.
at::ScalarType compute_dtype(at::ScalarType dtype) {
  return (dtype == at::kHalf || dtype == at::kBFloat16) ? at::kFloat : dtype;
}

at::Tensor stochastic_dissimilarity_cuda(const at::Tensor& h_in, const at::Tensor& mu_in, double sigma) {
  check_dissimilarity_inputs(h_in, mu_in, sigma);
  TORCH_CHECK(h_in.is_cuda(), "h must be a CUDA tensor, got ", h_in.device());
  c10::cuda::CUDAGuard device_guard(h_in.device());
  const at::NoTF32Guard full_float32;
  const at::ScalarType dtype = h_in.scalar_type();
  const at::ScalarType acc_dtype = compute_dtype(dtype);
  const int64_t B = h_in.size(0), d = h_in.size(1), n = mu_in.size(0);
  if (B == 0) return at::empty({0, n}, h_in.options());
  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  const CentroidSide side = centroid_side(mu_in.to(acc_dtype), sigma, stream);
  const SmoothedCentroids& s = side.s;
  const at::Tensor h = (h_in.to(acc_dtype) - side.shift).contiguous();  // centered (center_on_centroids)
  cuda::record_use(s.P, stream);
  at::Tensor G = at::mm(h, s.nu.t()).contiguous();  // h_x . nu_q, [B,n]
  at::Tensor D = acc_dtype == dtype ? G : at::empty({B, n}, h_in.options());
  const int64_t blocks = cuda::ceil_div(B, kWarpsPerBlock);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "stochastic_dissimilarity_cuda", [&] {
    using acc_t = cuda::acc_type<scalar_t>;
    dissimilarity_epilogue_kernel<scalar_t, acc_t><<<blocks, kThreads, 0, stream>>>(
        h.data_ptr<acc_t>(), G.data_ptr<acc_t>(), s.a.data_ptr<acc_t>(), s.c.data_ptr<acc_t>(), B, d, n,
        D.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return D;
}

// grad_h  = 2 (grad_D a) * h - 2 grad_D nu                        (at::mm + epilogue kernel)
// grad_mu = -2 P^T (grad_D^T h) + 2 mu * (P^T colsum(grad_D))      (at::mm, at::addmm)
std::tuple<at::Tensor, at::Tensor> stochastic_dissimilarity_backward_cuda(
    const at::Tensor& grad_in,
    const at::Tensor& h_in,
    const at::Tensor& mu_in,
    double sigma,
    bool need_grad_h,
    bool need_grad_mu) {
  check_dissimilarity_backward_inputs(grad_in, h_in, mu_in, sigma);
  TORCH_CHECK(h_in.is_cuda(), "h must be a CUDA tensor, got ", h_in.device());
  c10::cuda::CUDAGuard device_guard(h_in.device());
  const at::NoTF32Guard full_float32;
  const at::ScalarType dtype = h_in.scalar_type();
  const at::ScalarType acc_dtype = compute_dtype(dtype);
  const int64_t B = h_in.size(0), d = h_in.size(1), n = mu_in.size(0);
  at::Tensor grad_h = at::empty({0}, h_in.options());
  at::Tensor grad_mu = at::empty({0}, mu_in.options());
  if (!need_grad_h && !need_grad_mu) return {grad_h, grad_mu};

  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  const CentroidSide side = centroid_side(mu_in.to(acc_dtype), sigma, stream);
  const SmoothedCentroids& s = side.s;
  const at::Tensor h = (h_in.to(acc_dtype) - side.shift).contiguous();  // centered (center_on_centroids)
  const at::Tensor& mu = side.mu;
  const at::Tensor grad = grad_in.to(acc_dtype).contiguous();
  cuda::record_use(s.P, stream);

  if (need_grad_h) {
    if (B == 0) {
      grad_h = at::empty({0, d}, h_in.options());
    } else {
      at::Tensor Gh = at::mm(grad, s.nu).contiguous();  // [B,d] in acc dtype
      grad_h = acc_dtype == dtype ? Gh : at::empty({B, d}, h_in.options());
      const int64_t blocks = cuda::ceil_div(B, kWarpsPerBlock);
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "stochastic_dissimilarity_backward_cuda", [&] {
        using acc_t = cuda::acc_type<scalar_t>;
        dissimilarity_grad_h_epilogue_kernel<scalar_t, acc_t><<<blocks, kThreads, 0, stream>>>(
            grad.data_ptr<acc_t>(), h.data_ptr<acc_t>(), Gh.data_ptr<acc_t>(), s.a.data_ptr<acc_t>(), B, d, n,
            grad_h.data_ptr<scalar_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    }
  }
  if (need_grad_mu) {
    // With B == 0 every product below is an empty sum: grad_mu = 0, as on the CPU.
    const at::Tensor Pt = s.P.t();
    const at::Tensor weight = at::mv(Pt, grad.sum(0));  // P^T colsum(grad_D), [n]
    const at::Tensor base = mu * weight.unsqueeze(1).mul(2);
    grad_mu = at::addmm(base, Pt, at::mm(grad.t(), h), /*beta=*/1, /*alpha=*/-2)
                  .to(mu_in.scalar_type())
                  .contiguous();
  }
  return {grad_h, grad_mu};
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CUDA, m) {
  m.impl("stochastic_dissimilarity", &stochastic_dissimilarity_cuda);
  m.impl("_stochastic_dissimilarity_backward", &stochastic_dissimilarity_backward_cuda);
}

} // namespace sol_ext
