// Stochastic order loss (docs/math.md §6, §7) on the CPU, forward and backward.
//
// No [M,n] or [B,B,n] intermediate: each pair's loss is reduced over ranks on the fly, and the
// backward pass gives each row of grad_D to one worker, which visits that row's pairs in a fixed
// order. Every pair's rank-gradient is therefore computed twice (once per row), and the result is
// bitwise reproducible for any number of threads. Extra memory: O(B*n + M).
// order_loss_block (a rectangular block of pairs, local rows x gathered rows, for data-parallel
// training) works the same way: the forward sums each local row's pairs in order, the backward gives
// each local row and each gathered row to one worker. Extra memory O((B + N) * n).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../sol_ext.h"
#include "../sol_math.h"

namespace sol_ext {
namespace {

using acc_t = double;

// The ranks 0..n-1 of one pair split into at most five runs on which the hinge weights
// wA(q), wB(q) of PairTerms are constant. Looping run by run keeps the inner loops free of
// label comparisons, so the compiler vectorizes them.
struct Runs {
  int count = 0;
  int64_t begin[6];
  acc_t above[5], below[5];  // wA and wB on each run

  Runs(const PairTerms<acc_t>& t, int64_t n) {
    int64_t cut[6] = {0, n, t.rx, t.last_lower_x + 1, t.ry, t.last_lower_y + 1};
    for (int64_t& c : cut) c = std::min(std::max<int64_t>(c, 0), n);
    std::sort(cut, cut + 6);
    for (int i = 0; i < 5; ++i) {
      if (cut[i] == cut[i + 1]) continue;
      begin[count] = cut[i];
      above[count] = t.weight_above(cut[i]);
      below[count] = t.weight_below(cut[i]);
      begin[++count] = cut[i + 1];
    }
  }
};

// What every pair evaluation needs: D, labels, the probability table and the loss constants.
// The per-rank expressions are those of PairTerms::loss and PairTerms::grad (sol_math.h).
// A pair's x indexes (D, labels) and its y indexes (D_y, labels_y): the same rows for order_loss,
// the local and the gathered rows for order_loss_block.
template <typename scalar_t>
struct PairContext {
  using opmath_t = at::opmath_type<scalar_t>;
  const scalar_t* D;
  const int64_t* labels;
  const scalar_t* D_y;
  const int64_t* labels_y;
  const double* table;  // [n,n,3]
  int64_t n;
  scalar_t gamma;
  bool official;

  PairTerms<acc_t> terms(int64_t x, int64_t y) const {
    const int64_t rx = labels[x], ry = labels_y[y];
    const double* p = table + (rx * n + ry) * 3;
    return PairTerms<acc_t>(p[0], p[1], p[2], rx, ry, official);
  }

  acc_t loss(int64_t x, int64_t y) const {
    const PairTerms<acc_t> t = terms(x, y);
    const Runs runs(t, n);
    const scalar_t* Dx = D + x * n;
    const scalar_t* Dy = D_y + y * n;
    const scalar_t g = gamma, zero = scalar_t(0);
    acc_t total = 0;
    opmath_t apart_sum = 0;
    for (int r = 0; r < runs.count; ++r) {
      opmath_t above_sum = 0, below_sum = 0;
#pragma omp simd reduction(+ : above_sum, below_sum, apart_sum)
      for (int64_t q = runs.begin[r]; q < runs.begin[r + 1]; ++q) {
        const scalar_t delta = Dx[q] - Dy[q];
        above_sum += std::max(scalar_t(delta + g), zero);
        below_sum += std::max(scalar_t(g - delta), zero);
        apart_sum += std::max(scalar_t(std::abs(delta) - g), zero);
      }
      total += runs.above[r] * above_sum + runs.below[r] * below_sum;
    }
    return total + t.eq * apart_sum;
  }

