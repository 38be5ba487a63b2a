// Stochastic order loss over explicit pairs ([M,2] batch indices) on CUDA, forward and backward.
//
// The 32 lanes of a warp walk the ranks q; precision: see order_loss_common.cuh.
//
// Explicit pairs ([M,2]):
//   forward   one warp per 8 pairs, PairTerms::loss per rank, transposed warp reduction.
//   backward  default: one warp per 8 pairs, atomicAdd of +-grad into grad_D (float32 buffer for
//             float16/bfloat16): the summation order varies between runs. Under
//             torch.use_deterministic_algorithms(True): the CPU kernel's per-row incidence list (CSR,
//             built on the device with a sort of unique keys), then one warp per row sums its pairs in
//             pair order: no atomics, bitwise reproducible.
#include "order_loss_common.cuh"

namespace sol_ext {
namespace order_loss_cuda {
namespace {

constexpr int kPairsPerWarp = 8;                  // explicit pairs

template <typename scalar_t>
__device__ __forceinline__ PairTerms<acc_type<scalar_t>> pair_terms(
    const LossArgs<scalar_t>& args, int64_t x, int64_t y) {
  const int rx = load_rank(args, x), ry = load_rank(args, y);
  const acc_type<scalar_t>* t = args.table + (static_cast<int64_t>(rx) * args.n + ry) * 3;
  return PairTerms<acc_type<scalar_t>>(t[0], t[1], t[2], rx, ry, args.official);
}

template <typename scalar_t>
__device__ __forceinline__ void load_pair(const int64_t* pairs, int64_t m, int64_t B, int64_t& x, int64_t& y) {
  x = pairs[2 * m];
  y = pairs[2 * m + 1];
  CUDA_KERNEL_ASSERT(x >= 0 && x < B && y >= 0 && y < B);
}

// Grid: ceil(ceil(M/8) / 8) blocks; warp w of block b owns pairs [(b*8 + w)*8, ... + 8).
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) order_loss_pairs_forward_kernel(
    const LossArgs<scalar_t> args,
    const int64_t* __restrict__ pairs,
    int64_t M,
    scalar_t* __restrict__ out) {
  using acc_t = acc_type<scalar_t>;
  constexpr int P = kPairsPerWarp;
  const int lane = threadIdx.x % kWarpSize;
  const int n = args.n;
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize) * P;
  if (m0 >= M) return;
  acc_t loss[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int64_t m = m0 + p < M ? m0 + p : M - 1;
    int64_t x, y;
    load_pair<scalar_t>(pairs, m, args.B, x, y);
    const PairTerms<acc_t> terms = pair_terms(args, x, y);
    acc_t total = acc_t(0);
    for (int q = lane; q < n; q += kWarpSize) {
      total += terms.loss(q, static_cast<scalar_t>(args.D[x * n + q] - args.D[y * n + q]), args.gamma);
    }
    loss[p] = total;
  }
  cuda::warp_transpose_reduce<P>(loss, lane);
  if (cuda::transpose_reduce_owner<P>(lane)) {
    const int64_t m = m0 + cuda::transpose_reduce_value_index<P>(lane);
    if (m < M) out[m] = static_cast<scalar_t>(loss[0]);
  }
}

// Non-deterministic: atomicAdd of +-g * d l / d delta_q into grad_acc[x] and grad_acc[y] (acc_t).
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) order_loss_pairs_backward_atomic_kernel(
    const LossArgs<scalar_t> args,
    const int64_t* __restrict__ pairs,
    int64_t M,
    const scalar_t* __restrict__ grad_losses,
    int64_t grad_stride,
    acc_type<scalar_t>* __restrict__ grad_acc) {
  using acc_t = acc_type<scalar_t>;
  const int lane = threadIdx.x % kWarpSize;
  const int n = args.n;
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize) * kPairsPerWarp;
  for (int64_t m = m0; m < M && m < m0 + kPairsPerWarp; ++m) {
    int64_t x, y;
    load_pair<scalar_t>(pairs, m, args.B, x, y);
    if (x == y) continue;  // delta is 0 whatever D is: no gradient (as on the CPU)
    const PairTerms<acc_t> terms = pair_terms(args, x, y);
    const acc_t g = static_cast<acc_t>(grad_losses[m * grad_stride]);
    for (int q = lane; q < n; q += kWarpSize) {
      const acc_t value = g * terms.grad(q, static_cast<scalar_t>(args.D[x * n + q] - args.D[y * n + q]), args.gamma);
      if (value != acc_t(0)) {
        atomicAdd(grad_acc + x * n + q, value);
        atomicAdd(grad_acc + y * n + q, -value);
      }
    }
  }
}

