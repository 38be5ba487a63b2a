// Shared by the CUDA kernels of the stochastic order loss (docs/math.md §6, §7): the arguments a pair
// evaluation reads, the host-side preparation, and the entry points of the two algorithms of
// order_loss, one file each:
//   order_loss_all_pairs_kernel.cu   all pairs of the batch (pairs = None)
//   order_loss_pairs_kernel.cu       explicit pairs [M,2]
// order_loss_kernel.cu chooses between them and registers the ops; order_loss_block_kernel.cu holds the
// block op of data-parallel training.
//
// Layout used by every kernel here: the 32 lanes of a warp walk the ranks q (lane, lane+32, ...), so
// that a row of D is read coalesced and a pair's sum over q ends in a warp reduction. No [M,n] or
// [B,B,n] intermediate is ever formed; D (small, [B,n]) is read through L1/L2.
//
// Precision: delta = D[x,q] - D[y,q] is rounded to the input dtype (scalar_t), and the hinge arguments
// delta + gamma, gamma - delta and |delta| - gamma are computed in acc_t with gamma in acc_t and rounded
// once to scalar_t (HingeArgs, sol_math.h): the expressions of the PyTorch reference, so the hinge
// decisions are exactly those of the CPU kernel and the reference; gamma is never rounded to
// float16/bfloat16. Sums run in acc_t (float32 for float16/bfloat16/float32, float64 for float64), and
// the probability table is read in acc_t from the device copy cached by ordering_table(). A NaN in D
// gives NaN losses for the pairs that read it, as on the CPU and in the reference.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>

#include "../sol_ext.h"
#include "../sol_math.h"
#include "cuda_common.cuh"

namespace sol_ext {
namespace order_loss_cuda {

using cuda::acc_type;
using cuda::kWarpSize;

constexpr int kWarpsPerBlock = 8;                 // forward, explicit-pair and block kernels
constexpr int kThreads = kWarpsPerBlock * kWarpSize;
constexpr int kCsrRankChunks = 4;                 // deterministic explicit and block backward: ranks per pass / 32

// Everything a pair evaluation reads.
template <typename scalar_t>
struct LossArgs {
  const scalar_t* __restrict__ D;        // [B,n], contiguous
  const int64_t* __restrict__ labels;    // [B]
  const acc_type<scalar_t>* __restrict__ table;  // [n,n,3]: (lt, eq, gt) of (r_x, r_y)
  int64_t B;
  int n;
  acc_type<scalar_t> gamma;
  bool official;
};

// The hinge arguments of one rank from both rows' values (HingeArgs, sol_math.h).
template <typename scalar_t>
struct Hinges : HingeArgs<scalar_t, acc_type<scalar_t>> {
  __device__ __forceinline__ Hinges(scalar_t dx, scalar_t dy, acc_type<scalar_t> gamma)
      : HingeArgs<scalar_t, acc_type<scalar_t>>(static_cast<scalar_t>(dx - dy), gamma) {}
};

template <typename scalar_t>
__device__ __forceinline__ int load_rank(const LossArgs<scalar_t>& args, int64_t row) {
  const int64_t r = args.labels[row];
  CUDA_KERNEL_ASSERT(r >= 0 && r < args.n);
  return static_cast<int>(r);
}

inline at::ScalarType table_dtype(at::ScalarType dtype) {
  return dtype == at::kDouble ? at::kDouble : at::kFloat;
}

template <typename scalar_t>
LossArgs<scalar_t> make_args(const OrderLossProblem& problem, const at::Tensor& table, double margin) {
  LossArgs<scalar_t> args;
  args.D = problem.D.data_ptr<scalar_t>();
  args.labels = problem.labels.data_ptr<int64_t>();
  args.table = table.data_ptr<acc_type<scalar_t>>();
  args.B = problem.B;
  args.n = static_cast<int>(problem.n);
  args.gamma = static_cast<acc_type<scalar_t>>(margin);
  args.official = problem.convention == Convention::Official;
  return args;
}

// The shared checks and preparation, plus the CUDA kernels' limit on n (ranks are int there).
// Call it under the device guard: making inputs contiguous may launch copies.
inline OrderLossProblem prepare_cuda(
    const at::Tensor& D,
    const at::Tensor& labels,
    const std::optional<at::Tensor>& pairs,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention) {
  OrderLossProblem problem = prepare_order_loss(D, labels, pairs, sigma, tau, margin, convention);
  TORCH_CHECK(problem.n <= (1 << 20), "order_loss (CUDA): at most 2^20 ranks, got ", problem.n);
  return problem;
}

// Entry points of the two algorithms, one dtype dispatch each. Call them under the device guard, with
// M > 0 and the problem's probability table recorded on the stream.
void all_pairs_forward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                       at::Tensor& losses, cudaStream_t stream);
void all_pairs_backward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                        const at::Tensor& g, at::Tensor& grad_D, cudaStream_t stream);
void explicit_pairs_forward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                            at::Tensor& losses, cudaStream_t stream);
at::Tensor explicit_pairs_backward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                                   const at::Tensor& g, cudaStream_t stream);

} // namespace order_loss_cuda
} // namespace sol_ext