  // acc[q] += scale * d l(x,y) / d delta_q, where delta_q = D[x,q] - D[y,q]; acc in opmath precision.
  void add_grad(int64_t x, int64_t y, acc_t scale, opmath_t* acc) const {
    const PairTerms<acc_t> t = terms(x, y);
    const Runs runs(t, n);
    const scalar_t* Dx = D + x * n;
    const scalar_t* Dy = D_y + y * n;
    const scalar_t g = gamma;
    const opmath_t eq = opmath_t(scale * t.eq);
    for (int r = 0; r < runs.count; ++r) {
      const opmath_t above = opmath_t(scale * runs.above[r]), below = opmath_t(scale * runs.below[r]);
      const int64_t first = runs.begin[r], last = runs.begin[r + 1];
#pragma omp simd
      for (int64_t q = first; q < last; ++q) {
        // In IEEE arithmetic delta + g > 0 exactly when delta > -g (and so on), so these are the
        // hinge decisions of PairTerms::grad, written as products with 0/1 so that the loop vectorizes.
        const scalar_t delta = Dx[q] - Dy[q];
        acc[q] += above * opmath_t(delta > -g) - below * opmath_t(delta < g) +
                  eq * (opmath_t(delta > g) - opmath_t(delta < -g));
      }
    }
  }
};

// Sums a row's gradient over its pairs: blocks of kBlock pairs in opmath precision (vectorizes
// well for float32), the blocks in float64 (keeps the error independent of the batch size).
template <typename opmath_t>
class RowAccumulator {
 public:
  static constexpr int kBlock = 32;
  explicit RowAccumulator(int64_t n) : block_(n), total_(n) {}
  void reset() {
    std::fill(block_.begin(), block_.end(), opmath_t(0));
    std::fill(total_.begin(), total_.end(), acc_t(0));
    pending_ = 0;
  }
  opmath_t* block() { return block_.data(); }
  void pair_done() {
    if (++pending_ == kBlock) flush();
  }
  template <typename scalar_t>
  void write(scalar_t* out) {
    flush();
    for (size_t q = 0; q < total_.size(); ++q) out[q] = scalar_t(total_[q]);
  }

 private:
  void flush() {
    for (size_t q = 0; q < total_.size(); ++q) {
      total_[q] += block_[q];
      block_[q] = opmath_t(0);
    }
    pending_ = 0;
  }
  std::vector<opmath_t> block_;
  std::vector<acc_t> total_;
  int pending_ = 0;
};

template <typename scalar_t>
PairContext<scalar_t> make_context(const OrderLossProblem& problem, const at::Tensor& table, double margin) {
  const scalar_t* D = problem.D.data_ptr<scalar_t>();
  const int64_t* labels = problem.labels.data_ptr<int64_t>();
  return {D, labels, D, labels, table.data_ptr<double>(), problem.n, static_cast<scalar_t>(margin),
          problem.convention == Convention::Official};
}

template <typename scalar_t>
PairContext<scalar_t> make_block_context(
    const OrderLossBlockProblem& problem, const at::Tensor& table, double margin) {
  return {problem.D.data_ptr<scalar_t>(),     problem.labels.data_ptr<int64_t>(),
          problem.D_all.data_ptr<scalar_t>(), problem.labels_all.data_ptr<int64_t>(),
          table.data_ptr<double>(),           problem.n,
          static_cast<scalar_t>(margin),      problem.convention == Convention::Official};
}

// First pair (a, b) of the all-pairs order at linear index m.
std::pair<int64_t, int64_t> unravel_pair(int64_t m, int64_t B) {
  const double two_b = 2.0 * B - 1.0;
  int64_t a = static_cast<int64_t>((two_b - std::sqrt(std::max(0.0, two_b * two_b - 8.0 * m))) / 2.0);
  a = std::min(std::max<int64_t>(a, 0), B - 2);
  while (a > 0 && pair_index(a, a + 1, B) > m) --a;  // correct the float estimate
  while (a + 1 < B - 1 && pair_index(a + 1, a + 2, B) <= m) ++a;
  return {a, a + 1 + (m - pair_index(a, a + 1, B))};
}

at::Tensor order_loss_cpu(
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    const std::optional<at::Tensor>& pairs_in,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention) {
  const OrderLossProblem problem = prepare_order_loss(D_in, labels_in, pairs_in, sigma, tau, margin, convention);
  const int64_t B = problem.B, n = problem.n, M = problem.M;
  at::Tensor losses = at::empty({M}, problem.D.options());
  if (M == 0) return losses;
  const at::Tensor table = problem.table(sigma, tau, at::kDouble);

  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_cpu", [&] {
    const auto ctx = make_context<scalar_t>(problem, table, margin);
    scalar_t* out = losses.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / n);
    if (problem.pairs.has_value()) {
      const int64_t* p = problem.pairs->data_ptr<int64_t>();
      at::parallel_for(0, M, grain, [&](int64_t begin, int64_t end) {
        for (int64_t m = begin; m < end; ++m) out[m] = scalar_t(ctx.loss(p[2 * m], p[2 * m + 1]));
      });
    } else {
      at::parallel_for(0, M, grain, [&](int64_t begin, int64_t end) {
        auto [a, b] = unravel_pair(begin, B);
        for (int64_t m = begin; m < end; ++m) {
          out[m] = scalar_t(ctx.loss(a, b));
          if (++b == B) b = ++a + 1;
        }
      });
    }
  });
  return losses;
}

