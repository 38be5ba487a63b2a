// What the CPU kernels of the order loss share (order_loss_kernel.cpp and its all-pairs and explicit-pairs
// halves, order_loss_block_kernel.cpp): the kernels' inputs from a checked call. The kernels themselves
// run at the CPU's width (cpu/isa/order_loss_vec.h, cpu_kernels.h): every pair the same branch-free
// loop over vectors of ranks, no [M,n] or [B,B,n] intermediate, and a fixed summation order, so that
// the results are bitwise the same for any number of threads.
#pragma once

#include <ATen/ATen.h>

#include "../sol_ext.h"
#include "cpu_kernels.h"

namespace sol_ext {
namespace order_loss_cpu {

template <typename scalar_t>
inline cpu::OrderLossInputs<scalar_t> make_inputs(const OrderLossProblem& problem, const at::Tensor& table,
                                                  double margin) {
  const scalar_t* D = problem.D.data_ptr<scalar_t>();
  const int64_t* labels = problem.labels.data_ptr<int64_t>();
  return {D, labels, problem.B, D, labels, problem.B, table.data_ptr<double>(), problem.n, margin,
          problem.convention == Convention::Official};
}

// The kernels of order_loss and _order_loss_backward (order_loss_kernel.cpp checks and dispatches):
// all pairs of the batch (order_loss_all_pairs_kernel.cpp) or explicit pairs (order_loss_pairs_kernel.cpp).
// The backward passes read grad_losses [M] (any stride: a stride-0 gradient is read in place) and
// write every row of grad_D [B,n].
void all_pairs_forward(const OrderLossProblem& problem, const at::Tensor& table, double margin, at::Tensor& losses);
void all_pairs_backward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                        const at::Tensor& grad_losses, at::Tensor& grad_D);
void explicit_pairs_forward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                            at::Tensor& losses);
void explicit_pairs_backward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                             const at::Tensor& grad_losses, at::Tensor& grad_D);

} // namespace order_loss_cpu
} // namespace sol_ext
