// order_loss_block (docs/math.md §6, §7) on the CPU, forward and backward: a rectangular block of pairs,
// local rows x gathered rows, for data-parallel training. It works as order_loss does (order_loss_common.h):
// the forward sums each local row's pairs in order, the backward gives each local row and each gathered
// row to one worker, which visits its pairs in order (bitwise reproducible for any number of threads), at
// the CPU's width (cpu/isa/order_loss_vec.h).
// Extra memory O((B + N) * n).
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "order_loss_common.h"

namespace sol_ext {
namespace order_loss_cpu {
namespace {

template <typename scalar_t>
cpu::OrderLossInputs<scalar_t> make_block_inputs(const OrderLossBlockProblem& problem, const at::Tensor& table,
                                                 double margin) {
  return {problem.D.data_ptr<scalar_t>(),     problem.labels.data_ptr<int64_t>(),
          problem.B,                          problem.D_all.data_ptr<scalar_t>(),
          problem.labels_all.data_ptr<int64_t>(), problem.N,
          table.data_ptr<double>(),           problem.n,
          margin,                             problem.convention == Convention::Official};
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
  const int64_t B = problem.B;
  at::Tensor rows = at::empty({B}, problem.D.options());
  if (B == 0) return rows;
  const at::Tensor table = problem.table(sigma, tau, at::kDouble);

  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_block_cpu", [&] {
    const auto inputs = make_block_inputs<scalar_t>(problem, table, margin);
    SOL_EXT_CPU_DISPATCH(order_loss_block_forward(inputs, offset, rows.data_ptr<scalar_t>()));
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
  const int64_t B = problem.B, N = problem.N;
  check_grad_losses(grad_rows, problem.D, B);
  at::Tensor grad_D = need_grad_D ? at::zeros_like(problem.D) : problem.D.new_empty({0});
  at::Tensor grad_D_all = need_grad_D_all ? at::zeros_like(problem.D_all) : problem.D_all.new_empty({0});
  if (B == 0 || N == 0 || !(need_grad_D || need_grad_D_all)) return {grad_D, grad_D_all};
  const at::Tensor table = problem.table(sigma, tau, at::kDouble);
  // A stride-0 gradient (the backward of a sum or mean) is read in place, never materialized.
  const at::Tensor g = grad_rows.to(problem.D.scalar_type());
  const int64_t g_stride = g.stride(0);

  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_block_backward_cpu", [&] {
    const auto inputs = make_block_inputs<scalar_t>(problem, table, margin);
    const cpu::Strided<scalar_t> grad{g.data_ptr<scalar_t>(), g.stride(0)};
    SOL_EXT_CPU_DISPATCH(order_loss_block_backward(inputs, offset, grad,
                                                   need_grad_D ? grad_D.data_ptr<scalar_t>() : nullptr,
                                                   need_grad_D_all ? grad_D_all.data_ptr<scalar_t>() : nullptr));
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
