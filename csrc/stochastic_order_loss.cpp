// StochasticOrderLoss as one op per direction, with its own autograd kernel (docs/math.md §7):
//
//   stochastic_order_loss(h, mu, labels, pairs, ...) -> (loss, D)
//       D = stochastic_dissimilarity(h, mu), the order loss over the pairs and the disc loss per sample,
//       each reduced ("mean" or "sum"), loss = order + disc_weight * disc.
//   _stochastic_order_loss_backward(grad_loss, h, mu, D, labels, pairs, ...) -> (grad_h, grad_mu)
//
//   grouped_stochastic_order_loss(h, mu, labels, ..., check_values, need_grad) -> (loss, D, grad_order)
//   _grouped_stochastic_order_loss_backward(grad_loss, h, mu, D, labels, grad_order, ...) -> (grad_h, grad_mu)
//       The same loss over all pairs by the grouped algorithm (docs/math.md §13): the order term by
//       grouped_order_sum, whose gradient grad_order (d sum / dD, float64) the forward keeps for the
//       backward. On the CPU the whole step runs its parallel regions on the calling thread
//       (SerialRegions, sol_ext.h) and only the dissimilarity's row blocks and the per-rank sorts on
//       helpers that it never waits for to start (cpu/tasks.h), so that it forms no OpenMP team, whose
//       barrier would wait for a descheduled thread on a busy machine; the value checks are loops inside
//       it. On CUDA (StochasticOrderLoss takes it with SOL_EXT_CUDA_GROUPED=fused, see
//       cuda/grouped_order_loss_kernel.cu) the caller checks the values: check_values must be false.
//
// They call the device ops of sol_ext.h through the dispatcher, so they serve every backend those ops
// have. A training step then crosses from Python into C++ once per direction, and autograd keeps one C++
// node: at small batches the time of a step is mostly that per-call overhead, not arithmetic.
// The reductions are those of sol_ext/_reduction.py, operation for operation (the same numbers).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <initializer_list>
#include <iomanip>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "sol_ext.h"

namespace sol_ext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ------------------------------------------------------------------------------------------------
// The device ops, called through the dispatcher (their kernels live in csrc/<backend>/).
// ------------------------------------------------------------------------------------------------

template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

at::Tensor dissimilarity(const at::Tensor& h, const at::Tensor& mu, double sigma) {
  static const auto handle = op<at::Tensor(const at::Tensor&, const at::Tensor&, double)>(
      "sol_ext::stochastic_dissimilarity");
  return handle.call(h, mu, sigma);
}

std::tuple<at::Tensor, at::Tensor> dissimilarity_backward(const at::Tensor& grad_D, const at::Tensor& h,
                                                          const at::Tensor& mu, double sigma, bool need_h,
                                                          bool need_mu) {
  static const auto handle = op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                   const at::Tensor&, double, bool, bool)>(
      "sol_ext::_stochastic_dissimilarity_backward");
  return handle.call(grad_D, h, mu, sigma, need_h, need_mu);
}

using OrderLossSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                      double, int64_t, double, c10::string_view);
using OrderLossBackwardSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                              const std::optional<at::Tensor>&, double, int64_t, double,
                                              c10::string_view);

// ------------------------------------------------------------------------------------------------
// Reductions (sol_ext/_reduction.py: reduce_losses and grad_of_reduction)
// ------------------------------------------------------------------------------------------------

at::ScalarType reduced_dtype(at::ScalarType dtype) {
  return at::promote_types(dtype, at::kFloat);
}

// On the CPU: the sum in float64 in an order fixed by the number of losses alone (blocks of 4096 in
// order, then the block sums in order), so the result is the same for any number of threads. Elsewhere
// torch's sum, accumulating in float32 or wider.
at::Tensor reduce(const at::Tensor& losses, bool mean) {
  const int64_t count = losses.size(0);
  const at::ScalarType dtype = reduced_dtype(losses.scalar_type());
  if (!losses.is_cpu()) {
    const at::Tensor total = losses.sum(dtype);
    return mean ? total.div(std::max<int64_t>(count, 1)) : total;
  }
  constexpr int64_t kBlock = 4096;
  const at::Tensor values = losses.contiguous();
  double total = 0.0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "reduce", [&] {
    const scalar_t* v = values.const_data_ptr<scalar_t>();  // each value widened to float64 as it is read
    for (int64_t start = 0; start < count; start += kBlock) {
      double block = 0.0;
      for (int64_t i = start; i < std::min(start + kBlock, count); ++i) block += static_cast<double>(v[i]);
      total = start == 0 ? block : total + block;
    }
  });
  if (mean) total /= static_cast<double>(std::max<int64_t>(count, 1));
  return at::scalar_tensor(total, losses.options().dtype(dtype));
}

