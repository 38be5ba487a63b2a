// SerialRegions (sol_ext.h): the CPU side of a whole-step op.
#include <ATen/Parallel.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../sol_ext.h"

// MKL's thread count of the calling thread, which torch.set_num_threads sets and which overrides
// OpenMP's: the C entry point (mkl.h maps mkl_set_num_threads_local to it; the lower-case symbol is
// the Fortran one, which takes a pointer). Weak: a torch built without MKL leaves it null.
#if defined(__linux__)
extern "C" int MKL_Set_Num_Threads_Local(int threads) __attribute__((weak));
#define SOL_EXT_MKL_LOCAL_THREADS 1
#endif

namespace sol_ext {
namespace {

// torch's thread count outside the innermost SerialRegions of this thread; 0 outside every one.
thread_local int64_t outer_threads = 0;
// MKL's per-thread count outside the outermost one (0: MKL's global count).
thread_local int outer_mkl_threads = 0;

} // namespace

SerialRegions::SerialRegions() : previous_(static_cast<int>(outer_threads)) {
  if (outer_threads != 0) return;  // nested: already one thread
  outer_threads = at::get_num_threads();  // also runs torch's per-thread setup on a fresh thread, first
#ifdef _OPENMP
  omp_set_num_threads(1);  // torch's OpenMP backend reads it per thread
#endif
#ifdef SOL_EXT_MKL_LOCAL_THREADS
  if (MKL_Set_Num_Threads_Local != nullptr) outer_mkl_threads = MKL_Set_Num_Threads_Local(1);
#endif
}

SerialRegions::~SerialRegions() {
  if (previous_ != 0) return;
#ifdef _OPENMP
  omp_set_num_threads(static_cast<int>(outer_threads));
#endif
#ifdef SOL_EXT_MKL_LOCAL_THREADS
  if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(outer_mkl_threads);
#endif
  outer_threads = 0;
}

int64_t SerialRegions::threads() {
  return outer_threads > 0 ? outer_threads : at::get_num_threads();
}

} // namespace sol_ext
