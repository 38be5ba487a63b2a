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

// Weights of the three hinge families of one pair (SPEC §6), written per rank q as
//   l_order = sum_q  wA(q) [delta_q + gamma]+  +  wB(q) [gamma - delta_q]+  +  eq [|delta_q| - gamma]+
// with  wA(q) = lt [q <= last_lower_x] + gt [q >= r_x]  and  wB(q) = lt [q >= r_y] + gt [q <= last_lower_y].
// The "official" convention makes the lower sums exclusive (SPEC §10.1), i.e. last_lower = r - 1.
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

  // The pair's loss at rank q. `delta` and `gamma` stay in the input precision so that the hinge
  // decisions are exactly those of the plain PyTorch reference.
  template <typename scalar_t>
  C10_HOST_DEVICE acc_t loss(int64_t q, scalar_t delta, scalar_t gamma) const {
    const scalar_t above = delta + gamma;
    const scalar_t below = gamma - delta;
    const scalar_t apart = (delta < scalar_t(0) ? -delta : delta) - gamma;
    acc_t total = acc_t(0);
    if (above > scalar_t(0)) total += weight_above(q) * acc_t(above);
    if (below > scalar_t(0)) total += weight_below(q) * acc_t(below);
    if (apart > scalar_t(0)) total += eq * acc_t(apart);
    return total;
  }

  // d loss / d delta_q; the derivative of a hinge at its kink, and of |z| at 0, is 0.
  template <typename scalar_t>
  C10_HOST_DEVICE acc_t grad(int64_t q, scalar_t delta, scalar_t gamma) const {
    const scalar_t above = delta + gamma;
    const scalar_t below = gamma - delta;
    const scalar_t apart = (delta < scalar_t(0) ? -delta : delta) - gamma;
    acc_t g = acc_t(0);
    if (above > scalar_t(0)) g += weight_above(q);
    if (below > scalar_t(0)) g -= weight_below(q);
    if (apart > scalar_t(0)) g += delta > scalar_t(0) ? eq : -eq;
    return g;
  }
};

// The discriminative loss of one sample (SPEC §4) is linear in its row of D:
// l_disc = sum_k coef_k D[x, k]. Calls visit(k, coef) for each term, in a fixed order.
template <typename acc_t, typename Visit>
C10_HOST_DEVICE inline void for_each_disc_term(int64_t r, int64_t n, int64_t T, Visit visit) {
  for (int64_t t = 1; t <= T; ++t) {
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
}

} // namespace sol_ext
