// The all-pairs order loss by sorting (docs/math.md §13) on the CPU: its sum and gradient in one pass.
//
// Each rank q of the range is one task: sort the column D[., q], then two sweeps along the sorted order
// per hinge family give every sample's share of the gradient, and the value follows from them (§13.3).
// No [B, B] or [pairs, n] tensor: O(B + n^2) extra memory per worker besides the [B, n] gradient.
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
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../sol_ext.h"
#include "tasks.h"

namespace sol_ext {
namespace {

// An order-preserving unsigned image of a float's bits: a < b as floats (no NaN) implies key(a) <= key(b)
// (-0 and +0 get different keys; they are equal values and any order of them is fine). from_key inverts it.
template <typename Key, typename scalar_t>
inline Key sort_key(scalar_t v) {
  static_assert(sizeof(Key) == sizeof(scalar_t));
  constexpr Key sign = Key(1) << (8 * sizeof(Key) - 1);
  Key bits;
  std::memcpy(&bits, &v, sizeof bits);
  return (bits & sign) ? ~bits : (bits | sign);
}
template <typename scalar_t, typename Key>
inline scalar_t from_key(Key key) {
  constexpr Key sign = Key(1) << (8 * sizeof(Key) - 1);
  const Key bits = (key & sign) ? (key ^ sign) : ~key;
  scalar_t v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// A value's key and its row (batches of up to 2^31 - 1 rows).
template <typename Key>
struct Item {
  Key key;
  uint32_t index;
};

// Sorts items by key, ties by index (the items arrive in index order): an LSD radix sort on bytes, which
// is stable and several times faster than a comparison sort on long columns; std::sort for short ones.
template <typename Key>
void sort_items(std::vector<Item<Key>>& items, std::vector<Item<Key>>& scratch) {
  const int64_t B = static_cast<int64_t>(items.size());
  if (B < 256) {
    std::sort(items.begin(), items.end(), [](const Item<Key>& a, const Item<Key>& b) {
      return a.key < b.key || (a.key == b.key && a.index < b.index);
    });
    return;
  }
  constexpr int kBytes = sizeof(Key);
  std::vector<int64_t> histogram(kBytes * 256, 0);
  for (const auto& item : items) {
    for (int byte = 0; byte < kBytes; ++byte) ++histogram[byte * 256 + ((item.key >> (8 * byte)) & 0xff)];
  }
  scratch.resize(B);
  Item<Key>* from = items.data();
  Item<Key>* to = scratch.data();
  for (int byte = 0; byte < kBytes; ++byte) {
    int64_t* count = histogram.data() + byte * 256;
    if (*std::max_element(count, count + 256) == B) continue;  // one value of this byte: nothing to move
    int64_t start = 0;
    for (int v = 0; v < 256; ++v) std::swap(count[v], start), start += count[v];  // exclusive prefix sums
    for (int64_t i = 0; i < B; ++i) to[count[(from[i].key >> (8 * byte)) & 0xff]++] = from[i];
    std::swap(from, to);
  }
  if (from != items.data()) std::copy(from, from + B, items.data());
}

// Sums in blocks of kBlock terms, then the blocks: the same order every time, and an error that grows
// with the number of blocks rather than the number of terms.
class BlockSum {
 public:
  void add(double v) {
    block_ += v;
    if (++pending_ == kBlock) {
      total_ += block_;
      block_ = 0;
      pending_ = 0;
    }
  }
  double value() const { return total_ + block_; }

 private:
  static constexpr int kBlock = 1024;
  double total_ = 0, block_ = 0;
  int pending_ = 0;
};

inline double dot(const double* a, const double* b, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < n; ++k) s += a[k] * b[k];
  return s;
}

// The grouped sum of one rank at a time, with a worker's buffers. scalar_t is D's dtype, in which the hinge
// decisions are taken as the pairwise kernels take them (docs/math.md §13.4): the hinge of (x, y) with
// constant c is active when the difference D[x, q] - D[y, q], rounded to scalar_t, exceeds -c (c held in
// scalar_t: the margin rounded as the kernels round it).
template <typename scalar_t>
class RankSum {
 public:
  using Key = std::conditional_t<std::is_same_v<scalar_t, double>, uint64_t, uint32_t>;