// d reduce / d losses, [count] (one value, expanded), in the rounding autograd gives the reductions above.
at::Tensor grad_of_reduction(const at::Tensor& grad, int64_t count, bool mean, at::ScalarType dtype) {
  at::Tensor g = grad;
  if (mean) g = (grad.is_cpu() ? grad.to(at::kDouble) : grad).div(std::max<int64_t>(count, 1));
  return g.to(dtype).expand({count});
}

bool parse_mean(c10::string_view reduction) {
  TORCH_CHECK(reduction == "mean" || reduction == "sum", "reduction must be \"mean\" or \"sum\", got \"",
              std::string(reduction), "\"");
  return reduction == "mean";
}

// ------------------------------------------------------------------------------------------------
// The two ops, below autograd
// ------------------------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> stochastic_order_loss(
    const at::Tensor& h, const at::Tensor& mu, const at::Tensor& labels, const std::optional<at::Tensor>& pairs,
    double sigma, int64_t tau, double margin, int64_t T, double disc_weight, c10::string_view convention,
    c10::string_view reduction) {
  static const auto order_op = op<OrderLossSignature>("sol_ext::order_loss");
  static const auto disc_op = op<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>("sol_ext::disc_loss");
  TORCH_CHECK(disc_weight >= 0, "disc_weight must be >= 0, got ", disc_weight);
  const bool mean = parse_mean(reduction);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  at::Tensor D = dissimilarity(h, mu, sigma);
  const at::Tensor order = reduce(order_op.call(D, labels, pairs, sigma, tau, margin, convention), mean);
  const at::Tensor disc = reduce(disc_op.call(D, labels, T), mean);
  return {order.add(disc.mul(disc_weight)), D};
}

std::tuple<at::Tensor, at::Tensor> stochastic_order_loss_backward(
    const at::Tensor& grad_loss, const at::Tensor& h, const at::Tensor& mu, const at::Tensor& D,
    const at::Tensor& labels, const std::optional<at::Tensor>& pairs, double sigma, int64_t tau, double margin,
    int64_t T, double disc_weight, c10::string_view convention, c10::string_view reduction, bool need_grad_h,
    bool need_grad_mu) {
  static const auto order_backward_op = op<OrderLossBackwardSignature>("sol_ext::_order_loss_backward");
  static const auto disc_backward_op =
      op<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, int64_t)>("sol_ext::_disc_loss_backward");
  const bool mean = parse_mean(reduction);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const int64_t B = D.size(0), n = D.size(1);
  const at::Tensor grad_order = grad_of_reduction(grad_loss, num_pairs(B, pairs), mean, D.scalar_type());
  const at::Tensor grad_disc = grad_of_reduction(grad_loss.mul(disc_weight), B, mean, D.scalar_type());
  at::Tensor grad_D = order_backward_op.call(grad_order, D, labels, pairs, sigma, tau, margin, convention);
  grad_D = grad_D.add(disc_backward_op.call(grad_disc, labels, n, T));
  return dissimilarity_backward(grad_D, h, mu, sigma, need_grad_h, need_grad_mu);
}

// The grouped all-pairs path, CPU (see the top of the file). Its reductions and roundings are those of
// sol_ext/grouped.py's GroupedOrderLoss and the fused disc loss, operation for operation.

// The value checks of sol_ext/_validation.py's check_finite and sol_ext/ops.py's
// _check_dissimilarities_finite, same messages, as loops on this thread.
void check_finite(const char* name, const at::Tensor& t) {
  const int64_t bad = count_nonfinite(t);
  TORCH_CHECK_VALUE(bad == 0, name, " contains ", bad, " NaN or inf value(s); expected finite numbers");
}

void check_dissimilarities_finite(const at::Tensor& D, const at::Tensor& h, const at::Tensor& mu) {
  const int64_t bad = count_nonfinite(D);
  if (bad == 0) return;
  const double largest = std::max(h.abs().max().item<double>(), mu.abs().max().item<double>());
  std::ostringstream message;
  message << "the stochastic dissimilarities of h and mu overflow torch."
          << (D.scalar_type() == at::kDouble ? "float64" : "float32") << ": " << bad << " of D's " << D.numel()
          << " values are inf or NaN although h and mu are finite (largest |value| " << std::setprecision(3)
          << largest << "); scale the embeddings down or compute in float64";
  TORCH_CHECK_VALUE(false, message.str());
}

