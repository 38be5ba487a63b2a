// The order loss (docs/math.md §6, §7) at the capability's width: order_loss over all pairs and over
// explicit pairs, order_loss_block; forward and backward.
//
// Per pair the loss is  sum_q wA(q) [delta_q + gamma]+ + wB(q) [gamma - delta_q]+ + eq [|delta_q| - gamma]+
// with wA(q) = lt [q <= last_lower(r_x)] + gt [q >= r_x] and wB(q) = lt [q >= r_y] + gt [q <= last_lower(r_y)]
// (PairTerms, sol_math.h). The 0/1 factors depend on one label each, so they are two tables of rows set up
// once per call, low[r][q] = [q <= last_lower(r)] and high[r][q] = [q >= r], and every pair runs the same
// branch-free loop over whole vectors of ranks:
//   lt side += low[r_x] [delta + gamma]+ + high[r_y] [gamma - delta]+
//   gt side += high[r_x] [delta + gamma]+ + low[r_y] [gamma - delta]+
//   eq side += [|delta| - gamma]+
// The rows of D are copied padded to whole vectors with zeros (delta = 0 there, whose hinges the tables'
// zeros or gamma >= 0 cancel). The hinge decisions are those of PairTerms::grad, taken in D's dtype.
//
// All-pairs backward: each pair's rank gradient is computed once and added to both of its rows. The rows
// go in tiles of a size fixed by B (at most 16 per side); the tiles (I, I + k) of one diagonal k touch
// disjoint rows, so they run in parallel, and the diagonals run in order. Up to 512 rows (tiles of 32) the
// same sums come from one task per row of tiles instead, with no wait between diagonals
// (all_pairs_backward_by_tile_rows). Each row receives its sums in an order that depends on B alone:
// bitwise the same for any number of threads.

// Pairs per float partial sum, before it is added to a float64 row sum (as RowAccumulator did).
constexpr int kPairBlock = 32;

// Pairs evaluated side by side in one loop over the ranks. One pair's loop is a chain of dependent adds
// (bound by the add's latency); several pairs give the cores independent chains to fill both vector
// ports, and each pair keeps its own accumulators in its own order, so the results are those of one pair
// at a time. Two with 16 vector registers (SSE2), four with 32 or with 16 of twice the width.
constexpr int kPairsAtOnce = SOL_EXT_VECTOR_BYTES == 16 ? 2 : 4;
static_assert(kPairBlock % kPairsAtOnce == 0, "a pass of pairs never straddles a flush of the partial sums");

// f(k) for the pairs k = 0 .. K - 1 of a pass, k a compile-time constant: the pairs' accumulators are then
// registers (an array of them indexed in a loop is kept in memory around the loop).
template <typename F, int... k>
inline void each_pair_of(F& f, std::integer_sequence<int, k...>) {
  (f(std::integral_constant<int, k>{}), ...);
}
template <int K, typename F>
inline void each_pair(F&& f) {
  each_pair_of(f, std::make_integer_sequence<int, K>{});
}

template <typename T>
class PairKernel {
 public:
  using V = vec_t<T>;
  static constexpr int kLanes = Vec<T>::kLanes;

  explicit PairKernel(const OrderLossInputs<T>& in)
      : n_(in.n), stride_((in.n + kLanes - 1) / kLanes * kLanes), labels_(in.labels), labels_y_(in.labels_y),
        table_(in.table), gamma_(static_cast<T>(in.margin)) {
    D_ = padded(in.D, in.rows);
    // The y rows are D's own only when they are the same rows (order_loss_block's local rows at offset 0
    // begin where the gathered ones do, and are fewer).
    D_y_ = in.D_y == in.D && in.rows_y == in.rows ? std::vector<T>() : padded(in.D_y, in.rows_y);
    // Rank r's factors, vector by vector: low[r][c..c+lanes) then high[r][c..c+lanes), one pointer per rank.
    factors_.assign(n_ * 2 * stride_, T(0));
    for (int64_t r = 0; r < n_; ++r) {
      const int64_t last_lower = in.official ? r - 1 : r;
      for (int64_t q = 0; q < n_; ++q) {
        T* chunk = factors_.data() + r * 2 * stride_ + q / kLanes * 2 * kLanes + q % kLanes;
        chunk[0] = q <= last_lower ? T(1) : T(0);
        chunk[kLanes] = q >= r ? T(1) : T(0);
      }
    }
    // The forward's probabilities as its lanes take them (T(p), rounded once here rather than per pass).
    table_lanes_.assign(in.table, in.table + n_ * n_ * 3);
  }

