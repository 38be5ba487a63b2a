// grouped_order_sum's per-rank work (docs/math.md §13) at the capability's width: sort one rank's column,
// sweep it per hinge family (grouped_order_loss_kernel.cpp says how the op splits and sums the ranks).

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

// A value's key and a payload: its row, shifted left by RankSum's label bits, with its label in those
// bits (no label bits, the row alone, where the two do not fit in 32 bits). Payloads grow with the row, so
// sorting by (key, payload) sorts ties by row; the labels then come out in sorted order from the sort
// itself rather than from reads of labels[row] all over the batch.
template <typename Key>
struct Item {
  Key key;
  uint32_t payload;
};

// An LSD radix sort of items by key on digits of kDigitBits bits: stable, so ties stay in payload order
// (the order the items arrive in). A digit that every key shares takes no pass. The sorted items end in
// `items` (the vectors are swapped when they end in `scratch`).
template <int kDigitBits, typename Key>
void radix_sort(LargeVector<Item<Key>>& items, LargeVector<Item<Key>>& scratch) {
  constexpr int kDigits = (8 * sizeof(Key) + kDigitBits - 1) / kDigitBits;
  constexpr int kRadix = 1 << kDigitBits;
  constexpr Key kDigitMask = kRadix - 1;
  const int64_t B = static_cast<int64_t>(items.size());
  std::vector<uint32_t> histogram(kDigits * kRadix, 0);  // B < 2^31
  for (const auto& item : items) {
    for (int digit = 0; digit < kDigits; ++digit) {
      ++histogram[digit * kRadix + ((item.key >> (kDigitBits * digit)) & kDigitMask)];
    }
  }
  scratch.resize(B);
  Item<Key>* from = items.data();
  Item<Key>* to = scratch.data();
  for (int digit = 0; digit < kDigits; ++digit) {
    uint32_t* count = histogram.data() + digit * kRadix;
    const int shift = kDigitBits * digit;
    if (count[(from[0].key >> shift) & kDigitMask] == B) continue;  // one value of this digit: nothing to move
    uint32_t start = 0;
    for (int v = 0; v < kRadix; ++v) std::swap(count[v], start), start += count[v];  // exclusive prefix sums
    for (int64_t i = 0; i < B; ++i) to[count[(from[i].key >> shift) & kDigitMask]++] = from[i];
    std::swap(from, to);
  }
  if (from != items.data()) items.swap(scratch);
}

// Sorts items by key, ties by payload (the items arrive in payload order): a radix sort, several times
// faster than a comparison sort on long columns, with 11-bit digits on the longest (3 passes over 4-byte
// keys instead of 4; below 2^14 items the 2048 counters of a pass cost more than the pass saved);
// std::sort for short columns. Every one gives the same order: the keys and payloads decide it.
template <typename Key>
void sort_items(LargeVector<Item<Key>>& items, LargeVector<Item<Key>>& scratch) {
  const int64_t B = static_cast<int64_t>(items.size());
  if (B < 256) {
    std::sort(items.begin(), items.end(), [](const Item<Key>& a, const Item<Key>& b) {
      return a.key < b.key || (a.key == b.key && a.payload < b.payload);
    });
  } else if (B < (int64_t(1) << 14)) {
    radix_sort<8>(items, scratch);
  } else {
    radix_sort<11>(items, scratch);
  }
}

