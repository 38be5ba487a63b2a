// Stochastic order loss (docs/math.md §6, §7) on CUDA, forward and backward.
//
// Layout used by every kernel here: the 32 lanes of a warp walk the ranks q (lane, lane+32, ...), so
// that a row of D is read coalesced and a pair's sum over q ends in a warp reduction. No [M,n] or
// [B,B,n] intermediate is ever formed; D (small, [B,n]) is read through L1/L2.
//
// Precision: delta = D[x,q] - D[y,q] is rounded to the input dtype (scalar_t), and the hinge arguments
// delta + gamma, gamma - delta and |delta| - gamma are computed in acc_t with gamma in acc_t and rounded
// once to scalar_t (HingeArgs, sol_math.h): the expressions of the PyTorch reference, so the hinge
// decisions are exactly those of the CPU kernel and the reference; gamma is never rounded to
// float16/bfloat16. Sums run in acc_t (float32 for float16/bfloat16/float32, float64 for float64), and
// the probability table is read in acc_t from the device copy cached by ordering_table(). A NaN in D
// gives NaN losses for the pairs that read it, as on the CPU and in the reference.
//
// All pairs (pairs = None):
//   forward   one warp per micro-tile of XW x-rows by YW y-rows (only pairs x < y are written): per
//             lane and pair it accumulates the three hinge families, split by which probability
//             weighs them (lt, gt, eq), applies the weights once, and reduces all XW*YW pair sums
//             over the warp with one transposed butterfly. Each pair is evaluated once.
//   backward  one warp per XW rows x and a group of 32*QW ranks; it sweeps all y (optionally a
//             segment of them, see below) and accumulates d loss / d D[x,q] in registers. The warps of
//             a block share their y sequence, so they stage it through shared memory, a tile of
//             y rows at a time (one global read of each row per block, not per warp). Every row
//             is owned by exactly one warp, which visits y in a fixed order: no atomics, and the
//             result is bitwise reproducible. Each pair's rank gradient is therefore computed twice
//             (once for x's row, once for y's). When the grid would be too small to fill the GPU the
//             y range is split into S segments whose partial sums go to an [S,B,n] buffer that a
//             second kernel adds in segment order (still deterministic). S depends on (B, n, dtype)
//             only, not on the GPU's SM count, so the summation order is the same on every GPU.
// Explicit pairs ([M,2]):
//   forward   one warp per 8 pairs, PairTerms::loss per rank, transposed warp reduction.
//   backward  default: one warp per 8 pairs, atomicAdd of +-grad into grad_D (float32 buffer for
//             float16/bfloat16): the summation order varies between runs. Under
//             torch.use_deterministic_algorithms(True): the CPU kernel's per-row incidence list (CSR,
//             built on the device with a sort of unique keys), then one warp per row sums its pairs in
//             pair order: no atomics, bitwise reproducible.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdlib>
#include <type_traits>

#include "../sol_ext.h"
#include "../sol_math.h"
#include "cuda_common.cuh"

namespace sol_ext {
namespace {

using cuda::acc_type;
using cuda::kWarpSize;

constexpr int kWarpsPerBlock = 8;                 // forward and explicit-pair kernels
constexpr int kThreads = kWarpsPerBlock * kWarpSize;
constexpr int kBackwardWarpsPerBlock = 4;         // all-pairs backward: more, smaller blocks
constexpr int kBackwardThreads = kBackwardWarpsPerBlock * kWarpSize;
constexpr int kPairsPerWarp = 8;                  // explicit pairs
constexpr int kMaxRankChunks = 8;                 // all-pairs backward: at most 8*32 ranks per warp
// All-pairs backward: warps to aim for, 32 per SM of a GPU with 128 SMs (A100: 108, H100: 132). A fixed
// number rather than the device's SM count, so that the launch plan is a function of the shape only.
// SOL_EXT_CUDA_BACKWARD_WARPS overrides it (read once per process), for tuning on a new GPU.
constexpr int64_t kBackwardTargetWarps = 4096;
constexpr int kCsrRankChunks = 4;                 // deterministic explicit backward: ranks per pass / 32

// Everything a pair evaluation reads.
template <typename scalar_t>
struct LossArgs {
  const scalar_t* __restrict__ D;        // [B,n], contiguous
  const int64_t* __restrict__ labels;    // [B]
  const acc_type<scalar_t>* __restrict__ table;  // [n,n,3]: (lt, eq, gt) of (r_x, r_y)
  int64_t B;
  int n;
  acc_type<scalar_t> gamma;
  bool official;
};

// The hinge arguments of one rank from both rows' values (HingeArgs, sol_math.h).
template <typename scalar_t>
struct Hinges : HingeArgs<scalar_t, acc_type<scalar_t>> {
  __device__ __forceinline__ Hinges(scalar_t dx, scalar_t dy, acc_type<scalar_t> gamma)
      : HingeArgs<scalar_t, acc_type<scalar_t>>(static_cast<scalar_t>(dx - dy), gamma) {}
};

template <typename scalar_t>
__device__ __forceinline__ int load_rank(const LossArgs<scalar_t>& args, int64_t row) {
  const int64_t r = args.labels[row];
  CUDA_KERNEL_ASSERT(r >= 0 && r < args.n);
  return static_cast<int>(r);
}

// ------------------------------------------------------------------------------------------------
// All pairs, forward. Grid: (ceil(ceil(B/YW) / 8), ceil(B/XW)); warp w of block (bx, by) owns the
// micro-tile x in [by*XW, by*XW + XW), y in [(bx*8 + w)*YW, ... + YW). Warps with no pair x < y
// leave at once (about half of the grid).
//
// Per pair, with A = [delta+gamma]+, Bq = [gamma-delta]+, E = [|delta|-gamma]+ (docs/math.md §6):
//   l = lt * sum_q ([q <= last_lower_x] A + [q >= r_y] Bq)      (l_lt)
//     + gt * sum_q ([q >= r_x] A + [q <= last_lower_y] Bq)      (l_gt)
//     + eq * sum_q E                                             (l_eq)
// i.e. PairTerms::loss summed over q with the weights factored out of the sum.
// ------------------------------------------------------------------------------------------------
template <typename scalar_t, int XW, int YW>
__global__ void __launch_bounds__(kThreads) order_loss_all_pairs_forward_kernel(
    const LossArgs<scalar_t> args,
    scalar_t* __restrict__ out) {
  using acc_t = acc_type<scalar_t>;
  constexpr int P = XW * YW;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t B = args.B;
  const int n = args.n;
  const int64_t x0 = static_cast<int64_t>(blockIdx.y) * XW;
  const int64_t y0 = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize) * YW;
  if (y0 >= B) return;
  const int64_t y_last = (y0 + YW < B ? y0 + YW : B) - 1;
  if (x0 >= y_last) return;  // every pair of the micro-tile has x >= y

