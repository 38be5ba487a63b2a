// Stochastic order loss over all pairs of the batch (pairs = None) on the CPU, forward and backward.
//
//   forward   the pairs x < y in batch order, split into ranges of pairs among the workers, each
//             range starting from its first pair (unravel_pair).
//   backward  each row x of grad_D is summed by one worker over the pairs that hold x, y = 0..B-1 in
//             order: every pair's rank gradient is computed twice (once per row), and the result is
//             bitwise reproducible for any number of threads.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include "order_loss_common.h"

namespace sol_ext {
namespace order_loss_cpu {
namespace {

// First pair (a, b) of the all-pairs order at linear index m.
std::pair<int64_t, int64_t> unravel_pair(int64_t m, int64_t B) {
  const double two_b = 2.0 * B - 1.0;
  int64_t a = static_cast<int64_t>((two_b - std::sqrt(std::max(0.0, two_b * two_b - 8.0 * m))) / 2.0);
  a = std::min(std::max<int64_t>(a, 0), B - 2);
  while (a > 0 && pair_index(a, a + 1, B) > m) --a;  // correct the float estimate
  while (a + 1 < B - 1 && pair_index(a + 1, a + 2, B) <= m) ++a;
  return {a, a + 1 + (m - pair_index(a, a + 1, B))};
}

} // namespace

void all_pairs_forward(const OrderLossProblem& problem, const at::Tensor& table, double margin, at::Tensor& losses) {
  const int64_t B = problem.B, M = problem.M;
  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_cpu", [&] {
    const auto ctx = make_context<scalar_t>(problem, table, margin);
    scalar_t* out = losses.data_ptr<scalar_t>();
    at::parallel_for(0, M, forward_grain(problem.n), [&](int64_t begin, int64_t end) {
      auto [a, b] = unravel_pair(begin, B);
      for (int64_t m = begin; m < end; ++m) {
        out[m] = scalar_t(ctx.loss(a, b));
        if (++b == B) b = ++a + 1;
      }
    });
  });
}

void all_pairs_backward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                        const at::Tensor& grad_losses, at::Tensor& grad_D) {
  const int64_t B = problem.B, n = problem.n;
  const int64_t g_stride = grad_losses.stride(0);
  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_backward_cpu", [&] {
    const auto ctx = make_context<scalar_t>(problem, table, margin);
    const scalar_t* g_ptr = grad_losses.data_ptr<scalar_t>();
    scalar_t* out = grad_D.data_ptr<scalar_t>();
    at::parallel_for(0, B, backward_grain(B, n, problem.M), [&](int64_t begin, int64_t end) {
      RowAccumulator<at::opmath_type<scalar_t>> row(n);
      for (int64_t x = begin; x < end; ++x) {
        row.reset();
        for (int64_t y = 0; y < B; ++y) {
          if (y == x) continue;
          const int64_t a = std::min(x, y), b = std::max(x, y);
          const acc_t sign = x == a ? 1 : -1;
          ctx.add_grad(a, b, sign * acc_t(g_ptr[pair_index(a, b, B) * g_stride]), row.block());
          row.pair_done();
        }
        row.write(out + x * n);
      }
    });
  });
}

} // namespace order_loss_cpu
} // namespace sol_ext