// The number of bits that hold 0 .. largest.
inline int bits_for(int64_t largest) {
  int bits = 0;
  while (bits < 63 && (largest >> bits) != 0) ++bits;
  return bits;
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

#if SOL_EXT_VECTOR_BYTES == 64
// The label-weight dot product in the order GCC's vectorized reduction below gives it at this width (one
// loop, never inlined there): eight lanes over whole vectors, the remainder into lane 0, then 0 + lane 0
// + ... + lane 7. Written out it inlines into the sweeps, which no longer pay a call and a round trip of
// the lanes through memory per product; the numbers are the same. Below eight terms lanes 1 .. 7 stay
// +0, and 0 + lane 0 is never -0, so adding them changes nothing: the short dot product (a few ranks,
// the common case) skips those seven dependent additions.
// b(k) gives the k-th value of the second vector: label counts stored as doubles or as integers.
template <typename Values>
__attribute__((always_inline)) inline double dot_with(const double* a, int64_t n, const Values& b) {
  constexpr int kLanes = 8;
  if (n < kLanes) {
    double lane0 = 0;
    for (int64_t k = 0; k < n; ++k) lane0 = std::fma(a[k], b(k), lane0);
    return 0.0 + lane0;
  }
  double lane[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] = std::fma(a[k + l], b(k + l), lane[l]);
  }
  for (; k < n; ++k) lane[0] = std::fma(a[k], b(k), lane[0]);
  double s = 0;
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  return s;
}
__attribute__((always_inline)) inline double dot(const double* a, const double* b, int64_t n) {
  return dot_with(a, n, [b](int64_t k) { return b[k]; });
}
#else
inline double dot(const double* a, const double* b, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < n; ++k) s += a[k] * b[k];
  return s;
}
#endif

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
        label_bits_(bits_for(B - 1) + bits_for(n - 1) <= 32 ? bits_for(n - 1) : -1), items_(B),
        s_(B + past_column(n)), lab_(B), pos_(B + past_column(n)),
        pos2_(SOL_EXT_VECTOR_BYTES == 64 ? B + past_column(n) : 0), g_(B), counts_(count_sweep(n) ? (B + 1) * n : 0),
        x2_(count_sweep(n) ? B : 0), below_(n), above_(n), below2_(n), above2_(n), per_label_(n), w_plus_(n * n),
        w_plus_t_(n * n) {
    for (int64_t i = 0; i < B; ++i) per_label_[labels[i]] += 1;  // the same for every rank
    // past the column: values that no hinge takes in (sweep_counts reads a vector from any position)
    std::fill(s_.begin() + B, s_.end(), std::numeric_limits<scalar_t>::infinity());
  }

  // On AVX-512 up to 16 ranks the label counts below a position fit in one vector: sweep_counts reads
  // them from a table (counts_) instead of keeping them as the samples enter, and takes no branch per
  // sample, about 1.5 times as fast as sweep at n = 7. With longer rows the table costs more than it saves.
  static bool count_sweep(int64_t n) { return SOL_EXT_VECTOR_BYTES == 64 && n <= 16; }
  // What sweep_counts reads and writes past the column: 16 values of s (a vector of floats, two of
  // doubles) and of first_above.
  static int64_t past_column(int64_t n) { return count_sweep(n) ? 16 : 0; }

  // Rank q's share of the sum over the ordered pairs x != y; writes `scale` times d(share)/dD[x, q] to
  // column[x] (x < B) when column is not null. NaN (value and gradient) when D[., q] holds a NaN, as the
  // pairwise kernels give.
  double run(int64_t q, double* column, double scale) {
    const int64_t B = B_, n = n_;
    const bool packed = label_bits_ >= 0;
    for (int64_t i = 0; i < B; ++i) {
      const scalar_t v = D_[i * n + q];
      if (std::isnan(v)) {
        if (column != nullptr) std::fill(column, column + B, std::numeric_limits<double>::quiet_NaN());
        return std::numeric_limits<double>::quiet_NaN();
      }
      const uint32_t row = static_cast<uint32_t>(i);
      items_[i] = {sort_key<Key>(v), packed ? row << label_bits_ | static_cast<uint32_t>(labels_[i]) : row};
    }
    sort_items(items_, scratch_);
    const uint32_t label_mask = packed ? (uint32_t(1) << label_bits_) - 1 : 0;
    for (int64_t i = 0; i < B; ++i) {
      const uint32_t payload = items_[i].payload;
      s_[i] = from_key<scalar_t>(items_[i].key);
      lab_[i] = static_cast<int32_t>(packed ? payload & label_mask : labels_[payload]);
    }
    set_weights(q);
    std::fill(g_.begin(), g_.end(), 0.0);
    const double gamma = static_cast<double>(gamma_);
    double value = 0;
#if SOL_EXT_VECTOR_BYTES == 64
    const auto sweep_families = [this](std::initializer_list<Family*> families) {
      if (count_sweep(n_)) {
        sweep_counts(families);
      } else {
        sweep(families);
      }
    };
    if (gamma_ == scalar_t(0)) {  // [delta]+ and the positive half of [|delta|]+ are one hinge (§13.1)
      Family one{w_plus_.data(), w_plus_t_.data(), 0.0, scalar_t(0), pos_.data(), below_.data(), above_.data()};
      sweep_families({&one});
      value += side_value(one);
    } else {
      Family plus{w_plus_.data(), w_plus_t_.data(), gamma, -gamma_, pos_.data(), below_.data(), above_.data()};
      Family abs{E2_, E2_, -gamma, gamma_, pos2_.data(), below2_.data(), above2_.data()};  // E2 is symmetric
      sweep_families({&plus, &abs});
      value += side_value(plus);
      value += side_value(abs);
    }
#else
    if (gamma_ == scalar_t(0)) {  // [delta]+ and the positive half of [|delta|]+ are one hinge (§13.1)
      value += sweep(w_plus_.data(), w_plus_t_.data(), 0.0, scalar_t(0));
    } else {
      value += sweep(w_plus_.data(), w_plus_t_.data(), gamma, -gamma_);
      value += sweep(E2_, E2_, -gamma, gamma_);  // E2 is symmetric
    }
#endif
    // <gradient, D>, with D[., q] taken about the middle of its range (§13.3)
    const double mid = 0.5 * (static_cast<double>(s_[0]) + static_cast<double>(s_[B - 1]));
    BlockSum inner;
    for (int64_t i = 0; i < B; ++i) inner.add(g_[i] * (static_cast<double>(s_[i]) - mid));
    if (column != nullptr) {
      const int row_shift = packed ? label_bits_ : 0;
      for (int64_t i = 0; i < B; ++i) column[items_[i].payload >> row_shift] = scale * g_[i];
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

#if SOL_EXT_VECTOR_BYTES == 64
  // One hinge family, h(D[x, q] - D[y, q] + c) with weights W(r_x, r_y) (W_t: W transposed), active when
  // the difference exceeds `threshold` (= -c in scalar_t), and where its sweep stands.
  // x's side: the y active with the x at position i are the sorted positions 0 .. pos[i] - 1 (pos does
  // not decrease); `below` holds their labels. y's side: the x active with the y at position j are the
  // positions first_above .. B - 1, where first_above = #{x: pos[x] <= j}; `above` holds their labels.
  // (sweep_counts keeps first_above of every j in `pos` instead.)
  struct Family {
    const double *W, *W_t;
    double c;
    scalar_t threshold;
    int32_t* pos;
    double *below, *above;
    int64_t p = 0, first_above = 0;
    int64_t x_done = 0, y_done = 0;  // positions whose x side, y side, is in g_
    BlockSum x_sides;
  };

  // x's side of the next position: its gradient into g_, and pos.
  void x_side(Family& f) {
    const int64_t B = B_, n = n_, i = f.x_done++;
    const scalar_t x = s_[i];
    while (f.p < B && scalar_t(x - s_[f.p]) > f.threshold) f.below[lab_[f.p++]] += 1;
    f.pos[i] = static_cast<int32_t>(f.p);
    const double side = dot(f.W + lab_[i] * n, f.below, n);
    g_[i] += side;
    f.x_sides.add(side);
  }

  // y's side of the next position j, once it is ready: pos[x] is known up to the first x with pos[x] > j
  // (once x's side has passed position i, that x is at most i for every j < pos[i]), and j has its x side.
  bool y_side_ready(const Family& f) const { return f.y_done < std::min(f.p, f.x_done); }
  void y_side(Family& f) {
    const int64_t B = B_, n = n_, j = f.y_done++;
    while (f.first_above < B && f.pos[f.first_above] <= j) f.above[lab_[f.first_above++]] -= 1;
    g_[j] -= dot(f.W_t + lab_[j] * n, f.above, n);
  }

  // The families' sweeps (one or two) in one pass over the sorted column, the second family's sides
  // trailing the first's: every position gets its gradient terms in the order that one pass per side and
  // per family gives, x's side then y's, first family then second (the same numbers), while the sorted
  // column's data are still in cache.
  void sweep(std::initializer_list<Family*> families) {
    for (Family* f : families) {
      std::fill(f->below, f->below + n_, 0.0);
      std::copy(per_label_.begin(), per_label_.end(), f->above);
    }
    Family& first = **families.begin();
    Family* second = families.size() > 1 ? *(families.begin() + 1) : nullptr;
    const auto advance_second = [&](int64_t done) {  // second's sides up to the positions first has done
      while (second->x_done < done) {
        x_side(*second);
        while (y_side_ready(*second)) y_side(*second);
      }
    };
    for (int64_t i = 0; i < B_; ++i) {
      x_side(first);
      while (y_side_ready(first)) y_side(first);
      if (second != nullptr) advance_second(first.y_done);
    }
    while (first.y_done < B_) y_side(first);
    if (second != nullptr) {
      advance_second(B_);
      while (second->y_done < B_) y_side(*second);
    }
  }

  static constexpr int kWindow = 64 / sizeof(scalar_t);  // values in a vector

  // counts[p * n + b] = #{p' < p: lab[p'] = b} for p = 0 .. B, the counts in one vector.
  void count_labels() {
    const int64_t B = B_, n = n_;
    int32_t* counts = counts_.data();
    const __mmask16 row = static_cast<__mmask16>((1u << n) - 1);
    __m512i c = _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(counts, row, c);
    for (int64_t p = 0; p < B; ++p) {
      c = _mm512_mask_add_epi32(c, static_cast<__mmask16>(1u << lab_[p]), c, _mm512_set1_epi32(1));
      _mm512_mask_storeu_epi32(counts + (p + 1) * n, row, c);
    }
  }

  // #{l < kWindow: x - s[l] > threshold}, the difference rounded to scalar_t as in x_side: a prefix of
  // the window, s being ascending.
  static int active_in_window(const scalar_t* s, scalar_t x, scalar_t threshold) {
    if constexpr (std::is_same_v<scalar_t, float>) {
      const __m512 difference = _mm512_sub_ps(_mm512_set1_ps(x), _mm512_loadu_ps(s));
      return __builtin_popcount(_mm512_cmp_ps_mask(difference, _mm512_set1_ps(threshold), _CMP_GT_OQ));
    } else {
      const __m512d difference = _mm512_sub_pd(_mm512_set1_pd(x), _mm512_loadu_pd(s));
      return __builtin_popcount(_mm512_cmp_pd_mask(difference, _mm512_set1_pd(threshold), _CMP_GT_OQ));
    }
  }

  // sweep's numbers in two passes, x sides then y sides: each side is the same dot product of a weight
  // row with the same label counts, read from the table; pos moves a vector of comparisons at a time, and
  // each x writes itself as first_above of the positions it passes, so that no sample waits on a branch.
  // Each position gets its terms in sweep's order: x's side then y's, first family then second.
  void sweep_counts(std::initializer_list<Family*> families) {
    const int64_t B = B_, n = n_;
    count_labels();
    const int32_t* counts = counts_.data();
    const int32_t* total = counts + B * n;
    double* x2 = x2_.data();
    Family& one = **families.begin();
    Family* two = families.size() > 1 ? *(families.begin() + 1) : nullptr;
    // f.pos[j] = x for j in from .. to - 1, and for up to 15 positions past them, which later x (or the
    // last call) overwrite: then pos[j] = the first x with pos[x] > j = #{x: pos[x] <= j}.
    const auto first_above = [](Family& f, int64_t from, int64_t to, int64_t x) {
      const __m512i value = _mm512_set1_epi32(static_cast<int32_t>(x));
      _mm512_storeu_si512(f.pos + from, value);
      for (int64_t j = from + 16; j < to; j += 16) _mm512_storeu_si512(f.pos + j, value);
    };
    const auto x_side = [&](Family& f, scalar_t x, int32_t label, int64_t i) {
      const int64_t before = f.p;
      int active;
      while ((active = active_in_window(s_.data() + f.p, x, f.threshold)) == kWindow) f.p += kWindow;
      f.p += active;
      first_above(f, before, f.p, i);
      const int32_t* below = counts + f.p * n;
      const double side = dot_with(f.W + label * n, n, [below](int64_t k) { return double(below[k]); });
      f.x_sides.add(side);
      return side;
    };
    const auto y_side = [&](const Family& f, int32_t label, int64_t j) {
      const int32_t* counted = counts + f.pos[j] * n;  // the labels of the x below first_above
      return dot_with(f.W_t + label * n, n, [total, counted](int64_t k) { return double(total[k] - counted[k]); });
    };
    for (int64_t i = 0; i < B; ++i) {
      g_[i] += x_side(one, s_[i], lab_[i], i);
      if (two != nullptr) x2[i] = x_side(*two, s_[i], lab_[i], i);
    }
    first_above(one, one.p, B, B);
    if (two != nullptr) first_above(*two, two->p, B, B);
    int64_t j = 0;
    if (n < 8) {  // eight positions at a time, one per lane: each lane the fused multiply-adds of y_side
      __m512d w_one[8], w_two[8];
      weight_columns(one, w_one);
      if (two != nullptr) weight_columns(*two, w_two);
      const auto y_sides = [&](const Family& f, const __m512d* w, __m512i labels) {
        const __m512i rows = _mm512_mullo_epi64(_mm512_cvtepi32_epi64(_mm256_loadu_si256(
                                                    reinterpret_cast<const __m256i*>(f.pos + j))),
                                                _mm512_set1_epi64(n));
        __m512d side = _mm512_setzero_pd();
        for (int64_t k = 0; k < n; ++k) {
          const __m256i counted = _mm512_i64gather_epi32(_mm512_add_epi64(rows, _mm512_set1_epi64(k)), counts, 4);
          const __m512d above = _mm512_cvtepi32_pd(_mm256_sub_epi32(_mm256_set1_epi32(total[k]), counted));
          side = _mm512_fmadd_pd(_mm512_permutexvar_pd(labels, w[k]), above, side);
        }
        return _mm512_add_pd(_mm512_setzero_pd(), side);  // dot_with's 0.0 + lane0
      };
      for (; j + 8 <= B; j += 8) {
        const __m512i labels =
            _mm512_cvtepi32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lab_.data() + j)));
        __m512d g = _mm512_sub_pd(_mm512_loadu_pd(g_.data() + j), y_sides(one, w_one, labels));
        if (two != nullptr) {
          g = _mm512_add_pd(g, _mm512_loadu_pd(x2 + j));
          g = _mm512_sub_pd(g, y_sides(*two, w_two, labels));
        }
        _mm512_storeu_pd(g_.data() + j, g);
      }
    }
    for (; j < B; ++j) {
      g_[j] -= y_side(one, lab_[j], j);
      if (two != nullptr) {
        g_[j] += x2[j];
        g_[j] -= y_side(*two, lab_[j], j);
      }
    }
  }

  // w[k], lane a: W_t[a, k], for k, a < n < 8 (lanes from n on: 0, never read).
  void weight_columns(const Family& f, __m512d* w) const {
    const int64_t n = n_;
    for (int64_t k = 0; k < n; ++k) {
      double column[8] = {};
      for (int64_t a = 0; a < n; ++a) column[a] = f.W_t[a * n + k];
      w[k] = _mm512_loadu_pd(column);
    }
  }

  // The part of a family's value that is not <gradient, D>: c times the sum of the x sides, less the
  // pairs x = y (§13.2, §13.3).
  double side_value(const Family& f) const {
    if (f.c == 0) return 0.0;
    const int64_t n = n_;
    double value = f.c * f.x_sides.value();
    if (scalar_t(0) > f.threshold) {  // x's own hinge is active (delta = 0): take the pairs x = x out
      double diagonal = 0;
      for (int64_t a = 0; a < n; ++a) diagonal += per_label_[a] * f.W[a * n + a];
      value -= f.c * diagonal;
    }
    return value;
  }
