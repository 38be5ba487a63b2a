// Stochastic dissimilarity (docs/math.md §3) on the CPU, forward and backward.
//
// With nu = P mu, a = P 1 and c = P ||mu||^2:  D[x,q] = a_q ||h_x||^2 - 2 h_x . nu_q + c_q,
// so the forward pass is one BLAS product followed by a fused epilogue. Both passes work on h and mu
// centered on the centroids (center_on_centroids, sol_ext.h), which keeps D precise far from the origin.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../sol_ext.h"

namespace sol_ext {
namespace {

at::Tensor stochastic_dissimilarity_cpu(const at::Tensor& h_in, const at::Tensor& mu_in, double sigma) {
  check_dissimilarity_inputs(h_in, mu_in, sigma);
  const CenteredInputs centered = center_on_centroids(h_in.contiguous(), mu_in.contiguous());
  const at::Tensor& h = centered.h;
  const at::Tensor& mu = centered.mu;
  const int64_t B = h.size(0), d = h.size(1), n = mu.size(0);
  const SmoothedCentroids s = smooth_centroids(mu, sigma);
  at::Tensor D = at::mm(h, s.nu.t()).contiguous();  // h_x . nu_q
  if (B == 0) return D;

  AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "stochastic_dissimilarity_cpu", [&] {
    const scalar_t* h_ptr = h.data_ptr<scalar_t>();
    const scalar_t* a_ptr = s.a.data_ptr<scalar_t>();
    const scalar_t* c_ptr = s.c.data_ptr<scalar_t>();
    scalar_t* D_ptr = D.data_ptr<scalar_t>();
    at::parallel_for(0, B, 16, [&](int64_t begin, int64_t end) {
      for (int64_t x = begin; x < end; ++x) {
        double squared_norm = 0.0;
        for (int64_t k = 0; k < d; ++k) squared_norm += double(h_ptr[x * d + k]) * h_ptr[x * d + k];
        for (int64_t q = 0; q < n; ++q) {
          D_ptr[x * n + q] = scalar_t(double(a_ptr[q]) * squared_norm - 2.0 * D_ptr[x * n + q] + c_ptr[q]);
        }
      }
    });
  });
  return D;
}

// grad_h = 2 (grad_D a) * h - 2 grad_D nu
// grad_mu = P^T (-2 grad_D^T h) + 2 mu * (P^T colsum(grad_D))
// with h, mu (and so nu) centered: each h_x - mu_j is the same, so the gradients are too.
std::tuple<at::Tensor, at::Tensor> stochastic_dissimilarity_backward_cpu(
    const at::Tensor& grad_in,
    const at::Tensor& h_in,
    const at::Tensor& mu_in,
    double sigma,
    bool need_grad_h,
    bool need_grad_mu) {
  check_dissimilarity_inputs(h_in, mu_in, sigma);
  const CenteredInputs centered = center_on_centroids(h_in.contiguous(), mu_in.contiguous());
  const at::Tensor& h = centered.h;
  const at::Tensor& mu = centered.mu;
  const at::Tensor grad = grad_in.contiguous();
  TORCH_CHECK(grad.sizes() == at::IntArrayRef({h.size(0), mu.size(0)}),
              "grad_D must have shape [B, n] = ", at::IntArrayRef({h.size(0), mu.size(0)}), ", got ",
              grad.sizes());
  const SmoothedCentroids s = smooth_centroids(mu, sigma);
  at::Tensor grad_h = at::empty({0}, h.options());
  at::Tensor grad_mu = at::empty({0}, mu.options());

  if (need_grad_h) {
    grad_h = at::mm(grad, s.nu).mul_(-2).contiguous();
    const int64_t B = h.size(0), d = h.size(1), n = mu.size(0);
    AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "stochastic_dissimilarity_backward_cpu", [&] {
      const scalar_t* g_ptr = grad.data_ptr<scalar_t>();
      const scalar_t* h_ptr = h.data_ptr<scalar_t>();
      const scalar_t* a_ptr = s.a.data_ptr<scalar_t>();
      scalar_t* out = grad_h.data_ptr<scalar_t>();
      at::parallel_for(0, B, 16, [&](int64_t begin, int64_t end) {
        for (int64_t x = begin; x < end; ++x) {
          double weight = 0.0;  // sum_q grad_D[x,q] a_q
          for (int64_t q = 0; q < n; ++q) weight += double(g_ptr[x * n + q]) * a_ptr[q];
          const scalar_t scale = scalar_t(2.0 * weight);
          for (int64_t k = 0; k < d; ++k) out[x * d + k] += scale * h_ptr[x * d + k];
        }
      });
    });
  }
  if (need_grad_mu) {
    const at::Tensor Pt = s.P.t();
    grad_mu = at::mm(Pt, at::mm(grad.t(), h)).mul_(-2);
    grad_mu.addcmul_(mu, at::mv(Pt, grad.sum(0)).unsqueeze(1), 2);
  }
  return {grad_h, grad_mu};
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CPU, m) {
  m.impl("stochastic_dissimilarity", &stochastic_dissimilarity_cpu);
  m.impl("_stochastic_dissimilarity_backward", &stochastic_dissimilarity_backward_cpu);
}

} // namespace sol_ext
