// The all-pairs order loss by sorting (docs/math.md §13) on the CPU: its sum and gradient in one pass.
//
// Each rank q of the range is one task: sort the column D[., q], then two sweeps along the sorted order
// per hinge family give every sample's share of the gradient, and the value follows from them (§13.3).
// No [B, B] or [pairs, n] tensor: O(B + n^2) extra memory per worker besides the [B, n] gradient and the
// ranks' gradient columns (O(n B) on AVX-512 up to 16 ranks, for a table of label counts: grouped_vec.h).
// A rank writes its gradient by sample, in sorted order: to a [B] column of its own, whose cache lines
// hold 8 samples each, rather than to grad's rows, whose lines hold 8 / n samples; the columns then go
// into grad in one pass in row order (about twice as fast at n = 5, B = 10^6).
//
// Determinism: one worker computes a whole rank, in a fixed order, into that rank's slot; the ranks'
// values are added in rank order at the end. The result is therefore bitwise the same for any number of
// threads. Workers (the calling thread and up to get_num_threads() - 1 helpers) take the next rank from a
// shared counter (run_tasks, tasks.h) rather than a fixed share of the ranks, so a worker that the OS
// deschedules (a busy machine) delays the call by at most the rank it holds, and one that has not
// started by the time the last rank is taken delays it not at all. No other parallel region runs in the op.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../sol_ext.h"
#include "cpu_kernels.h"
#include "large_buffers.h"
#include "tasks.h"

namespace sol_ext {
namespace {

// Below this many (sample, rank) values a call runs on the calling thread alone.
constexpr int64_t kSerialValues = 1 << 15;

std::tuple<at::Tensor, at::Tensor> grouped_order_sum_cpu(
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention,
    int64_t rank_begin,
    int64_t rank_end,
    bool need_grad) {
  const GroupedOrderSumProblem problem =
      prepare_grouped_order_sum(D_in, labels_in, sigma, tau, margin, convention, rank_begin, rank_end);
  const at::Tensor &D = problem.D, &labels = problem.labels;
  const int64_t B = problem.B, n = problem.n;
  const Convention conv = problem.convention;
  const int64_t* labels_ptr = labels.data_ptr<int64_t>();
  const int64_t outside = label_range(labels, n).first_outside;  // on this thread: no parallel region
  TORCH_CHECK(outside < 0, "labels must lie in 0..", n - 1, ", got ", labels_ptr[outside], " at index ", outside);
  const auto options = D.options().dtype(at::kDouble);
  const int64_t K = rank_end - rank_begin;
  // The gradient: columns of the range are written whole by the ranks, the others are 0. at::empty and
  // the loops here, not at::zeros, whose fill would be a parallel region of its own.
  at::Tensor grad = need_grad ? at::empty({B, n}, options) : at::empty({0}, options);
  if (need_grad && K < n) {
    double* g = grad.data_ptr<double>();
    for (int64_t x = 0; x < B; ++x) {
      std::fill(g + x * n, g + x * n + rank_begin, 0.0);
      std::fill(g + x * n + rank_end, g + (x + 1) * n, 0.0);
    }
  }
  if (B < 2 || K == 0) {
    if (need_grad) grad.zero_();
    return {at::zeros({}, options), grad};
  }
  // L = lt + gt^T, U = gt + lt^T, E2 = eq + eq^T (docs/math.md §13.1), [n, n] each
  const at::Tensor table = ordering_table(n, sigma, tau, conv, at::kDouble, D.device());
  const at::Tensor lt = table.select(2, 0), eq = table.select(2, 1), gt = table.select(2, 2);
  const at::Tensor L = (lt + gt.t()).contiguous(), U = (gt + lt.t()).contiguous(), E2 = (eq + eq.t()).contiguous();
  // [K, B]: row k the gradient of rank rank_begin + k, every value written by that rank
  LargeVector<double> columns(need_grad ? K * B : 0);
  double* columns_ptr = need_grad ? columns.data() : nullptr;
  std::vector<double> shares(K, 0.0);  // per rank of the range

  // One rank per task (tasks.h), at the CPU's width (cpu_kernels.h).
  const int64_t helpers = B * K < kSerialValues ? 0 : task_helpers(K);
  AT_DISPATCH_FLOATING_TYPES(D.scalar_type(), "grouped_order_sum_cpu", [&] {
    const cpu::GroupedInputs<scalar_t> inputs{D.data_ptr<scalar_t>(), labels_ptr, B, n, L.data_ptr<double>(),
                                              U.data_ptr<double>(), E2.data_ptr<double>(), margin,
                                              conv == Convention::Official, rank_begin, rank_end, helpers};
    SOL_EXT_CPU_DISPATCH(grouped_rank_shares(inputs, shares.data(), columns_ptr));
  });
  if (need_grad) {  // grad[x, rank_begin + k] = columns[k, x], in tiles of rows that stay in cache
    constexpr int64_t kTileRows = 64;
    double* g = grad.data_ptr<double>();
    for (int64_t x0 = 0; x0 < B; x0 += kTileRows) {
      const int64_t x1 = std::min(B, x0 + kTileRows);
      for (int64_t k = 0; k < K; ++k) {
        const double* column = columns_ptr + k * B;
        for (int64_t x = x0; x < x1; ++x) g[x * n + rank_begin + k] = column[x];
      }
    }
  }
  double total = 0;
  for (const double share : shares) total += share;  // in rank order: any number of threads
  return {at::full({}, 0.5 * total, options), grad};
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CPU, m) {
  m.impl("grouped_order_sum", &grouped_order_sum_cpu);
}

} // namespace sol_ext
