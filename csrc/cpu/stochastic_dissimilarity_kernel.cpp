// Stochastic dissimilarity (docs/math.md §3) on the CPU, forward and backward.
//
// With nu = P mu, a = P 1 and c = P ||mu||^2:  D[x,q] = a_q ||h_x||^2 - 2 h_x . nu_q + c_q,
// so the forward pass is one BLAS product followed by a fused epilogue. Both passes work on h and mu
// centered on the centroids (center_on_centroids, sol_ext.h), which keeps D precise far from the origin.
// Small problems take the definition itself instead (use_direct).
//
// Threads: the rows go in blocks whose size depends on the shape alone, one task each (run_tasks,
// tasks.h): each block is centered, multiplied and finished on one thread, and the sums over the batch
// that grad_mu needs are taken per block and added in block order, so no result depends on which thread
// ran which block, and a busy machine's descheduled thread does not stall the call.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "../sol_ext.h"
#include "cpu_kernels.h"
#include "tasks.h"

namespace sol_ext {
namespace {

// Small problems (B n^2 d up to this many terms) take the definition directly: D[x,q] = sum_j P[q,j]
// ||h_x - mu_j||^2 summed in float64 from the exact differences, with no BLAS call and no temporary
// tensor. At such sizes a step's time is per-operation overhead (the product form below runs about
// fifteen ATen operations per pass), and the definition is at least as precise as the product form.
constexpr int64_t kDirectTerms = 1 << 15;

bool use_direct(int64_t B, int64_t n, int64_t d) {
  return B * n * n * d <= kDirectTerms;
}

// Rows per block: about 2^17 values of h, and at least d rows, so that the per-block [n, d] sums of the
// backward take about as much memory as D does (n d more for a last, partial block).
int64_t block_rows(int64_t d) {
  return std::max<int64_t>({(int64_t{1} << 17) / std::max<int64_t>(d, 1), d, 1});
}

int64_t num_blocks(int64_t B, int64_t d) {
  return (B + block_rows(d) - 1) / block_rows(d);
}

// sum_b parts[b] in b order, accumulated in float64 and returned in parts' dtype: [blocks, ...] -> [...].
at::Tensor sum_in_order(const at::Tensor& parts) {
  const int64_t blocks = parts.size(0), size = parts.numel() / std::max<int64_t>(blocks, 1);
  std::vector<double> total(size, 0.0);
  AT_DISPATCH_FLOATING_TYPES(parts.scalar_type(), "sum_in_order", [&] {
    const scalar_t* v = parts.const_data_ptr<scalar_t>();
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t i = 0; i < size; ++i) total[i] += double(v[b * size + i]);
    }
  });
  const at::Tensor sums = at::tensor(total, parts.options().dtype(at::kDouble));
  return sums.view(parts.sizes().slice(1)).to(parts.scalar_type());
}

// Runs block(b, r0, r1) for the blocks of B rows. The ops run it under SerialRegions, as the whole-step
// ops do: a block's MKL products then stay on one thread whether a helper or the caller runs it (alone,
// with one block, the caller's MKL would otherwise split a product's sum over the rows across its
// threads), so D and its gradients are bitwise the same for any number of threads, and the same as
// inside StochasticOrderLoss's one op.
template <typename Block>
void for_each_block(int64_t B, int64_t d, const Block& block) {
  const int64_t rows = block_rows(d), blocks = num_blocks(B, d);
  run_tasks(blocks, task_helpers(blocks), [&] {
    return [&](int64_t b) { block(b, b * rows, std::min(B, (b + 1) * rows)); };
  });
}

// The products with the noise kernel P (P mu, P^T times the batch's sums) with the CPU's flush-to-zero and
// denormals-are-zero modes on this thread (x86 MXCSR; restored at the end of the scope). A float32 P's far
// entries are tiny (8,010 of 10,201 below 1e-30 at n = 101, sigma = 1), their products with the centroids
// subnormal, and each such product an assist that made these products four times slower (P mu at
// 101 x 512: 277 us, 70 us without). A subnormal product is below half an ulp of any sum of normal size,
// so flushing it changes no such sum.
class FlushSubnormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero); }
  ~FlushSubnormals() { _mm_setcsr(saved_); }
