// Stochastic order loss over all pairs of the batch (pairs = None) on the CPU, forward and backward, at the
// CPU's width (cpu/isa/order_loss_vec.h):
//
//   forward   the pairs x < y in batch order, in ranges of pairs that the workers take in turn (run_tasks).
//   backward  each pair's rank gradient computed once and added to both of its rows, tile by tile of a
//             size fixed by B, each row's sums in an order fixed by B: bitwise reproducible for any
//             number of threads.
#include <ATen/Dispatch.h>

#include "order_loss_common.h"

namespace sol_ext {
namespace order_loss_cpu {

void all_pairs_forward(const OrderLossProblem& problem, const at::Tensor& table, double margin, at::Tensor& losses) {
  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_cpu", [&] {
    const auto inputs = make_inputs<scalar_t>(problem, table, margin);
    SOL_EXT_CPU_DISPATCH(order_loss_all_pairs_forward(inputs, losses.data_ptr<scalar_t>()));
  });
}

void all_pairs_backward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                        const at::Tensor& grad_losses, at::Tensor& grad_D) {
  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_backward_cpu", [&] {
    const auto inputs = make_inputs<scalar_t>(problem, table, margin);
    const cpu::Strided<scalar_t> g{grad_losses.data_ptr<scalar_t>(), grad_losses.stride(0)};
    SOL_EXT_CPU_DISPATCH(order_loss_all_pairs_backward(inputs, g, grad_D.data_ptr<scalar_t>()));
  });
}

} // namespace order_loss_cpu
} // namespace sol_ext
