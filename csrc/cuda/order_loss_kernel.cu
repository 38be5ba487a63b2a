// Stochastic order loss (docs/math.md §6, §7) on CUDA: the ops order_loss and _order_loss_backward.
// They check and prepare the inputs, then run one of the two algorithms (order_loss_common.cuh):
// all pairs of the batch (order_loss_all_pairs_kernel.cu) or explicit pairs (order_loss_pairs_kernel.cu).
#include "order_loss_common.cuh"

namespace sol_ext {
namespace order_loss_cuda {
namespace {

at::Tensor order_loss_cuda(
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    const std::optional<at::Tensor>& pairs_in,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention_name) {
  TORCH_CHECK(D_in.is_cuda(), "D must be a CUDA tensor, got ", D_in.device());
  c10::cuda::CUDAGuard device_guard(D_in.device());
  const OrderLossProblem problem = prepare_cuda(D_in, labels_in, pairs_in, sigma, tau, margin, convention_name);
  at::Tensor losses = at::empty({problem.M}, problem.D.options());
  if (problem.M == 0) return losses;
  const at::Tensor table = problem.table(sigma, tau, table_dtype(problem.D.scalar_type()));
  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  cuda::record_use(table, stream);
  if (problem.pairs.has_value()) {
    explicit_pairs_forward(problem, table, margin, losses, stream);
  } else {
    all_pairs_forward(problem, table, margin, losses, stream);
  }
  return losses;
}

at::Tensor order_loss_backward_cuda(
    const at::Tensor& grad_losses,
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    const std::optional<at::Tensor>& pairs_in,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention_name) {
  TORCH_CHECK(D_in.is_cuda(), "D must be a CUDA tensor, got ", D_in.device());
  c10::cuda::CUDAGuard device_guard(D_in.device());
  const OrderLossProblem problem = prepare_cuda(D_in, labels_in, pairs_in, sigma, tau, margin, convention_name);
  const at::Tensor& D = problem.D;
  check_grad_losses(grad_losses, D, problem.M);
  if (problem.M == 0) return at::zeros_like(D, at::MemoryFormat::Contiguous);
  // A stride-0 gradient (the backward of a mean or sum) is read in place, never materialized.
  const at::Tensor g = grad_losses.scalar_type() == D.scalar_type() ? grad_losses : grad_losses.to(D.scalar_type());
  const at::Tensor table = problem.table(sigma, tau, table_dtype(D.scalar_type()));
  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  cuda::record_use(table, stream);
  if (problem.pairs.has_value()) return explicit_pairs_backward(problem, table, margin, g, stream);
  at::Tensor grad_D = at::empty_like(D, at::MemoryFormat::Contiguous);
  all_pairs_backward(problem, table, margin, g, grad_D, stream);
  return grad_D;
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CUDA, m) {
  m.impl("order_loss", &order_loss_cuda);
  m.impl("_order_loss_backward", &order_loss_backward_cuda);
}

} // namespace order_loss_cuda
} // namespace sol_ext
