// Last-guard argument checks shared by every backend. The Python layer (sol_ext/_validation.py)
// validates first and gives friendlier messages; these keep a kernel from ever reading out of bounds
// when an op is called directly through torch.ops.
#include <ATen/Dispatch.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include "sol_ext.h"

namespace sol_ext {

LabelRange label_range(const at::Tensor& labels, int64_t num_ranks) {
  const at::Tensor values = labels.contiguous();
  const int64_t* v = values.const_data_ptr<int64_t>();
  LabelRange range{0, 0, -1};
  if (values.numel() == 0) return range;
  range.lowest = range.highest = v[0];
  for (int64_t i = 0; i < values.numel(); ++i) {
    range.lowest = std::min(range.lowest, v[i]);
    range.highest = std::max(range.highest, v[i]);
    if (range.first_outside < 0 && (v[i] < 0 || v[i] >= num_ranks)) range.first_outside = i;
  }
  return range;
}

void check_label_shape(const at::Tensor& labels, int64_t batch_size) {
  TORCH_CHECK(labels.scalar_type() == at::kLong, "labels must be int64, got ", labels.scalar_type());
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == batch_size,
              "labels must have shape [", batch_size, "], got ", labels.sizes());
}

void check_labels(const at::Tensor& labels, int64_t batch_size, int64_t n) {
  check_label_shape(labels, batch_size);
  if (labels.is_cpu()) {  // a device-side check would synchronize
    const LabelRange range = label_range(labels, n);
    TORCH_CHECK(range.first_outside < 0, "labels must lie in 0..", n - 1, ", got values in ", range.lowest, "..",
                range.highest);
  }
}

void check_label_values(const at::Tensor& labels, int64_t batch_size, int64_t num_ranks) {
  check_label_shape(labels, batch_size);
  const LabelRange range = label_range(labels, num_ranks);
  if (range.first_outside < 0) return;
  const bool one_based = range.lowest >= 1 && range.highest == num_ranks;
  TORCH_CHECK_VALUE(false, "labels must lie in 0 … ", num_ranks - 1, " (0-based ranks for num_ranks=", num_ranks,
                    "), got values in ", range.lowest, " … ", range.highest,
                    one_based ? "; they look 1-based: pass labels - 1" : "");
}

// D [B, n], n >= 1, floating, and its labels [B] on its device (values checked on the CPU).
void check_dissimilarities_and_labels(const at::Tensor& D, const at::Tensor& labels) {
  TORCH_CHECK(D.dim() == 2 && D.size(1) >= 1, "D must have shape [B, n] with n >= 1, got ", D.sizes());
  TORCH_CHECK(at::isFloatingType(D.scalar_type()), "D must be floating point, got ", D.scalar_type());
  TORCH_CHECK(labels.device() == D.device(), "labels must be on D's device ", D.device(), ", got ",
              labels.device());
  check_labels(labels, D.size(0), D.size(1));
}

void check_order_loss_constants(double sigma, int64_t tau, double margin) {
  TORCH_CHECK(std::isfinite(sigma) && sigma > 0, "sigma must be a finite number > 0, got ", sigma);
  TORCH_CHECK(tau >= 0, "tau must be >= 0, got ", tau);
  TORCH_CHECK(std::isfinite(margin) && margin >= 0, "margin must be a finite number >= 0, got ", margin);
}

void check_dissimilarity_inputs(const at::Tensor& h, const at::Tensor& mu, double sigma) {
  TORCH_CHECK(h.dim() == 2, "h must have shape [B, d], got ", h.sizes());
  TORCH_CHECK(mu.dim() == 2 && mu.size(0) >= 1 && mu.size(1) == h.size(1),
              "mu must have shape [n, ", h.size(1), "] with n >= 1, got ", mu.sizes());
  TORCH_CHECK(h.scalar_type() == mu.scalar_type(), "h and mu must have one dtype, got ",
              h.scalar_type(), " and ", mu.scalar_type());
  TORCH_CHECK(at::isFloatingType(h.scalar_type()), "h must be floating point, got ", h.scalar_type());
  TORCH_CHECK(h.device() == mu.device(), "h and mu must be on one device, got ", h.device(), " and ",
              mu.device());
  TORCH_CHECK(std::isfinite(sigma) && sigma > 0, "sigma must be a finite number > 0, got ", sigma);
}

