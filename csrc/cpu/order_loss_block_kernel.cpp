// order_loss_block (docs/math.md §6, §7) on the CPU, forward and backward: a rectangular block of pairs,
// local rows x gathered rows, for data-parallel training. It works as order_loss does (order_loss_common.h):
// the forward sums each local row's pairs in order, the backward gives each local row and each gathered
// row to one worker, which visits its pairs in order (bitwise reproducible for any number of threads).
// Extra memory O((B + N) * n).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "order_loss_common.h"

namespace sol_ext {
namespace order_loss_cpu {
namespace {

template <typename scalar_t>
PairContext<scalar_t> make_block_context(
    const OrderLossBlockProblem& problem, const at::Tensor& table, double margin) {
  return {problem.D.data_ptr<scalar_t>(),     problem.labels.data_ptr<int64_t>(),
          problem.D_all.data_ptr<scalar_t>(), problem.labels_all.data_ptr<int64_t>(),
          table.data_ptr<double>(),           problem.n,
          static_cast<scalar_t>(margin),      problem.convention == Convention::Official};
}

// Block mode: local row i owns the pairs (i, j) of the gathered rows with j > offset + i.
at::Tensor order_loss_block_cpu(
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    const at::Tensor& D_all_in,
    const at::Tensor& labels_all_in,
    int64_t offset,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention) {
  const OrderLossBlockProblem problem =
      prepare_order_loss_block(D_in, labels_in, D_all_in, labels_all_in, offset, sigma, tau, margin, convention);
  const int64_t B = problem.B, N = problem.N, n = problem.n;
  at::Tensor rows = at::empty({B}, problem.D.options());
  if (B == 0) return rows;
  const at::Tensor table = problem.table(sigma, tau, at::kDouble);

  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_block_cpu", [&] {
    const auto ctx = make_block_context<scalar_t>(problem, table, margin);
    scalar_t* out = rows.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, N * n));
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        acc_t total = 0;
        for (int64_t j = offset + i + 1; j < N; ++j) total += ctx.loss(i, j);
        out[i] = scalar_t(total);
      }
    });
  });
  return rows;
}

std::tuple<at::Tensor, at::Tensor> order_loss_block_backward_cpu(
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
  const OrderLossBlockProblem problem =
      prepare_order_loss_block(D_in, labels_in, D_all_in, labels_all_in, offset, sigma, tau, margin, convention);
  const int64_t B = problem.B, N = problem.N, n = problem.n;
  check_grad_losses(grad_rows, problem.D, B);
  at::Tensor grad_D = need_grad_D ? at::zeros_like(problem.D) : problem.D.new_empty({0});
  at::Tensor grad_D_all = need_grad_D_all ? at::zeros_like(problem.D_all) : problem.D_all.new_empty({0});
  if (B == 0 || N == 0 || !(need_grad_D || need_grad_D_all)) return {grad_D, grad_D_all};
  const at::Tensor table = problem.table(sigma, tau, at::kDouble);
  // A stride-0 gradient (the backward of a sum or mean) is read in place, never materialized.
  const at::Tensor g = grad_rows.to(problem.D.scalar_type());
  const int64_t g_stride = g.stride(0);

  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_block_backward_cpu", [&] {
    const auto ctx = make_block_context<scalar_t>(problem, table, margin);
    const scalar_t* g_ptr = g.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, B * n));
    // d/dD[i]: the pairs of local row i, in j order; x is the local row, so the sign is +.
    if (need_grad_D) {
      scalar_t* out = grad_D.data_ptr<scalar_t>();
      at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
        RowAccumulator<at::opmath_type<scalar_t>> row(n);
        for (int64_t i = begin; i < end; ++i) {
          row.reset();
          const acc_t scale = acc_t(g_ptr[i * g_stride]);
          for (int64_t j = offset + i + 1; j < N; ++j) {
            ctx.add_grad(i, j, scale, row.block());
            row.pair_done();
          }
          row.write(out + i * n);
        }
      });
    }
    // d/dD_all[j]: the local rows i with offset + i < j, in i order; D_all[j] is the pair's y (sign -).
    if (need_grad_D_all) {
      scalar_t* out = grad_D_all.data_ptr<scalar_t>();
      at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
        RowAccumulator<at::opmath_type<scalar_t>> row(n);
        for (int64_t j = begin; j < end; ++j) {
          const int64_t rows = std::min(B, j - offset);
          if (rows <= 0) continue;  // no local row pairs with j: its gradient stays 0
          row.reset();
          for (int64_t i = 0; i < rows; ++i) {
            ctx.add_grad(i, j, -acc_t(g_ptr[i * g_stride]), row.block());
            row.pair_done();
          }
          row.write(out + j * n);
        }
      });
    }
  });
  return {grad_D, grad_D_all};
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CPU, m) {
  m.impl("order_loss_block", &order_loss_block_cpu);
  m.impl("_order_loss_block_backward", &order_loss_block_backward_cpu);
}

} // namespace order_loss_cpu
} // namespace sol_ext
