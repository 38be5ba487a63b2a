// Stochastic order loss over explicit pairs ([M,2] batch indices) on the CPU, forward and backward.
//
//   forward   one loss per pair, the pairs split into ranges among the workers.
//   backward  the pairs that hold each row, as a per-row incidence list (CSR) in pair order; each row of
//             grad_D is summed by one worker over its list: every pair's rank gradient is computed twice
//             (once per row), and the result is bitwise reproducible for any number of threads.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include "order_loss_common.h"

namespace sol_ext {
namespace order_loss_cpu {

void explicit_pairs_forward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                            at::Tensor& losses) {
  const int64_t* p = problem.pairs->data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_cpu", [&] {
    const auto ctx = make_context<scalar_t>(problem, table, margin);
    scalar_t* out = losses.data_ptr<scalar_t>();
    at::parallel_for(0, problem.M, forward_grain(problem.n), [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) out[m] = scalar_t(ctx.loss(p[2 * m], p[2 * m + 1]));
    });
  });
}

void explicit_pairs_backward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                             const at::Tensor& grad_losses, at::Tensor& grad_D) {
  const int64_t B = problem.B, n = problem.n, M = problem.M;
  const int64_t g_stride = grad_losses.stride(0);
  // For each row x, the pairs that touch it, as (pair index, +1 if x is the pair's first element
  // else -1), in pair order.
  const int64_t* p = problem.pairs->data_ptr<int64_t>();
  std::vector<int64_t> row_start(B + 1, 0), entries;
  for (int64_t m = 0; m < M; ++m) {
    if (p[2 * m] == p[2 * m + 1]) continue;  // x == y: delta is 0 whatever D is, so no gradient
    ++row_start[p[2 * m] + 1];
    ++row_start[p[2 * m + 1] + 1];
  }
  for (int64_t x = 0; x < B; ++x) row_start[x + 1] += row_start[x];
  entries.resize(row_start[B]);
  std::vector<int64_t> fill(row_start.begin(), row_start.end() - 1);
  for (int64_t m = 0; m < M; ++m) {
    if (p[2 * m] == p[2 * m + 1]) continue;
    entries[fill[p[2 * m]]++] = 2 * m;          // even: this row is the pair's x
    entries[fill[p[2 * m + 1]]++] = 2 * m + 1;  // odd: this row is the pair's y
  }

  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_backward_cpu", [&] {
    const auto ctx = make_context<scalar_t>(problem, table, margin);
    const scalar_t* g_ptr = grad_losses.data_ptr<scalar_t>();
    scalar_t* out = grad_D.data_ptr<scalar_t>();
    at::parallel_for(0, B, backward_grain(B, n, M), [&](int64_t begin, int64_t end) {
      RowAccumulator<at::opmath_type<scalar_t>> row(n);
      for (int64_t x = begin; x < end; ++x) {
        row.reset();
        for (int64_t e = row_start[x]; e < row_start[x + 1]; ++e) {
          const int64_t m = entries[e] / 2;
          const acc_t sign = entries[e] % 2 == 0 ? 1 : -1;
          ctx.add_grad(p[2 * m], p[2 * m + 1], sign * acc_t(g_ptr[m * g_stride]), row.block());
          row.pair_done();
        }
        row.write(out + x * n);
      }
    });
  });
}

} // namespace order_loss_cpu
} // namespace sol_ext
