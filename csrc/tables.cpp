// The noise kernel P (docs/math.md §2) and the ordering-probability table (docs/math.md §5, §10.2): small,
// computed once in float64 on the CPU and cached on each device that asks for them.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <tuple>
#include <vector>

#include "sol_ext.h"

#ifdef SOL_EXT_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace sol_ext {
namespace {

// (what, n, sigma bits, tau, convention, dtype, device type, device index)
using CacheKey = std::tuple<int, int64_t, uint64_t, int64_t, int, int, int, int>;
constexpr size_t kMaxCachedTensors = 64;

uint64_t bits_of(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// Returns the cached tensor for `key`, computing it with `make` on a miss. Tables are cast on the CPU
// and then copied with a blocking copy (copy_to_device_for_cache), so a cached device tensor is complete
// before any stream reads it.
template <typename Make>
at::Tensor cached(const CacheKey& key, Make make) {
  static std::mutex mutex;
  // Never destroyed: freeing a CUDA table at process exit, after the CUDA runtime has begun to shut down,
  // makes the caching allocator record events on the streams that used it, and that error aborts the
  // process. The memory goes back with the process.
  static auto& cache = *new std::map<CacheKey, at::Tensor>();
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  at::Tensor value = make();  // outside the lock: may copy to a device
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() >= kMaxCachedTensors) cache.clear();  // a run uses a handful; never grow unbounded
  return cache.emplace(key, value).first->second;
}

// A zeroed float64 buffer of `size` values for the tables of num_ranks = n, refused by name where the
// machine cannot hold it.
std::vector<double> table_buffer(int64_t size, int64_t n) {
  try {
    return std::vector<double>(size, 0.0);
  } catch (const std::bad_alloc&) {
    C10_THROW_ERROR(ValueError, c10::str("num_ranks=", n, " needs probability tables of ", size,
                                         " float64 values, more memory than could be allocated"));
  }
}

// P [n,n] in float64 on the CPU. The exponent is written as -((j - q) / sigma)^2 / 2 so that every
// finite sigma > 0 gives a kernel: a tiny sigma makes (j - q) / sigma infinite off the diagonal and 0 on
// it (the identity: plain order learning), a huge sigma makes it 0 everywhere (the uniform kernel).
// 1 / (2 sigma^2) would overflow below sigma ~ 1e-154 and give 0 * inf = NaN on the diagonal.
std::vector<double> noise_kernel_values(int64_t n, double sigma) {
  std::vector<double> P = table_buffer(n * n, n);
  for (int64_t q = 0; q < n; ++q) {
    double row_sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      const double z = static_cast<double>(j - q) / sigma;
      P[q * n + j] = std::exp(-0.5 * z * z);
      row_sum += P[q * n + j];
    }
    for (int64_t j = 0; j < n; ++j) P[q * n + j] /= row_sum;  // row_sum >= 1: the diagonal is exp(0)
  }
  return P;
}

// The device copy of a table for the cache. A cached table outlives the call that makes it, and under
// torch.compile(mode="reduce-overhead") the first calls run with the calling thread's allocations (on any
// stream) routed to a CUDA-graph memory pool, which must own nothing that outlives its graphs (PyTorch
// stops with "tensors in the cudagraph pool not tracked as outputs"). So the copy is made by another
// thread, on a side stream, whose allocations come from the general pool; it is complete (the side
// stream synchronized) when this returns, and each kernel that reads the table records its use on its
// own stream. While the current stream is being captured (a table first asked for inside a capture)
// nothing changes: the capture owns it.
at::Tensor copy_to_device_for_cache(const at::Tensor& table, at::Device device) {
#ifdef SOL_EXT_WITH_CUDA
  if (device.is_cuda() && c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None) {
    at::Tensor copy;
    std::exception_ptr error;
    std::thread copier([&] {
      try {
        const c10::cuda::CUDAGuard device_guard(device);
        const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
        const c10::cuda::CUDAStreamGuard stream_guard(side);
        copy = table.to(device);
        side.synchronize();
      } catch (...) {
        error = std::current_exception();
      }
    });
    copier.join();
    if (error) std::rethrow_exception(error);
    return copy;
  }
#endif
  return table.to(device);
}

at::Tensor to_tensor(const std::vector<double>& values, at::IntArrayRef sizes) {
  return at::from_blob(const_cast<double*>(values.data()), sizes, at::kDouble).clone();
}

// The tables hold n^2 (the ordering table 3n^2) float64 values: past this bound (2-6 PiB) no machine
// could hold them, and far past it their sizes would overflow int64 (sol_ext/_validation.py's MAX_RANKS).
constexpr int64_t kMaxRanks = int64_t{1} << 24;