  int64_t x_row[XW], y_row[YW];
  int rx[XW], ry[YW], lower_x[XW], lower_y[YW];
#pragma unroll
  for (int a = 0; a < XW; ++a) {
    x_row[a] = x0 + a < B ? x0 + a : B - 1;  // rows past the end are evaluated, never written
    rx[a] = load_rank(args, x_row[a]);
    lower_x[a] = args.official ? rx[a] - 1 : rx[a];
  }
#pragma unroll
  for (int b = 0; b < YW; ++b) {
    y_row[b] = y0 + b < B ? y0 + b : B - 1;
    ry[b] = load_rank(args, y_row[b]);
    lower_y[b] = args.official ? ry[b] - 1 : ry[b];
  }

  acc_t sum_lt[P], sum_gt[P], sum_eq[P];
#pragma unroll
  for (int p = 0; p < P; ++p) sum_lt[p] = sum_gt[p] = sum_eq[p] = acc_t(0);

  for (int q = lane; q < n; q += kWarpSize) {
    scalar_t dx[XW], dy[YW];
    // The rank windows of each row at this q, as 0/1 multipliers (no predicate per pair).
    acc_t x_lower[XW], x_upper[XW], y_lower[YW], y_upper[YW];
#pragma unroll
    for (int a = 0; a < XW; ++a) {
      dx[a] = args.D[x_row[a] * n + q];
      x_lower[a] = q <= lower_x[a] ? acc_t(1) : acc_t(0);
      x_upper[a] = q >= rx[a] ? acc_t(1) : acc_t(0);
    }
#pragma unroll
    for (int b = 0; b < YW; ++b) {
      dy[b] = args.D[y_row[b] * n + q];
      y_lower[b] = q <= lower_y[b] ? acc_t(1) : acc_t(0);
      y_upper[b] = q >= ry[b] ? acc_t(1) : acc_t(0);
    }
#pragma unroll
    for (int a = 0; a < XW; ++a) {
#pragma unroll
      for (int b = 0; b < YW; ++b) {
        const int p = a * YW + b;
        const Hinges<scalar_t> hinge(dx[a], dy[b], args.gamma);
        const acc_t above = positive_part(static_cast<acc_t>(hinge.above));
        const acc_t below = positive_part(static_cast<acc_t>(hinge.below));
        sum_lt[p] += x_lower[a] * above;  // one FMA each
        sum_lt[p] += y_upper[b] * below;
        sum_gt[p] += x_upper[a] * above;
        sum_gt[p] += y_lower[b] * below;
        sum_eq[p] += positive_part(static_cast<acc_t>(hinge.apart));
      }
    }
  }

