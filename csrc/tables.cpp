// The noise kernel P (docs/math.md §2) and the ordering-probability table (docs/math.md §5, §10.2): small,
// computed once in float64 on the CPU and cached on each device that asks for them.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
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
                                         " float64 values, more memory than could be allocated; use fewer "
                                         "ranks (a coarser grid of labels)"));
  }
}

// exp(-((j - q) / sigma)^2 / 2), the unnormalized kernel at the offset d = j - q. The exponent is
// written so that every finite sigma > 0 gives a kernel: a tiny sigma makes (j - q) / sigma infinite
// off the diagonal and 0 on it (the identity: plain order learning), a huge sigma makes it 0 everywhere
// (the uniform kernel). 1 / (2 sigma^2) would overflow below sigma ~ 1e-154 and give 0 * inf = NaN on
// the diagonal.
double kernel_weight(int64_t offset, double sigma) {
  const double z = static_cast<double>(offset) / sigma;
  return std::exp(-0.5 * z * z);
}

// P [n,n] in float64 on the CPU.
std::vector<double> noise_kernel_values(int64_t n, double sigma) {
  std::vector<double> P = table_buffer(n * n, n);
  for (int64_t q = 0; q < n; ++q) {
    double row_sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      P[q * n + j] = kernel_weight(j - q, sigma);
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

// A float64 tensor that takes over `values` without a copy (at 10,000 ranks the ordering table alone
// is 2.4 GB).
at::Tensor to_tensor(std::vector<double>&& values, at::IntArrayRef sizes) {
  auto owned = std::make_unique<std::vector<double>>(std::move(values));
  std::vector<double>* storage = owned.get();
  at::Tensor tensor = at::from_blob(
      storage->data(), sizes, [storage](void*) { delete storage; }, at::TensorOptions().dtype(at::kDouble));
  owned.release();  // the tensor's deleter frees it now
  return tensor;
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

// Up to this many ranks the ordering table is summed as docs/math.md §5 writes it, one sum over j per
// entry: O(n^3) in all for a kernel as wide as the grid (about 2 s at 1,000 ranks), much less for a
// narrow one, and the same tables, bit for bit, so the same runs, as this package has always computed.
// Beyond it the entries come from cumulative sums along the table's diagonals, O(n^2) in all (seconds
// at 10,000 ranks, where the direct sums take hours), equal to the direct sums up to float64 rounding
// (measured: 1e-14 apart at most, Pr(x<y) and Pr(x>y) also relatively) but not bit for bit.
constexpr int64_t kDirectSumMaxRanks = 1000;

// The ordering table [n,n,3] of docs/math.md §5 (and §10.2 under the official convention), each entry
// summed over j. Terms where P[a, j] is 0 (far outside a narrow kernel) are skipped: each would add
// +0.0 to a sum of nonnegative terms, which changes no bit of it.
std::vector<double> ordering_table_by_direct_sums(int64_t n, double sigma, int64_t tau, Convention convention) {
  const std::vector<double> P = noise_kernel_values(n, sigma);
  // tail[b][k] = sum_{k' >= k} P[b,k'], for k in 0..n (tail[b][n] = 0).
  std::vector<double> tail = table_buffer(n * (n + 1), n);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t k = n - 1; k >= 0; --k) tail[b * (n + 1) + k] = tail[b * (n + 1) + k + 1] + P[b * n + k];
  }
  // Row a's nonzero terms lie in [first_nonzero[a], last_nonzero[a]] (the diagonal, 1 / row_sum, is > 0).
  std::vector<int64_t> first_nonzero(n), last_nonzero(n);
  for (int64_t a = 0; a < n; ++a) {
    int64_t first = 0, last = n - 1;
    while (P[a * n + first] == 0.0) ++first;
    while (P[a * n + last] == 0.0) --last;
    first_nonzero[a] = first;
    last_nonzero[a] = last;
  }
  const int64_t far = tau + 1;
  // Pr(true rank of y >= j + tau + 1); the authors' code clamps that start at n-1 (docs/math.md §10.2).
  const int64_t last_start = convention == Convention::Official ? n - 1 : n;
  auto prob_beyond = [&](int64_t a, int64_t b) {  // sum_j P[a,j] Pr_b(k >= j + tau + 1)
    double total = 0.0;
    for (int64_t j = first_nonzero[a]; j <= last_nonzero[a]; ++j) {
      total += P[a * n + j] * tail[b * (n + 1) + std::min(last_start, j + far)];
    }
    return total;
  };
  std::vector<double> table = table_buffer(n * n * 3, n);
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t a = begin; a < end; ++a) {
      for (int64_t b = 0; b < n; ++b) {
        double eq = 0.0;
        for (int64_t j = first_nonzero[a]; j <= last_nonzero[a]; ++j) {
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
  return table;
}

// The same table in O(n^2). With g(d) = exp(-(d / sigma)^2 / 2) the kernel by offset, Z_a the sum of
// row a (P[a, j] = g(j - a) / Z_a) and U(t) = sum_{d >= t} g(d) over offsets d <= n - 1, the numerator
// of Pr(x < y) for labels (a, b) is, with J = n - 1 - (tau + 1) the last j whose tail start is a rank,
//   sum_{j=0}^{J} g(j - a) [U(j + tau + 1 - b) - U(n - b)]
//     = R_s(-a .. J - a) - U(n - b) sum_{j=0}^{J} g(j - a),   R_s(u) = g(u) U(u + s + tau + 1), s = a - b,
// a sum over u of a function of the diagonal s alone: one cumulative sum per diagonal gives all its
// entries. Upper sums U are kept apart from lower ones (U(t) = G(-t), G the lower cumulative sum, g
// being even) so that small probabilities are sums of small terms, not differences of large ones.
// Pr(x > y) is Pr(x < y) of (b, a); Pr(x ~ y) is what the two leave of 1. The official convention adds
// the clamped tail's top-rank mass, sum_{j > J} P[a, j] P[b, n - 1], to both (docs/math.md §10.2).
std::vector<double> ordering_table_by_diagonal_sums(int64_t n, double sigma, int64_t tau, Convention convention) {
  std::vector<double> table = table_buffer(n * n * 3, n);  // first: a grid too large is refused at once
  // lower_sums[t + n] = G(t) = sum_{d=-(n-1)}^{t} g(d) for t in -n..n-1 (G(-n) = 0).
  std::vector<double> weights(2 * n - 1), lower_sums(2 * n, 0.0);
  for (int64_t d = -(n - 1); d <= n - 1; ++d) {
    weights[d + n - 1] = kernel_weight(d, sigma);
    lower_sums[d + n] = lower_sums[d + n - 1] + weights[d + n - 1];
  }
  auto g = [&](int64_t d) { return weights[d + n - 1]; };
  auto lower = [&](int64_t t) { return t < -n ? 0.0 : lower_sums[std::min(t, n - 1) + n]; };  // sum_{d <= t}
  auto upper = [&](int64_t t) { return lower(-t); };                                          // sum_{d >= t}
  std::vector<double> row_sum(n, 0.0);  // summed as noise_kernel_values sums its rows
  for (int64_t a = 0; a < n; ++a) {
    for (int64_t j = 0; j < n; ++j) row_sum[a] += g(j - a);
  }
  const int64_t far = tau + 1;
  const int64_t last_j = n - 1 - far;  // -1 when tau = n - 1: never "x < y"
  // Pass 1: Pr(x < y) of the paper, one diagonal s = a - b at a time, into slot 0 of (a, b) and slot 2
  // (Pr(x > y)) of (b, a). Each entry sums R_s over a range of u, taken from the cumulative sums of R_s
  // from the left or from the right, whichever leaves out less: R_s is unimodal in u (a product of
  // log-concave terms), so a small sum away from its peak is never the difference of two large ones.
  // The diagonals go in blocks, whose entries are then written row by row: a row's entries on
  // neighbouring diagonals are neighbours, where one diagonal's entries are a row apart.
  constexpr int64_t kDiagonalsPerBlock = 128;
  const int64_t num_blocks = (2 * n - 1 + kDiagonalsPerBlock - 1) / kDiagonalsPerBlock;
  at::parallel_for(0, num_blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    std::vector<double> from_left(2 * n + 1), from_right(2 * n + 1);
    std::vector<double> block_lt(kDiagonalsPerBlock * n);  // block_lt[k * n + a]: Pr(x < y) of (a, a - s)
    for (int64_t block = block_begin; block < block_end; ++block) {
      const int64_t s_begin = -(n - 1) + block * kDiagonalsPerBlock;
      const int64_t s_end = std::min(n, s_begin + kDiagonalsPerBlock);
      for (int64_t s = s_begin; s < s_end; ++s) {
        double* lt_of = &block_lt[(s - s_begin) * n];
        const int64_t a_first = std::max<int64_t>(0, s), a_last = std::min(n - 1, n - 1 + s);
        // R_s(u) for u in -a_last .. last_j - a_first, at index i = u + a_last: from_left[i] sums the
        // terms before index i, from_right[i] those from index i on.
        const int64_t count = std::max<int64_t>(0, last_j - a_first + a_last + 1);
        from_left[0] = 0.0;
        for (int64_t i = 0; i < count; ++i) {
          const int64_t u = i - a_last;
          from_left[i + 1] = from_left[i] + g(u) * upper(u + s + far);
        }
        from_right[count] = 0.0;
        for (int64_t i = count - 1; i >= 0; --i) {
          const int64_t u = i - a_last;
          from_right[i] = from_right[i + 1] + g(u) * upper(u + s + far);
        }
        for (int64_t a = a_first; a <= a_last; ++a) {
          const int64_t b = a - s;
          double numerator = 0.0;
          if (last_j >= 0) {
            const int64_t first = a_last - a, past_last = last_j - a + a_last + 1;  // u = -a .. last_j - a
            const double along = from_left[first] <= from_right[past_last]
                                     ? from_left[past_last] - from_left[first]
                                     : from_right[first] - from_right[past_last];
            numerator = along - upper(n - b) * (lower(last_j - a) - lower(-a - 1));
          }
          lt_of[a] = std::max(0.0, numerator / (row_sum[a] * row_sum[b]));
        }
      }
      double* const entries = table.data();
      for (int64_t row = 0; row < n; ++row) {
        // Pr(x < y) of (row, row - s) for the s with 0 <= row - s < n; Pr(x > y) of (row, row + s) likewise.
        double* const row_entries = entries + row * n * 3;
        for (int64_t s = std::max(s_begin, row - (n - 1)); s < std::min(s_end, row + 1); ++s) {
          row_entries[(row - s) * 3] = block_lt[(s - s_begin) * n + row];
        }
        for (int64_t s = std::max(s_begin, -row); s < std::min(s_end, n - row); ++s) {
          row_entries[(row + s) * 3 + 2] = block_lt[(s - s_begin) * n + row + s];
        }
      }
    }
  });
  // Pass 2: Pr(x ~ y), what the paper's Pr(x < y) and Pr(x > y) leave of 1.
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t a = begin; a < end; ++a) {
      for (int64_t b = 0; b < n; ++b) {
        double* out = &table[(a * n + b) * 3];
        out[1] = std::max(0.0, 1.0 - out[0] - out[2]);
      }
    }
  });
  if (convention == Convention::Official) {
    // Pass 3: the clamped tail's mass at the top rank, Pr_a(j > J) P[b, n-1], to Pr(x < y); mirrored to Pr(x > y).
    std::vector<double> mass_above_last_j(n), top_rank(n);
    for (int64_t a = 0; a < n; ++a) {
      mass_above_last_j[a] = (upper(last_j + 1 - a) - upper(n - a)) / row_sum[a];
      top_rank[a] = g(n - 1 - a) / row_sum[a];
    }
    at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
      for (int64_t a = begin; a < end; ++a) {
        for (int64_t b = 0; b < n; ++b) {
          table[(a * n + b) * 3] += mass_above_last_j[a] * top_rank[b];
          table[(a * n + b) * 3 + 2] += mass_above_last_j[b] * top_rank[a];
        }
      }
    });
  }
  return table;
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
    at::Tensor P = to_tensor(noise_kernel_values(n, sigma), {n, n}).to(dtype);
    if (dtype == at::kFloat) {
      // The far tails of a float32 kernel are subnormal (174 entries at n = 101, sigma = 1), which
      // makes every product with P several times slower on x86 CPUs; added to a row's normal weights
      // they are below float32's resolution anyway.
      P.masked_fill_(P.abs() < std::numeric_limits<float>::min(), 0.0);
    }
    return copy_to_device_for_cache(P, device);
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
    std::vector<double> table = n <= kDirectSumMaxRanks ? ordering_table_by_direct_sums(n, sigma, tau, convention)
                                                        : ordering_table_by_diagonal_sums(n, sigma, tau, convention);
    return copy_to_device_for_cache(to_tensor(std::move(table), {n, n, 3}).to(dtype), device);
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