void check_table_args(int64_t n, double sigma) {
  TORCH_CHECK(n >= 1, "num_ranks must be >= 1, got ", n);
  TORCH_CHECK_VALUE(n <= kMaxRanks, "num_ranks must be <= ", kMaxRanks,
                    " (the noise kernel and the ordering table are [num_ranks, num_ranks] float64 tables), got ", n);
  TORCH_CHECK(std::isfinite(sigma) && sigma > 0, "sigma must be a finite number > 0, got ", sigma);
}

} // namespace

Convention parse_convention(std::string_view name) {
  if (name == "paper") return Convention::Paper;
  if (name == "official") return Convention::Official;
  TORCH_CHECK(false, "convention must be \"paper\" or \"official\", got \"", std::string(name), "\"");
}

at::Tensor noise_kernel(int64_t n, double sigma, at::ScalarType dtype, at::Device device) {
  check_table_args(n, sigma);
  const CacheKey key{0, n, bits_of(sigma), 0, 0, static_cast<int>(dtype),
                     static_cast<int>(device.type()), device.has_index() ? device.index() : -1};
  return cached(key, [&] {
    return copy_to_device_for_cache(to_tensor(noise_kernel_values(n, sigma), {n, n}).to(dtype), device);
  });
}

at::Tensor ordering_table(
    int64_t n, double sigma, int64_t tau_in, Convention convention, at::ScalarType dtype, at::Device device) {
  check_table_args(n, sigma);
  TORCH_CHECK(tau_in >= 0, "tau must be >= 0, got ", tau_in);
  // True ranks differ by at most n - 1, so every tau >= n - 1 means "always similar"; clamping keeps
  // tau + 1 below from overflowing and lets all such tau share one cache entry.
  const int64_t tau = std::min(tau_in, n - 1);
  const CacheKey key{1, n, bits_of(sigma), tau, static_cast<int>(convention), static_cast<int>(dtype),
                     static_cast<int>(device.type()), device.has_index() ? device.index() : -1};
  return cached(key, [&] {
    const std::vector<double> P = noise_kernel_values(n, sigma);
    // tail[b][k] = sum_{k' >= k} P[b,k'], for k in 0..n (tail[b][n] = 0).
    std::vector<double> tail = table_buffer(n * (n + 1), n);
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t k = n - 1; k >= 0; --k) tail[b * (n + 1) + k] = tail[b * (n + 1) + k + 1] + P[b * n + k];
    }
    const int64_t far = tau + 1;
    // Pr(true rank of y >= j + tau + 1); the authors' code clamps that start at n-1 (docs/math.md §10.2).
    const int64_t last_start = convention == Convention::Official ? n - 1 : n;
    auto prob_beyond = [&](int64_t a, int64_t b) {  // sum_j P[a,j] Pr_b(k >= j + tau + 1)
      double total = 0.0;
      for (int64_t j = 0; j < n; ++j) total += P[a * n + j] * tail[b * (n + 1) + std::min(last_start, j + far)];
      return total;
    };
    std::vector<double> table = table_buffer(n * n * 3, n);
    at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t a = begin; a < end; ++a) {
        for (int64_t b = 0; b < n; ++b) {
          double eq = 0.0;
          for (int64_t j = 0; j < n; ++j) {
            const double within = tail[b * (n + 1) + std::max<int64_t>(0, j - tau)] -
                                  tail[b * (n + 1) + std::min(n, j + far)];
            eq += P[a * n + j] * within;
          }
          double* out = &table[(a * n + b) * 3];
          out[0] = prob_beyond(a, b);  // x < y: y's true rank exceeds x's by more than tau
          out[1] = eq;
          out[2] = prob_beyond(b, a);  // x > y
        }
      }
    });
    return copy_to_device_for_cache(to_tensor(table, {n, n, 3}).to(dtype), device);
  });
}

at::Tensor centering_shift(const at::Tensor& mu) {
  // Halves first: no overflow for any finite mu.
  return mu.amin(0, /*keepdim=*/true).mul(0.5).add_(mu.amax(0, /*keepdim=*/true).mul(0.5));
}

CenteredInputs center_on_centroids(const at::Tensor& h, const at::Tensor& mu) {
  const at::Tensor shift = centering_shift(mu);
  return {h - shift, mu - shift};
}

SmoothedCentroids smooth_centroids(const at::Tensor& mu, double sigma) {
  const at::Tensor P = noise_kernel(mu.size(0), sigma, mu.scalar_type(), mu.device());
  return {P, at::mm(P, mu), P.sum(1), at::mv(P, mu.pow(2).sum(1))};
}

int64_t num_pairs(int64_t batch_size, const std::optional<at::Tensor>& pairs) {
  return pairs.has_value() ? pairs->size(0) : batch_size * (batch_size - 1) / 2;
}

} // namespace sol_ext