  int64_t stride() const { return stride_; }

  // The losses of K pairs (x[k], y[k]), x a row of D, y one of D_y, into out[k]. kSameX: x[k] == x[0].
  // Inlined into the loops over pairs, which then keep the kernel's fields and constants in registers from
  // one pass to the next (as a call, its set-up was 40 % of the forward's time at n = 101).
  template <int K, bool kSameX>
  __attribute__((always_inline)) void losses(const int64_t* x, const int64_t* y, T* out) const {
    const Pairs<K> pairs = gather<K, kSameX>(x, y);
    const T* const *dx = pairs.dx, * const *dy = pairs.dy, * const *fx = pairs.fx, * const *fy = pairs.fy;
    const V g = splat(gamma_);
    V lt_side[K] = {}, gt_side[K] = {}, eq_side[K] = {};
    for (int64_t c = 0; c < stride_; c += kLanes) {
      each_pair<K>([&](auto k) {
        const V delta = load(dx[k] + c) - load(dy[k] + c);
        const V up = delta + g, down = g - delta;
        const V above = positive_part(up), below = positive_part(down);
        const T *low_x = fx[k] + 2 * c, *high_x = low_x + kLanes;
        const T *low_y = fy[k] + 2 * c, *high_y = low_y + kLanes;
        lt_side[k] += load(low_x) * above;
        lt_side[k] += load(high_y) * below;
        gt_side[k] += load(high_x) * above;
        gt_side[k] += load(low_y) * below;
        // [|delta| - g]+ is -[min(up, down)]-: |delta| - g rounds as -(g - |delta|) does, and the smaller
        // of up and down is g - |delta|. Two operations instead of three, the same number.
        eq_side[k] -= negative_part(smaller(up, down));
      });
    }
    V total[K];
    each_pair<K>([&](auto k) {
      const T* p = pairs.p_lanes[k];
      total[k] = p[0] * lt_side[k] + p[2] * gt_side[k] + p[1] * eq_side[k];
    });
    sum_lanes_of<T, K>(total, out);
  }

  // The loss of the pair (x, y).
  T loss(int64_t x, int64_t y) const {
    T out;
    losses<1, true>(&x, &y, &out);
    return out;
  }

  // The rank gradients of K pairs, scale[k] * d loss(x[k], y[k]) / d delta_q, each [stride] in float
  // partial sums: added to shared in the order k = 0, 1, ... (kSharedSign +1), subtracted from it (-1) or
  // not (0), and subtracted from own[k] when own is not null. kSameX: x[k] == x[0].
  template <int K, bool kSameX, int kSharedSign>
  void add_grads(const int64_t* x, const int64_t* y, const double* scale, T* shared, T* const* own) const {
    const Pairs<K> pairs = gather<K, kSameX>(x, y);
    const T* const *dx = pairs.dx, * const *dy = pairs.dy, * const *fx = pairs.fx, * const *fy = pairs.fy;
    V lt[K], eq[K], gt[K];
    for (int k = 0; k < K; ++k) {
      lt[k] = splat(T(scale[k] * pairs.p[k][0]));
      eq[k] = splat(T(scale[k] * pairs.p[k][1]));
      gt[k] = splat(T(scale[k] * pairs.p[k][2]));
    }
    const V g = splat(gamma_), minus_g = splat(T(-gamma_)), zero{};
    for (int64_t c = 0; c < stride_; c += kLanes) {
      V sum{};
      if (kSharedSign != 0) sum = load(shared + c);
#pragma GCC unroll 4
      for (int k = 0; k < K; ++k) {
        const V delta = load(dx[k] + c) - load(dy[k] + c);
        const T *low_x = fx[k] + 2 * c, *high_x = low_x + kLanes;
        const T *low_y = fy[k] + 2 * c, *high_y = low_y + kLanes;
        const V w_above = lt[k] * load(low_x) + gt[k] * load(high_x);
        const V w_below = lt[k] * load(high_y) + gt[k] * load(low_y);
        // In IEEE arithmetic delta + g > 0 exactly when delta > -g (and so on): PairTerms::grad's decisions.
#if SOL_EXT_VECTOR_BYTES == 64
        // ((a - b) + [delta > g] eq) - [delta < -g] eq as two masked operations (AVX-512's masks) instead
        // of two masked moves, an add and a subtract: adding or subtracting 0 changes only a zero's sign,
        // which no partial sum can tell (they start at +0, and a sum that starts at +0 never becomes -0).
        V grad = (delta > minus_g ? w_above : zero) - (delta < g ? w_below : zero);
        grad = delta > g ? grad + eq[k] : grad;
        grad = delta < minus_g ? grad - eq[k] : grad;
#else
        const V grad = (delta > minus_g ? w_above : zero) - (delta < g ? w_below : zero) +
                       (delta > g ? eq[k] : zero) - (delta < minus_g ? eq[k] : zero);
#endif
        if (kSharedSign > 0) sum = sum + grad;
        if (kSharedSign < 0) sum = sum - grad;
        if (own != nullptr) store(own[k] + c, load(own[k] + c) - grad);
      }
      if (kSharedSign != 0) store(shared + c, sum);
    }
  }

