// The all-pairs order loss by sorting (docs/math.md §13) on CUDA: the op grouped_order_sum of the CPU
// kernel (csrc/cpu/grouped_order_loss_kernel.cpp), with the same hinge decisions and float64 sums.
//
// The ranks of the range go in chunks of K columns, K set by the shape alone so that the label-count
// table of a chunk stays under kCountsBudgetBytes. Per chunk:
//   1. one stable sort of each column of D (torch's segmented sort), and the labels along it;
//   2. counts[k, a, p] = #{j < p : lab[k, j] = a}, the prefix counts of the labels (int32: exact);
//   3. per hinge family with constant c (threshold t = -c, in D's dtype): below[k, i] = #{p : s[i] - s[p] > t}
//      by a binary search (the difference, rounded to D's dtype as the pairwise kernels round it, does
//      not grow with p, so the active p are a prefix), and passed[k, i] = #{x : the hinge of (x, i) is
//      inactive} by a second one (a prefix of x for the same reason);
//   4. one thread per (k, i) adds x's side, sum_b W_q(r_x, b) counts[below_i, b], to the gradient at i and
//      subtracts y's side, sum_a W_q(a, r_y) (per_label[a] - counts[passed_i, a]).
// The value follows from the gradient as on the CPU (§13.3). Every sum is a per-thread loop in a fixed
// order or a torch reduction (no atomics): the result is bitwise reproducible. Nothing is read back to the host, so
// the op runs inside CUDA graphs. A column that holds a NaN gives a NaN value and a NaN gradient column,
// as the pairwise kernels and the CPU op do (torch's sort puts NaN last).
//
// Two implementations of steps 2-4, chosen by SOL_EXT_CUDA_GROUPED (read at each call):
//   "separate" (the default): the counts by torch's scan along each row of B + 1 counts, which runs one
//       thread block per row (K * n blocks, each walking its row in turn); passed from the array of
//       below; one launch per step and family, the pair weights and the value's parts in torch operations;
//   "fused": the counts by one scan of the whole table (cub's device-wide scan, every block busy; each
//       row is then offset by the total of the rows before it, which the readers subtract), and one
//       kernel per chunk for steps 3-4 of every family, the gradient's scatter and the value's parts,
//       the pair weights read from the ordering table: about 8 launches per chunk instead of about 35.
//       StochasticOrderLoss then also runs its grouped step as one op per direction
//       (grouped_stochastic_order_loss, csrc/stochastic_order_loss.cpp) instead of Python's composition.
// "fused" becomes the only one once it has run on a GPU (benchmarks/gpu_check.sh tests and times both).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

#include "../sol_ext.h"
#include "cuda_common.cuh"

namespace sol_ext {
namespace {

constexpr int kThreads = 256;
// The int32 label counts of one chunk of ranks, [K, n, B + 1], stay under this many bytes (or K = 1).
constexpr int64_t kCountsBudgetBytes = int64_t(64) << 20;

// The hinge families: W+_q (constant +gamma; with gamma = 0 also E2, one hinge) and E2 (constant -gamma).
enum Family : int { kPlus = 0, kPlusWithE2 = 1, kApart = 2 };

// W_q(a, b) of a family (docs/math.md §13.1): W+_q(a, b) = L(a, b) [q in lower(a)] + U(a, b) [q >= a].
struct PairWeights {
  const double* __restrict__ L;
  const double* __restrict__ U;
  const double* __restrict__ E2;
  int64_t n;
  bool official;

  __device__ __forceinline__ double operator()(int family, int64_t q, int64_t a, int64_t b) const {
    const int64_t ab = a * n + b;
    if (family == kApart) return E2[ab];
    const bool lower = official ? q < a : q <= a;
    double w = (lower ? L[ab] : 0.0) + (q >= a ? U[ab] : 0.0);
    if (family == kPlusWithE2) w += E2[ab];
    return w;
  }
};

// pos[k, i] = #{p : (s[k, i] - s[k, p]) rounded to scalar_t > threshold}, over a sorted row of length B.
template <typename scalar_t>
__global__ void count_active_kernel(const scalar_t* __restrict__ s, int64_t rows, int64_t B, scalar_t threshold,
                                    int32_t* __restrict__ pos) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < rows * B;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const scalar_t* row = s + (idx / B) * B;
    const scalar_t x = s[idx];
    int64_t lo = 0, hi = B;  // the predicate holds on [0, lo) and fails on [hi, B)
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (static_cast<scalar_t>(x - row[mid]) > threshold) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    pos[idx] = static_cast<int32_t>(lo);
  }
}