// sol_ext/_validation.py's check_loss_finite for h and mu, same message: finite but huge h and mu can
// overflow the loss.
void check_loss_finite(const at::Tensor& loss, const at::Tensor& h, const at::Tensor& mu, double margin) {
  if (std::isfinite(loss.item<double>())) return;
  const double largest = std::max(h.abs().max().item<double>(), mu.abs().max().item<double>());
  std::ostringstream message;
  message << std::setprecision(3) << "the loss overflows torch."
          << (loss.scalar_type() == at::kDouble ? "float64" : "float32")
          << " although its inputs are finite: the largest |value| of h and mu is " << largest
          << " and margin=" << margin << ", and a pair's order loss adds up to 2n hinge terms of about |D| + "
          << "margin each; scale them down or compute in float64";
  TORCH_CHECK_VALUE(false, message.str());
}

// 1 / (number of pairs) for "mean", as GroupedOrderLoss scales (a product, not a quotient).
double grouped_scale(int64_t B, bool mean) {
  return mean ? 1.0 / static_cast<double>(std::max<int64_t>(B * (B - 1) / 2, 1)) : 1.0;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_stochastic_order_loss(
    const at::Tensor& h, const at::Tensor& mu, const at::Tensor& labels, double sigma, int64_t tau, double margin,
    int64_t T, double disc_weight, c10::string_view convention, c10::string_view reduction, bool check_values,
    bool need_grad) {
  static const auto grouped_op = op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, double, int64_t, double, c10::string_view, int64_t, int64_t, bool)>(
      "sol_ext::grouped_order_sum");
  static const auto disc_op = op<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>("sol_ext::disc_loss");
  TORCH_CHECK(disc_weight >= 0, "disc_weight must be >= 0, got ", disc_weight);
  TORCH_CHECK(!check_values || h.is_cpu(), "grouped_stochastic_order_loss: check_values=True reads the values "
              "on the CPU; on ", h.device(), " check them before the call, as StochasticOrderLoss does, and pass False");
  const bool mean = parse_mean(reduction);
  std::optional<SerialRegions> serial;  // the CPU's parallel regions on this thread (see the top of the file)
  if (h.is_cpu()) serial.emplace();
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  if (check_values) {
    check_finite("mu", mu);  // [n, d]: cheap
    check_label_values(labels, h.size(0), mu.size(0));
  }
  const at::Tensor D = dissimilarity(h, mu, sigma);
  // A NaN or inf in a row of h makes that row of D non-finite, so a finite D clears h too: the whole
  // of h ([B, d], the largest input) is read only to name the culprit.
  if (check_values && count_nonfinite(D) > 0) {
    check_finite("h", h);
    check_dissimilarities_finite(D, h, mu);
  }
  const int64_t B = D.size(0), n = D.size(1);
  const auto [total, grad_order] = grouped_op.call(D, labels, sigma, tau, margin, convention, 0, n, need_grad);
  const at::Tensor order = total.mul(grouped_scale(B, mean)).to(reduced_dtype(D.scalar_type()));
  const at::Tensor disc = reduce(disc_op.call(D, labels, T), mean);
  const at::Tensor loss = order.add(disc.mul(disc_weight));
  if (check_values) check_loss_finite(loss, h, mu, margin);
  return {loss, D, grad_order};
}

std::tuple<at::Tensor, at::Tensor> grouped_stochastic_order_loss_backward(
    const at::Tensor& grad_loss, const at::Tensor& h, const at::Tensor& mu, const at::Tensor& D,
    const at::Tensor& labels, const at::Tensor& grad_order, double sigma, int64_t T, double disc_weight,
    c10::string_view reduction, bool need_grad_h, bool need_grad_mu) {
  static const auto disc_backward_op =
      op<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, int64_t)>("sol_ext::_disc_loss_backward");
  const bool mean = parse_mean(reduction);
  const int64_t B = D.size(0), n = D.size(1);
  TORCH_CHECK(grad_order.sizes() == D.sizes() && grad_order.scalar_type() == at::kDouble,
              "grad_order must be the float64 [B, n] = ", D.sizes(), " gradient that "
              "grouped_stochastic_order_loss returns with need_grad=True, got ", grad_order.scalar_type(), " ",
              grad_order.sizes());
  std::optional<SerialRegions> serial;
  if (h.is_cpu()) serial.emplace();
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const at::Tensor grad_disc = grad_of_reduction(grad_loss.mul(disc_weight), B, mean, D.scalar_type());
  const at::Tensor grad_D = grad_loss.to(at::kDouble)
                                .mul(grouped_scale(B, mean))
                                .mul(grad_order)
                                .to(D.scalar_type())
                                .add(disc_backward_op.call(grad_disc, labels, n, T));
  return dissimilarity_backward(grad_D, h, mu, sigma, need_grad_h, need_grad_mu);
}