#else
  FlushSubnormals() {}  // elsewhere the products run as they are
#endif
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
#if defined(__x86_64__) || defined(__i386__)
  static constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;
  unsigned saved_;
#endif
};

// The centroids about their center and their smoothing, with the numbers of centering_shift, mu - shift and
// smooth_centroids (tables.cpp): the shift's halves, the differences and the squared entries (mu.pow(2))
// in one pass over mu after ATen's column minima and maxima (whose NaN and signed-zero choices the shift
// keeps). At the batch sizes where a step's fixed costs dominate, the seven small ATen operations this
// replaces took longer than the loop.
struct CenteredCentroids {
  at::Tensor shift, mu, squared;  // [1, d], [n, d], [n, d]
};

CenteredCentroids center_centroids(const at::Tensor& mu_raw) {
  const at::Tensor lowest = mu_raw.amin(0, /*keepdim=*/true), highest = mu_raw.amax(0, /*keepdim=*/true);
  CenteredCentroids out{at::empty_like(lowest), at::empty_like(mu_raw), at::empty_like(mu_raw)};
  const int64_t n = mu_raw.size(0), d = mu_raw.size(1);
  AT_DISPATCH_FLOATING_TYPES(mu_raw.scalar_type(), "center_centroids", [&] {
    const scalar_t *lo = lowest.const_data_ptr<scalar_t>(), *hi = highest.const_data_ptr<scalar_t>();
    const scalar_t* m = mu_raw.const_data_ptr<scalar_t>();
    scalar_t *shift = out.shift.data_ptr<scalar_t>(), *mu = out.mu.data_ptr<scalar_t>();
    scalar_t* squared = out.squared.data_ptr<scalar_t>();
    const scalar_t half = scalar_t(0.5);
    for (int64_t k = 0; k < d; ++k) shift[k] = lo[k] * half + hi[k] * half;  // halves first: no overflow
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t k = 0; k < d; ++k) {
        const scalar_t centered = m[j * d + k] - shift[k];
        mu[j * d + k] = centered;
        squared[j * d + k] = centered * centered;
      }
    }
  });
  return out;
}

// smooth_centroids(centroids.mu, sigma); c (P ||mu||^2) only where with_c (the backward needs nu and a).
SmoothedCentroids smooth_centered(const CenteredCentroids& centroids, double sigma, bool with_c) {
  const at::Tensor& mu = centroids.mu;
  const at::Tensor P = noise_kernel(mu.size(0), sigma, mu.scalar_type(), mu.device());
  const FlushSubnormals flush;
  return {P, at::mm(P, mu), P.sum(1), with_c ? at::mv(P, centroids.squared.sum(1)) : at::Tensor()};
}