  RankSum(const scalar_t* D, const int64_t* labels, int64_t B, int64_t n, const double* L, const double* U,
          const double* E2, scalar_t gamma, bool official)
      : D_(D), labels_(labels), B_(B), n_(n), L_(L), U_(U), E2_(E2), gamma_(gamma), official_(official),
        items_(B), s_(B), lab_(B), pos_(B), g_(B), counts_(n), per_label_(n), w_plus_(n * n), w_plus_t_(n * n) {}

  // Rank q's share of the sum over the ordered pairs x != y; writes `scale` times d(share)/dD[., q] to
  // column q of grad [B, n] when grad is not null. NaN (value and gradient) when the column holds a NaN,
  // as the pairwise kernels give.
  double run(int64_t q, double* grad, double scale) {
    const int64_t B = B_, n = n_;
    for (int64_t i = 0; i < B; ++i) {
      const scalar_t v = D_[i * n + q];
      if (std::isnan(v)) {
        if (grad != nullptr) {
          for (int64_t x = 0; x < B; ++x) grad[x * n + q] = std::numeric_limits<double>::quiet_NaN();
        }
        return std::numeric_limits<double>::quiet_NaN();
      }
      items_[i] = {sort_key<Key>(v), static_cast<uint32_t>(i)};
    }
    sort_items(items_, scratch_);
    std::fill(per_label_.begin(), per_label_.end(), 0.0);
    for (int64_t i = 0; i < B; ++i) {
      s_[i] = from_key<scalar_t>(items_[i].key);
      lab_[i] = static_cast<int32_t>(labels_[items_[i].index]);
      per_label_[lab_[i]] += 1;
    }
    set_weights(q);
    std::fill(g_.begin(), g_.end(), 0.0);
    const double gamma = static_cast<double>(gamma_);
    double value = 0;
    if (gamma_ == scalar_t(0)) {  // [delta]+ and the positive half of [|delta|]+ are one hinge (§13.1)
      value += sweep(w_plus_.data(), w_plus_t_.data(), 0.0, scalar_t(0));
    } else {
      value += sweep(w_plus_.data(), w_plus_t_.data(), gamma, -gamma_);
      value += sweep(E2_, E2_, -gamma, gamma_);  // E2 is symmetric
    }
    // <gradient, D>, with D[., q] taken about the middle of its range (§13.3)
    const double mid = 0.5 * (static_cast<double>(s_[0]) + static_cast<double>(s_[B - 1]));
    BlockSum inner;
    for (int64_t i = 0; i < B; ++i) inner.add(g_[i] * (static_cast<double>(s_[i]) - mid));
    if (grad != nullptr) {
      for (int64_t i = 0; i < B; ++i) grad[int64_t(items_[i].index) * n + q] = scale * g_[i];
    }
    return inner.value() + value;
  }

 private:
  // W+_q (docs/math.md §13.1) and its transpose; with gamma = 0, W+_q + E2 (one hinge).
  void set_weights(int64_t q) {
    const int64_t n = n_;
    for (int64_t a = 0; a < n; ++a) {
      const bool lower = official_ ? q < a : q <= a;
      const bool upper = q >= a;
      for (int64_t b = 0; b < n; ++b) {
        const int64_t ab = a * n + b;
        double w = lower && upper ? L_[ab] + U_[ab] : lower ? L_[ab] : upper ? U_[ab] : 0.0;
        if (gamma_ == scalar_t(0)) w += E2_[ab];
        w_plus_[ab] = w;
        w_plus_t_[b * n + a] = w;
      }
    }
  }

