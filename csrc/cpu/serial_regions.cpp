// SerialRegions and count_nonfinite (sol_ext.h): the CPU side of a whole-step op.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../sol_ext.h"

namespace sol_ext {
namespace {

// torch's thread count outside the innermost SerialRegions of this thread; 0 outside every one.
thread_local int64_t outer_threads = 0;

} // namespace

SerialRegions::SerialRegions() : previous_(static_cast<int>(outer_threads)) {
  if (outer_threads == 0) outer_threads = at::get_num_threads();
#ifdef _OPENMP
  omp_set_num_threads(1);  // torch's OpenMP backend and MKL read it per thread
#endif
}

SerialRegions::~SerialRegions() {
#ifdef _OPENMP
  if (previous_ == 0) omp_set_num_threads(static_cast<int>(outer_threads));
#endif
  outer_threads = previous_;
}

int64_t SerialRegions::threads() {
  return outer_threads > 0 ? outer_threads : at::get_num_threads();
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