at::Tensor stochastic_dissimilarity_cpu(const at::Tensor& h_in, const at::Tensor& mu_in, double sigma) {
  check_dissimilarity_inputs(h_in, mu_in, sigma);
  const SerialRegions serial;  // see for_each_block
  if (use_direct(h_in.size(0), mu_in.size(0), h_in.size(1))) {
    const at::Tensor h = h_in.contiguous(), mu = mu_in.contiguous();
    const int64_t B = h.size(0), d = h.size(1), n = mu.size(0);
    const at::Tensor P = noise_kernel(n, sigma, h.scalar_type(), h.device());
    at::Tensor D = at::empty({B, n}, h.options());
    AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "stochastic_dissimilarity_cpu", [&] {
      SOL_EXT_CPU_DISPATCH(dissimilarity_direct_forward(h.const_data_ptr<scalar_t>(), mu.const_data_ptr<scalar_t>(),
                                                        P.const_data_ptr<scalar_t>(), B, n, d, D.data_ptr<scalar_t>()));
    });
    return D;
  }
  const at::Tensor h = h_in.contiguous();
  const CenteredCentroids centroids = center_centroids(mu_in.contiguous());
  const at::Tensor& shift = centroids.shift;
  const int64_t B = h.size(0), d = h.size(1), n = centroids.mu.size(0);
  const SmoothedCentroids s = smooth_centered(centroids, sigma, /*with_c=*/true);
  const at::Tensor nu_t = s.nu.t();
  at::Tensor D = at::empty({B, n}, h.options());
  AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "stochastic_dissimilarity_cpu", [&] {
    const scalar_t* a_ptr = s.a.data_ptr<scalar_t>();
    const scalar_t* c_ptr = s.c.data_ptr<scalar_t>();
    for_each_block(B, d, [&](int64_t, int64_t r0, int64_t r1) {
      const at::Tensor hc = h.slice(0, r0, r1) - shift;  // centered rows
      at::Tensor D_rows = D.slice(0, r0, r1);
      at::mm_out(D_rows, hc, nu_t);  // h_x . nu_q
      SOL_EXT_CPU_DISPATCH(dissimilarity_forward_epilogue(hc.const_data_ptr<scalar_t>(), a_ptr, c_ptr, r1 - r0, n, d,
                                                          D_rows.data_ptr<scalar_t>()));
    });
  });
  return D;
}