 private:
  std::vector<T> padded(const T* D, int64_t rows) const {
    std::vector<T> out(rows * stride_, T(0));
    for (int64_t x = 0; x < rows; ++x) std::copy(D + x * n_, D + (x + 1) * n_, out.data() + x * stride_);
    return out;
  }
  // What the loop over the ranks reads of K pairs (x[k], y[k]): their rows of D, their labels' factor
  // rows and their row of the probability table. kSameX: x[k] == x[0].
  template <int K>
  struct Pairs {
    const T *dx[K], *dy[K], *fx[K], *fy[K];
    const double* p[K];
    const T* p_lanes[K];  // the same row in T
  };
  template <int K, bool kSameX>
  Pairs<K> gather(const int64_t* x, const int64_t* y) const {
    Pairs<K> pairs;
    for (int k = 0; k < K; ++k) {
      const int64_t rx = labels_[x[kSameX ? 0 : k]], ry = labels_y_[y[k]];
      pairs.dx[k] = row(x[kSameX ? 0 : k]);
      pairs.dy[k] = row_y(y[k]);
      pairs.fx[k] = factors(rx);
      pairs.fy[k] = factors(ry);
      pairs.p[k] = table_ + (rx * n_ + ry) * 3;
      pairs.p_lanes[k] = table_lanes_.data() + (rx * n_ + ry) * 3;
    }
    return pairs;
  }

  const T* row(int64_t x) const { return D_.data() + x * stride_; }
  const T* row_y(int64_t y) const { return (D_y_.empty() ? D_.data() : D_y_.data()) + y * stride_; }
  const T* factors(int64_t r) const { return factors_.data() + r * 2 * stride_; }

  int64_t n_, stride_;
  const int64_t *labels_, *labels_y_;
  const double* table_;
  T gamma_;
  std::vector<T> D_, D_y_, factors_, table_lanes_;
};

// A float64 row sum fed by float partial sums of kPairBlock pairs each.
template <typename T>
class RowSum {
 public:
  explicit RowSum(int64_t stride) : partial_(stride, T(0)), total_(stride, 0.0) {}
  void reset() {
    std::fill(partial_.begin(), partial_.end(), T(0));
    std::fill(total_.begin(), total_.end(), 0.0);
    pending_ = 0;
  }
  T* partial() { return partial_.data(); }
  // count pairs were added to partial(): a pass of pairs (kPairsAtOnce) or one.
  void pairs_done(int count) {
    pending_ += count;
    if (pending_ == kPairBlock) flush();
  }
  void write(T* out, int64_t n) {
    flush();
    for (int64_t q = 0; q < n; ++q) out[q] = T(total_[q]);
  }

 private:
  void flush() {
    for (size_t q = 0; q < total_.size(); ++q) {
      total_[q] += partial_[q];
      partial_[q] = T(0);
    }
    pending_ = 0;
  }
  std::vector<T> partial_;
  std::vector<double> total_;
  int pending_ = 0;
};

// First pair (a, b) of the all-pairs order at linear index m.
inline void unravel_pair(int64_t m, int64_t B, int64_t& a, int64_t& b) {
  const double two_b = 2.0 * B - 1.0;
  a = static_cast<int64_t>((two_b - std::sqrt(std::max(0.0, two_b * two_b - 8.0 * m))) / 2.0);
  a = std::min(std::max<int64_t>(a, 0), B - 2);
  while (a > 0 && pair_index(a, a + 1, B) > m) --a;  // correct the float estimate
  while (a + 1 < B - 1 && pair_index(a + 1, a + 2, B) <= m) ++a;
  b = a + 1 + (m - pair_index(a, a + 1, B));
}

