// Vectors of the capability's width as GCC/clang vector extensions: the compiler emits the capability's
// instructions for them (xmm, ymm or zmm registers), and the lane count, which fixes each kernel's
// summation order, is the capability's.

template <typename T>
struct Vec;
template <>
struct Vec<float> {
  typedef float type __attribute__((vector_size(SOL_EXT_VECTOR_BYTES)));
  static constexpr int kLanes = SOL_EXT_VECTOR_BYTES / 4;
};
template <>
struct Vec<double> {
  typedef double type __attribute__((vector_size(SOL_EXT_VECTOR_BYTES)));
  static constexpr int kLanes = SOL_EXT_VECTOR_BYTES / 8;
};
template <typename T>
using vec_t = typename Vec<T>::type;

template <typename T>
inline vec_t<T> load(const T* p) {
  vec_t<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
inline void store(T* p, vec_t<T> v) {
  std::memcpy(p, &v, sizeof v);
}
template <typename T>
inline vec_t<T> splat(T value) {
  return vec_t<T>{} + value;
}

// [x]+ lane by lane, keeping a NaN as std::max(x, 0) and positive_part (sol_math.h) do: MAXPS returns its
// second operand when either is NaN. (The AVX-512 form with a full mask: GCC 12 warns about the plain one's
// undefined pass-through operand.)
inline vec_t<float> positive_part(vec_t<float> x) {
#if SOL_EXT_VECTOR_BYTES == 64
  return _mm512_mask_max_ps(x, __mmask16(0xFFFF), vec_t<float>{}, x);
#elif SOL_EXT_VECTOR_BYTES == 32
  return _mm256_max_ps(vec_t<float>{}, x);
#elif defined(__SSE2__)
  return _mm_max_ps(vec_t<float>{}, x);
#else
  return x < 0 ? vec_t<float>{} : x;
#endif
}
inline vec_t<double> positive_part(vec_t<double> x) {
#if SOL_EXT_VECTOR_BYTES == 64
  return _mm512_mask_max_pd(x, __mmask8(0xFF), vec_t<double>{}, x);
#elif SOL_EXT_VECTOR_BYTES == 32
  return _mm256_max_pd(vec_t<double>{}, x);
#elif defined(__SSE2__)
  return _mm_max_pd(vec_t<double>{}, x);
#else
  return x < 0 ? vec_t<double>{} : x;
#endif
}

// [x]- = min(x, 0) lane by lane, keeping a NaN (MINPS returns its second operand when either is NaN).
inline vec_t<float> negative_part(vec_t<float> x) {
#if SOL_EXT_VECTOR_BYTES == 64
  return _mm512_mask_min_ps(x, __mmask16(0xFFFF), vec_t<float>{}, x);
#elif SOL_EXT_VECTOR_BYTES == 32
  return _mm256_min_ps(vec_t<float>{}, x);
#elif defined(__SSE2__)
  return _mm_min_ps(vec_t<float>{}, x);
#else
  return x > 0 ? vec_t<float>{} : x;
#endif
}
inline vec_t<double> negative_part(vec_t<double> x) {
#if SOL_EXT_VECTOR_BYTES == 64
  return _mm512_mask_min_pd(x, __mmask8(0xFF), vec_t<double>{}, x);
#elif SOL_EXT_VECTOR_BYTES == 32
  return _mm256_min_pd(vec_t<double>{}, x);
#elif defined(__SSE2__)
  return _mm_min_pd(vec_t<double>{}, x);
#else
  return x > 0 ? vec_t<double>{} : x;
#endif
}

// min(x, y) lane by lane, y where either is NaN (MINPS).
inline vec_t<float> smaller(vec_t<float> x, vec_t<float> y) {
#if SOL_EXT_VECTOR_BYTES == 64
  return _mm512_mask_min_ps(y, __mmask16(0xFFFF), x, y);
#elif SOL_EXT_VECTOR_BYTES == 32
  return _mm256_min_ps(x, y);
#elif defined(__SSE2__)
  return _mm_min_ps(x, y);
#else
  return x < y ? x : y;
#endif
}
inline vec_t<double> smaller(vec_t<double> x, vec_t<double> y) {
#if SOL_EXT_VECTOR_BYTES == 64
  return _mm512_mask_min_pd(y, __mmask8(0xFF), x, y);
#elif SOL_EXT_VECTOR_BYTES == 32
  return _mm256_min_pd(x, y);
#elif defined(__SSE2__)
  return _mm_min_pd(x, y);
#else
  return x < y ? x : y;
#endif
}

// v rotated by Shift lanes: lane i holds v[(i + Shift) % lanes].
template <typename T, int Shift, int... I>
inline vec_t<T> rotate_lanes(vec_t<T> v, std::integer_sequence<int, I...>) {
#if defined(__clang__)
  return __builtin_shufflevector(v, v, ((I + Shift) % Vec<T>::kLanes)...);
#else
  typedef std::conditional_t<sizeof(T) == 4, int32_t, int64_t> index_t;
  typedef index_t mask_t __attribute__((vector_size(SOL_EXT_VECTOR_BYTES)));
  return __builtin_shuffle(v, mask_t{((I + Shift) % Vec<T>::kLanes)...});
#endif
}

// The sum of the lanes, halves added pairwise (lane i += lane i + width, width = lanes/2, ..., 1): the
// same order in every call.
template <typename T>
inline T sum_lanes(vec_t<T> v) {
  constexpr int kLanes = Vec<T>::kLanes;
  using lanes = std::make_integer_sequence<int, kLanes>;
  if constexpr (kLanes >= 16) v += rotate_lanes<T, 8>(v, lanes{});
  if constexpr (kLanes >= 8) v += rotate_lanes<T, 4>(v, lanes{});
  if constexpr (kLanes >= 4) v += rotate_lanes<T, 2>(v, lanes{});
  if constexpr (kLanes >= 2) v += rotate_lanes<T, 1>(v, lanes{});
  return v[0];
}

// Lanes of a and b picked by Index(lane) (0 .. 2 lanes - 1, b's from lanes on).
template <typename T, typename Index, int... I>
inline vec_t<T> pick_lanes(vec_t<T> a, vec_t<T> b, std::integer_sequence<int, I...>) {
#if defined(__clang__)
  return __builtin_shufflevector(a, b, Index::of(I)...);
#else
  typedef std::conditional_t<sizeof(T) == 4, int32_t, int64_t> index_t;
  typedef index_t mask_t __attribute__((vector_size(SOL_EXT_VECTOR_BYTES)));
  return __builtin_shuffle(a, b, mask_t{Index::of(I)...});
#endif
}

// a and b hold groups of 2 Width lanes, one sum each: the result holds groups of Width lanes, lane j of
// a group the sum of lanes j and j + Width of its source group, the groups of a and b taking turns.
template <typename T, int Width>
inline vec_t<T> fold_groups(vec_t<T> a, vec_t<T> b) {
  constexpr int kLanes = Vec<T>::kLanes;
  struct Low {
    static constexpr int of(int t) { return (t / Width % 2 ? kLanes : 0) + t / Width / 2 * 2 * Width + t % Width; }
  };
  struct High {
    static constexpr int of(int t) { return Low::of(t) + Width; }
  };
  using lanes = std::make_integer_sequence<int, kLanes>;
  return pick_lanes<T, Low>(a, b, lanes{}) + pick_lanes<T, High>(a, b, lanes{});
}

// Within groups of 2 Width lanes: lane j += lane j + Width, for Width, Width / 2, ..., 1.
template <typename T, int Width>
inline vec_t<T> fold_within(vec_t<T> v) {
  if constexpr (Width >= 1) {
    struct Upper {
      static constexpr int of(int t) { return t % (2 * Width) < Width ? t + Width : t; }
    };
    v += pick_lanes<T, Upper>(v, v, std::make_integer_sequence<int, Vec<T>::kLanes>{});
    return fold_within<T, Width / 2>(v);
  } else {
    return v;
  }
}

// The sums of the lanes of K vectors (1, 2 or 4), each added as sum_lanes adds it (lane i + lane i +
// width, the width halved each time: the same numbers), but K at a time: the halves of two vectors go
// into one vector at each of the first steps, so K sums take the shuffles and adds of about one.
template <typename T, int K>
inline void sum_lanes_of(const vec_t<T> (&v)[K], T* out) {
  constexpr int L = Vec<T>::kLanes;
  static_assert(K == 1 || K == 2 || K == 4, "one, two or four vectors");
  static_assert(L >= K, "a lane for each sum");
  if constexpr (K == 1) {
    out[0] = sum_lanes<T>(v[0]);
  } else if constexpr (K == 2) {
    const vec_t<T> folded = fold_within<T, L / 4>(fold_groups<T, L / 2>(v[0], v[1]));  // groups: v0, v1
    out[0] = folded[0];
    out[1] = folded[L / 2];
  } else {
    const vec_t<T> v01 = fold_groups<T, L / 2>(v[0], v[1]), v23 = fold_groups<T, L / 2>(v[2], v[3]);
    const vec_t<T> folded = fold_within<T, L / 8>(fold_groups<T, L / 4>(v01, v23));  // groups: v0, v2, v1, v3
    out[0] = folded[0];
    out[1] = folded[2 * L / 4];
    out[2] = folded[L / 4];
    out[3] = folded[3 * L / 4];
  }
}