  acc_t loss[P];
#pragma unroll
  for (int a = 0; a < XW; ++a) {
#pragma unroll
    for (int b = 0; b < YW; ++b) {
      const int p = a * YW + b;
      const acc_t* t = args.table + (static_cast<int64_t>(rx[a]) * n + ry[b]) * 3;
      loss[p] = t[0] * sum_lt[p] + t[2] * sum_gt[p] + t[1] * sum_eq[p];
    }
  }
  cuda::warp_transpose_reduce<P>(loss, lane);
  if (cuda::transpose_reduce_owner<P>(lane)) {
    const int p = cuda::transpose_reduce_value_index<P>(lane);
    const int64_t x = x0 + p / YW, y = y0 + p % YW;
    if (y < B && x < y) out[pair_index(x, y, B)] = static_cast<scalar_t>(loss[0]);
  }
}

// ------------------------------------------------------------------------------------------------
// All pairs, backward. Grid: (ceil(ceil(B/XW) / 4), G, S); warp w of block (bx, g, s) owns rows
// x in [(bx*4 + w)*XW, ... + XW) and ranks q = g*32*QW + lane + 32k (k < QW), and sweeps y over segment
// s of [0, B). For each y != x it uses the pair's symmetry l(x,y) = l(y,x) (docs/math.md §6) to evaluate the
// pair from x's side: delta = D[x] - D[y], probabilities table[r_x, r_y], and
//   d l / d D[x,q] = [delta+gamma > 0] w_above(q) - [gamma-delta > 0] w_below(q) + [|delta|-gamma > 0] sgn(delta) eq
// (PairTerms::grad; evaluating (y,x) instead flips the sign of delta exactly and swaps lt/gt, so both
// rows see the same hinge decisions). The x-dependent weights [q <= last_lower_x], [q >= r_x] are
// constant per thread and applied once at the end.
// ------------------------------------------------------------------------------------------------
// y rows staged in shared memory per tile: 32 KB for 32*QW = 256 ranks in float32 or float64.
template <typename scalar_t>
constexpr int backward_tile_rows() {
  return sizeof(scalar_t) == 8 ? 16 : 32;
}

template <typename scalar_t, int XW, int QW>
__global__ void __launch_bounds__(kBackwardThreads) order_loss_all_pairs_backward_kernel(
    const LossArgs<scalar_t> args,
    const scalar_t* __restrict__ grad_losses,
    int64_t grad_stride,
    int64_t segment_length,
    scalar_t* __restrict__ grad_D,         // written when gridDim.z == 1
    acc_type<scalar_t>* __restrict__ partial) {  // [S,B,n], written when gridDim.z > 1
  using acc_t = acc_type<scalar_t>;
  constexpr int YT = backward_tile_rows<scalar_t>();
  __shared__ scalar_t dy_tile[YT][kWarpSize * QW];
  __shared__ int ry_tile[YT];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int64_t B = args.B;
  const int n = args.n;
  // A warp past the last row computes nothing but still helps stage the tiles (no early return: every
  // thread of the block must reach each __syncthreads).
  const int64_t x0 = (static_cast<int64_t>(blockIdx.x) * kBackwardWarpsPerBlock + warp) * XW;
  const int q0 = blockIdx.y * (kWarpSize * QW) + lane;
  const int64_t y_begin = blockIdx.z * segment_length;
  const int64_t y_end = y_begin + segment_length < B ? y_begin + segment_length : B;

  int rx[XW], lower_x[XW];
  scalar_t dx[XW][QW];
#pragma unroll
  for (int a = 0; a < XW; ++a) {
    const int64_t x = x0 + a < B ? x0 + a : B - 1;
    rx[a] = load_rank(args, x);
    lower_x[a] = args.official ? rx[a] - 1 : rx[a];
#pragma unroll
    for (int k = 0; k < QW; ++k) {
      const int q = q0 + k * kWarpSize;
      dx[a][k] = q < n ? args.D[x * n + q] : scalar_t(0);
    }
  }

  // grad[x,q] = [q <= last_lower_x] g_above_lt + [q >= r_x] g_above_gt + g_rest
  acc_t g_above_lt[XW][QW], g_above_gt[XW][QW], g_rest[XW][QW];
#pragma unroll
  for (int a = 0; a < XW; ++a) {
#pragma unroll
    for (int k = 0; k < QW; ++k) g_above_lt[a][k] = g_above_gt[a][k] = g_rest[a][k] = acc_t(0);
  }

  for (int64_t tile_begin = y_begin; tile_begin < y_end; tile_begin += YT) {
    const int rows = static_cast<int>(y_end - tile_begin < YT ? y_end - tile_begin : YT);
    __syncthreads();  // every warp is done with the previous tile
    for (int t = warp; t < rows; t += kBackwardWarpsPerBlock) {
      const int64_t y = tile_begin + t;
#pragma unroll
      for (int k = 0; k < QW; ++k) {
        const int q = q0 + k * kWarpSize;
        dy_tile[t][lane + k * kWarpSize] = q < n ? args.D[y * n + q] : scalar_t(0);
      }
      if (lane == 0) ry_tile[t] = load_rank(args, y);
    }
    __syncthreads();
    if (x0 >= B) continue;
    for (int t = 0; t < rows; ++t) {
      const int64_t y = tile_begin + t;
      const int ry = ry_tile[t];
      const int lower_y = args.official ? ry - 1 : ry;
      scalar_t dy[QW];
#pragma unroll
      for (int k = 0; k < QW; ++k) dy[k] = dy_tile[t][lane + k * kWarpSize];
#pragma unroll
      for (int a = 0; a < XW; ++a) {
        const int64_t x = x0 + a;
        if (x >= B || x == y) continue;  // uniform over the warp
        const int64_t m = x < y ? pair_index(x, y, B) : pair_index(y, x, B);
        const acc_t g = static_cast<acc_t>(grad_losses[m * grad_stride]);
        const acc_t* probs = args.table + (static_cast<int64_t>(rx[a]) * n + ry) * 3;
        const acc_t c_lt = g * probs[0], c_eq = g * probs[1], c_gt = g * probs[2];
#pragma unroll
        for (int k = 0; k < QW; ++k) {
          const int q = q0 + k * kWarpSize;
          const Hinges<scalar_t> hinge(dx[a][k], dy[k], args.gamma);
          // PairTerms::grad, with its eq term [|delta| - gamma > 0] sgn(delta) eq rewritten through the
          // signs of the other two hinges: for gamma >= 0, |delta| - gamma > 0 and delta > 0 exactly when
          // gamma - delta < 0, and with delta < 0 exactly when delta + gamma < 0 (HingeArgs rounds each
          // argument once, and rounding is symmetric: apart == -below for delta > 0, apart == -above for
          // delta < 0). Same decisions, fewer tests.
          if (hinge.above > scalar_t(0)) {
            g_above_lt[a][k] += c_lt;
            g_above_gt[a][k] += c_gt;
          } else if (hinge.above < scalar_t(0)) {
            g_rest[a][k] -= c_eq;
          }
          if (hinge.below > scalar_t(0)) {
            if (q >= ry) g_rest[a][k] -= c_lt;
            if (q <= lower_y) g_rest[a][k] -= c_gt;
          } else if (hinge.below < scalar_t(0)) {
            g_rest[a][k] += c_eq;
          }
        }
      }
    }
  }

#pragma unroll
  for (int a = 0; a < XW; ++a) {
    const int64_t x = x0 + a;
    if (x >= B) continue;
#pragma unroll
    for (int k = 0; k < QW; ++k) {
      const int q = q0 + k * kWarpSize;
      if (q >= n) continue;
      acc_t value = g_rest[a][k];
      if (q <= lower_x[a]) value += g_above_lt[a][k];
      if (q >= rx[a]) value += g_above_gt[a][k];
      if (partial == nullptr) {
        grad_D[x * n + q] = static_cast<scalar_t>(value);
      } else {
        partial[(blockIdx.z * B + x) * n + q] = value;
      }
    }
  }
}

// grad_D[i] = sum_s partial[s, i], in segment order.
template <typename scalar_t>
__global__ void sum_segments_kernel(
    const acc_type<scalar_t>* __restrict__ partial, int64_t segments, int64_t size, scalar_t* __restrict__ out) {
  using acc_t = acc_type<scalar_t>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < size;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc_t total = acc_t(0);
    for (int64_t s = 0; s < segments; ++s) total += partial[s * size + i];
    out[i] = static_cast<scalar_t>(total);
  }
}