#else
  // One hinge family, h(D[x, q] - D[y, q] + c) with weights W(r_x, r_y) (W_t: W transposed), active when
  // the difference exceeds `threshold` (= -c in scalar_t). Adds its gradient to g_ (sorted order) and
  // returns the part of the value that is not <gradient, D>: c times the sum of the x sides, less the
  // pairs x = y (§13.2, §13.3). Two passes, x's side then y's: GCC's vectorized dot (above) takes its
  // summation order from the loop it is inlined into, and these two loops give the numbers this
  // capability has always given (AVX-512's sweep above is one pass).
  double sweep(const double* W, const double* W_t, double c, scalar_t threshold) {
    const int64_t B = B_, n = n_;
    // x's side: the y active with x are the sorted positions 0 .. pos[x] - 1 (pos does not decrease).
    std::fill(below_.begin(), below_.end(), 0.0);
    BlockSum x_sides;
    int64_t p = 0;
    for (int64_t i = 0; i < B; ++i) {
      const scalar_t x = s_[i];
      while (p < B && scalar_t(x - s_[p]) > threshold) below_[lab_[p++]] += 1;
      pos_[i] = static_cast<int32_t>(p);
      const double side = dot(W + lab_[i] * n, below_.data(), n);
      g_[i] += side;
      x_sides.add(side);
    }
    // y's side: the x active with the y at position i are the positions first_above .. B - 1, where
    // first_above = #{x: pos[x] <= i}; `above_` holds the labels of those x.
    std::copy(per_label_.begin(), per_label_.end(), above_.begin());
    int64_t first_above = 0;
    for (int64_t i = 0; i < B; ++i) {
      while (first_above < B && pos_[first_above] <= i) above_[lab_[first_above++]] -= 1;
      g_[i] -= dot(W_t + lab_[i] * n, above_.data(), n);
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
#endif

  const scalar_t* D_;
  const int64_t* labels_;
  int64_t B_, n_;
  const double *L_, *U_, *E2_;
  scalar_t gamma_;
  bool official_;
  int label_bits_;  // of the items' payloads, or -1: the payload is the row alone (Item)
  LargeVector<Item<Key>> items_, scratch_;
  LargeVector<scalar_t> s_;        // D[., q] in sorted order
  LargeVector<int32_t> lab_;       // labels in sorted order
  LargeVector<int32_t> pos_;       // pos[x] of the current hinge (B < 2^31); sweep_counts: first_above
  LargeVector<int32_t> pos2_;      // the same of the second family (AVX-512)
  LargeVector<double> g_;          // gradient in sorted order
  LargeVector<int32_t> counts_;    // label counts below each position (sweep_counts)
  LargeVector<double> x2_;         // the second family's x sides (sweep_counts)
  std::vector<double> below_, above_, below2_, above2_;  // label counts of the families' two sides
  std::vector<double> per_label_, w_plus_, w_plus_t_;
};

// One rank per task (tasks.h); each worker owns the buffers of one RankSum, and writes its ranks' slots
// and gradient columns.
template <typename scalar_t>
void rank_shares(const GroupedInputs<scalar_t>& in, double* shares, double* columns) {
  run_tasks(in.rank_end - in.rank_begin, in.helpers, [&] {
    return [rank_sum = RankSum<scalar_t>(in.D, in.labels, in.B, in.n, in.L, in.U, in.E2,
                                         static_cast<scalar_t>(in.margin), in.official),
            shares, columns, B = in.B, rank_begin = in.rank_begin](int64_t k) mutable {
      // x 0.5: the unordered pairs carry half of the ordered pairs x != y (docs/math.md §13.2)
      shares[k] = rank_sum.run(rank_begin + k, columns == nullptr ? nullptr : columns + k * B, 0.5);
    };
  });
}

void grouped_rank_shares(const GroupedInputs<float>& inputs, double* shares, double* columns) {
  rank_shares(inputs, shares, columns);
}
void grouped_rank_shares(const GroupedInputs<double>& inputs, double* shares, double* columns) {
  rank_shares(inputs, shares, columns);
}
