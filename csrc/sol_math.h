// Per-element formulas shared by the CPU and CUDA kernels, so that both backends
// evaluate exactly the same expressions in the same order.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

namespace sol_ext {

// Index of the unordered pair (a, b), a < b, in the all-pairs order
// (0,1), (0,2), ..., (0,B-1), (1,2), ...
C10_HOST_DEVICE inline int64_t pair_index(int64_t a, int64_t b, int64_t batch_size) {
  return a * (2 * batch_size - a - 1) / 2 + (b - a - 1);
}

// [v]+ that keeps a NaN, as torch.relu and std::max(v, 0) do (fmax would turn it into 0).
template <typename T>
C10_HOST_DEVICE inline T positive_part(T v) {
  return v < T(0) ? T(0) : v;
}

// The hinge arguments of one rank (docs/math.md §6) as the reference evaluates them: delta = D[x,q] - D[y,q]
// in the input dtype, and delta + gamma, gamma - delta, |delta| - gamma each computed in acc_t and
// rounded once to the input dtype. gamma stays in acc_t: PyTorch adds a Python float to a
// float16/bfloat16 tensor in float32, so the margin itself is never rounded to the input dtype.
template <typename scalar_t, typename acc_t>
struct HingeArgs {
  scalar_t above, below, apart;
  C10_HOST_DEVICE HingeArgs(scalar_t delta, acc_t gamma) {
    const acc_t d = static_cast<acc_t>(delta);
    above = static_cast<scalar_t>(d + gamma);
    below = static_cast<scalar_t>(gamma - d);
    apart = static_cast<scalar_t>((d < acc_t(0) ? -d : d) - gamma);
  }
};

// Weights of the three hinge families of one pair (docs/math.md §6), written per rank q as
//   l_order = sum_q  wA(q) [delta_q + gamma]+  +  wB(q) [gamma - delta_q]+  +  eq [|delta_q| - gamma]+
// with  wA(q) = lt [q <= last_lower_x] + gt [q >= r_x]  and  wB(q) = lt [q >= r_y] + gt [q <= last_lower_y].
// The "official" convention makes the lower sums exclusive (docs/math.md §10.1), i.e. last_lower = r - 1.
template <typename acc_t>
struct PairTerms {
  acc_t lt, eq, gt;
  int64_t rx, ry;
  int64_t last_lower_x, last_lower_y;

  C10_HOST_DEVICE PairTerms(acc_t lt_, acc_t eq_, acc_t gt_, int64_t rx_, int64_t ry_, bool official)
      : lt(lt_), eq(eq_), gt(gt_), rx(rx_), ry(ry_),
        last_lower_x(official ? rx_ - 1 : rx_), last_lower_y(official ? ry_ - 1 : ry_) {}

  C10_HOST_DEVICE acc_t weight_above(int64_t q) const {  // multiplies [delta_q + gamma]+
    return (q <= last_lower_x ? lt : acc_t(0)) + (q >= rx ? gt : acc_t(0));
  }
  C10_HOST_DEVICE acc_t weight_below(int64_t q) const {  // multiplies [gamma - delta_q]+
    return (q >= ry ? lt : acc_t(0)) + (q <= last_lower_y ? gt : acc_t(0));
  }

  // The pair's loss at rank q; a NaN delta gives NaN, as in the CPU kernel and the reference.
  template <typename scalar_t>
  C10_HOST_DEVICE acc_t loss(int64_t q, scalar_t delta, acc_t gamma) const {
    const HingeArgs<scalar_t, acc_t> h(delta, gamma);
    return weight_above(q) * positive_part(acc_t(h.above)) + weight_below(q) * positive_part(acc_t(h.below)) +
           eq * positive_part(acc_t(h.apart));
  }

  // d loss / d delta_q; the derivative of a hinge at its kink, and of |z| at 0, is 0 (and so is every
  // decision on a NaN delta).
  template <typename scalar_t>
  C10_HOST_DEVICE acc_t grad(int64_t q, scalar_t delta, acc_t gamma) const {
    const HingeArgs<scalar_t, acc_t> h(delta, gamma);
    acc_t g = acc_t(0);
    if (h.above > scalar_t(0)) g += weight_above(q);
    if (h.below > scalar_t(0)) g -= weight_below(q);
    if (h.apart > scalar_t(0)) g += delta > scalar_t(0) ? eq : -eq;
    return g;
  }
};

// The discriminative loss of one sample (docs/math.md §4) is linear in its row of D:
// l_disc = sum_k coef_k D[x, k]. Calls visit(k, coef) for each term, in a fixed order. The coefficients
// of one sample sum to 0, so l_disc = sum_k coef_k (D[x, k] - D[x, r]) too.
// Every t >= n has both neighbours out of range (r lies in 0..n-1) and adds the same term, so those
// terms are visited once with their count as a factor: a huge T costs what T = n - 1 costs.
template <typename acc_t, typename Visit>
C10_HOST_DEVICE inline void for_each_disc_term(int64_t r, int64_t n, int64_t T, Visit visit) {
  const int64_t looped = T < n - 1 ? T : n - 1;
  for (int64_t t = 1; t <= looped; ++t) {
    const int64_t lo = r - t;
    const int64_t hi = r + t;
    const bool lo_in = lo >= 0;
    const bool hi_in = hi <= n - 1;
    if (lo_in && hi_in) {
      visit(r, acc_t(2));
      visit(lo, acc_t(-1));
      visit(hi, acc_t(-1));
    } else if (!lo_in && hi_in) {
      visit(r, acc_t(2));
      visit(hi, acc_t(-2));
    } else if (lo_in && !hi_in) {
      visit(r, acc_t(2));
      visit(lo, acc_t(-2));
    } else {
      visit(r, acc_t(4));
      visit(int64_t(0), acc_t(-2));
      visit(n - 1, acc_t(-2));
    }
  }
  if (T > looped) {
    const acc_t count = static_cast<acc_t>(T - looped);
    visit(r, acc_t(4) * count);
    visit(int64_t(0), acc_t(-2) * count);
    visit(n - 1, acc_t(-2) * count);
  }
}

} // namespace sol_ext