// ------------------------------------------------------------------------------------------------
// Explicit pairs.
// ------------------------------------------------------------------------------------------------
template <typename scalar_t>
__device__ __forceinline__ PairTerms<acc_type<scalar_t>> pair_terms(
    const LossArgs<scalar_t>& args, int64_t x, int64_t y) {
  const int rx = load_rank(args, x), ry = load_rank(args, y);
  const acc_type<scalar_t>* t = args.table + (static_cast<int64_t>(rx) * args.n + ry) * 3;
  return PairTerms<acc_type<scalar_t>>(t[0], t[1], t[2], rx, ry, args.official);
}

template <typename scalar_t>
__device__ __forceinline__ void load_pair(const int64_t* pairs, int64_t m, int64_t B, int64_t& x, int64_t& y) {
  x = pairs[2 * m];
  y = pairs[2 * m + 1];
  CUDA_KERNEL_ASSERT(x >= 0 && x < B && y >= 0 && y < B);
}

// Grid: ceil(ceil(M/8) / 8) blocks; warp w of block b owns pairs [(b*8 + w)*8, ... + 8).
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) order_loss_pairs_forward_kernel(
    const LossArgs<scalar_t> args,
    const int64_t* __restrict__ pairs,
    int64_t M,
    scalar_t* __restrict__ out) {
  using acc_t = acc_type<scalar_t>;
  constexpr int P = kPairsPerWarp;
  const int lane = threadIdx.x % kWarpSize;
  const int n = args.n;
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize) * P;
  if (m0 >= M) return;
  acc_t loss[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int64_t m = m0 + p < M ? m0 + p : M - 1;
    int64_t x, y;
    load_pair<scalar_t>(pairs, m, args.B, x, y);
    const PairTerms<acc_t> terms = pair_terms(args, x, y);
    acc_t total = acc_t(0);
    for (int q = lane; q < n; q += kWarpSize) {
      total += terms.loss(q, static_cast<scalar_t>(args.D[x * n + q] - args.D[y * n + q]), args.gamma);
    }
    loss[p] = total;
  }
  cuda::warp_transpose_reduce<P>(loss, lane);
  if (cuda::transpose_reduce_owner<P>(lane)) {
    const int64_t m = m0 + cuda::transpose_reduce_value_index<P>(lane);
    if (m < M) out[m] = static_cast<scalar_t>(loss[0]);
  }
}

// Non-deterministic: atomicAdd of +-g * d l / d delta_q into grad_acc[x] and grad_acc[y] (acc_t).
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) order_loss_pairs_backward_atomic_kernel(
    const LossArgs<scalar_t> args,
    const int64_t* __restrict__ pairs,
    int64_t M,
    const scalar_t* __restrict__ grad_losses,
    int64_t grad_stride,
    acc_type<scalar_t>* __restrict__ grad_acc) {
  using acc_t = acc_type<scalar_t>;
  const int lane = threadIdx.x % kWarpSize;
  const int n = args.n;
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize) * kPairsPerWarp;
  for (int64_t m = m0; m < M && m < m0 + kPairsPerWarp; ++m) {
    int64_t x, y;
    load_pair<scalar_t>(pairs, m, args.B, x, y);
    if (x == y) continue;  // delta is 0 whatever D is: no gradient (as on the CPU)
    const PairTerms<acc_t> terms = pair_terms(args, x, y);
    const acc_t g = static_cast<acc_t>(grad_losses[m * grad_stride]);
    for (int q = lane; q < n; q += kWarpSize) {
      const acc_t value = g * terms.grad(q, static_cast<scalar_t>(args.D[x * n + q] - args.D[y * n + q]), args.gamma);
      if (value != acc_t(0)) {
        atomicAdd(grad_acc + x * n + q, value);
        atomicAdd(grad_acc + y * n + q, -value);
      }
    }
  }
}