  // One hinge family, h(D[x, q] - D[y, q] + c) with weights W(r_x, r_y) (W_t: W transposed), active when
  // the difference exceeds `threshold` (= -c in scalar_t). Adds its gradient to g_ (sorted order) and
  // returns the part of the value that is not <gradient, D>: c times the sum of the x sides, less the
  // pairs x = y (§13.2, §13.3).
  double sweep(const double* W, const double* W_t, double c, scalar_t threshold) {
    const int64_t B = B_, n = n_;
    // x's side: the y active with x are the sorted positions 0 .. pos[x] - 1 (pos does not decrease).
    std::fill(counts_.begin(), counts_.end(), 0.0);
    BlockSum x_sides;
    int64_t p = 0;
    for (int64_t i = 0; i < B; ++i) {
      const scalar_t x = s_[i];
      while (p < B && scalar_t(x - s_[p]) > threshold) counts_[lab_[p++]] += 1;
      pos_[i] = p;
      const double side = dot(W + lab_[i] * n, counts_.data(), n);
      g_[i] += side;
      x_sides.add(side);
    }
    // y's side: the x active with the y at position i are the positions first_above .. B - 1, where
    // first_above = #{x: pos[x] <= i}; `counts_` holds the labels of those x.
    std::copy(per_label_.begin(), per_label_.end(), counts_.begin());
    int64_t first_above = 0;
    for (int64_t i = 0; i < B; ++i) {
      while (first_above < B && pos_[first_above] <= i) counts_[lab_[first_above++]] -= 1;
      g_[i] -= dot(W_t + lab_[i] * n, counts_.data(), n);
    }
    if (c == 0) return 0.0;
    double value = c * x_sides.value();
    if (scalar_t(0) > threshold) {  // x's own hinge is active (delta = 0): take the pairs x = x out
      double diagonal = 0;
      for (int64_t a = 0; a < n; ++a) diagonal += per_label_[a] * W[a * n + a];
      value -= c * diagonal;
    }
    return value;
  }

  const scalar_t* D_;
  const int64_t* labels_;
  int64_t B_, n_;
  const double *L_, *U_, *E2_;
  scalar_t gamma_;
  bool official_;
  std::vector<Item<Key>> items_, scratch_;
  std::vector<scalar_t> s_;        // D[., q] in sorted order
  std::vector<int32_t> lab_;       // labels in sorted order
  std::vector<int64_t> pos_;       // pos[x] of the current hinge
  std::vector<double> g_;          // gradient in sorted order
  std::vector<double> counts_, per_label_, w_plus_, w_plus_t_;
};

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
  double* grad_ptr = need_grad ? grad.data_ptr<double>() : nullptr;
  std::vector<double> shares(K, 0.0);  // per rank of the range

  // One rank per task (tasks.h); each worker owns the buffers of one RankSum.
  const int64_t helpers = B * K < kSerialValues ? 0 : task_helpers(K);
  AT_DISPATCH_FLOATING_TYPES(D.scalar_type(), "grouped_order_sum_cpu", [&] {
    run_tasks(K, helpers, [&] {
      return [rank_sum = RankSum<scalar_t>(D.data_ptr<scalar_t>(), labels_ptr, B, n, L.data_ptr<double>(),
                                           U.data_ptr<double>(), E2.data_ptr<double>(),
                                           static_cast<scalar_t>(margin), conv == Convention::Official),
              &shares, grad_ptr, rank_begin](int64_t k) mutable {
        // x 0.5: the unordered pairs carry half of the ordered pairs x != y (docs/math.md §13.2)
        shares[k] = rank_sum.run(rank_begin + k, grad_ptr, 0.5);
      };
    });
  });
  double total = 0;
  for (const double share : shares) total += share;  // in rank order: any number of threads
  return {at::full({}, 0.5 * total, options), grad};
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CPU, m) {
  m.impl("grouped_order_sum", &grouped_order_sum_cpu);
}

} // namespace sol_ext
