// stochastic_dissimilarity's loops that are not BLAS (stochastic_dissimilarity_kernel.cpp) at the capability's
// width: the definition for small problems, and the product form's epilogues.

template <typename scalar_t>
void direct_forward(const scalar_t* h, const scalar_t* mu, const scalar_t* P, int64_t B, int64_t n, int64_t d,
                    scalar_t* D) {
  std::vector<double> distance(n);  // ||h_x - mu_j||^2 of one row x
  for (int64_t x = 0; x < B; ++x) {
    for (int64_t j = 0; j < n; ++j) {
      double total = 0.0;
      for (int64_t k = 0; k < d; ++k) {
        const double diff = double(h[x * d + k]) - double(mu[j * d + k]);
        total += diff * diff;
      }
      distance[j] = total;
    }
    for (int64_t q = 0; q < n; ++q) {
      double total = 0.0;
      for (int64_t j = 0; j < n; ++j) total += double(P[q * n + j]) * distance[j];
      D[x * n + q] = scalar_t(total);
    }
  }
}

// With W = grad_D P: grad_h[x] = 2 sum_j W[x,j] (h_x - mu_j), grad_mu[j] = -2 sum_x W[x,j] (h_x - mu_j).
template <typename scalar_t>
void direct_backward(const scalar_t* g, const scalar_t* h, const scalar_t* mu, const scalar_t* P, int64_t B,
                     int64_t n, int64_t d, scalar_t* grad_h, scalar_t* grad_mu) {
  std::vector<double> W(B * n, 0.0), gh(grad_h ? B * d : 0, 0.0), gmu(grad_mu ? n * d : 0, 0.0);
  for (int64_t x = 0; x < B; ++x) {
    for (int64_t j = 0; j < n; ++j) {
      double total = 0.0;
      for (int64_t q = 0; q < n; ++q) total += double(g[x * n + q]) * double(P[q * n + j]);
      W[x * n + j] = total;
    }
  }
  for (int64_t x = 0; x < B; ++x) {
    for (int64_t j = 0; j < n; ++j) {
      const double w = 2.0 * W[x * n + j];
      for (int64_t k = 0; k < d; ++k) {
        const double term = w * (double(h[x * d + k]) - double(mu[j * d + k]));
        if (grad_h) gh[x * d + k] += term;
        if (grad_mu) gmu[j * d + k] -= term;
      }
    }
  }
  for (size_t i = 0; i < gh.size(); ++i) grad_h[i] = scalar_t(gh[i]);
  for (size_t i = 0; i < gmu.size(); ++i) grad_mu[i] = scalar_t(gmu[i]);
}

// Each row's float64 sum (of d or n terms) is a chain of dependent adds, bound by the add's latency: the
// epilogues take kRowsAtOnce rows side by side, each row's sum in its own order (the same numbers as one
// row at a time), so that the core has independent chains to run.
constexpr int kRowsAtOnce = 8;

// group(x0, count) for the rows x0 .. x0 + count - 1, count kRowsAtOnce (a compile-time constant: the sums are
// then registers) while whole groups are left, then 1.
template <typename Rows>
void in_row_groups(int64_t rows, const Rows& group) {
  int64_t x = 0;
  for (; x + kRowsAtOnce <= rows; x += kRowsAtOnce) group(x, std::integral_constant<int, kRowsAtOnce>{});
  for (; x < rows; ++x) group(x, std::integral_constant<int, 1>{});
}

template <typename scalar_t>
void forward_epilogue(const scalar_t* h, const scalar_t* a, const scalar_t* c, int64_t rows, int64_t n, int64_t d,
                      scalar_t* D) {
  in_row_groups(rows, [&](int64_t x0, auto count) {
    constexpr int R = decltype(count)::value;
    double squared_norm[R] = {};
    for (int64_t k = 0; k < d; ++k) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) squared_norm[r] += double(h[(x0 + r) * d + k]) * h[(x0 + r) * d + k];
    }
    for (int r = 0; r < R; ++r) {
      scalar_t* D_row = D + (x0 + r) * n;
      for (int64_t q = 0; q < n; ++q) D_row[q] = scalar_t(double(a[q]) * squared_norm[r] - 2.0 * D_row[q] + c[q]);
    }
  });
}

template <typename scalar_t>
void grad_h_epilogue(const scalar_t* grad_D, const scalar_t* h, const scalar_t* a, int64_t rows, int64_t n, int64_t d,
                     scalar_t* grad_h) {
  in_row_groups(rows, [&](int64_t x0, auto count) {
    constexpr int R = decltype(count)::value;
    double weight[R] = {};  // sum_q grad_D[x,q] a_q
    for (int64_t q = 0; q < n; ++q) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) weight[r] += double(grad_D[(x0 + r) * n + q]) * a[q];
    }
    for (int r = 0; r < R; ++r) {
      const scalar_t scale = scalar_t(2.0 * weight[r]);
      for (int64_t k = 0; k < d; ++k) grad_h[(x0 + r) * d + k] += scale * h[(x0 + r) * d + k];
    }
  });
}

#define SOL_EXT_DEFINE_DISSIMILARITY_KERNELS(T)                                                                     \
  void dissimilarity_direct_forward(const T* h, const T* mu, const T* P, int64_t B, int64_t n, int64_t d, T* D) {  \
    direct_forward(h, mu, P, B, n, d, D);                                                                          \
  }                                                                                                                \
  void dissimilarity_direct_backward(const T* grad_D, const T* h, const T* mu, const T* P, int64_t B, int64_t n,   \
                                     int64_t d, T* grad_h, T* grad_mu) {                                           \
    direct_backward(grad_D, h, mu, P, B, n, d, grad_h, grad_mu);                                                   \
  }                                                                                                                \
  void dissimilarity_forward_epilogue(const T* h, const T* a, const T* c, int64_t rows, int64_t n, int64_t d,      \
                                      T* D) {                                                                      \
    forward_epilogue(h, a, c, rows, n, d, D);                                                                      \
  }                                                                                                                \
  void dissimilarity_grad_h_epilogue(const T* grad_D, const T* h, const T* a, int64_t rows, int64_t n, int64_t d,  \
                                     T* grad_h) {                                                                  \
    grad_h_epilogue(grad_D, h, a, rows, n, d, grad_h);                                                             \
  }
SOL_EXT_DEFINE_DISSIMILARITY_KERNELS(float)
SOL_EXT_DEFINE_DISSIMILARITY_KERNELS(double)
#undef SOL_EXT_DEFINE_DISSIMILARITY_KERNELS
