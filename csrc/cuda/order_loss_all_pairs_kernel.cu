// Stochastic order loss over all pairs of the batch (pairs = None) on CUDA, forward and backward.
//
// The 32 lanes of a warp walk the ranks q (lane, lane+32, ...), so that a row of D is read coalesced
// and a pair's sum over q ends in a warp reduction. No [M,n] or [B,B,n] intermediate is ever formed;
// D (small, [B,n]) is read through L1/L2. Precision: see order_loss_common.cuh.
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
//   backward, one pass (large batches)
//             each pair evaluated once: one block per pair of row tiles (I <= J) and 32 ranks, which
//             adds a pair's rank gradient to x's row and subtracts it from y's. Rows of tile I are
//             summed in the block's registers over tile J; rows of tile J over the block's warps, in a
//             fixed order. Each block writes its two row tiles' sums into slot J (rows of I) and slot I
//             (rows of J) of an [T,B,n] buffer, which the segment-sum kernel adds in slot order: every
//             (row, slot) is written once, so the result is bitwise reproducible. The plan (tile size,
//             or the two-pass kernel above when the buffer would be large or the grid too small) depends
//             on (B, n, dtype) only.
#include <cstdlib>
#include <string>

#include "order_loss_common.cuh"

namespace sol_ext {
namespace order_loss_cuda {
namespace {

constexpr int kBackwardWarpsPerBlock = 4;         // all-pairs backward: more, smaller blocks
constexpr int kBackwardThreads = kBackwardWarpsPerBlock * kWarpSize;
constexpr int kMaxRankChunks = 8;                 // all-pairs backward: at most 8*32 ranks per warp
// All-pairs backward: warps to aim for, 32 per SM of a GPU with 128 SMs (A100: 108, H100: 132). A fixed
// number rather than the device's SM count, so that the launch plan is a function of the shape only.
// SOL_EXT_CUDA_BACKWARD_WARPS overrides it (read once per process), for tuning on a new GPU.
constexpr int64_t kBackwardTargetWarps = 4096;

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
// All pairs, backward in one pass. Grid: (T, T, ceil(n/32)) over T = ceil(B/S) row tiles of S = 8*XW
// rows; block (J, I, c) with I <= J handles the pairs x in tile I, y in tile J (x < y on the diagonal)
// for the ranks q = 32c + lane. Warp w holds XW rows x of tile I (its values of D and its gradient sums)
// in registers; tile J is staged through shared memory, kOnePassTileY rows at a time, together with each
// pair's weights g * (lt, eq, gt) (zero for the pairs that do not exist, so they add exactly nothing).
// Per pair and rank, G = d l / d delta_q (PairTerms::grad, with the sign rewriting of the two-pass kernel)
// goes to x's row as +G and to y's as -G: d delta / d D[y,q] = -1.
// ------------------------------------------------------------------------------------------------
constexpr int kOnePassWarps = 8;
constexpr int kOnePassThreads = kOnePassWarps * kWarpSize;
constexpr int kOnePassTileY = 8;  // y rows staged per step
// The one-pass buffer holds T partial copies of grad_D; above this many bytes the two-pass kernel runs.
constexpr int64_t kOnePassMaxBufferBytes = int64_t(64) << 20;

// One pair's upstream gradient times its three probabilities, padded to one 16-byte (float) or two
// (double) shared-memory loads.
template <typename acc_t>
struct alignas(4 * sizeof(acc_t)) PairWeights {
  acc_t lt, eq, gt, unused;
};

template <typename scalar_t, int XW>
__global__ void __launch_bounds__(kOnePassThreads) order_loss_all_pairs_backward_one_pass_kernel(
    const LossArgs<scalar_t> args,
    const scalar_t* __restrict__ grad_losses,
    int64_t grad_stride,
    acc_type<scalar_t>* __restrict__ partial) {  // [T,B,n]
  using acc_t = acc_type<scalar_t>;
  constexpr int S = kOnePassWarps * XW;
  constexpr int YT = kOnePassTileY;
  static_assert(XW <= 32, "the row windows are bit masks of one 32-bit word");
  __shared__ PairWeights<acc_t> weights[YT][S];
  __shared__ scalar_t dy_tile[YT][kWarpSize];
  __shared__ int ry_tile[YT];
  __shared__ acc_t y_sums[kOnePassWarps][YT][kWarpSize];

  const int64_t tile_x = blockIdx.y, tile_y = blockIdx.x;
  if (tile_x > tile_y) return;  // the lower triangle of tiles: uniform over the block
  const bool diagonal = tile_x == tile_y;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int64_t B = args.B;
  const int n = args.n;
  const int q = blockIdx.z * kWarpSize + lane;
  const bool q_valid = q < n;
  const int64_t x_base = tile_x * S, y_base = tile_y * S;
  const int64_t warp_x0 = x_base + warp * XW;

  scalar_t dx[XW];
  acc_t grad_x[XW];
  uint32_t x_lower_bits = 0, x_upper_bits = 0;  // bit a: [q <= last_lower_x], [q >= r_x] of row a
#pragma unroll
  for (int a = 0; a < XW; ++a) {
    const int64_t x = warp_x0 + a < B ? warp_x0 + a : B - 1;  // rows past the end: weights 0, never written
    dx[a] = q_valid ? args.D[x * n + q] : scalar_t(0);
    const int rx = load_rank(args, x);
    if (q <= (args.official ? rx - 1 : rx)) x_lower_bits |= 1u << a;
    if (q >= rx) x_upper_bits |= 1u << a;
    grad_x[a] = acc_t(0);
  }

  acc_t* rows_of_x = partial + tile_y * B * n;  // slot J
  acc_t* rows_of_y = partial + tile_x * B * n;  // slot I
  const int64_t y_end = y_base + S < B ? y_base + S : B;
  for (int64_t y0 = y_base; y0 < y_end; y0 += YT) {
    const int rows = static_cast<int>(y_end - y0 < YT ? y_end - y0 : YT);
    __syncthreads();  // the previous step's shared tiles are consumed
    for (int i = threadIdx.x; i < YT * S; i += kOnePassThreads) {
      const int t = i % YT, xi = i / YT;  // consecutive threads: consecutive y, consecutive pair indices
      const int64_t x = x_base + xi, y = y0 + t;
      PairWeights<acc_t> w{acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
      if (t < rows && x < B && x < y) {
        const acc_t g = static_cast<acc_t>(grad_losses[pair_index(x, y, B) * grad_stride]);
        const acc_t* probs =
            args.table + (static_cast<int64_t>(load_rank(args, x)) * n + load_rank(args, y)) * 3;
        w.lt = g * probs[0];
        w.eq = g * probs[1];
        w.gt = g * probs[2];
      }
      weights[t][xi] = w;
    }
    for (int t = warp; t < YT; t += kOnePassWarps) {
      const bool valid = t < rows;
      dy_tile[t][lane] = valid && q_valid ? args.D[(y0 + t) * n + q] : scalar_t(0);
      if (lane == 0) ry_tile[t] = valid ? load_rank(args, y0 + t) : 0;
    }
    __syncthreads();

    for (int t = 0; t < rows; ++t) {
      const scalar_t dy = dy_tile[t][lane];
      const int ry = ry_tile[t];
      const bool y_upper = q >= ry;
      const bool y_lower = q <= (args.official ? ry - 1 : ry);
      acc_t y_sum = acc_t(0);
#pragma unroll
      for (int a = 0; a < XW; ++a) {
        const PairWeights<acc_t> w = weights[t][warp * XW + a];
        const Hinges<scalar_t> hinge(dx[a], dy, args.gamma);
        acc_t grad = acc_t(0);
        if (hinge.above > scalar_t(0)) {
          grad = (((x_lower_bits >> a) & 1u) ? w.lt : acc_t(0)) + (((x_upper_bits >> a) & 1u) ? w.gt : acc_t(0));
        } else if (hinge.above < scalar_t(0)) {
          grad = -w.eq;
        }
        if (hinge.below > scalar_t(0)) {
          grad -= (y_upper ? w.lt : acc_t(0)) + (y_lower ? w.gt : acc_t(0));
        } else if (hinge.below < scalar_t(0)) {
          grad += w.eq;
        }
        grad_x[a] += grad;
        y_sum += grad;
      }
      y_sums[warp][t][lane] = y_sum;
    }
    __syncthreads();
    // Rows of J: the warps' sums added in warp order.
    for (int i = threadIdx.x; i < rows * kWarpSize; i += kOnePassThreads) {
      const int t = i / kWarpSize, l = i % kWarpSize;
      const int q_out = blockIdx.z * kWarpSize + l;
      if (q_out >= n) continue;
      acc_t total = acc_t(0);
#pragma unroll
      for (int w = 0; w < kOnePassWarps; ++w) total += y_sums[w][t][l];
      rows_of_y[(y0 + t) * n + q_out] = -total;
    }
  }

  // On the diagonal both row tiles are tile I and share slot I: the rows' y-side sums written above
  // (visible to the whole block after the barrier) come first, then the x-side sum is added.
  if (diagonal) __syncthreads();
#pragma unroll
  for (int a = 0; a < XW; ++a) {
    const int64_t x = warp_x0 + a;
    if (x >= B || !q_valid) continue;
    acc_t value = grad_x[a];
    if (diagonal) value = rows_of_x[x * n + q] + value;
    rows_of_x[x * n + q] = value;
  }
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

// SOL_EXT_CUDA_ALL_PAIRS_BACKWARD: "auto" (the default), "one_pass" (whenever its buffer fits) or
// "two_pass"; read at each call (a getenv is cheap beside a launch), for timing and testing both kernels.
enum class BackwardChoice { Auto, OnePass, TwoPass };

BackwardChoice backward_choice() {
  const char* text = std::getenv("SOL_EXT_CUDA_ALL_PAIRS_BACKWARD");
  const std::string value = text == nullptr ? "" : text;
  if (value.empty() || value == "auto") return BackwardChoice::Auto;
  if (value == "one_pass") return BackwardChoice::OnePass;
  TORCH_CHECK(value == "two_pass", "SOL_EXT_CUDA_ALL_PAIRS_BACKWARD must be auto, one_pass or two_pass, got '", value,
              "'");
  return BackwardChoice::TwoPass;
}

// Rows per warp of the one-pass kernel (its tiles are 8 * XW rows), or 0 for the two-pass kernel: the
// largest tile whose grid still fills the GPU (backward_target_warps) and whose [T,B,n] buffer stays
// under kOnePassMaxBufferBytes (with "one_pass", the largest tile whose buffer fits). float64 keeps 8 rows
// per warp (registers). Larger tiles mean a smaller buffer and fewer pair weights staged twice.
template <typename scalar_t>
int one_pass_rows_per_warp(int64_t B, int64_t n) {
  const BackwardChoice choice = backward_choice();
  if (choice == BackwardChoice::TwoPass) return 0;
  const int64_t chunks = cuda::ceil_div(n, kWarpSize);
  for (const int xw : {32, 16, 8}) {
    if (std::is_same<scalar_t, double>::value && xw > 8) continue;
    const int64_t tiles = cuda::ceil_div(B, kOnePassWarps * xw);
    const int64_t buffer_bytes = tiles * B * n * static_cast<int64_t>(sizeof(acc_type<scalar_t>));
    if (buffer_bytes > kOnePassMaxBufferBytes || tiles > 65535) return 0;  // smaller tiles need more
    const int64_t warps = tiles * (tiles + 1) / 2 * chunks * kOnePassWarps;
    if (choice == BackwardChoice::OnePass || warps >= backward_target_warps()) return xw;
  }
  return 0;
}

template <typename scalar_t, int XW>
void launch_all_pairs_backward_one_pass(const LossArgs<scalar_t>& args, const at::Tensor& g, at::Tensor& grad_D,
                                        cudaStream_t stream) {
  using acc_t = acc_type<scalar_t>;
  const int64_t tiles = cuda::ceil_div(args.B, kOnePassWarps * XW);
  const int64_t chunks = cuda::ceil_div(args.n, kWarpSize);
  at::Tensor partial = at::empty({tiles, args.B, args.n}, grad_D.options().dtype(table_dtype(grad_D.scalar_type())));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
  order_loss_all_pairs_backward_one_pass_kernel<scalar_t, XW><<<grid, kOnePassThreads, 0, stream>>>(
      args, g.data_ptr<scalar_t>(), g.stride(0), partial.data_ptr<acc_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int64_t size = args.B * args.n;
  const int64_t blocks = std::min<int64_t>(cuda::ceil_div(size, kThreads), 65535);
  sum_segments_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(partial.data_ptr<acc_t>(), tiles, size,
                                                                  grad_D.data_ptr<scalar_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Chooses the one-pass kernel where it fits, else rows per warp (XW), ranks per warp (32*QW in G groups)
// and y segments (S) of the two-pass kernel, then launches.
template <typename scalar_t>
void launch_all_pairs_backward(const LossArgs<scalar_t>& args, const at::Tensor& g, at::Tensor& grad_D,
                               cudaStream_t stream) {
  using acc_t = acc_type<scalar_t>;
  const int64_t B = args.B;
  switch (one_pass_rows_per_warp<scalar_t>(B, args.n)) {
    case 32:  // never planned for float64
      if constexpr (!std::is_same<scalar_t, double>::value) {
        launch_all_pairs_backward_one_pass<scalar_t, 32>(args, g, grad_D, stream);
      }
      return;
    case 16:
      if constexpr (!std::is_same<scalar_t, double>::value) {
        launch_all_pairs_backward_one_pass<scalar_t, 16>(args, g, grad_D, stream);
      }
      return;
    case 8:
      launch_all_pairs_backward_one_pass<scalar_t, 8>(args, g, grad_D, stream);
      return;
    default:
      break;
  }
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

} // namespace

void all_pairs_forward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                       at::Tensor& losses, cudaStream_t stream) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, problem.D.scalar_type(), "order_loss_cuda", [&] {
    launch_all_pairs_forward<scalar_t>(make_args<scalar_t>(problem, table, margin), losses.data_ptr<scalar_t>(), stream);
  });
}

void all_pairs_backward(const OrderLossProblem& problem, const at::Tensor& table, double margin,
                        const at::Tensor& g, at::Tensor& grad_D, cudaStream_t stream) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, problem.D.scalar_type(), "order_loss_backward_cuda", [&] {
    launch_all_pairs_backward<scalar_t>(make_args<scalar_t>(problem, table, margin), g, grad_D, stream);
  });
}

} // namespace order_loss_cuda
} // namespace sol_ext