// grad_h = 2 (grad_D a) * h - 2 grad_D nu
// grad_mu = P^T (-2 grad_D^T h) + 2 mu * (P^T colsum(grad_D))
// with h, mu (and so nu) centered: each h_x - mu_j is the same, so the gradients are too.
std::tuple<at::Tensor, at::Tensor> stochastic_dissimilarity_backward_cpu(
    const at::Tensor& grad_in,
    const at::Tensor& h_in,
    const at::Tensor& mu_in,
    double sigma,
    bool need_grad_h,
    bool need_grad_mu) {
  check_dissimilarity_backward_inputs(grad_in, h_in, mu_in, sigma);
  const SerialRegions serial;  // see for_each_block
  const at::Tensor grad = grad_in.contiguous();
  if (use_direct(h_in.size(0), mu_in.size(0), h_in.size(1))) {
    const at::Tensor h = h_in.contiguous(), mu = mu_in.contiguous();
    const int64_t B = h.size(0), d = h.size(1), n = mu.size(0);
    const at::Tensor P = noise_kernel(n, sigma, h.scalar_type(), h.device());
    at::Tensor grad_h = need_grad_h ? at::empty_like(h) : at::empty({0}, h.options());
    at::Tensor grad_mu = need_grad_mu ? at::empty_like(mu) : at::empty({0}, mu.options());
    AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "stochastic_dissimilarity_backward_cpu", [&] {
      const at::Tensor g = grad.to(h.scalar_type());
      SOL_EXT_CPU_DISPATCH(dissimilarity_direct_backward(
          g.const_data_ptr<scalar_t>(), h.const_data_ptr<scalar_t>(), mu.const_data_ptr<scalar_t>(),
          P.const_data_ptr<scalar_t>(), B, n, d, need_grad_h ? grad_h.data_ptr<scalar_t>() : nullptr,
          need_grad_mu ? grad_mu.data_ptr<scalar_t>() : nullptr));
    });
    return {grad_h, grad_mu};
  }
  if (!need_grad_h && !need_grad_mu) return {at::empty({0}, h_in.options()), at::empty({0}, mu_in.options())};
  const at::Tensor h = h_in.contiguous();
  const CenteredCentroids centroids = center_centroids(mu_in.contiguous());
  const at::Tensor &shift = centroids.shift, &mu = centroids.mu;
  const int64_t B = h.size(0), d = h.size(1), n = mu.size(0);
  const at::Tensor P = noise_kernel(n, sigma, h.scalar_type(), h.device());
  // grad_mu = P^T (-2 products) + 2 mu * (P^T sums), from grad_D^T h [n, d] and grad_D's column sums [n]
  const auto grad_mu_of = [&](const at::Tensor& products, const at::Tensor& sums) {
    const at::Tensor Pt = P.t();
    const FlushSubnormals flush;
    at::Tensor grad_mu = at::mm(Pt, products).mul_(-2);
    return grad_mu.addcmul_(mu, at::mv(Pt, sums).unsqueeze(1), 2);
  };
  const auto grad_h_rows = [&](const SmoothedCentroids& s, int64_t r0, int64_t r1, at::Tensor& grad_h) {
    const at::Tensor hc = h.slice(0, r0, r1) - shift;  // centered rows
    const at::Tensor g = grad.slice(0, r0, r1);
    at::Tensor out_rows = grad_h.slice(0, r0, r1);
    at::mm_out(out_rows, g, s.nu).mul_(-2);
    AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "stochastic_dissimilarity_backward_cpu", [&] {
      SOL_EXT_CPU_DISPATCH(dissimilarity_grad_h_epilogue(g.const_data_ptr<scalar_t>(), hc.const_data_ptr<scalar_t>(),
                                                         s.a.data_ptr<scalar_t>(), r1 - r0, n, d,
                                                         out_rows.data_ptr<scalar_t>()));
    });
  };
  const auto grad_mu_terms = [&](int64_t r0, int64_t r1, at::Tensor& product, at::Tensor& sums) {
    const at::Tensor hc = h.slice(0, r0, r1) - shift;  // centered rows
    const at::Tensor g = grad.slice(0, r0, r1);
    at::mm_out(product, g.t(), hc);
    at::sum_out(sums, g, {0});
  };
  at::Tensor grad_h = need_grad_h ? at::empty_like(h) : at::empty({0}, h.options());
  const int64_t blocks = num_blocks(B, d);
  if (blocks == 1) {
    // One block: grad_h and grad_mu are two tasks, each with its own products (the same numbers as in
    // turn: one block's sums over the batch are its own).
    at::Tensor grad_mu = at::empty({0}, mu.options());
    const int64_t parts = int64_t(need_grad_h) + int64_t(need_grad_mu);
    run_tasks(parts, task_helpers(parts), [&] {
      return [&](int64_t part) {
        if (need_grad_h && part == 0) {
          grad_h_rows(smooth_centered(centroids, sigma, /*with_c=*/false), 0, B, grad_h);
        } else {
          at::Tensor product = at::empty({n, d}, h.options()), sums = at::empty({n}, h.options());
          grad_mu_terms(0, B, product, sums);
          grad_mu = grad_mu_of(product, sums);
        }
      };
    });
    return {grad_h, grad_mu};
  }
  const SmoothedCentroids s = smooth_centered(centroids, sigma, /*with_c=*/false);
  // per block: grad_D^T h [n, d] and the column sums of grad_D [n], for grad_mu
  at::Tensor block_products = need_grad_mu ? at::empty({blocks, n, d}, h.options()) : at::Tensor();
  at::Tensor block_sums = need_grad_mu ? at::empty({blocks, n}, h.options()) : at::Tensor();
  for_each_block(B, d, [&](int64_t b, int64_t r0, int64_t r1) {
    if (need_grad_h) grad_h_rows(s, r0, r1, grad_h);
    if (need_grad_mu) {
      at::Tensor product = block_products.select(0, b), sums = block_sums.select(0, b);
      grad_mu_terms(r0, r1, product, sums);
    }
  });
  if (!need_grad_mu) return {grad_h, at::empty({0}, mu.options())};
  // the blocks' sums in block order, in float64
  return {grad_h, grad_mu_of(sum_in_order(block_products), sum_in_order(block_sums))};
}

} // namespace

TORCH_LIBRARY_IMPL(sol_ext, CPU, m) {
  m.impl("stochastic_dissimilarity", &stochastic_dissimilarity_cpu);
  m.impl("_stochastic_dissimilarity_backward", &stochastic_dissimilarity_backward_cpu);
}

} // namespace sol_ext