// ------------------------------------------------------------------------------------------------
// Autograd
// ------------------------------------------------------------------------------------------------

// Passes a gradient through; differentiating it again raises (the backward kernels have no derivative
// of their own). Like sol_ext/ops.py's _DoubleBackwardError: only a second differentiation raises.
class DoubleBackwardError : public torch::autograd::Function<DoubleBackwardError> {
 public:
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& grad, at::TensorList /*sources*/) {
    return grad.clone();
  }
  static variable_list backward(AutogradContext* /*ctx*/, variable_list /*grads*/) {
    TORCH_CHECK(false,
                "double backward (differentiating a gradient, e.g. a gradient penalty built with "
                "create_graph=True) through the fused sol_ext.StochasticOrderLoss is not supported: its "
                "backward kernel has no derivative of its own. Use backend='reference' for such a loss.");
    return {};
  }
};

// With create_graph, the gradients out[0] and out[1] depend on every one of `inputs` that requires grad:
// differentiating them raises.
void refuse_double_backward(variable_list& out, std::initializer_list<at::Tensor> inputs) {
  variable_list sources;
  for (const at::Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) sources.push_back(t);
  }
  if (sources.empty()) return;
  for (size_t i = 0; i < 2; ++i) {
    if (out[i].defined()) out[i] = DoubleBackwardError::apply(out[i], at::TensorList(sources));
  }
}

class StochasticOrderLossFunction : public torch::autograd::Function<StochasticOrderLossFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& mu,
                               const at::Tensor& labels, const std::optional<at::Tensor>& pairs, double sigma,
                               int64_t tau, double margin, int64_t T, double disc_weight,
                               c10::string_view convention, c10::string_view reduction) {
    static const auto forward_op =
        op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                              const std::optional<at::Tensor>&, double, int64_t, double, int64_t,
                                              double, c10::string_view, c10::string_view)>(
            "sol_ext::stochastic_order_loss");
    at::Tensor loss, D;
    {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::tie(loss, D) =
          forward_op.call(h, mu, labels, pairs, sigma, tau, margin, T, disc_weight, convention, reduction);
    }
    ctx->save_for_backward({h, mu, D, labels, pairs.value_or(at::Tensor())});
    ctx->saved_data["sigma"] = sigma;
    ctx->saved_data["tau"] = tau;
    ctx->saved_data["margin"] = margin;
    ctx->saved_data["T"] = T;
    ctx->saved_data["disc_weight"] = disc_weight;
    ctx->saved_data["convention"] = std::string(convention);
    ctx->saved_data["reduction"] = std::string(reduction);
    ctx->mark_non_differentiable({D});
    ctx->set_materialize_grads(false);  // D's gradient is always undefined: no zero tensor for it
    return {loss, D};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op =
        op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                              const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                              double, int64_t, double, int64_t, double, c10::string_view,
                                              c10::string_view, bool, bool)>(
            "sol_ext::_stochastic_order_loss_backward");
    constexpr size_t kInputs = 11;  // one gradient (or none) per argument of forward
    const bool need_h = ctx->needs_input_grad(0), need_mu = ctx->needs_input_grad(1);
    variable_list out(kInputs);
    if (!(need_h || need_mu) || !grads[0].defined()) return out;
    const variable_list saved = ctx->get_saved_variables();
    const std::optional<at::Tensor> pairs =
        saved[4].defined() ? std::optional<at::Tensor>(saved[4]) : std::optional<at::Tensor>();
    const auto& data = ctx->saved_data;
    const bool create_graph = at::GradMode::is_enabled();
    {
      const at::AutoGradMode no_grad(false);
      std::tie(out[0], out[1]) = backward_op.call(
          grads[0], saved[0], saved[1], saved[2], saved[3], pairs, data.at("sigma").toDouble(),
          data.at("tau").toInt(), data.at("margin").toDouble(), data.at("T").toInt(), data.at("disc_weight").toDouble(),
          data.at("convention").toStringRef(), data.at("reduction").toStringRef(), need_h, need_mu);
    }
    if (!need_h) out[0] = at::Tensor();
    if (!need_mu) out[1] = at::Tensor();
    if (create_graph) refuse_double_backward(out, {grads[0], saved[0], saved[1]});
    return out;
  }
};