// The grain of the forward loops over pairs and of the backward loops over rows.
inline int64_t forward_grain(int64_t n) {
  return std::max<int64_t>(1, 32768 / n);
}
inline int64_t backward_grain(int64_t pairs_per_row, int64_t n) {
  return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, pairs_per_row * n));
}

// The pairs in ranges of forward_grain(n), each range a task (tasks.h), not an OpenMP team: after its region
// a team's threads spin on their cores for a while, and the backward's helpers that run next (or the
// dissimilarity's) would share a core with one (each pair's loss is its own: the same numbers either way).
template <typename T>
void all_pairs_forward(const OrderLossInputs<T>& in, T* losses) {
  const int64_t B = in.rows, M = B * (B - 1) / 2;
  const PairKernel<T> kernel(in);
  constexpr int K = kPairsAtOnce;
  const int64_t grain = forward_grain(in.n), tasks = (M + grain - 1) / grain;
  const auto range = [&](int64_t task) {
    const int64_t begin = task * grain, end = std::min(M, begin + grain);
    int64_t a, b, x[K], y[K];
    unravel_pair(begin, B, a, b);
    int64_t m = begin;
    for (; m + K <= end; m += K) {
      const bool same_x = b + K <= B;
      for (int k = 0; k < K; ++k) {
        x[k] = a;
        y[k] = b;
        if (++b == B) b = ++a + 1;
      }
      if (same_x) {
        kernel.template losses<K, true>(x, y, losses + m);
      } else {
        kernel.template losses<K, false>(x, y, losses + m);
      }
    }
    for (; m < end; ++m) {
      losses[m] = kernel.loss(a, b);
      if (++b == B) b = ++a + 1;
    }
  };
  run_tasks(tasks, task_helpers(tasks), [&] { return range; });
}

// Rows per tile side: at least 32, and at most 16 tiles per side.
inline int64_t tile_rows(int64_t B) {
  return std::max<int64_t>(32, (B + 15) / 16);
}

// The pairs x < y of tile (I, J): each pair's gradient once, into the float64 sums of its two rows, from
// float partial sums of at most kPairBlock pairs each.
template <typename T>
class TileWorker {
  static constexpr int K = kPairsAtOnce;

 public:
  TileWorker(const PairKernel<T>& kernel, int64_t B, int64_t tile, Strided<T> grad_losses)
      : kernel_(kernel), B_(B), tile_(tile), stride_(kernel.stride()), grad_losses_(grad_losses), x_partial_(stride_),
        y_partial_(tile * stride_) {}

  // x_sums, y_sums: [B, stride] float64 row sums. With y_slots ([B, stride], tile <= kPairBlock), the y rows'
  // partial sums of this tile, one per row, are written there instead of being added to y_sums.
  void run(int64_t I, int64_t J, double* x_sums, double* y_sums, T* y_slots = nullptr) {
    const int64_t x_begin = I * tile_, x_end = std::min(B_, x_begin + tile_);
    const int64_t y_begin = J * tile_, y_end = std::min(B_, y_begin + tile_);
    if (x_begin >= x_end || y_begin >= y_end) return;
    std::fill(y_partial_.begin(), y_partial_.end(), T(0));
    int64_t rows_in_y_partial = 0;
    for (int64_t x = x_begin; x < x_end; ++x) {
      const int64_t first_y = std::max(y_begin, x + 1);
      if (first_y < y_end) {
        std::fill(x_partial_.begin(), x_partial_.end(), T(0));
        int64_t m = pair_index(x, first_y, B_), y = first_y;
        int pending = 0;
        for (; y <= y_end - K; y += K, m += K) {  // kPairBlock is a whole number of these passes
          int64_t ys[K];
          double scales[K];
          T* y_rows[K];
          for (int k = 0; k < K; ++k) {
            ys[k] = y + k;
            scales[k] = double(grad_losses_[m + k]);
            y_rows[k] = y_partial_.data() + (y + k - y_begin) * stride_;
          }
          kernel_.template add_grads<K, true, +1>(&x, ys, scales, x_partial_.data(), y_rows);
          pending += K;
          if (pending == kPairBlock) {
            flush(x_partial_.data(), x_sums + x * stride_, stride_);
            pending = 0;
          }
        }
        for (; y < y_end; ++y, ++m) {
          const double scale = double(grad_losses_[m]);
          T* y_row = y_partial_.data() + (y - y_begin) * stride_;
          kernel_.template add_grads<1, true, +1>(&x, &y, &scale, x_partial_.data(), &y_row);
          if (++pending == kPairBlock) {
            flush(x_partial_.data(), x_sums + x * stride_, stride_);
            pending = 0;
          }
        }
        flush(x_partial_.data(), x_sums + x * stride_, stride_);
      }
      // each y row has at most kPairBlock pairs in its partial sum (with slots, the tile's rows are no more)
      if (++rows_in_y_partial == kPairBlock && y_slots == nullptr) {
        flush(y_partial_.data(), y_sums + y_begin * stride_, (y_end - y_begin) * stride_);
        rows_in_y_partial = 0;
      }
    }
    if (y_slots != nullptr) {
      std::copy(y_partial_.begin(), y_partial_.begin() + (y_end - y_begin) * stride_, y_slots + y_begin * stride_);
    } else {
      flush(y_partial_.data(), y_sums + y_begin * stride_, (y_end - y_begin) * stride_);
    }
  }

