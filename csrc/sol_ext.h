// sol_ext: fused Stochastic Order Learning ops.
//
// Every op schema lives in sol_ext.cpp; each backend registers its kernels in
// csrc/<backend>/<op>_kernel.{cpp,cu}. The math is docs/math.md (sections cited below).
//
// Ops (all tensors on one device; B = batch, n = ranks, d = embedding size, M = pairs):
//
//   stochastic_dissimilarity(h [B,d], mu [n,d], sigma) -> D [B,n]                      (docs/math.md §3)
//       D[x,q] = sum_j P[q,j] ||h_x - mu_j||^2, computed as one [B,d]x[d,n] product plus
//       a fused epilogue, about the center of mu (center_on_centroids below), so that embeddings far
//       from the origin keep D's precision. dtype of h (float32/float64; CUDA also float16/bfloat16).
//       Every finite sigma > 0 works: a tiny one gives the identity kernel, a huge one the uniform one.
//       CUDA: float32 products run in full float32 whatever torch.backends.cuda.matmul.allow_tf32 or
//       torch.set_float32_matmul_precision say (TF32 would cost D its precision, and D is what the
//       losses compare).
//       CPU: the rows in blocks fixed by the shape, one task each (run_tasks, cpu/tasks.h), so the
//       results do not depend on which thread ran which block.
//   _stochastic_dissimilarity_backward(grad_D [B,n], h, mu, sigma, need_grad_h, need_grad_mu)
//       -> (grad_h [B,d], grad_mu [n,d]); an output that is not needed comes back empty ([0]).
//
//   ordering_probabilities(r_x [M] int64, r_y [M] int64, n, sigma, tau, convention, dtype)
//       -> [M,3] = (Pr(x<y), Pr(x~y), Pr(x>y)) gathered from the cached [n,n,3] table (docs/math.md §5, §10.2).
//       Every tau >= n - 1 means the same (true ranks never differ by more than n - 1) and is clamped.
//
//   order_loss(D [B,n], labels [B] int64, pairs [M,2] int64 or None, sigma, tau, margin, convention)
//       -> per-pair losses [M], M = B(B-1)/2 for all pairs x<y in batch order      (docs/math.md §6, §7)
//       A NaN in D gives NaN for every pair that reads it, on every backend (as torch.relu does).
//   _order_loss_backward(grad_losses [M], D, labels, pairs, sigma, tau, margin, convention) -> grad_D [B,n]
//       Deterministic on the CPU: all pairs, each pair's gradient computed once and added to its two rows
//       tile by tile, every row's sums in an order fixed by B; explicit pairs, each row of grad_D summed
//       by one worker in pair order. The CPU kernels run at the machine's width (cpu/cpu_capability.h):
//       bitwise reproducible for any number of threads on each capability.
//       CUDA, all pairs: no atomics, bitwise reproducible; the summation order depends on (B, n, dtype)
//       only, not on the GPU model.
//       Extra memory O(B*n + M): no [M,n] or [B,B,n] intermediate.
//
//   order_loss_block(D [B,n], labels [B] int64, D_all [N,n], labels_all [N] int64, offset, sigma, tau,
//                    margin, convention) -> per-row sums [B]                            (docs/math.md §6, §7)
//       A rectangular block of pairs for data-parallel training: the local rows D are rows
//       offset..offset+B-1 of the global batch D_all (0 <= offset <= N - B), and local row i owns the
//       pairs (i, j) with j > offset + i, j indexing D_all, oriented x = D[i], y = D_all[j]. Every pair
//       x < y of the global batch then belongs to exactly one process. Returns
//       out[i] = sum_{j > offset+i} l_order(D[i], D_all[j]), summed in acc precision in j order.
//   _order_loss_block_backward(grad_rows [B], D, labels, D_all, labels_all, offset, sigma, tau, margin,
//                              convention, need_grad_D, need_grad_D_all) -> (grad_D [B,n], grad_D_all [N,n])
//       An output that is not needed comes back empty ([0]). Deterministic, no atomics: each row of
//       grad_D (of grad_D_all) is summed by one worker over its pairs in order. Extra memory O((B + N) n).
//       CPU and CUDA; the CUDA kernels use one warp per row (no atomics, bitwise reproducible).
//
//   disc_loss(D [B,n], labels [B] int64, T) -> per-sample losses [B]                (docs/math.md §4)
//       The terms of every t >= n are equal and are added as one term times their count: O(n) for any T.
//   _disc_loss_backward(grad_losses [B], labels, n, T) -> grad_D [B,n]
//
//   stochastic_order_loss(h, mu, labels, pairs, sigma, tau, margin, T, disc_weight, convention, reduction)
//       -> (loss, D): StochasticOrderLoss in one op (stochastic_order_loss.cpp): D, the order and disc
//       losses, their reductions ("mean"/"sum") and order + disc_weight * disc; loss is float32 for
//       float16/bfloat16. Has its own autograd kernel (one node); D comes back for the value checks.
//   _stochastic_order_loss_backward(grad_loss, h, mu, D, labels, pairs, ..., need_grad_h, need_grad_mu)
//       -> (grad_h, grad_mu); an output that is not needed comes back empty ([0]).
//
//   grouped_stochastic_order_loss(h, mu, labels, sigma, tau, margin, T, disc_weight, convention, reduction,
//                                 check_values, need_grad) -> (loss, D, grad_order [B,n] float64)
//       stochastic_order_loss over all pairs by the grouped algorithm (below), its own autograd kernel;
//       grad_order = d(order sum)/dD for the backward (empty [0] unless need_grad). CPU and CUDA (the
//       composition of the device ops, as stochastic_order_loss). With check_values it refuses non-finite
//       h, mu and D (ValueError), on CPU tensors: on CUDA the caller checks the values and passes false.
//       CPU: runs the step's parallel regions on the calling thread and spreads only the dissimilarity's
//       row blocks and the per-rank sorts over helpers that it never waits for to start (SerialRegions
//       below, cpu/tasks.h).
//   _grouped_stochastic_order_loss_backward(grad_loss, h, mu, D, labels, grad_order, sigma, T, disc_weight,
//                                           reduction, need_grad_h, need_grad_mu) -> (grad_h, grad_mu)
//
//   grouped_order_sum(D [B,n], labels [B] int64, sigma, tau, margin, convention, rank_begin, rank_end,
//                     need_grad) -> (total [] float64, grad [B,n] float64)                (docs/math.md §13)
//       The sum of the order loss over all pairs x<y, restricted to the ranks rank_begin..rank_end-1, by
//       sorting each rank's column: O(n^2 B + n B log B) instead of O(B^2 n). grad = d total / dD (zero
//       outside the ranks; empty [0] unless need_grad): the loss is piecewise linear in D, so the backward
//       is grad times the incoming gradient. float32/float64; the same hinge decisions as order_loss.
//       CPU: deterministic, each rank is summed by one worker, the ranks in order. CUDA: a stable sort
//       per rank column and fixed-order sums, no atomics, bitwise reproducible; the label values are
//       checked on the device (cuda/grouped_order_loss_kernel.cu).
#pragma once

