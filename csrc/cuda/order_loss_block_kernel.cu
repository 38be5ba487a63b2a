// The order loss of a block of pairs (order_loss_block: local rows x gathered rows) on CUDA, forward
// and backward: the building block of data-parallel training (sol_ext/distributed.py). Precision: see
// order_loss_common.cuh.
#include "order_loss_common.cuh"

namespace sol_ext {
namespace order_loss_cuda {
namespace {

// ------------------------------------------------------------------------------------------------
// Block mode (order_loss_block): local rows D [B,n] x gathered rows D_all [N,n]; local row i owns the
// pairs (i, j) with j > offset + i, oriented x = D[i], y = D_all[j].
//   forward   one warp per local row; the lanes walk the ranks, each lane sums its share over j in
//             order, then a fixed-order warp reduction: deterministic.
//   backward  one warp per row of grad_D (its pairs in j order) and one warp per row of grad_D_all
//             (its local rows i in order), in chunks of 32*kCsrRankChunks ranks: no atomics, bitwise
//             reproducible. Extra memory: the outputs only.
// ------------------------------------------------------------------------------------------------
template <typename scalar_t>
struct BlockArgs {
  const scalar_t* __restrict__ D;               // [B,n]
  const int64_t* __restrict__ labels;           // [B]
  const scalar_t* __restrict__ D_all;           // [N,n]
  const int64_t* __restrict__ labels_all;       // [N]
  const acc_type<scalar_t>* __restrict__ table;  // [n,n,3]
  int64_t B, N, offset;
  int n;
  acc_type<scalar_t> gamma;
  bool official;

  __device__ __forceinline__ PairTerms<acc_type<scalar_t>> terms(int64_t i, int64_t j) const {
    const int64_t rx = labels[i], ry = labels_all[j];
    CUDA_KERNEL_ASSERT(rx >= 0 && rx < n && ry >= 0 && ry < n);
    const acc_type<scalar_t>* t = table + (rx * n + ry) * 3;
    return PairTerms<acc_type<scalar_t>>(t[0], t[1], t[2], rx, ry, official);
  }
  __device__ __forceinline__ scalar_t delta(int64_t i, int64_t j, int q) const {
    return static_cast<scalar_t>(D[i * n + q] - D_all[j * n + q]);
  }
};

// Grid: ceil(B / 8) blocks of 8 warps; warp w of block b owns local row b*8 + w.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) order_loss_block_forward_kernel(
    const BlockArgs<scalar_t> args, scalar_t* __restrict__ out) {
  using acc_t = acc_type<scalar_t>;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (i >= args.B) return;
  acc_t total[1] = {acc_t(0)};
  for (int64_t j = args.offset + i + 1; j < args.N; ++j) {
    const PairTerms<acc_t> terms = args.terms(i, j);
    for (int q = lane; q < args.n; q += kWarpSize) total[0] += terms.loss(q, args.delta(i, j, q), args.gamma);
  }
  cuda::warp_transpose_reduce<1>(total, lane);
  if (lane == 0) out[i] = static_cast<scalar_t>(total[0]);
}

// Grid: ceil(B / 8) blocks; warp per local row i, summing d l(i, j) / d D[i] over j in order.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) order_loss_block_backward_local_kernel(
    const BlockArgs<scalar_t> args, const scalar_t* __restrict__ g, int64_t g_stride,
    scalar_t* __restrict__ grad_D) {
  using acc_t = acc_type<scalar_t>;
  constexpr int QC = kCsrRankChunks;
  const int lane = threadIdx.x % kWarpSize;
  const int n = args.n;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (i >= args.B) return;
  const acc_t scale = static_cast<acc_t>(g[i * g_stride]);
  for (int q_begin = 0; q_begin < n; q_begin += QC * kWarpSize) {
    acc_t acc[QC];
#pragma unroll
    for (int k = 0; k < QC; ++k) acc[k] = acc_t(0);
    for (int64_t j = args.offset + i + 1; j < args.N; ++j) {
      const PairTerms<acc_t> terms = args.terms(i, j);
#pragma unroll
      for (int k = 0; k < QC; ++k) {
        const int q = q_begin + lane + k * kWarpSize;
        if (q < n) acc[k] += scale * terms.grad(q, args.delta(i, j, q), args.gamma);
      }
    }
#pragma unroll
    for (int k = 0; k < QC; ++k) {
      const int q = q_begin + lane + k * kWarpSize;
      if (q < n) grad_D[i * n + q] = static_cast<scalar_t>(acc[k]);
    }
  }
}

// Grid: ceil(N / 8) blocks; warp per gathered row j, summing -g[i] d l(i, j) / d delta over the local
// rows i with offset + i < j, in i order (rows with none get 0).
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) order_loss_block_backward_gathered_kernel(
    const BlockArgs<scalar_t> args, const scalar_t* __restrict__ g, int64_t g_stride,
    scalar_t* __restrict__ grad_D_all) {
  using acc_t = acc_type<scalar_t>;
  constexpr int QC = kCsrRankChunks;
  const int lane = threadIdx.x % kWarpSize;
  const int n = args.n;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (j >= args.N) return;
  const int64_t rows = j - args.offset < args.B ? j - args.offset : args.B;
  for (int q_begin = 0; q_begin < n; q_begin += QC * kWarpSize) {
    acc_t acc[QC];
#pragma unroll
    for (int k = 0; k < QC; ++k) acc[k] = acc_t(0);
    for (int64_t i = 0; i < rows; ++i) {
      const PairTerms<acc_t> terms = args.terms(i, j);
      const acc_t scale = -static_cast<acc_t>(g[i * g_stride]);
#pragma unroll
      for (int k = 0; k < QC; ++k) {
        const int q = q_begin + lane + k * kWarpSize;
        if (q < n) acc[k] += scale * terms.grad(q, args.delta(i, j, q), args.gamma);
      }
    }
#pragma unroll
    for (int k = 0; k < QC; ++k) {
      const int q = q_begin + lane + k * kWarpSize;
      if (q < n) grad_D_all[j * n + q] = static_cast<scalar_t>(acc[k]);
    }
  }
}