void check_order_loss_inputs(
    const at::Tensor& D,
    const at::Tensor& labels,
    const std::optional<at::Tensor>& pairs,
    double sigma,
    int64_t tau,
    double margin) {
  check_dissimilarities_and_labels(D, labels);
  check_order_loss_constants(sigma, tau, margin);
  if (pairs.has_value()) {
    const at::Tensor& p = *pairs;
    TORCH_CHECK(p.scalar_type() == at::kLong, "pairs must be int64, got ", p.scalar_type());
    TORCH_CHECK(p.dim() == 2 && p.size(1) == 2, "pairs must have shape [M, 2], got ", p.sizes());
    TORCH_CHECK(p.device() == D.device(), "pairs must be on D's device ", D.device(), ", got ", p.device());
    TORCH_CHECK(p.size(0) == 0 || D.size(0) > 0, "pairs must be empty for an empty batch, got ", p.size(0), " pairs");
    if (p.is_cpu() && p.numel() > 0) {
      const auto [lowest, highest] = at::aminmax(p);
      TORCH_CHECK(lowest.item<int64_t>() >= 0 && highest.item<int64_t>() < D.size(0),
                  "pair indices must lie in 0..", D.size(0) - 1, ", got values in ", lowest.item<int64_t>(),
                  "..", highest.item<int64_t>());
    }
  }
}

DiscLossProblem prepare_disc_loss(const at::Tensor& D, const at::Tensor& labels, int64_t T) {
  check_dissimilarities_and_labels(D, labels);
  TORCH_CHECK(T >= 1, "T must be >= 1, got ", T);
  return {D.contiguous(), labels.contiguous(), D.size(0), D.size(1)};
}

DiscLossBackwardProblem prepare_disc_loss_backward(const at::Tensor& grad_losses, const at::Tensor& labels,
                                                   int64_t n, int64_t T) {
  TORCH_CHECK(n >= 1, "num_ranks must be >= 1, got ", n);
  TORCH_CHECK(at::isFloatingType(grad_losses.scalar_type()), "grad_losses must be floating point, got ",
              grad_losses.scalar_type());
  TORCH_CHECK(grad_losses.dim() == 1, "grad_losses must have shape [B], got ", grad_losses.sizes());
  TORCH_CHECK(T >= 1, "T must be >= 1, got ", T);
  TORCH_CHECK(labels.device() == grad_losses.device(), "labels must be on grad_losses' device ",
              grad_losses.device(), ", got ", labels.device());
  const int64_t B = grad_losses.size(0);
  check_labels(labels, B, n);
  return {grad_losses, labels.contiguous(), B, n};
}

void check_dissimilarity_backward_inputs(const at::Tensor& grad_D, const at::Tensor& h, const at::Tensor& mu,
                                         double sigma) {
  check_dissimilarity_inputs(h, mu, sigma);
  TORCH_CHECK(grad_D.device() == h.device(), "grad_D must be on h's device ", h.device(), ", got ",
              grad_D.device());
  TORCH_CHECK(grad_D.sizes() == at::IntArrayRef({h.size(0), mu.size(0)}), "grad_D must have shape [B, n] = ",
              at::IntArrayRef({h.size(0), mu.size(0)}), ", got ", grad_D.sizes());
  TORCH_CHECK(at::isFloatingType(grad_D.scalar_type()), "grad_D must be floating point, got ",
              grad_D.scalar_type());
}

void check_ordering_probability_inputs(const at::Tensor& r_x, const at::Tensor& r_y, at::ScalarType dtype) {
  TORCH_CHECK(r_x.scalar_type() == at::kLong && r_y.scalar_type() == at::kLong,
              "r_x and r_y must be int64, got ", r_x.scalar_type(), " and ", r_y.scalar_type());
  TORCH_CHECK(r_x.dim() == 1 && r_x.sizes() == r_y.sizes(), "r_x and r_y must be 1-D of one length, got ",
              r_x.sizes(), " and ", r_y.sizes());
  TORCH_CHECK(r_x.device() == r_y.device(), "r_x and r_y must be on one device, got ", r_x.device(), " and ",
              r_y.device());
  TORCH_CHECK(at::isFloatingType(dtype), "dtype must be floating point, got ", dtype);
}

