// Stochastic order loss over explicit pairs ([M,2] batch indices) on the CPU, forward and backward, at the
// CPU's width (cpu/isa/order_loss_vec.h):
//
//   forward   one loss per pair, the pairs split into ranges among the workers.
//   backward  the pairs that hold each row, as a per-row incidence list (CSR) in pair order; each row of
//             grad_D is summed by one worker over its list: every pair's rank gradient is computed twice
//             (once per row), and the result is bitwise reproducible for any number of threads.
#include <ATen/Dispatch.h>

#include <vector>

#include "order_loss_common.h"

namespace sol_ext {
namespace order_loss_cpu {

void explicit_pairs_forward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                            at::Tensor& losses) {
  const int64_t* p = problem.pairs->data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_cpu", [&] {
    const auto inputs = make_inputs<scalar_t>(problem, table, margin);
    SOL_EXT_CPU_DISPATCH(order_loss_pairs_forward(inputs, p, problem.M, losses.data_ptr<scalar_t>()));
  });
}

void explicit_pairs_backward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                             const at::Tensor& grad_losses, at::Tensor& grad_D) {
  const int64_t B = problem.B, M = problem.M;
  // For each row x, the pairs that touch it, as 2 m if x is pair m's first element, else 2 m + 1, in
  // pair order.
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
    const auto inputs = make_inputs<scalar_t>(problem, table, margin);
    const cpu::Strided<scalar_t> g{grad_losses.data_ptr<scalar_t>(), grad_losses.stride(0)};
    SOL_EXT_CPU_DISPATCH(order_loss_pairs_backward(inputs, p, row_start.data(), entries.data(), g,
                                                   grad_D.data_ptr<scalar_t>()));
  });
}

} // namespace order_loss_cpu
} // namespace sol_ext
