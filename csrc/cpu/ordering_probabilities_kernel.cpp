// Ordering probabilities (docs/math.md §5, §10.2) on the CPU: a gather from the cached [n,n,3] table.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../sol_ext.h"

namespace sol_ext {
namespace {

at::Tensor ordering_probabilities_cpu(
    const at::Tensor& r_x_in,
    const at::Tensor& r_y_in,
    int64_t n,
    double sigma,
    int64_t tau,
    c10::string_view convention,
    at::ScalarType dtype) {
  check_ordering_probability_inputs(r_x_in, r_y_in, dtype);
  const at::Tensor r_x = r_x_in.contiguous();
  const at::Tensor r_y = r_y_in.contiguous();
  const int64_t M = r_x.size(0);
  const at::Tensor table = ordering_table(n, sigma, tau, parse_convention(convention), at::kDouble, r_x.device());
  at::Tensor out = at::empty({M, 3}, r_x.options().dtype(dtype));
  if (M == 0) return out;
  const int64_t* rx = r_x.data_ptr<int64_t>();
  const int64_t* ry = r_y.data_ptr<int64_t>();
  const double* tab = table.data_ptr<double>();
  for (int64_t m = 0; m < M; ++m) {
    TORCH_CHECK(rx[m] >= 0 && rx[m] < n && ry[m] >= 0 && ry[m] < n, "ranks must lie in 0..", n - 1,
                ", got (", rx[m], ", ", ry[m], ") at position ", m);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "ordering_probabilities_cpu", [&] {
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, M, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        const double* p = tab + (rx[m] * n + ry[m]) * 3;
        for (int k = 0; k < 3; ++k) o[m * 3 + k] = static_cast<scalar_t>(p[k]);
      }
    });
  });
  return out;
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CPU, m) {
  m.impl("ordering_probabilities", &ordering_probabilities_cpu);
}

} // namespace sol_ext
