// Stochastic order loss (docs/math.md §6, §7) on the CPU: the ops order_loss and _order_loss_backward.
// They check and prepare the inputs, then run one of the two algorithms (order_loss_common.h): all pairs
// of the batch (order_loss_all_pairs_kernel.cpp) or explicit pairs (order_loss_pairs_kernel.cpp).
// Extra memory: O(B*n + M).
#include <torch/library.h>

#include "order_loss_common.h"

namespace sol_ext {
namespace order_loss_cpu {
namespace {

at::Tensor order_loss_cpu(
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    const std::optional<at::Tensor>& pairs_in,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention) {
  const OrderLossProblem problem = prepare_order_loss(D_in, labels_in, pairs_in, sigma, tau, margin, convention);
  at::Tensor losses = at::empty({problem.M}, problem.D.options());
  if (problem.M == 0) return losses;
  const at::Tensor table = problem.table(sigma, tau, at::kDouble);
  if (problem.pairs.has_value()) {
    explicit_pairs_forward(problem, table, margin, losses);
  } else {
    all_pairs_forward(problem, table, margin, losses);
  }
  return losses;
}

at::Tensor order_loss_backward_cpu(
    const at::Tensor& grad_losses,
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    const std::optional<at::Tensor>& pairs_in,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention) {
  const OrderLossProblem problem = prepare_order_loss(D_in, labels_in, pairs_in, sigma, tau, margin, convention);
  check_grad_losses(grad_losses, problem.D, problem.M);
  if (problem.M == 0) return at::zeros_like(problem.D);
  at::Tensor grad_D = at::empty_like(problem.D);  // the kernels write every row, a row without pairs as zeros
  const at::Tensor table = problem.table(sigma, tau, at::kDouble);
  // A stride-0 gradient (the backward of a mean or sum) is read in place, never materialized.
  const at::Tensor g = grad_losses.to(problem.D.scalar_type());
  if (problem.pairs.has_value()) {
    explicit_pairs_backward(problem, table, margin, g, grad_D);
  } else {
    all_pairs_backward(problem, table, margin, g, grad_D);
  }
  return grad_D;
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CPU, m) {
  m.impl("order_loss", &order_loss_cpu);
  m.impl("_order_loss_backward", &order_loss_backward_cpu);
}

} // namespace order_loss_cpu
} // namespace sol_ext