#include <ATen/ATen.h>

#include <string_view>

namespace sol_ext {

// docs/math.md §10: "paper" follows the paper's equations, "official" reproduces the authors' code.
enum class Convention { Paper, Official };

Convention parse_convention(std::string_view name);

// Noise kernel P [n,n] (docs/math.md §2), computed in float64 and cast to `dtype` on `device`.
// Cached per (n, sigma, dtype, device); the returned tensor must not be modified.
at::Tensor noise_kernel(int64_t num_ranks, double sigma, at::ScalarType dtype, at::Device device);

// Ordering-probability table [n,n,3] (docs/math.md §5, §10.2): table[a,b] = (lt, eq, gt) for
// noisy ranks (r_x, r_y) = (a, b). Computed in float64 on the CPU, cast and cached per
// (n, sigma, tau, convention, dtype, device); the returned tensor must not be modified.
at::Tensor ordering_table(
    int64_t num_ranks,
    double sigma,
    int64_t tau,
    Convention convention,
    at::ScalarType dtype,
    at::Device device);

// D is unchanged when h and every mu_j move by one vector s, and the kernels compute it about the
// center of the centroids, s = (min_j mu_j + max_j mu_j) / 2 per coordinate. Far from the origin
// a_q ||h||^2 - 2 h.nu_q + c_q is a difference of huge terms that cancel (h and mu near 1000: every
// digit of D lost in float32); about s the terms are of the size of D. h - s and mu - s are exact where
// h and mu lie near s, and min/max are exact, so s does not depend on the number of threads. The
// gradients come out the same: D does not depend on s, so no gradient flows through it.
struct CenteredInputs {
  at::Tensor h, mu;  // h - s [B,d], mu - s [n,d]
};
CenteredInputs center_on_centroids(const at::Tensor& h, const at::Tensor& mu);
at::Tensor centering_shift(const at::Tensor& mu);  // s [1,d]

// The centroid side of the dissimilarity algebra (docs/math.md §3), on mu's device and dtype:
// P [n,n], nu = P mu [n,d], a = P 1 [n] and c = P ||mu_j||^2 [n].
struct SmoothedCentroids {
  at::Tensor P, nu, a, c;
};
SmoothedCentroids smooth_centroids(const at::Tensor& mu, double sigma);

// Number of pairs the order loss sees: B(B-1)/2 for all pairs, else pairs.size(0).
int64_t num_pairs(int64_t batch_size, const std::optional<at::Tensor>& pairs);

// An order-loss call after the shared checks: contiguous inputs, sizes, and the parsed convention.
// Each backend then fetches the probability table in the precision it accumulates in.
struct OrderLossProblem {
  at::Tensor D, labels;             // [B,n], [B]
  std::optional<at::Tensor> pairs;  // [M,2] or none (all pairs)
  int64_t B, n, M;
  Convention convention;