// Deterministic: warp per row x; entries[row_start[x] .. row_start[x+1]) are 2m (+1 if x is the
// pair's second element), sorted, i.e. the row's pairs in pair order (the CPU kernel's order).
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) order_loss_pairs_backward_rows_kernel(
    const LossArgs<scalar_t> args,
    const int64_t* __restrict__ pairs,
    const int64_t* __restrict__ row_start,
    const int64_t* __restrict__ entries,
    const scalar_t* __restrict__ grad_losses,
    int64_t grad_stride,
    scalar_t* __restrict__ grad_D) {
  using acc_t = acc_type<scalar_t>;
  constexpr int QC = kCsrRankChunks;
  const int lane = threadIdx.x % kWarpSize;
  const int n = args.n;
  const int64_t x = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (x >= args.B) return;
  const int64_t begin = row_start[x], end = row_start[x + 1];
  for (int q_begin = 0; q_begin < n; q_begin += QC * kWarpSize) {
    acc_t acc[QC];
#pragma unroll
    for (int k = 0; k < QC; ++k) acc[k] = acc_t(0);
    for (int64_t e = begin; e < end; ++e) {
      const int64_t code = entries[e];
      const int64_t m = code / 2;
      int64_t a, b;
      load_pair<scalar_t>(pairs, m, args.B, a, b);
      if (a == b) continue;
      const PairTerms<acc_t> terms = pair_terms(args, a, b);
      const acc_t g = static_cast<acc_t>(grad_losses[m * grad_stride]);
      const acc_t scale = code % 2 == 0 ? g : -g;
#pragma unroll
      for (int k = 0; k < QC; ++k) {
        const int q = q_begin + lane + k * kWarpSize;
        if (q < n) {
          acc[k] += scale * terms.grad(q, static_cast<scalar_t>(args.D[a * n + q] - args.D[b * n + q]), args.gamma);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < QC; ++k) {
      const int q = q_begin + lane + k * kWarpSize;
      if (q < n) grad_D[x * n + q] = static_cast<scalar_t>(acc[k]);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Host side.
// ------------------------------------------------------------------------------------------------
at::ScalarType table_dtype(at::ScalarType dtype) {
  return dtype == at::kDouble ? at::kDouble : at::kFloat;
}

template <typename scalar_t>
LossArgs<scalar_t> make_args(const OrderLossProblem& problem, const at::Tensor& table, double margin) {
  LossArgs<scalar_t> args;
  args.D = problem.D.data_ptr<scalar_t>();
  args.labels = problem.labels.data_ptr<int64_t>();
  args.table = table.data_ptr<acc_type<scalar_t>>();
  args.B = problem.B;
  args.n = static_cast<int>(problem.n);
  args.gamma = static_cast<acc_type<scalar_t>>(margin);
  args.official = problem.convention == Convention::Official;
  return args;
}

// The shared checks and preparation, plus the CUDA kernels' limit on n (ranks are int there).
// Call it under the device guard: making inputs contiguous may launch copies.
OrderLossProblem prepare_cuda(
    const at::Tensor& D,
    const at::Tensor& labels,
    const std::optional<at::Tensor>& pairs,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention) {
  OrderLossProblem problem = prepare_order_loss(D, labels, pairs, sigma, tau, margin, convention);
  TORCH_CHECK(problem.n <= (1 << 20), "order_loss (CUDA): at most 2^20 ranks, got ", problem.n);
  return problem;
}

// Forward micro-tile: 4x4 pairs per warp (48 accumulators); 4x2 in float64 to bound registers.
template <typename scalar_t>
struct ForwardTile {
  static constexpr int XW = 4, YW = 4;
};
template <>
struct ForwardTile<double> {
  static constexpr int XW = 4, YW = 2;
};

template <typename scalar_t>
void launch_all_pairs_forward(const LossArgs<scalar_t>& args, scalar_t* out, cudaStream_t stream) {
  constexpr int XW = ForwardTile<scalar_t>::XW, YW = ForwardTile<scalar_t>::YW;
  const int64_t x_tiles = cuda::ceil_div(args.B, XW);
  const int64_t y_blocks = cuda::ceil_div(cuda::ceil_div(args.B, YW), kWarpsPerBlock);
  TORCH_CHECK(x_tiles <= 65535, "order_loss (CUDA): batch size ", args.B, " is too large for all pairs (at most ",
              65535 * XW, ")");
  const dim3 grid(static_cast<unsigned>(y_blocks), static_cast<unsigned>(x_tiles));
  order_loss_all_pairs_forward_kernel<scalar_t, XW, YW><<<grid, kThreads, 0, stream>>>(args, out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t, int XW, int QW>
void launch_all_pairs_backward_qw(const LossArgs<scalar_t>& args, const scalar_t* g, int64_t g_stride,
                                  int64_t groups, int64_t segments, int64_t segment_length, scalar_t* grad_D,
                                  acc_type<scalar_t>* partial, cudaStream_t stream) {
  const int64_t blocks = cuda::ceil_div(cuda::ceil_div(args.B, XW), kBackwardWarpsPerBlock);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(groups), static_cast<unsigned>(segments));
  order_loss_all_pairs_backward_kernel<scalar_t, XW, QW><<<grid, kBackwardThreads, 0, stream>>>(
      args, g, g_stride, segment_length, grad_D, partial);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t, int XW>
void launch_all_pairs_backward_xw(const LossArgs<scalar_t>& args, const scalar_t* g, int64_t g_stride, int qw,
                                  int64_t groups, int64_t segments, int64_t segment_length, scalar_t* grad_D,
                                  acc_type<scalar_t>* partial, cudaStream_t stream) {
#define SOL_EXT_QW_CASE(QW)                                                                                    \
  case QW:                                                                                                     \
    launch_all_pairs_backward_qw<scalar_t, XW, QW>(args, g, g_stride, groups, segments, segment_length, grad_D, \
                                                   partial, stream);                                           \
    break;
  switch (qw) {
    SOL_EXT_QW_CASE(1)
    SOL_EXT_QW_CASE(2)
    SOL_EXT_QW_CASE(3)
    SOL_EXT_QW_CASE(4)
    SOL_EXT_QW_CASE(5)
    SOL_EXT_QW_CASE(6)
    SOL_EXT_QW_CASE(7)
    SOL_EXT_QW_CASE(8)
    default:
      TORCH_CHECK(false, "order_loss (CUDA): internal error, rank chunks per warp = ", qw);
  }
#undef SOL_EXT_QW_CASE
}

int64_t backward_target_warps() {
  static const int64_t warps = [] {
    const char* text = std::getenv("SOL_EXT_CUDA_BACKWARD_WARPS");
    if (text == nullptr || *text == '\0') return kBackwardTargetWarps;
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    TORCH_CHECK(*end == '\0' && value >= 64 && value <= (1 << 20),
                "SOL_EXT_CUDA_BACKWARD_WARPS must be an integer in 64..1048576, got '", text, "'");
    return static_cast<int64_t>(value);
  }();
  return warps;
}

// Chooses rows per warp (XW), ranks per warp (32*QW in G groups) and y segments (S), then launches.
template <typename scalar_t>
void launch_all_pairs_backward(const LossArgs<scalar_t>& args, const at::Tensor& g, at::Tensor& grad_D,
                               cudaStream_t stream) {
  using acc_t = acc_type<scalar_t>;
  const int64_t B = args.B;
  const int64_t chunks = cuda::ceil_div(args.n, kWarpSize);
  const int64_t groups = cuda::ceil_div(chunks, kMaxRankChunks);
  const int qw = static_cast<int>(cuda::ceil_div(chunks, groups));
  TORCH_CHECK(groups <= 65535, "order_loss (CUDA): too many ranks (", args.n, ")");
  const int64_t target_warps = backward_target_warps();
  // Enough warps to fill the GPU: 2 rows per warp (half the loads and pair set-up per evaluation) when
  // that still gives target_warps / 2 warps, otherwise 1 row per warp and, if that gives fewer than
  // target_warps, y split into segments (each at least 32 long). The plan depends on (B, n, dtype) only,
  // never on the device: the summation order is the same on every GPU model.
  const bool two_rows =
      !std::is_same<scalar_t, double>::value && cuda::ceil_div(B, 2) * groups >= target_warps / 2;
  const int64_t warps = (two_rows ? cuda::ceil_div(B, 2) : B) * groups;
  int64_t segments = std::max<int64_t>(1, std::min<int64_t>(cuda::ceil_div(target_warps, warps), B / 32));
  segments = std::min<int64_t>(segments, 64);
  const int64_t segment_length = cuda::ceil_div(B, segments);
  segments = cuda::ceil_div(B, segment_length);  // no empty segment
  at::Tensor partial;
  if (segments > 1) partial = at::empty({segments, B, args.n}, grad_D.options().dtype(table_dtype(grad_D.scalar_type())));
  acc_t* partial_ptr = segments > 1 ? partial.data_ptr<acc_t>() : nullptr;
  const scalar_t* g_ptr = g.data_ptr<scalar_t>();
  scalar_t* out = grad_D.data_ptr<scalar_t>();
  bool launched = false;
  if constexpr (!std::is_same<scalar_t, double>::value) {  // float64 keeps one row per warp (registers)
    if (two_rows) {
      launch_all_pairs_backward_xw<scalar_t, 2>(args, g_ptr, g.stride(0), qw, groups, segments, segment_length, out,
                                                partial_ptr, stream);
      launched = true;
    }
  }
  if (!launched) {
    launch_all_pairs_backward_xw<scalar_t, 1>(args, g_ptr, g.stride(0), qw, groups, segments, segment_length, out,
                                              partial_ptr, stream);
  }
  if (segments > 1) {
    const int64_t size = B * args.n;
    const int64_t blocks = std::min<int64_t>(cuda::ceil_div(size, kThreads), 65535);
    sum_segments_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(partial_ptr, segments, size, out);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// Per-row incidence of explicit pairs, sorted: for each pair m with x != y, the entries 2m in row x
// and 2m+1 in row y. Returns (row_start [B+1], entries [E]), built with one sort of unique keys
// row * 2M + code, so the result does not depend on the sort's stability.
std::pair<at::Tensor, at::Tensor> pair_incidence(const at::Tensor& pairs, int64_t B) {
  const int64_t M = pairs.size(0);
  const at::Tensor m = at::arange(M, pairs.options());
  const at::Tensor rows = at::cat({pairs.select(1, 0), pairs.select(1, 1)});
  const at::Tensor codes = at::cat({m * 2, m * 2 + 1});
  // x == y pairs are kept (they are skipped in the kernel) so that no data-dependent size, hence no
  // device synchronization, is needed.
  const at::Tensor keys = std::get<0>(at::sort(rows * (2 * M) + codes));
  const at::Tensor sorted_rows = at::div(keys, 2 * M, "floor");
  const at::Tensor entries = keys - sorted_rows * (2 * M);
  const at::Tensor row_start = at::searchsorted(sorted_rows, at::arange(B + 1, pairs.options()));
  return {row_start.contiguous(), entries.contiguous()};
}

at::Tensor order_loss_cuda(
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    const std::optional<at::Tensor>& pairs_in,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention_name) {
  TORCH_CHECK(D_in.is_cuda(), "D must be a CUDA tensor, got ", D_in.device());
  c10::cuda::CUDAGuard device_guard(D_in.device());
  const OrderLossProblem problem = prepare_cuda(D_in, labels_in, pairs_in, sigma, tau, margin, convention_name);
  const at::Tensor& D = problem.D;
  const int64_t M = problem.M;
  at::Tensor losses = at::empty({M}, D.options());
  if (M == 0) return losses;
  const at::Tensor table = problem.table(sigma, tau, table_dtype(D.scalar_type()));
  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  cuda::record_use(table, stream);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, D.scalar_type(), "order_loss_cuda", [&] {
    const LossArgs<scalar_t> args = make_args<scalar_t>(problem, table, margin);
    if (problem.pairs.has_value()) {
      const at::Tensor& pairs = *problem.pairs;
      const int64_t blocks = cuda::ceil_div(cuda::ceil_div(M, kPairsPerWarp), kWarpsPerBlock);
      order_loss_pairs_forward_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
          args, pairs.data_ptr<int64_t>(), M, losses.data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      launch_all_pairs_forward<scalar_t>(args, losses.data_ptr<scalar_t>(), stream);
    }
  });
  return losses;
}

at::Tensor order_loss_backward_cuda(
    const at::Tensor& grad_losses,
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    const std::optional<at::Tensor>& pairs_in,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention_name) {
  TORCH_CHECK(D_in.is_cuda(), "D must be a CUDA tensor, got ", D_in.device());
  c10::cuda::CUDAGuard device_guard(D_in.device());
  const OrderLossProblem problem = prepare_cuda(D_in, labels_in, pairs_in, sigma, tau, margin, convention_name);
  const at::Tensor& D = problem.D;
  const int64_t B = problem.B, n = problem.n, M = problem.M;
  check_grad_losses(grad_losses, D, M);
  if (M == 0) return at::zeros_like(D, at::MemoryFormat::Contiguous);
  // A stride-0 gradient (the backward of a mean or sum) is read in place, never materialized.
  const at::Tensor g = grad_losses.scalar_type() == D.scalar_type() ? grad_losses : grad_losses.to(D.scalar_type());
  const at::Tensor table = problem.table(sigma, tau, table_dtype(D.scalar_type()));
  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  cuda::record_use(table, stream);

  if (!problem.pairs.has_value()) {
    at::Tensor grad_D = at::empty_like(D, at::MemoryFormat::Contiguous);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, D.scalar_type(), "order_loss_backward_cuda", [&] {
      const LossArgs<scalar_t> args = make_args<scalar_t>(problem, table, margin);
      launch_all_pairs_backward<scalar_t>(args, g, grad_D, stream);
    });
    return grad_D;
  }

  const at::Tensor& pairs = *problem.pairs;
  if (at::globalContext().deterministicAlgorithms()) {
    const auto [row_start, entries] = pair_incidence(pairs, B);
    at::Tensor grad_D = at::empty_like(D, at::MemoryFormat::Contiguous);
    const int64_t blocks = cuda::ceil_div(B, kWarpsPerBlock);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, D.scalar_type(), "order_loss_backward_cuda", [&] {
      const LossArgs<scalar_t> args = make_args<scalar_t>(problem, table, margin);
      order_loss_pairs_backward_rows_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
          args, pairs.data_ptr<int64_t>(), row_start.data_ptr<int64_t>(), entries.data_ptr<int64_t>(),
          g.data_ptr<scalar_t>(), g.stride(0), grad_D.data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return grad_D;
  }

  // Atomic path: accumulate in acc_t (float32 for float16/bfloat16), then cast.
  at::Tensor grad_acc = at::zeros({B, n}, D.options().dtype(table_dtype(D.scalar_type())));
  const int64_t blocks = cuda::ceil_div(cuda::ceil_div(M, kPairsPerWarp), kWarpsPerBlock);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, D.scalar_type(), "order_loss_backward_cuda", [&] {
    const LossArgs<scalar_t> args = make_args<scalar_t>(problem, table, margin);
    order_loss_pairs_backward_atomic_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
        args, pairs.data_ptr<int64_t>(), M, g.data_ptr<scalar_t>(), g.stride(0),
        grad_acc.data_ptr<acc_type<scalar_t>>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad_acc.scalar_type() == D.scalar_type() ? grad_acc : grad_acc.to(D.scalar_type());
}

// ------------------------------------------------------------------------------------------------
// Block mode (order_loss_block): local rows D [B,n] x gathered rows D_all [N,n]; local row i owns the
// pairs (i, j) with j > offset + i, oriented x = D[i], y = D_all[j].
//   forward   one warp per local row; the lanes walk the ranks, each lane sums its share over j in
//             order, then a fixed-order warp reduction: deterministic.
//   backward  one warp per row of grad_D (its pairs in j order) and one warp per row of grad_D_all
//             (its local rows i in order), in chunks of 32*kCsrRankChunks ranks: no atomics, bitwise
//             reproducible. Extra memory: the outputs only.
// ------------------------------------------------------------------------------------------------
template <typename scalar_t>
struct BlockArgs {
  const scalar_t* __restrict__ D;               // [B,n]
  const int64_t* __restrict__ labels;           // [B]
  const scalar_t* __restrict__ D_all;           // [N,n]
  const int64_t* __restrict__ labels_all;       // [N]
  const acc_type<scalar_t>* __restrict__ table;  // [n,n,3]
  int64_t B, N, offset;
  int n;
  acc_type<scalar_t> gamma;
  bool official;

  __device__ __forceinline__ PairTerms<acc_type<scalar_t>> terms(int64_t i, int64_t j) const {
    const int64_t rx = labels[i], ry = labels_all[j];
    CUDA_KERNEL_ASSERT(rx >= 0 && rx < n && ry >= 0 && ry < n);
    const acc_type<scalar_t>* t = table + (rx * n + ry) * 3;
    return PairTerms<acc_type<scalar_t>>(t[0], t[1], t[2], rx, ry, official);
  }
  __device__ __forceinline__ scalar_t delta(int64_t i, int64_t j, int q) const {
    return static_cast<scalar_t>(D[i * n + q] - D_all[j * n + q]);
  }
};

// Grid: ceil(B / 8) blocks of 8 warps; warp w of block b owns local row b*8 + w.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) order_loss_block_forward_kernel(
    const BlockArgs<scalar_t> args, scalar_t* __restrict__ out) {
  using acc_t = acc_type<scalar_t>;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (i >= args.B) return;
  acc_t total[1] = {acc_t(0)};
  for (int64_t j = args.offset + i + 1; j < args.N; ++j) {
    const PairTerms<acc_t> terms = args.terms(i, j);
    for (int q = lane; q < args.n; q += kWarpSize) total[0] += terms.loss(q, args.delta(i, j, q), args.gamma);
  }
  cuda::warp_transpose_reduce<1>(total, lane);
  if (lane == 0) out[i] = static_cast<scalar_t>(total[0]);
}

// Grid: ceil(B / 8) blocks; warp per local row i, summing d l(i, j) / d D[i] over j in order.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) order_loss_block_backward_local_kernel(
    const BlockArgs<scalar_t> args, const scalar_t* __restrict__ g, int64_t g_stride,
    scalar_t* __restrict__ grad_D) {
  using acc_t = acc_type<scalar_t>;
  constexpr int QC = kCsrRankChunks;
  const int lane = threadIdx.x % kWarpSize;
  const int n = args.n;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (i >= args.B) return;
  const acc_t scale = static_cast<acc_t>(g[i * g_stride]);
  for (int q_begin = 0; q_begin < n; q_begin += QC * kWarpSize) {
    acc_t acc[QC];
#pragma unroll
    for (int k = 0; k < QC; ++k) acc[k] = acc_t(0);
    for (int64_t j = args.offset + i + 1; j < args.N; ++j) {
      const PairTerms<acc_t> terms = args.terms(i, j);
#pragma unroll
      for (int k = 0; k < QC; ++k) {
        const int q = q_begin + lane + k * kWarpSize;
        if (q < n) acc[k] += scale * terms.grad(q, args.delta(i, j, q), args.gamma);
      }
    }
#pragma unroll
    for (int k = 0; k < QC; ++k) {
      const int q = q_begin + lane + k * kWarpSize;
      if (q < n) grad_D[i * n + q] = static_cast<scalar_t>(acc[k]);
    }
  }
}

// Grid: ceil(N / 8) blocks; warp per gathered row j, summing -g[i] d l(i, j) / d delta over the local
// rows i with offset + i < j, in i order (rows with none get 0).
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) order_loss_block_backward_gathered_kernel(
    const BlockArgs<scalar_t> args, const scalar_t* __restrict__ g, int64_t g_stride,
    scalar_t* __restrict__ grad_D_all) {
  using acc_t = acc_type<scalar_t>;
  constexpr int QC = kCsrRankChunks;
  const int lane = threadIdx.x % kWarpSize;
  const int n = args.n;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (j >= args.N) return;
  const int64_t rows = j - args.offset < args.B ? j - args.offset : args.B;
  for (int q_begin = 0; q_begin < n; q_begin += QC * kWarpSize) {
    acc_t acc[QC];
#pragma unroll
    for (int k = 0; k < QC; ++k) acc[k] = acc_t(0);
    for (int64_t i = 0; i < rows; ++i) {
      const PairTerms<acc_t> terms = args.terms(i, j);
      const acc_t scale = -static_cast<acc_t>(g[i * g_stride]);
#pragma unroll
      for (int k = 0; k < QC; ++k) {
        const int q = q_begin + lane + k * kWarpSize;
        if (q < n) acc[k] += scale * terms.grad(q, args.delta(i, j, q), args.gamma);
      }
    }
#pragma unroll
    for (int k = 0; k < QC; ++k) {
      const int q = q_begin + lane + k * kWarpSize;
      if (q < n) grad_D_all[j * n + q] = static_cast<scalar_t>(acc[k]);
    }
  }
}

template <typename scalar_t>
BlockArgs<scalar_t> make_block_args(const OrderLossBlockProblem& problem, const at::Tensor& table, double margin) {
  BlockArgs<scalar_t> args;
  args.D = problem.D.data_ptr<scalar_t>();
  args.labels = problem.labels.data_ptr<int64_t>();
  args.D_all = problem.D_all.data_ptr<scalar_t>();
  args.labels_all = problem.labels_all.data_ptr<int64_t>();
  args.table = table.data_ptr<acc_type<scalar_t>>();
  args.B = problem.B;
  args.N = problem.N;
  args.offset = problem.offset;
  args.n = static_cast<int>(problem.n);
  args.gamma = static_cast<acc_type<scalar_t>>(margin);
  args.official = problem.convention == Convention::Official;
  return args;
}

OrderLossBlockProblem prepare_block_cuda(
    const at::Tensor& D,
    const at::Tensor& labels,
    const at::Tensor& D_all,
    const at::Tensor& labels_all,
    int64_t offset,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention) {
  TORCH_CHECK(D.is_cuda(), "D must be a CUDA tensor, got ", D.device());
  OrderLossBlockProblem problem =
      prepare_order_loss_block(D, labels, D_all, labels_all, offset, sigma, tau, margin, convention);
  TORCH_CHECK(problem.n <= (1 << 20), "order_loss_block (CUDA): at most 2^20 ranks, got ", problem.n);
  return problem;
}

at::Tensor order_loss_block_cuda(
    const at::Tensor& D_in,
    const at::Tensor& labels_in,
    const at::Tensor& D_all_in,
    const at::Tensor& labels_all_in,
    int64_t offset,
    double sigma,
    int64_t tau,
    double margin,
    c10::string_view convention) {
  c10::cuda::CUDAGuard device_guard(D_in.device());
  const OrderLossBlockProblem problem =
      prepare_block_cuda(D_in, labels_in, D_all_in, labels_all_in, offset, sigma, tau, margin, convention);
  at::Tensor rows = at::empty({problem.B}, problem.D.options());
  if (problem.B == 0) return rows;
  const at::Tensor table = problem.table(sigma, tau, table_dtype(problem.D.scalar_type()));
  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  cuda::record_use(table, stream);
  const int64_t blocks = cuda::ceil_div(problem.B, kWarpsPerBlock);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, problem.D.scalar_type(), "order_loss_block_cuda", [&] {
    const BlockArgs<scalar_t> args = make_block_args<scalar_t>(problem, table, margin);
    order_loss_block_forward_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(args, rows.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return rows;
}

std::tuple<at::Tensor, at::Tensor> order_loss_block_backward_cuda(
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
  c10::cuda::CUDAGuard device_guard(D_in.device());
  const OrderLossBlockProblem problem =
      prepare_block_cuda(D_in, labels_in, D_all_in, labels_all_in, offset, sigma, tau, margin, convention);
  const int64_t B = problem.B, N = problem.N;
  check_grad_losses(grad_rows, problem.D, B);
  at::Tensor grad_D = need_grad_D ? at::empty_like(problem.D, at::MemoryFormat::Contiguous) : problem.D.new_empty({0});
  at::Tensor grad_D_all =
      need_grad_D_all ? at::empty_like(problem.D_all, at::MemoryFormat::Contiguous) : problem.D_all.new_empty({0});
  if (B == 0 || N == 0) {  // no pairs: zero gradients
    grad_D.zero_();
    grad_D_all.zero_();
    return {grad_D, grad_D_all};
  }
  if (!(need_grad_D || need_grad_D_all)) return {grad_D, grad_D_all};
  // A stride-0 gradient (the backward of a sum or mean) is read in place, never materialized.
  const at::Tensor g = grad_rows.scalar_type() == problem.D.scalar_type() ? grad_rows
                                                                          : grad_rows.to(problem.D.scalar_type());
  const at::Tensor table = problem.table(sigma, tau, table_dtype(problem.D.scalar_type()));
  const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  cuda::record_use(table, stream);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, problem.D.scalar_type(), "order_loss_block_backward_cuda", [&] {
        const BlockArgs<scalar_t> args = make_block_args<scalar_t>(problem, table, margin);
        if (need_grad_D) {
          order_loss_block_backward_local_kernel<scalar_t>
              <<<cuda::ceil_div(B, kWarpsPerBlock), kThreads, 0, stream>>>(
                  args, g.data_ptr<scalar_t>(), g.stride(0), grad_D.data_ptr<scalar_t>());
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
        if (need_grad_D_all) {
          order_loss_block_backward_gathered_kernel<scalar_t>
              <<<cuda::ceil_div(N, kWarpsPerBlock), kThreads, 0, stream>>>(
                  args, g.data_ptr<scalar_t>(), g.stride(0), grad_D_all.data_ptr<scalar_t>());
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
      });
  return {grad_D, grad_D_all};
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CUDA, m) {
  m.impl("order_loss", &order_loss_cuda);
  m.impl("_order_loss_backward", &order_loss_backward_cuda);
  m.impl("order_loss_block", &order_loss_block_cuda);
  m.impl("_order_loss_block_backward", &order_loss_block_backward_cuda);
}

} // namespace sol_ext