at::Tensor order_loss_backward_cpu(
    const at::Tensor& grad_losses,
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    const std::optional<at::Tensor>& pairs_in,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention) {
  const OrderLossProblem problem = prepare_order_loss(D_in, labels_in, pairs_in, sigma, tau, margin, convention);
  const int64_t B = problem.B, n = problem.n, M = problem.M;
  check_grad_losses(grad_losses, problem.D, M);
  at::Tensor grad_D = at::zeros_like(problem.D);
  if (M == 0) return grad_D;
  const at::Tensor table = problem.table(sigma, tau, at::kDouble);
  // A stride-0 gradient (the backward of a mean or sum) is read in place, never materialized.
  const at::Tensor g = grad_losses.to(problem.D.scalar_type());
  const int64_t g_stride = g.stride(0);

  // For each row x, the pairs that touch it, as (pair index, +1 if x is the pair's first element
  // else -1). Rows of all pairs are implicit; explicit pairs get a CSR list in pair order.
  std::vector<int64_t> row_start, entries;
  const int64_t* p = nullptr;
  if (problem.pairs.has_value()) {
    p = problem.pairs->data_ptr<int64_t>();
    row_start.assign(B + 1, 0);
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
  }

  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_backward_cpu", [&] {
    const auto ctx = make_context<scalar_t>(problem, table, margin);
    const scalar_t* g_ptr = g.data_ptr<scalar_t>();
    scalar_t* out = grad_D.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, M / B * n));
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      RowAccumulator<at::opmath_type<scalar_t>> row(n);
      for (int64_t x = begin; x < end; ++x) {
        row.reset();
        if (p != nullptr) {
          for (int64_t e = row_start[x]; e < row_start[x + 1]; ++e) {
            const int64_t m = entries[e] / 2;
            const acc_t sign = entries[e] % 2 == 0 ? 1 : -1;
            ctx.add_grad(p[2 * m], p[2 * m + 1], sign * acc_t(g_ptr[m * g_stride]), row.block());
            row.pair_done();
          }
        } else {
          for (int64_t y = 0; y < B; ++y) {
            if (y == x) continue;
            const int64_t a = std::min(x, y), b = std::max(x, y);
            const acc_t sign = x == a ? 1 : -1;
            ctx.add_grad(a, b, sign * acc_t(g_ptr[pair_index(a, b, B) * g_stride]), row.block());
            row.pair_done();
          }
        }
        row.write(out + x * n);
      }
    });
  });
  return grad_D;
}

