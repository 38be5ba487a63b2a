// The CPU kernels at the machine's width, as PyTorch's DispatchStub does it: the hot kernels
// (cpu_kernels.h) are compiled once per capability, DEFAULT (the architecture's baseline: SSE2 on x86-64),
// AVX2 (with FMA) and AVX512 (F, BW, DQ, VL), each into its own namespace (cpu/isa/<capability>.cpp),
// and the best one this CPU supports runs. One binary runs on any machine of its architecture: no code
// outside those namespaces uses an instruction the baseline lacks.
//
// The choice is made once, at the first call: SOL_EXT_CPU_CAPABILITY (default, avx2, avx512) if set, else
// ATEN_CPU_CAPABILITY as ATen reads it (its AVX-512 variants mean avx512 here; a capability above the CPU's
// is capped), else CPUID. Each capability gives bitwise the same results for any number of threads; the
// capabilities differ from each other in rounding only (the vector width sets the summation order).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

// setup.py defines SOL_EXT_CPU_AVX2 and SOL_EXT_CPU_AVX512 on x86-64 where its compiler builds them.
#if defined(SOL_EXT_CPU_AVX512)
#define SOL_EXT_IF_AVX512(...) __VA_ARGS__
#else
#define SOL_EXT_IF_AVX512(...)
#endif
#if defined(SOL_EXT_CPU_AVX2)
#define SOL_EXT_IF_AVX2(...) __VA_ARGS__
#else
#define SOL_EXT_IF_AVX2(...)
#endif

namespace sol_ext {
namespace cpu {

enum class CpuCapability : int { Default = 0, Avx2 = 1, Avx512 = 2 };

// The capability the kernels run with. Throws (ValueError) when SOL_EXT_CPU_CAPABILITY names none, or one
// this build or CPU lacks; sol_ext's import asks once, so such a setting fails there.
CpuCapability cpu_capability();
// "DEFAULT", "AVX2", "AVX512" (the names of torch.backends.cpu.get_cpu_capability()).
const char* capability_name(CpuCapability capability);

// Each capability with whether this build has its kernels and whether this CPU runs them.
struct CapabilitySupport {
  CpuCapability capability;
  bool built, cpu_supports;
};
std::vector<CapabilitySupport> capability_support();

// Makes the kernels run `name` (case-insensitive) from now on; for tests that run every capability in
// one process. Throws (ValueError) for a name that is none, or one this build or CPU lacks.
void set_cpu_capability(const std::string& name);

} // namespace cpu
} // namespace sol_ext

// Calls cpu::<capability>::call for the capability that runs, e.g.
//   SOL_EXT_CPU_DISPATCH(order_loss_all_pairs_forward(inputs, out));
#define SOL_EXT_CPU_DISPATCH(call)                                               \
  do {                                                                           \
    switch (::sol_ext::cpu::cpu_capability()) {                                  \
      SOL_EXT_IF_AVX512(case ::sol_ext::cpu::CpuCapability::Avx512 :             \
                            ::sol_ext::cpu::AVX512::call;                        \
                        break;)                                                  \
      SOL_EXT_IF_AVX2(case ::sol_ext::cpu::CpuCapability::Avx2 :                 \
                          ::sol_ext::cpu::AVX2::call;                            \
                      break;)                                                    \
      default:                                                                   \
        ::sol_ext::cpu::DEFAULT::call;                                           \
    }                                                                            \
  } while (0)