// first_above[k, i] = #{x : pos[k, x] <= i}, pos non-decreasing along each row.
__global__ void first_above_kernel(const int32_t* __restrict__ pos, int64_t rows, int64_t B,
                                   int32_t* __restrict__ first_above) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < rows * B;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t* row = pos + (idx / B) * B;
    const int32_t i = static_cast<int32_t>(idx % B);
    int64_t lo = 0, hi = B;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (row[mid] <= i) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    first_above[idx] = static_cast<int32_t>(lo);
  }
}

// One family's two sides at every sorted position: grad[k, i] += x_side - y_side (grad is NaN for a
// column holding a NaN), x_sides[k, i] = x_side (for the value).
__global__ void family_sides_kernel(const int64_t* __restrict__ lab, const int32_t* __restrict__ counts,
                                    const int32_t* __restrict__ pos, const int32_t* __restrict__ first_above,
                                    const bool* __restrict__ column_has_nan, PairWeights weights, int family,
                                    int64_t q_begin, int64_t rows, int64_t B, double* __restrict__ grad,
                                    double* __restrict__ x_sides) {
  const int64_t n = weights.n;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < rows * B;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = idx / B;
    const int64_t q = q_begin + k;
    const int64_t r = lab[idx];
    CUDA_KERNEL_ASSERT(r >= 0 && r < n);
    // counts of label b among the first p sorted samples: table[b * (B + 1) + p]; neighbouring threads
    // read neighbouring p (pos and first_above grow along the sorted column)
    const int32_t* table = counts + k * n * (B + 1);
    const int64_t below = pos[idx];             // the y active with x: positions 0 .. below - 1
    const int64_t passed = first_above[idx];    // the x not active with y: positions 0 .. passed - 1
    double x_side = 0, y_side = 0;
    for (int64_t b = 0; b < n; ++b) {
      const int32_t* label_counts = table + b * (B + 1);
      x_side += weights(family, q, r, b) * label_counts[below];
      y_side += weights(family, q, b, r) * (label_counts[B] - label_counts[passed]);
    }
    x_sides[idx] = x_side;
    grad[idx] = column_has_nan[k] ? NAN : grad[idx] + (x_side - y_side);
  }
}

// diagonal[k] = sum_a per_label[k, a] W_q(a, a): the pairs x = x that an active hinge at delta = 0 counts.
__global__ void family_diagonal_kernel(const int32_t* __restrict__ counts, PairWeights weights, int family,
                                       int64_t q_begin, int64_t rows, int64_t B, double* __restrict__ diagonal) {
  const int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (k >= rows) return;
  const int32_t* table = counts + k * weights.n * (B + 1);
  double total = 0;
  for (int64_t a = 0; a < weights.n; ++a) total += table[a * (B + 1) + B] * weights(family, q_begin + k, a, a);
  diagonal[k] = total;
}

// grad_out[order[k, i], q_begin + k] = 0.5 grad[k, i]: the unordered pairs carry half of the ordered ones.
__global__ void scatter_gradient_kernel(const double* __restrict__ grad, const int64_t* __restrict__ order,
                                        int64_t rows, int64_t B, int64_t n, int64_t q_begin,
                                        double* __restrict__ grad_out) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < rows * B;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = idx / B;
    grad_out[order[idx] * n + q_begin + k] = 0.5 * grad[idx];
  }
}

unsigned grid_for(int64_t count) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cuda::ceil_div(count, kThreads), 65535)));
}

// ---- "fused" (see the top of the file) ------------------------------------------------------------------

// W_q(a, b) of a family read from the ordering table [n, n, 3] (lt, eq, gt of labels (a, b)): the same
// float64 sums as PairWeights' L = lt + gt^T, U = gt + lt^T, E2 = eq + eq^T.
struct TableWeights {
  const double* __restrict__ table;
  int64_t n;
  bool official;

  __device__ __forceinline__ double p(int64_t a, int64_t b, int j) const { return table[(a * n + b) * 3 + j]; }

  __device__ __forceinline__ double operator()(int family, int64_t q, int64_t a, int64_t b) const {
    if (family == kApart) return p(a, b, 1) + p(b, a, 1);
    const bool lower = official ? q < a : q <= a;
    double w = (lower ? p(a, b, 0) + p(b, a, 2) : 0.0) + (q >= a ? p(a, b, 2) + p(b, a, 0) : 0.0);
    if (family == kPlusWithE2) w += p(a, b, 1) + p(b, a, 1);
    return w;
  }
};

