// The CPU kernels compiled once per capability (cpu_capability.h): their inputs, and their declarations in
// each capability's namespace, sol_ext::cpu::DEFAULT, ::AVX2 and ::AVX512. The op files check, prepare
// and call them through SOL_EXT_CPU_DISPATCH; the bodies are in cpu/isa/*_vec.h.
//
// Every kernel is deterministic for a given capability: the work is split by the shape alone, and each
// sum is taken in an order that does not depend on which thread ran what.
#pragma once

#include <cstdint>

#include "cpu_capability.h"

namespace sol_ext {
namespace cpu {

// One order-loss call: a pair's x indexes (D, labels), its y indexes (D_y, labels_y) — the same rows for
// order_loss, the local and the gathered rows for order_loss_block. Rows are contiguous, n wide.
template <typename scalar_t>
struct OrderLossInputs {
  const scalar_t* D;
  const int64_t* labels;
  int64_t rows;
  const scalar_t* D_y;
  const int64_t* labels_y;
  int64_t rows_y;
  const double* table;  // [n, n, 3] (lt, eq, gt) per (r_x, r_y)
  int64_t n;
  double margin;
  bool official;
};

// A per-pair or per-row gradient: values g[i * stride] (stride 0: one value read in place).
template <typename scalar_t>
struct Strided {
  const scalar_t* values;
  int64_t stride;
  scalar_t operator[](int64_t i) const { return values[i * stride]; }
};

// One grouped_order_sum call (grouped_order_loss_kernel.cpp): D [B, n], the [n, n] weight matrices L, U,
// E2 (docs/math.md §13.1), ranks rank_begin..rank_end-1. shares[k] gets rank rank_begin + k's share;
// columns (when not null) [K, B] float64, K = rank_end - rank_begin: row k gets 0.5 times the gradient
// of rank rank_begin + k's share with respect to D[., rank_begin + k].
template <typename scalar_t>
struct GroupedInputs {
  const scalar_t* D;
  const int64_t* labels;
  int64_t B, n;
  const double *L, *U, *E2;
  double margin;
  bool official;
  int64_t rank_begin, rank_end;
  int64_t helpers;  // threads beside the caller (run_tasks, tasks.h)
};

} // namespace cpu
} // namespace sol_ext

// The declarations, once per compiled capability.
#define SOL_EXT_DECLARE_CPU_KERNELS(T)                                                                              \
  /* order_loss over all pairs x < y of the batch (inputs.D_y == inputs.D): losses [M] in pair order */          \
  void order_loss_all_pairs_forward(const OrderLossInputs<T>& inputs, T* losses);                                 \
  /* grad_D [B, n] from grad_losses [M] */                                                                         \
  void order_loss_all_pairs_backward(const OrderLossInputs<T>& inputs, Strided<T> grad_losses, T* grad_D);        \
  /* explicit pairs [M, 2] */                                                                                      \
  void order_loss_pairs_forward(const OrderLossInputs<T>& inputs, const int64_t* pairs, int64_t M, T* losses);   \
  /* row_start [B + 1] and entries: the pairs of each row, 2 m (the row is pair m's x) or 2 m + 1 (its y) */       \
  void order_loss_pairs_backward(const OrderLossInputs<T>& inputs, const int64_t* pairs, const int64_t* row_start, \
                                 const int64_t* entries, Strided<T> grad_losses, T* grad_D);                       \
  /* order_loss_block: row i of D pairs with the rows j > offset + i of D_y */                                     \
  void order_loss_block_forward(const OrderLossInputs<T>& inputs, int64_t offset, T* row_sums);                   \
  void order_loss_block_backward(const OrderLossInputs<T>& inputs, int64_t offset, Strided<T> grad_rows,          \
                                 T* grad_D, T* grad_D_all);                                                        \
  /* grouped_order_sum's per-rank shares (and gradient) */                                                         \
  void grouped_rank_shares(const GroupedInputs<T>& inputs, double* shares, double* columns);                       \
  /* stochastic_dissimilarity of small problems, from the definition (P [n, n] in T) */                           \
  void dissimilarity_direct_forward(const T* h, const T* mu, const T* P, int64_t B, int64_t n, int64_t d, T* D);  \
  void dissimilarity_direct_backward(const T* grad_D, const T* h, const T* mu, const T* P, int64_t B, int64_t n,  \
                                     int64_t d, T* grad_h, T* grad_mu);                                            \
  /* the product form's epilogues on rows of centered h [rows, d]: D = a ||h||^2 - 2 D + c in place, and */        \
  /* grad_h += 2 (grad_D a) h */                                                                                   \
  void dissimilarity_forward_epilogue(const T* h, const T* a, const T* c, int64_t rows, int64_t n, int64_t d,     \
                                      T* D);                                                                       \
  void dissimilarity_grad_h_epilogue(const T* grad_D, const T* h, const T* a, int64_t rows, int64_t n, int64_t d, \
                                     T* grad_h);

namespace sol_ext {
namespace cpu {
namespace DEFAULT {
SOL_EXT_DECLARE_CPU_KERNELS(float)
SOL_EXT_DECLARE_CPU_KERNELS(double)
} // namespace DEFAULT
#if defined(SOL_EXT_CPU_AVX2)
namespace AVX2 {
SOL_EXT_DECLARE_CPU_KERNELS(float)
SOL_EXT_DECLARE_CPU_KERNELS(double)
} // namespace AVX2
#endif
#if defined(SOL_EXT_CPU_AVX512)
namespace AVX512 {
SOL_EXT_DECLARE_CPU_KERNELS(float)
SOL_EXT_DECLARE_CPU_KERNELS(double)
} // namespace AVX512
#endif
} // namespace cpu
} // namespace sol_ext