 private:
  static void flush(T* partial, double* sums, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      sums[i] += partial[i];
      partial[i] = T(0);
    }
  }
  const PairKernel<T>& kernel_;
  int64_t B_, tile_, stride_;
  Strided<T> grad_losses_;
  std::vector<T> x_partial_, y_partial_;
};

// Up to 512 rows (tiles of kPairBlock rows): one task per row of tiles I, which runs the tiles (I, I), (I, I + 1),
// ... in order and so adds tile I's x rows' partial sums to their float64 sums in the order of the diagonals;
// tile (I, J)'s y rows get one partial sum each, kept in slot I, and a last pass adds each row's slots in the
// diagonals' order (I = J, J - 1, ..., 0). Every sum is then what the diagonals give, bitwise, with one
// call to run_tasks instead of one per diagonal (whose waits cost more than a small batch's arithmetic).
template <typename T>
void all_pairs_backward_by_tile_rows(const PairKernel<T>& kernel, int64_t B, int64_t n, Strided<T> grad_losses,
                                     bool serial, T* grad_D) {
  const int64_t stride = kernel.stride(), tile = kPairBlock, tiles = (B + tile - 1) / tile;
  LargeVector<double> x_sums(B * stride);
  LargeVector<T> y_slots(tiles * B * stride);  // slot I of row y: tile (I, J(y))'s partial sum
  run_tasks(tiles, serial ? 0 : task_helpers(tiles), [&] {
    return [&, worker = TileWorker<T>(kernel, B, tile, grad_losses)](int64_t I) mutable {
      const int64_t rows_begin = I * tile, rows_end = std::min(B, rows_begin + tile);
      std::fill(x_sums.data() + rows_begin * stride, x_sums.data() + rows_end * stride, 0.0);
      for (int64_t J = I; J < tiles; ++J) worker.run(I, J, x_sums.data(), nullptr, y_slots.data() + I * B * stride);
    };
  });
  std::vector<double> y_sum(stride);
  for (int64_t y = 0; y < B; ++y) {
    std::fill(y_sum.begin(), y_sum.end(), 0.0);
    for (int64_t I = y / tile; I >= 0; --I) {
      const T* slot = y_slots.data() + (I * B + y) * stride;
      for (int64_t q = 0; q < stride; ++q) y_sum[q] += slot[q];
    }
    for (int64_t q = 0; q < n; ++q) grad_D[y * n + q] = T(x_sums[y * stride + q] + y_sum[q]);
  }
}