// One hinge family of the sum: its constant c (0: no part in the value), its threshold -c in D's dtype,
// and whether x's own hinge is active (delta = 0 > threshold), so that the pairs x = x come out of the value.
template <typename scalar_t>
struct FusedTerm {
  int family;
  double c;
  scalar_t threshold;
  bool diagonal;
};

// counts[k, a, p] = [labels[order[k, p - 1]] == a] for p >= 1 and 0 at p = 0: the labels along each sorted
// column as indicators. Their prefix sum over the whole table is offset(k, a) + #{j < p : lab[k, j] = a},
// with offset(k, a) = counts[k, a, 0] (position 0 adds nothing to its own row). One thread per (k, p)
// writes its n entries: neighbouring threads write neighbouring p.
__global__ void label_indicator_kernel(const int64_t* __restrict__ labels, const int64_t* __restrict__ order,
                                       int64_t rows, int64_t B, int64_t n, int32_t* __restrict__ counts) {
  const int64_t stride = B + 1;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < rows * stride;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = idx / stride, p = idx % stride;
    const int64_t r = p == 0 ? -1 : labels[order[k * B + p - 1]];
    CUDA_KERNEL_ASSERT(p == 0 || (r >= 0 && r < n));
    int32_t* column = counts + k * n * stride + p;
    for (int64_t a = 0; a < n; ++a) column[a * stride] = r == a;
  }
}

// Every family of one chunk at sorted position (k, i): the gradient (x's side minus y's side, summed over
// the families; NaN for a column holding a NaN), scattered to grad_out[order[k, i], q] at half weight
// (the unordered pairs carry half of the ordered ones; skipped when grad_out is null), and
// value_parts[k, i], whose sum over i is the rank's share of the sum (§13.3):
//   gradient * (s[i] - mid) + sum_families c * x_side, minus at i = 0 c * sum_a per_label[a] W_q(a, a).
// counts holds the prefix counts offset per row (label_indicator_kernel): every read subtracts its row's
// first entry or is a difference of two entries of one row.
template <typename scalar_t>
__global__ void grouped_sides_kernel(const scalar_t* __restrict__ sorted, const int64_t* __restrict__ order,
                                     const int64_t* __restrict__ labels, const int32_t* __restrict__ counts,
                                     TableWeights weights, FusedTerm<scalar_t> first, FusedTerm<scalar_t> second,
                                     int term_count, int64_t q_begin, int64_t rows, int64_t B,
                                     double* __restrict__ value_parts, double* __restrict__ grad_out) {
  const int64_t n = weights.n, stride = B + 1;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < rows * B;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = idx / B, i = idx % B, q = q_begin + k;
    const scalar_t* row = sorted + k * B;
    const int32_t* table = counts + k * n * stride;
    const int64_t r = labels[order[idx]];
    CUDA_KERNEL_ASSERT(r >= 0 && r < n);
    const scalar_t x = row[i];
    double gradient = 0, value = 0;
    for (int t = 0; t < term_count; ++t) {
      const FusedTerm<scalar_t> term = t == 0 ? first : second;  // a copy: a reference would put both in local memory
      // below: the y active with x, positions 0 .. below - 1 (the predicate holds on a prefix of p)
      int64_t lo = 0, hi = B;
      while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (static_cast<scalar_t>(x - row[mid]) > term.threshold) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      const int64_t below = lo;
      // passed: the x' not active with y = i, positions 0 .. passed - 1 (a prefix of x' likewise)
      lo = 0, hi = B;
      while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (!(static_cast<scalar_t>(row[mid] - x) > term.threshold)) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      const int64_t passed = lo;
      double x_side = 0, y_side = 0;
      for (int64_t b = 0; b < n; ++b) {
        const int32_t* label_counts = table + b * stride;
        x_side += weights(term.family, q, r, b) * (label_counts[below] - label_counts[0]);
        y_side += weights(term.family, q, b, r) * (label_counts[B] - label_counts[passed]);
      }
      gradient += x_side - y_side;
      if (term.c == 0) continue;
      value += term.c * x_side;
      if (term.diagonal && i == 0) {
        double diagonal = 0;
        for (int64_t a = 0; a < n; ++a) {
          const int32_t* label_counts = table + a * stride;
          diagonal += (label_counts[B] - label_counts[0]) * weights(term.family, q, a, a);
        }
        value -= term.c * diagonal;
      }
    }
    if (isnan(static_cast<double>(row[B - 1]))) gradient = NAN;  // NaN sorts last
    const double middle = 0.5 * (static_cast<double>(row[0]) + static_cast<double>(row[B - 1]));
    value_parts[idx] = value + gradient * (static_cast<double>(x) - middle);
    if (grad_out != nullptr) grad_out[order[idx] * n + q] = 0.5 * gradient;
  }
}

