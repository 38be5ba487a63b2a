// What the CPU kernels of the order loss share (order_loss_kernel.cpp and its all-pairs and explicit-pairs
// halves, order_loss_block_kernel.cpp): the per-pair loss and gradient over the ranks, and the row sums.
//
// No [M,n] or [B,B,n] intermediate: each pair's loss is reduced over ranks on the fly, and the backward
// passes give each row of a gradient to one worker, which visits that row's pairs in a fixed order.
// Every pair's rank-gradient is therefore computed twice (once per row), and the result is bitwise
// reproducible for any number of threads.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../sol_ext.h"
#include "../sol_math.h"

namespace sol_ext {
namespace order_loss_cpu {

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
inline PairContext<scalar_t> make_context(const OrderLossProblem& problem, const at::Tensor& table, double margin) {
  const scalar_t* D = problem.D.data_ptr<scalar_t>();
  const int64_t* labels = problem.labels.data_ptr<int64_t>();
  return {D, labels, D, labels, table.data_ptr<double>(), problem.n, static_cast<scalar_t>(margin),
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

// The grain of the forward loops over pairs and of the backward loops over rows (M pairs in all).
inline int64_t forward_grain(int64_t n) {
  return std::max<int64_t>(1, 32768 / n);
}
inline int64_t backward_grain(int64_t B, int64_t n, int64_t M) {
  return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, M / B * n));
}

} // namespace order_loss_cpu
} // namespace sol_ext