// Deterministic: warp per row x; entries[row_start[x] .. row_start[x+1]) are 2m (+1 if x is the
// pair's second element), sorted, i.e. the row's pairs in pair order (the CPU kernel's order).
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) order_loss_pairs_backward_rows_kernel(
    const LossArgs<scalar_t> args,
    const int64_t* __restrict__ pairs,
    const int64_t* __restrict__ row_start,
    const int64_t* __restrict__ entries,
    const scalar_t* __restrict__ grad_losses,
    int64_t grad_stride,
    scalar_t* __restrict__ grad_D) {
  using acc_t = acc_type<scalar_t>;
  constexpr int QC = kCsrRankChunks;
  const int lane = threadIdx.x % kWarpSize;
  const int n = args.n;
  const int64_t x = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (x >= args.B) return;
  const int64_t begin = row_start[x], end = row_start[x + 1];
  for (int q_begin = 0; q_begin < n; q_begin += QC * kWarpSize) {
    acc_t acc[QC];
#pragma unroll
    for (int k = 0; k < QC; ++k) acc[k] = acc_t(0);
    for (int64_t e = begin; e < end; ++e) {
      const int64_t code = entries[e];
      const int64_t m = code / 2;
      int64_t a, b;
      load_pair<scalar_t>(pairs, m, args.B, a, b);
      if (a == b) continue;
      const PairTerms<acc_t> terms = pair_terms(args, a, b);
      const acc_t g = static_cast<acc_t>(grad_losses[m * grad_stride]);
      const acc_t scale = code % 2 == 0 ? g : -g;
#pragma unroll
      for (int k = 0; k < QC; ++k) {
        const int q = q_begin + lane + k * kWarpSize;
        if (q < n) {
          acc[k] += scale * terms.grad(q, static_cast<scalar_t>(args.D[a * n + q] - args.D[b * n + q]), args.gamma);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < QC; ++k) {
      const int q = q_begin + lane + k * kWarpSize;
      if (q < n) grad_D[x * n + q] = static_cast<scalar_t>(acc[k]);
    }
  }
}

// Per-row incidence of explicit pairs, sorted: for each pair m with x != y, the entries 2m in row x
// and 2m+1 in row y. Returns (row_start [B+1], entries [E]), built with one sort of unique keys
// row * 2M + code, so the result does not depend on the sort's stability.
std::pair<at::Tensor, at::Tensor> pair_incidence(const at::Tensor& pairs, int64_t B) {
  const int64_t M = pairs.size(0);
  const at::Tensor m = at::arange(M, pairs.options());
  const at::Tensor rows = at::cat({pairs.select(1, 0), pairs.select(1, 1)});
  const at::Tensor codes = at::cat({m * 2, m * 2 + 1});
  // x == y pairs are kept (they are skipped in the kernel) so that no data-dependent size, hence no
  // device synchronization, is needed.
  const at::Tensor keys = std::get<0>(at::sort(rows * (2 * M) + codes));
  const at::Tensor sorted_rows = at::div(keys, 2 * M, "floor");
  const at::Tensor entries = keys - sorted_rows * (2 * M);
  const at::Tensor row_start = at::searchsorted(sorted_rows, at::arange(B + 1, pairs.options()));
  return {row_start.contiguous(), entries.contiguous()};
}

} // namespace

void explicit_pairs_forward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                            at::Tensor& losses, cudaStream_t stream) {
  const at::Tensor& pairs = *problem.pairs;
  const int64_t M = problem.M;
  const int64_t blocks = cuda::ceil_div(cuda::ceil_div(M, kPairsPerWarp), kWarpsPerBlock);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, problem.D.scalar_type(), "order_loss_cuda", [&] {
    order_loss_pairs_forward_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
        make_args<scalar_t>(problem, table, margin), pairs.data_ptr<int64_t>(), M, losses.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

at::Tensor explicit_pairs_backward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                                   const at::Tensor& g, cudaStream_t stream) {
  const at::Tensor& D = problem.D;
  const at::Tensor& pairs = *problem.pairs;
  const int64_t B = problem.B, n = problem.n, M = problem.M;
  if (at::globalContext().deterministicAlgorithms()) {
    const auto [row_start, entries] = pair_incidence(pairs, B);
    at::Tensor grad_D = at::empty_like(D, at::MemoryFormat::Contiguous);
    const int64_t blocks = cuda::ceil_div(B, kWarpsPerBlock);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, D.scalar_type(), "order_loss_backward_cuda", [&] {
      const LossArgs<scalar_t> args = make_args<scalar_t>(problem, table, margin);
      order_loss_pairs_backward_rows_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
          args, pairs.data_ptr<int64_t>(), row_start.data_ptr<int64_t>(), entries.data_ptr<int64_t>(),
          g.data_ptr<scalar_t>(), g.stride(0), grad_D.data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return grad_D;
  }

  // Atomic path: accumulate in acc_t (float32 for float16/bfloat16), then cast.
  at::Tensor grad_acc = at::zeros({B, n}, D.options().dtype(table_dtype(D.scalar_type())));
  const int64_t blocks = cuda::ceil_div(cuda::ceil_div(M, kPairsPerWarp), kWarpsPerBlock);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, D.scalar_type(), "order_loss_backward_cuda", [&] {
    const LossArgs<scalar_t> args = make_args<scalar_t>(problem, table, margin);
    order_loss_pairs_backward_atomic_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
        args, pairs.data_ptr<int64_t>(), M, g.data_ptr<scalar_t>(), g.stride(0),
        grad_acc.data_ptr<acc_type<scalar_t>>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad_acc.scalar_type() == D.scalar_type() ? grad_acc : grad_acc.to(D.scalar_type());
}

} // namespace order_loss_cuda
} // namespace sol_ext