std::tuple<at::Tensor, at::Tensor> grouped_order_sum_cuda(
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention,
    int64_t rank_begin,
    int64_t rank_end,
    bool need_grad) {
  // the label values are checked on the device
  const GroupedOrderSumProblem problem =
      prepare_grouped_order_sum(D_in, labels_in, sigma, tau, margin, convention, rank_begin, rank_end);
  const at::Tensor &D = problem.D, &labels = problem.labels;
  const int64_t B = problem.B, n = problem.n;
  const Convention conv = problem.convention;
  const c10::cuda::CUDAGuard guard(D_in.device());
  const auto options = D_in.options().dtype(at::kDouble);
  const int64_t ranks = rank_end - rank_begin;
  at::Tensor grad_out = need_grad ? at::zeros({B, n}, options) : at::empty({0}, options);
  if (B < 2 || ranks == 0) return {at::zeros({}, options), grad_out};

  const at::Tensor table = ordering_table(n, sigma, tau, conv, at::kDouble, D.device()).contiguous();
  cuda::record_use(table, at::cuda::getCurrentCUDAStream());
  const bool fused = cuda::fused_chosen("SOL_EXT_CUDA_GROUPED");  // see the top of the file
  // "separate": L = lt + gt^T, U = gt + lt^T, E2 = eq + eq^T (docs/math.md §13.1), [n, n] float64 each
  at::Tensor L, U, E2;
  if (!fused) {
    const at::Tensor lt = table.select(2, 0), eq = table.select(2, 1), gt = table.select(2, 2);
    L = (lt + gt.t()).contiguous(), U = (gt + lt.t()).contiguous(), E2 = (eq + eq.t()).contiguous();
  }
  const PairWeights weights{fused ? nullptr : L.data_ptr<double>(), fused ? nullptr : U.data_ptr<double>(),
                            fused ? nullptr : E2.data_ptr<double>(), n, conv == Convention::Official};
  const TableWeights table_weights{table.data_ptr<double>(), n, conv == Convention::Official};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t chunk = std::max<int64_t>(
      1, std::min<int64_t>(ranks, kCountsBudgetBytes / (static_cast<int64_t>(sizeof(int32_t)) * (B + 1) * n)));
  at::Tensor shares = at::empty({ranks}, options);  // each rank's share of the sum

  AT_DISPATCH_FLOATING_TYPES(D.scalar_type(), "grouped_order_sum_cuda", [&] {
    // The hinge of constant c is active when D_x - D_y, rounded to scalar_t, exceeds -c held in scalar_t
    // (docs/math.md §13.4), as on the CPU.
    const scalar_t gamma = static_cast<scalar_t>(margin);
    const bool one_hinge = gamma == scalar_t(0);  // [delta]+ and the positive half of [|delta|]+ (§13.1)
    const FusedTerm<scalar_t> terms[2] = {
        {one_hinge ? kPlusWithE2 : kPlus, one_hinge ? 0.0 : static_cast<double>(gamma), static_cast<scalar_t>(-gamma),
         !one_hinge && scalar_t(0) > static_cast<scalar_t>(-gamma)},
        {kApart, -static_cast<double>(gamma), gamma, scalar_t(0) > gamma}};
    const int term_count = one_hinge ? 1 : 2;
    for (int64_t q0 = rank_begin; q0 < rank_end; q0 += chunk) {
      const int64_t K = std::min(chunk, rank_end - q0);
      const int64_t size = K * B;
      // std::optional<bool>: a plain `true` would pick the overload sort(self, dim, descending)
      auto [sorted, order] = at::sort(D.narrow(1, q0, K).t().contiguous(), std::optional<bool>(true), /*dim=*/1,
                                      /*descending=*/false);
      if (fused) {
        at::Tensor counts = at::empty({K, n, B + 1}, D.options().dtype(at::kInt));
        label_indicator_kernel<<<grid_for(K * (B + 1)), kThreads, 0, stream>>>(
            labels.data_ptr<int64_t>(), order.data_ptr<int64_t>(), K, B, n, counts.data_ptr<int32_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        counts.view({-1}).cumsum_(0);  // one device-wide scan (cub), not one thread block per row
        at::Tensor value_parts = at::empty({K, B}, options);
        grouped_sides_kernel<scalar_t><<<grid_for(size), kThreads, 0, stream>>>(
            sorted.data_ptr<scalar_t>(), order.data_ptr<int64_t>(), labels.data_ptr<int64_t>(),
            counts.data_ptr<int32_t>(), table_weights, terms[0], terms[1], term_count, q0, K, B,
            value_parts.data_ptr<double>(), need_grad ? grad_out.data_ptr<double>() : nullptr);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        at::Tensor chunk_shares = shares.narrow(0, q0 - rank_begin, K);
        at::sum_out(chunk_shares, value_parts, {1});
        continue;
      }
      const at::Tensor lab = labels.index_select(0, order.reshape(-1)).view({K, B});
      const at::Tensor column_has_nan = sorted.select(1, B - 1).isnan();  // NaN sorts last
      // counts of a scan along each row (torch's scan of the innermost dimension; a scan along B with
      // K * n rows beside it would run on K * n threads)
      at::Tensor counts = at::zeros({K, n, B + 1}, D.options().dtype(at::kInt));
      counts.narrow(2, 1, B).scatter_(1, lab.unsqueeze(1), 1);
      counts.cumsum_(2);
      at::Tensor grad = at::zeros({K, B}, options);
      at::Tensor pos = at::empty({K, B}, D.options().dtype(at::kInt));
      at::Tensor first_above = at::empty_like(pos);
      at::Tensor x_sides = at::empty({K, B}, options);
      at::Tensor diagonal = at::empty({K}, options);
      const at::Tensor values = sorted.to(at::kDouble);
      // <gradient, D> with each column taken about the middle of its range (§13.3), plus c dF/dc per family
      at::Tensor share = at::zeros({K}, options);
      for (int t = 0; t < term_count; ++t) {
        const FusedTerm<scalar_t>& term = terms[t];
        count_active_kernel<scalar_t><<<grid_for(size), kThreads, 0, stream>>>(
            sorted.data_ptr<scalar_t>(), K, B, term.threshold, pos.data_ptr<int32_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        first_above_kernel<<<grid_for(size), kThreads, 0, stream>>>(pos.data_ptr<int32_t>(), K, B,
                                                                   first_above.data_ptr<int32_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        family_sides_kernel<<<grid_for(size), kThreads, 0, stream>>>(
            lab.data_ptr<int64_t>(), counts.data_ptr<int32_t>(), pos.data_ptr<int32_t>(),
            first_above.data_ptr<int32_t>(), column_has_nan.data_ptr<bool>(), weights, term.family, q0, K, B,
            grad.data_ptr<double>(), x_sides.data_ptr<double>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        if (term.c == 0) continue;
        share.add_(x_sides.sum(1), term.c);
        if (term.diagonal) {  // x's own hinge is active (delta = 0): take the pairs x = x out
          family_diagonal_kernel<<<grid_for(K), kThreads, 0, stream>>>(counts.data_ptr<int32_t>(), weights,
                                                                      term.family, q0, K, B,
                                                                      diagonal.data_ptr<double>());
          C10_CUDA_KERNEL_LAUNCH_CHECK();
          share.sub_(diagonal, term.c);
        }
      }
      const at::Tensor mid = 0.5 * (values.select(1, 0) + values.select(1, B - 1));
      shares.narrow(0, q0 - rank_begin, K).copy_((grad * (values - mid.unsqueeze(1))).sum(1) + share);
      if (need_grad) {
        scatter_gradient_kernel<<<grid_for(size), kThreads, 0, stream>>>(
            grad.data_ptr<double>(), order.data_ptr<int64_t>(), K, B, n, q0, grad_out.data_ptr<double>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    }
  });
  // x 0.5: the unordered pairs carry half of the ordered pairs x != y (docs/math.md §13.2)
  return {shares.sum() * 0.5, grad_out};
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CUDA, m) {
  m.impl("grouped_order_sum", &grouped_order_sum_cuda);
}

} // namespace sol_ext