  at::Tensor table(double sigma, int64_t tau, at::ScalarType dtype) const {
    return ordering_table(n, sigma, tau, convention, dtype, D.device());
  }
};
OrderLossProblem prepare_order_loss(
    const at::Tensor& D,
    const at::Tensor& labels,
    const std::optional<at::Tensor>& pairs,
    double sigma,
    int64_t tau,
    double margin,
    std::string_view convention);

// An order_loss_block call after the shared checks: contiguous inputs and sizes.
struct OrderLossBlockProblem {
  at::Tensor D, labels, D_all, labels_all;  // [B,n], [B], [N,n], [N]
  int64_t B, N, n, offset;
  Convention convention;

  at::Tensor table(double sigma, int64_t tau, at::ScalarType dtype) const {
    return ordering_table(n, sigma, tau, convention, dtype, D.device());
  }
};
OrderLossBlockProblem prepare_order_loss_block(
    const at::Tensor& D,
    const at::Tensor& labels,
    const at::Tensor& D_all,
    const at::Tensor& labels_all,
    int64_t offset,
    double sigma,
    int64_t tau,
    double margin,
    std::string_view convention);

// CPU: the parallel regions that the calling thread opens while a SerialRegions is alive (at::parallel_for,
// MKL's products) run on that thread alone, and threads() is torch's intra-op thread count outside it.
// It sets OpenMP's and MKL's thread counts of the calling thread to 1 and restores them at the end.
// On a machine whose cores are busy, an OpenMP team's barrier waits for a thread the OS has descheduled,
// a time slice (milliseconds) per region; a step of many regions then runs slower on two threads than
// on one. A whole-step op holds one and spreads only its heavy loops over helpers that never make the
// caller wait for them to start (cpu/tasks.h). Both settings are per thread; without OpenMP and MKL it
// does nothing.
class SerialRegions {
 public:
  SerialRegions();
  ~SerialRegions();
  SerialRegions(const SerialRegions&) = delete;
  SerialRegions& operator=(const SerialRegions&) = delete;
  static int64_t threads();