void check_grad_losses(const at::Tensor& grad_losses, const at::Tensor& D, int64_t num_losses) {
  TORCH_CHECK(grad_losses.device() == D.device(), "grad_losses must be on D's device ", D.device(), ", got ",
              grad_losses.device());
  TORCH_CHECK(at::isFloatingType(grad_losses.scalar_type()), "grad_losses must be floating point, got ",
              grad_losses.scalar_type());
  TORCH_CHECK(grad_losses.dim() == 1 && grad_losses.size(0) == num_losses, "grad_losses must have shape [",
              num_losses, "], got ", grad_losses.sizes());
}

OrderLossProblem prepare_order_loss(
    const at::Tensor& D,
    const at::Tensor& labels,
    const std::optional<at::Tensor>& pairs,
    double sigma,
    int64_t tau,
    double margin,
    std::string_view convention) {
  check_order_loss_inputs(D, labels, pairs, sigma, tau, margin);
  std::optional<at::Tensor> contiguous_pairs;
  if (pairs.has_value()) contiguous_pairs = pairs->contiguous();
  const int64_t B = D.size(0);
  return {D.contiguous(),           labels.contiguous(),  contiguous_pairs, B, D.size(1),
          num_pairs(B, pairs), parse_convention(convention)};
}

OrderLossBlockProblem prepare_order_loss_block(
    const at::Tensor& D,
    const at::Tensor& labels,
    const at::Tensor& D_all,
    const at::Tensor& labels_all,
    int64_t offset,
    double sigma,
    int64_t tau,
    double margin,
    std::string_view convention) {
  check_order_loss_inputs(D, labels, std::nullopt, sigma, tau, margin);
  check_order_loss_inputs(D_all, labels_all, std::nullopt, sigma, tau, margin);
  TORCH_CHECK(D_all.device() == D.device(), "D_all must be on D's device ", D.device(), ", got ", D_all.device());
  TORCH_CHECK(D_all.scalar_type() == D.scalar_type(), "D and D_all must have one dtype, got ", D.scalar_type(),
              " and ", D_all.scalar_type());
  TORCH_CHECK(D_all.size(1) == D.size(1), "D and D_all must have the same number of ranks, got ", D.size(1),
              " and ", D_all.size(1));
  const int64_t B = D.size(0), N = D_all.size(0);
  TORCH_CHECK(offset >= 0 && offset + B <= N, "offset must lie in 0..", N - B,
              " (the local rows are rows offset..offset+B-1 of D_all), got ", offset);
  return {D.contiguous(), labels.contiguous(), D_all.contiguous(), labels_all.contiguous(), B, N, D.size(1), offset,
          parse_convention(convention)};
}

GroupedOrderSumProblem prepare_grouped_order_sum(const at::Tensor& D, const at::Tensor& labels, double sigma,
                                                 int64_t tau, double margin, std::string_view convention,
                                                 int64_t rank_begin, int64_t rank_end) {
  TORCH_CHECK(D.dim() == 2 && D.size(1) >= 1, "D must have shape [B, n] with n >= 1, got ", D.sizes());
  TORCH_CHECK(D.scalar_type() == at::kFloat || D.scalar_type() == at::kDouble,
              "grouped_order_sum: D must be float32 or float64, got ", D.scalar_type());
  TORCH_CHECK(labels.device() == D.device(), "labels must be on D's device ", D.device(), ", got ", labels.device());
  const int64_t B = D.size(0), n = D.size(1);
  check_label_shape(labels, B);
  TORCH_CHECK(B < (int64_t(1) << 31), "grouped_order_sum takes batches of fewer than 2^31 rows, got ", B);
  check_order_loss_constants(sigma, tau, margin);
  TORCH_CHECK(0 <= rank_begin && rank_begin <= rank_end && rank_end <= n, "rank_begin and rank_end must satisfy ",
              "0 <= rank_begin <= rank_end <= ", n, ", got ", rank_begin, " and ", rank_end);
  const Convention parsed = parse_convention(convention);  // refused even where nothing is summed
  return {D.contiguous(), labels.contiguous(), B, n, parsed};
}

int64_t count_nonfinite(const at::Tensor& t_in) {
  const at::Tensor t = t_in.contiguous();
  int64_t count = 0;
  AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "count_nonfinite", [&] {
    const scalar_t* values = t.const_data_ptr<scalar_t>();
    for (int64_t i = 0; i < t.numel(); ++i) count += !std::isfinite(values[i]);
  });
  return count;
}

} // namespace sol_ext
