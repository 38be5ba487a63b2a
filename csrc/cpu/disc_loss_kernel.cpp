// Discriminative loss (docs/math.md §4) on the CPU. The loss is linear in D, so its backward pass needs
// only the labels: grad_D[x,k] = grad[x] * coef_k.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../sol_ext.h"
#include "../sol_math.h"

namespace sol_ext {
namespace {

at::Tensor disc_loss_cpu(const at::Tensor& D_in, const at::Tensor& labels_in, int64_t T) {
  const DiscLossProblem problem = prepare_disc_loss(D_in, labels_in, T);
  const at::Tensor &D = problem.D, &labels = problem.labels;
  const int64_t B = problem.B, n = problem.n;
  at::Tensor losses = at::empty({B}, D.options());
  AT_DISPATCH_FLOATING_TYPES(D.scalar_type(), "disc_loss_cpu", [&] {
    const scalar_t* D_ptr = D.data_ptr<scalar_t>();
    const int64_t* r = labels.data_ptr<int64_t>();
    scalar_t* out = losses.data_ptr<scalar_t>();
    at::parallel_for(0, B, 1024, [&](int64_t begin, int64_t end) {
      for (int64_t x = begin; x < end; ++x) {
        // sum_k coef_k (D[x, k] - D[x, r]): the coefficients sum to 0, and subtracting the label's own
        // entry first cancels its terms exactly, whatever the compiler does with multiply-adds.
        const double own = D_ptr[x * n + r[x]];
        double total = 0.0;
        for_each_disc_term<double>(r[x], n, T, [&](int64_t k, double coef) {
          total += coef * (static_cast<double>(D_ptr[x * n + k]) - own);
        });
        out[x] = scalar_t(total);
      }
    });
  });
  return losses;
}

at::Tensor disc_loss_backward_cpu(const at::Tensor& grad_in, const at::Tensor& labels_in, int64_t n, int64_t T) {
  const DiscLossBackwardProblem problem = prepare_disc_loss_backward(grad_in, labels_in, n, T);
  const int64_t B = problem.B;
  const at::Tensor grad = problem.grad_losses.contiguous();
  const at::Tensor& labels = problem.labels;
  at::Tensor grad_D = at::zeros({B, n}, grad.options());
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "disc_loss_backward_cpu", [&] {
    const scalar_t* g = grad.data_ptr<scalar_t>();
    const int64_t* r = labels.data_ptr<int64_t>();
    scalar_t* out = grad_D.data_ptr<scalar_t>();
    at::parallel_for(0, B, 1024, [&](int64_t begin, int64_t end) {
      for (int64_t x = begin; x < end; ++x) {
        for_each_disc_term<scalar_t>(r[x], n, T, [&](int64_t k, scalar_t coef) { out[x * n + k] += coef * g[x]; });
      }
    });
  });
  return grad_D;
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CPU, m) {
  m.impl("disc_loss", &disc_loss_cpu);
  m.impl("_disc_loss_backward", &disc_loss_backward_cpu);
}

} // namespace sol_ext
