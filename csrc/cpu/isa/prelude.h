// Every header the per-capability kernels use, included before a capability's target pragma
// (default.cpp, avx2.cpp, avx512.cpp): the code of these headers (ATen's, the standard library's) is
// then compiled for the baseline in every translation unit alike, and only the kernels' own functions,
// defined after the pragma inside their capability's namespace, use the wider instructions. A template
// of these headers that a kernel instantiates takes the options of its definition, the baseline's.
// The kernel bodies (*_vec.h) include nothing themselves.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "../../sol_math.h"
#include "../cpu_kernels.h"
#include "../large_buffers.h"
#include "../tasks.h"