template <typename scalar_t>
BlockArgs<scalar_t> make_block_args(const OrderLossBlockProblem& problem, const at::Tensor& table, double margin) {
  BlockArgs<scalar_t> args;
  args.D = problem.D.data_ptr<scalar_t>();
  args.labels = problem.labels.data_ptr<int64_t>();
  args.D_all = problem.D_all.data_ptr<scalar_t>();
  args.labels_all = problem.labels_all.data_ptr<int64_t>();
  args.table = table.data_ptr<acc_type<scalar_t>>();
  args.B = problem.B;
  args.N = problem.N;
  args.offset = problem.offset;
  args.n = static_cast<int>(problem.n);
  args.gamma = static_cast<acc_type<scalar_t>>(margin);
  args.official = problem.convention == Convention::Official;
  return args;
}

OrderLossBlockProblem prepare_block_cuda(
    const at::Tensor& D,
    const at::Tensor& labels,
    const at::Tensor& D_all,
    const at::Tensor& labels_all,
    int64_t offset,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention) {
  TORCH_CHECK(D.is_cuda(), "D must be a CUDA tensor, got ", D.device());
  OrderLossBlockProblem problem =
      prepare_order_loss_block(D, labels, D_all, labels_all, offset, sigma, tau, margin, convention);
  TORCH_CHECK(problem.n <= (1 << 20), "order_loss_block (CUDA): at most 2^20 ranks, got ", problem.n);
  return problem;
}

at::Tensor order_loss_block_cuda(
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    const at::Tensor& D_all_in,
    const at::Tensor& labels_all_in,
    int64_t offset,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention) {
  c10::cuda::CUDAGuard device_guard(D_in.device());
  const OrderLossBlockProblem problem =
      prepare_block_cuda(D_in, labels_in, D_all_in, labels_all_in, offset, sigma, tau, margin, convention);
  at::Tensor rows = at::empty({problem.B}, problem.D.options());
  if (problem.B == 0) return rows;
  const at::Tensor table = problem.table(sigma, tau, table_dtype(problem.D.scalar_type()));
  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  cuda::record_use(table, stream);
  const int64_t blocks = cuda::ceil_div(problem.B, kWarpsPerBlock);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, problem.D.scalar_type(), "order_loss_block_cuda", [&] {
    const BlockArgs<scalar_t> args = make_block_args<scalar_t>(problem, table, margin);
    order_loss_block_forward_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(args, rows.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return rows;
}

std::tuple<at::Tensor, at::Tensor> order_loss_block_backward_cuda(
    const at::Tensor& grad_rows,
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    const at::Tensor& D_all_in,
    const at::Tensor& labels_all_in,
    int64_t offset,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention,
    bool need_grad_D,
    bool need_grad_D_all) {
  c10::cuda::CUDAGuard device_guard(D_in.device());
  const OrderLossBlockProblem problem =
      prepare_block_cuda(D_in, labels_in, D_all_in, labels_all_in, offset, sigma, tau, margin, convention);
  const int64_t B = problem.B, N = problem.N;
  check_grad_losses(grad_rows, problem.D, B);
  at::Tensor grad_D = need_grad_D ? at::empty_like(problem.D, at::MemoryFormat::Contiguous) : problem.D.new_empty({0});
  at::Tensor grad_D_all =
      need_grad_D_all ? at::empty_like(problem.D_all, at::MemoryFormat::Contiguous) : problem.D_all.new_empty({0});
  if (B == 0 || N == 0) {  // no pairs: zero gradients
    grad_D.zero_();
    grad_D_all.zero_();
    return {grad_D, grad_D_all};
  }
  if (!(need_grad_D || need_grad_D_all)) return {grad_D, grad_D_all};
  // A stride-0 gradient (the backward of a sum or mean) is read in place, never materialized.
  const at::Tensor g = grad_rows.scalar_type() == problem.D.scalar_type() ? grad_rows
                                                                          : grad_rows.to(problem.D.scalar_type());
  const at::Tensor table = problem.table(sigma, tau, table_dtype(problem.D.scalar_type()));
  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  cuda::record_use(table, stream);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, problem.D.scalar_type(), "order_loss_block_backward_cuda", [&] {
        const BlockArgs<scalar_t> args = make_block_args<scalar_t>(problem, table, margin);
        if (need_grad_D) {
          order_loss_block_backward_local_kernel<scalar_t>
              <<<cuda::ceil_div(B, kWarpsPerBlock), kThreads, 0, stream>>>(
                  args, g.data_ptr<scalar_t>(), g.stride(0), grad_D.data_ptr<scalar_t>());
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
        if (need_grad_D_all) {
          order_loss_block_backward_gathered_kernel<scalar_t>
              <<<cuda::ceil_div(N, kWarpsPerBlock), kThreads, 0, stream>>>(
                  args, g.data_ptr<scalar_t>(), g.stride(0), grad_D_all.data_ptr<scalar_t>());
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
      });
  return {grad_D, grad_D_all};
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CUDA, m) {
  m.impl("order_loss_block", &order_loss_block_cuda);
  m.impl("_order_loss_block_backward", &order_loss_block_backward_cuda);
}

} // namespace order_loss_cuda
} // namespace sol_ext