// Block mode: local row i owns the pairs (i, j) of the gathered rows with j > offset + i.
at::Tensor order_loss_block_cpu(
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    const at::Tensor& D_all_in,
    const at::Tensor& labels_all_in,
    int64_t offset,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention) {
  const OrderLossBlockProblem problem =
      prepare_order_loss_block(D_in, labels_in, D_all_in, labels_all_in, offset, sigma, tau, margin, convention);
  const int64_t B = problem.B, N = problem.N, n = problem.n;
  at::Tensor rows = at::empty({B}, problem.D.options());
  if (B == 0) return rows;
  const at::Tensor table = problem.table(sigma, tau, at::kDouble);

  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_block_cpu", [&] {
    const auto ctx = make_block_context<scalar_t>(problem, table, margin);
    scalar_t* out = rows.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, N * n));
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        acc_t total = 0;
        for (int64_t j = offset + i + 1; j < N; ++j) total += ctx.loss(i, j);
        out[i] = scalar_t(total);
      }
    });
  });
  return rows;
}

std::tuple<at::Tensor, at::Tensor> order_loss_block_backward_cpu(
    const at::Tensor& grad_rows,
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    const at::Tensor& D_all_in,
    const at::Tensor& labels_all_in,
    int64_t offset,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention,
    bool need_grad_D,
    bool need_grad_D_all) {
  const OrderLossBlockProblem problem =
      prepare_order_loss_block(D_in, labels_in, D_all_in, labels_all_in, offset, sigma, tau, margin, convention);
  const int64_t B = problem.B, N = problem.N, n = problem.n;
  check_grad_losses(grad_rows, problem.D, B);
  at::Tensor grad_D = need_grad_D ? at::zeros_like(problem.D) : problem.D.new_empty({0});
  at::Tensor grad_D_all = need_grad_D_all ? at::zeros_like(problem.D_all) : problem.D_all.new_empty({0});
  if (B == 0 || N == 0 || !(need_grad_D || need_grad_D_all)) return {grad_D, grad_D_all};
  const at::Tensor table = problem.table(sigma, tau, at::kDouble);
  // A stride-0 gradient (the backward of a sum or mean) is read in place, never materialized.
  const at::Tensor g = grad_rows.to(problem.D.scalar_type());
  const int64_t g_stride = g.stride(0);

  AT_DISPATCH_FLOATING_TYPES(problem.D.scalar_type(), "order_loss_block_backward_cpu", [&] {
    const auto ctx = make_block_context<scalar_t>(problem, table, margin);
    const scalar_t* g_ptr = g.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, B * n));
    // d/dD[i]: the pairs of local row i, in j order; x is the local row, so the sign is +.
    if (need_grad_D) {
      scalar_t* out = grad_D.data_ptr<scalar_t>();
      at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
        RowAccumulator<at::opmath_type<scalar_t>> row(n);
        for (int64_t i = begin; i < end; ++i) {
          row.reset();
          const acc_t scale = acc_t(g_ptr[i * g_stride]);
          for (int64_t j = offset + i + 1; j < N; ++j) {
            ctx.add_grad(i, j, scale, row.block());
            row.pair_done();
          }
          row.write(out + i * n);
        }
      });
    }
    // d/dD_all[j]: the local rows i with offset + i < j, in i order; D_all[j] is the pair's y (sign -).
    if (need_grad_D_all) {
      scalar_t* out = grad_D_all.data_ptr<scalar_t>();
      at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
        RowAccumulator<at::opmath_type<scalar_t>> row(n);
        for (int64_t j = begin; j < end; ++j) {
          const int64_t rows = std::min(B, j - offset);
          if (rows <= 0) continue;  // no local row pairs with j: its gradient stays 0
          row.reset();
          for (int64_t i = 0; i < rows; ++i) {
            ctx.add_grad(i, j, -acc_t(g_ptr[i * g_stride]), row.block());
            row.pair_done();
          }
          row.write(out + j * n);
        }
      });
    }
  });
  return {grad_D, grad_D_all};
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CPU, m) {
  m.impl("order_loss", &order_loss_cpu);
  m.impl("_order_loss_backward", &order_loss_backward_cpu);
  m.impl("order_loss_block", &order_loss_block_cpu);
  m.impl("_order_loss_block_backward", &order_loss_block_backward_cpu);
}

} // namespace sol_ext
