// The bodies of the per-capability kernels (cpu_kernels.h), compiled once by each of default.cpp,
// avx2.cpp and avx512.cpp into sol_ext::cpu::SOL_EXT_CPU_NS, with vectors of SOL_EXT_VECTOR_BYTES bytes.
// No include guard: each of those files includes it once. prelude.h has every header they need.

namespace sol_ext {
namespace cpu {
namespace SOL_EXT_CPU_NS {

#include "vec.h"
#include "order_loss_vec.h"
#include "grouped_vec.h"
#include "dissimilarity_vec.h"

} // namespace SOL_EXT_CPU_NS
} // namespace cpu
} // namespace sol_ext