template <typename T>
void all_pairs_backward(const OrderLossInputs<T>& in, Strided<T> grad_losses, T* grad_D) {
  const int64_t B = in.rows, n = in.n;
  const PairKernel<T> kernel(in);
  const int64_t stride = kernel.stride(), tile = tile_rows(B), tiles = (B + tile - 1) / tile;
  const bool serial = B * B * n < (int64_t{1} << 20);
  if (tile <= kPairBlock) {
    all_pairs_backward_by_tile_rows(kernel, B, n, grad_losses, serial, grad_D);
    return;
  }
  // Row x's gradient: x_sums[x] (its pairs as x) + y_sums[x] (as y, where add_grads subtracts).
  std::vector<double> x_sums(B * stride, 0.0), y_sums(B * stride, 0.0);
  for (int64_t k = 0; k < tiles; ++k) {  // diagonal k: tiles (I, I + k), disjoint rows on each side
    const int64_t count = tiles - k;
    run_tasks(count, serial ? 0 : task_helpers(count), [&] {
      return [worker = TileWorker<T>(kernel, B, tile, grad_losses), &x_sums, &y_sums, k](int64_t I) mutable {
        worker.run(I, I + k, x_sums.data(), y_sums.data());
      };
    });
  }
  for (int64_t x = 0; x < B; ++x) {
    for (int64_t q = 0; q < n; ++q) grad_D[x * n + q] = T(x_sums[x * stride + q] + y_sums[x * stride + q]);
  }
}

template <typename T>
void pairs_forward(const OrderLossInputs<T>& in, const int64_t* pairs, int64_t M, T* losses) {
  const PairKernel<T> kernel(in);
  constexpr int K = kPairsAtOnce;
  at::parallel_for(0, M, forward_grain(in.n), [&](int64_t begin, int64_t end) {
    int64_t m = begin, x[K], y[K];
    for (; m + K <= end; m += K) {
      for (int k = 0; k < K; ++k) {
        x[k] = pairs[2 * (m + k)];
        y[k] = pairs[2 * (m + k) + 1];
      }
      kernel.template losses<K, false>(x, y, losses + m);
    }
    for (; m < end; ++m) losses[m] = kernel.loss(pairs[2 * m], pairs[2 * m + 1]);
  });
}

// Each row of grad_D summed by one worker over its pairs (row_start, entries) in pair order. A pair whose y
// the row is adds the gradient of the negated scale: -(a gradient) is that of -scale bitwise (each rounding
// is symmetric), and acc - grad is acc + (-grad).
template <typename T>
void pairs_backward(const OrderLossInputs<T>& in, const int64_t* pairs, const int64_t* row_start,
                    const int64_t* entries, Strided<T> grad_losses, T* grad_D) {
  const int64_t B = in.rows, n = in.n;
  const PairKernel<T> kernel(in);
  const int64_t per_row = B > 0 ? row_start[B] / B : 0;
  at::parallel_for(0, B, backward_grain(per_row, n), [&](int64_t begin, int64_t end) {
    constexpr int K = kPairsAtOnce;
    RowSum<T> row(kernel.stride());
    int64_t xs[K], ys[K];
    double scales[K];
    for (int64_t x = begin; x < end; ++x) {
      row.reset();
      int64_t e = row_start[x];
      const auto take = [&](int k) {
        const int64_t m = entries[e + k] / 2;
        const double g = double(grad_losses[m]);
        xs[k] = pairs[2 * m];
        ys[k] = pairs[2 * m + 1];
        scales[k] = entries[e + k] % 2 == 0 ? g : -g;  // even: this row is the pair's x
      };
      for (; e + K <= row_start[x + 1]; e += K) {
        for (int k = 0; k < K; ++k) take(k);
        kernel.template add_grads<K, false, +1>(xs, ys, scales, row.partial(), nullptr);
        row.pairs_done(K);
      }
      for (; e < row_start[x + 1]; ++e) {
        take(0);
        kernel.template add_grads<1, false, +1>(xs, ys, scales, row.partial(), nullptr);
        row.pairs_done(1);
      }
      row.write(grad_D + x * n, n);
    }
  });
}

// Local row i owns the pairs (i, j) of the gathered rows with j > offset + i.
template <typename T>
void block_forward(const OrderLossInputs<T>& in, int64_t offset, T* row_sums) {
  const int64_t B = in.rows, N = in.rows_y, n = in.n;
  const PairKernel<T> kernel(in);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, N * n));
  at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
    constexpr int K = kPairsAtOnce;
    int64_t js[K];
    T values[K];
    for (int64_t i = begin; i < end; ++i) {
      double total = 0;
      int64_t j = offset + i + 1;
      for (; j + K <= N; j += K) {
        for (int k = 0; k < K; ++k) js[k] = j + k;
        kernel.template losses<K, true>(&i, js, values);
        for (int k = 0; k < K; ++k) total += values[k];
      }
      for (; j < N; ++j) total += kernel.loss(i, j);
      row_sums[i] = T(total);
    }
  });
}