class GroupedStochasticOrderLossFunction : public torch::autograd::Function<GroupedStochasticOrderLossFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& mu,
                               const at::Tensor& labels, double sigma, int64_t tau, double margin, int64_t T,
                               double disc_weight, c10::string_view convention, c10::string_view reduction,
                               bool check_values, bool need_grad) {
    static const auto forward_op =
        op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                          double, int64_t, double, int64_t, double, c10::string_view,
                                                          c10::string_view, bool, bool)>(
            "sol_ext::grouped_stochastic_order_loss");
    at::Tensor loss, D, grad_order;
    {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::tie(loss, D, grad_order) = forward_op.call(h, mu, labels, sigma, tau, margin, T, disc_weight, convention,
                                                      reduction, check_values, need_grad);
    }
    ctx->save_for_backward({h, mu, D, labels, grad_order});
    ctx->saved_data["sigma"] = sigma;
    ctx->saved_data["T"] = T;
    ctx->saved_data["disc_weight"] = disc_weight;
    ctx->saved_data["reduction"] = std::string(reduction);
    ctx->saved_data["need_grad"] = need_grad;
    ctx->mark_non_differentiable({D, grad_order});
    ctx->set_materialize_grads(false);
    return {loss, D, grad_order};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op =
        op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                              const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                              int64_t, double, c10::string_view, bool, bool)>(
            "sol_ext::_grouped_stochastic_order_loss_backward");
    constexpr size_t kInputs = 12;
    const bool need_h = ctx->needs_input_grad(0), need_mu = ctx->needs_input_grad(1);
    variable_list out(kInputs);
    if (!(need_h || need_mu) || !grads[0].defined()) return out;
    const auto& data = ctx->saved_data;
    TORCH_CHECK(data.at("need_grad").toBool(),
                "sol_ext::grouped_stochastic_order_loss was called with need_grad=False; pass need_grad=True "
                "to differentiate it");
    const variable_list saved = ctx->get_saved_variables();
    const bool create_graph = at::GradMode::is_enabled();
    {
      const at::AutoGradMode no_grad(false);
      std::tie(out[0], out[1]) = backward_op.call(
          grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], data.at("sigma").toDouble(),
          data.at("T").toInt(), data.at("disc_weight").toDouble(), data.at("reduction").toStringRef(), need_h,
          need_mu);
    }
    if (!need_h) out[0] = at::Tensor();
    if (!need_mu) out[1] = at::Tensor();
    if (create_graph) refuse_double_backward(out, {grads[0], saved[0], saved[1]});
    return out;
  }
};

std::tuple<at::Tensor, at::Tensor> stochastic_order_loss_autograd(
    const at::Tensor& h, const at::Tensor& mu, const at::Tensor& labels, const std::optional<at::Tensor>& pairs,
    double sigma, int64_t tau, double margin, int64_t T, double disc_weight, c10::string_view convention,
    c10::string_view reduction) {
  const variable_list out = StochasticOrderLossFunction::apply(h, mu, labels, pairs, sigma, tau, margin, T,
                                                               disc_weight, convention, reduction);
  return {out[0], out[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_stochastic_order_loss_autograd(
    const at::Tensor& h, const at::Tensor& mu, const at::Tensor& labels, double sigma, int64_t tau, double margin,
    int64_t T, double disc_weight, c10::string_view convention, c10::string_view reduction, bool check_values,
    bool need_grad) {
  const variable_list out = GroupedStochasticOrderLossFunction::apply(
      h, mu, labels, sigma, tau, margin, T, disc_weight, convention, reduction, check_values, need_grad);
  return {out[0], out[1], out[2]};
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CPU, m) {
  m.impl("stochastic_order_loss", &stochastic_order_loss);
  m.impl("_stochastic_order_loss_backward", &stochastic_order_loss_backward);
  m.impl("grouped_stochastic_order_loss", &grouped_stochastic_order_loss);
  m.impl("_grouped_stochastic_order_loss_backward", &grouped_stochastic_order_loss_backward);
}

#ifdef SOL_EXT_WITH_CUDA
TORCH_LIBRARY_IMPL(sol_ext, CUDA, m) {
  m.impl("stochastic_order_loss", &stochastic_order_loss);
  m.impl("_stochastic_order_loss_backward", &stochastic_order_loss_backward);
  m.impl("grouped_stochastic_order_loss", &grouped_stochastic_order_loss);
  m.impl("_grouped_stochastic_order_loss_backward", &grouped_stochastic_order_loss_backward);
}
#endif

TORCH_LIBRARY_IMPL(sol_ext, Autograd, m) {
  m.impl("stochastic_order_loss", &stochastic_order_loss_autograd);
  m.impl("grouped_stochastic_order_loss", &grouped_stochastic_order_loss_autograd);
}

} // namespace sol_ext