 private:
  int previous_;
};

// Last-guard argument checks shared by every backend (the Python layer validates first). Each op's
// checks are in one place, checks.cpp: a prepare_* function checks a call and returns its inputs ready
// for the kernels; the ops without one call the check_* function of their inputs.

// The smallest and the largest label and the index of the first one outside 0..num_ranks-1 (-1 if none),
// read in one pass on the calling thread (no parallel region). CPU tensors.
struct LabelRange {
  int64_t lowest, highest, first_outside;
};
LabelRange label_range(const at::Tensor& labels, int64_t num_ranks);
// labels: int64 of shape [batch_size].
void check_label_shape(const at::Tensor& labels, int64_t batch_size);
// check_label_shape, and on the CPU the values in 0..num_ranks-1.
void check_labels(const at::Tensor& labels, int64_t batch_size, int64_t num_ranks);
// check_label_shape and the values (a CPU tensor) with sol_ext/_validation.py's check_ranks message
// (ValueError), for the ops that check values on request (check_values).
void check_label_values(const at::Tensor& labels, int64_t batch_size, int64_t num_ranks);
void check_dissimilarity_inputs(const at::Tensor& h, const at::Tensor& mu, double sigma);
// _stochastic_dissimilarity_backward: check_dissimilarity_inputs and grad_D [B, n], floating, on h's device.
void check_dissimilarity_backward_inputs(const at::Tensor& grad_D, const at::Tensor& h, const at::Tensor& mu,
                                         double sigma);
void check_order_loss_inputs(
    const at::Tensor& D,
    const at::Tensor& labels,
    const std::optional<at::Tensor>& pairs,
    double sigma,
    int64_t tau,
    double margin);

// A disc_loss call after the checks: contiguous inputs and sizes.
struct DiscLossProblem {
  at::Tensor D, labels;  // [B,n], [B]
  int64_t B, n;
};
DiscLossProblem prepare_disc_loss(const at::Tensor& D, const at::Tensor& labels, int64_t T);

// A _disc_loss_backward call after the checks. grad_losses comes back as given: a stride-0 gradient (the
// backward of a mean or sum) is read in place.
struct DiscLossBackwardProblem {
  at::Tensor grad_losses, labels;  // [B], [B] contiguous
  int64_t B, n;
};
DiscLossBackwardProblem prepare_disc_loss_backward(const at::Tensor& grad_losses, const at::Tensor& labels,
                                                   int64_t num_ranks, int64_t T);

// A grouped_order_sum call after the checks: D [B, n] float32/float64, labels [B] int64 on D's device,
// B < 2^31, a rank range in 0..n, the parsed convention. The label values are each backend's to check
// (the CPU op with label_range on its thread, CUDA on the device).
struct GroupedOrderSumProblem {
  at::Tensor D, labels;  // [B,n], [B] contiguous
  int64_t B, n;
  Convention convention;
};
GroupedOrderSumProblem prepare_grouped_order_sum(const at::Tensor& D, const at::Tensor& labels, double sigma,
                                                 int64_t tau, double margin, std::string_view convention,
                                                 int64_t rank_begin, int64_t rank_end);

// The number of NaN and inf values of a float32/float64 CPU tensor, counted on the calling thread.
int64_t count_nonfinite(const at::Tensor& t);
void check_ordering_probability_inputs(const at::Tensor& r_x, const at::Tensor& r_y, at::ScalarType dtype);
// grad_losses: [num_losses], floating, on D's device.
void check_grad_losses(const at::Tensor& grad_losses, const at::Tensor& D, int64_t num_losses);

} // namespace sol_ext