// d/dD[i]: the pairs of local row i in j order (x side); d/dD_all[j]: the local rows i with offset + i < j,
// in i order (y side). Each row is one worker's.
template <typename T>
void block_backward(const OrderLossInputs<T>& in, int64_t offset, Strided<T> grad_rows, T* grad_D, T* grad_D_all) {
  const int64_t B = in.rows, N = in.rows_y, n = in.n;
  const PairKernel<T> kernel(in);
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, B * n));
  constexpr int K = kPairsAtOnce;
  if (grad_D != nullptr) {
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      RowSum<T> row(kernel.stride());
      int64_t js[K];
      for (int64_t i = begin; i < end; ++i) {
        row.reset();
        const double scale = double(grad_rows[i]);
        double scales[K];
        std::fill(scales, scales + K, scale);
        int64_t j = offset + i + 1;
        for (; j + K <= N; j += K) {
          for (int k = 0; k < K; ++k) js[k] = j + k;
          kernel.template add_grads<K, true, +1>(&i, js, scales, row.partial(), nullptr);
          row.pairs_done(K);
        }
        for (; j < N; ++j) {
          kernel.template add_grads<1, true, +1>(&i, &j, &scale, row.partial(), nullptr);
          row.pairs_done(1);
        }
        row.write(grad_D + i * n, n);
      }
    });
  }
  if (grad_D_all != nullptr) {
    at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
      RowSum<T> row(kernel.stride());
      int64_t is[K], js[K];
      double scales[K];
      for (int64_t j = begin; j < end; ++j) {
        const int64_t rows = std::min(B, j - offset);
        if (rows <= 0) continue;  // no local row pairs with j: its gradient stays 0
        row.reset();
        int64_t i = 0;
        for (; i + K <= rows; i += K) {
          for (int k = 0; k < K; ++k) {
            is[k] = i + k;
            js[k] = j;
            scales[k] = double(grad_rows[i + k]);
          }
          kernel.template add_grads<K, false, -1>(is, js, scales, row.partial(), nullptr);
          row.pairs_done(K);
        }
        for (; i < rows; ++i) {
          const double scale = double(grad_rows[i]);
          kernel.template add_grads<1, false, -1>(&i, &j, &scale, row.partial(), nullptr);
          row.pairs_done(1);
        }
        row.write(grad_D_all + j * n, n);
      }
    });
  }
}

#define SOL_EXT_DEFINE_ORDER_LOSS_KERNELS(T)                                                                       \
  void order_loss_all_pairs_forward(const OrderLossInputs<T>& inputs, T* losses) {                                \
    all_pairs_forward(inputs, losses);                                                                            \
  }                                                                                                               \
  void order_loss_all_pairs_backward(const OrderLossInputs<T>& inputs, Strided<T> grad_losses, T* grad_D) {       \
    all_pairs_backward(inputs, grad_losses, grad_D);                                                              \
  }                                                                                                               \
  void order_loss_pairs_forward(const OrderLossInputs<T>& inputs, const int64_t* pairs, int64_t M, T* losses) {  \
    pairs_forward(inputs, pairs, M, losses);                                                                      \
  }                                                                                                               \
  void order_loss_pairs_backward(const OrderLossInputs<T>& inputs, const int64_t* pairs, const int64_t* row_start, \
                                 const int64_t* entries, Strided<T> grad_losses, T* grad_D) {                     \
    pairs_backward(inputs, pairs, row_start, entries, grad_losses, grad_D);                                       \
  }                                                                                                               \
  void order_loss_block_forward(const OrderLossInputs<T>& inputs, int64_t offset, T* row_sums) {                  \
    block_forward(inputs, offset, row_sums);                                                                      \
  }                                                                                                               \
  void order_loss_block_backward(const OrderLossInputs<T>& inputs, int64_t offset, Strided<T> grad_rows,          \
                                 T* grad_D, T* grad_D_all) {                                                      \
    block_backward(inputs, offset, grad_rows, grad_D, grad_D_all);                                                \
  }
SOL_EXT_DEFINE_ORDER_LOSS_KERNELS(float)
SOL_EXT_DEFINE_ORDER_LOSS_KERNELS(double)
#undef SOL_EXT_DEFINE_ORDER_LOSS_KERNELS
