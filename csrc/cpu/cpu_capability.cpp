// Which compiled capability of the CPU kernels runs (cpu_capability.h): CPUID, and the overrides.
#include "cpu_capability.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>

namespace sol_ext {
namespace cpu {
namespace {

constexpr CpuCapability kAll[] = {CpuCapability::Default, CpuCapability::Avx2, CpuCapability::Avx512};

bool built(CpuCapability capability) {
  switch (capability) {
    case CpuCapability::Avx512:
      SOL_EXT_IF_AVX512(return true;)
      return false;
    case CpuCapability::Avx2:
      SOL_EXT_IF_AVX2(return true;)
      return false;
    default:
      return true;
  }
}

// CPUID, and whether the OS saves the vector registers (GCC's and clang's builtins check both).
bool cpu_supports(CpuCapability capability) {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  switch (capability) {
    case CpuCapability::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuCapability::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default:
      return true;
  }
#else
  return capability == CpuCapability::Default;
#endif
}

CpuCapability best_available() {
  CpuCapability best = CpuCapability::Default;
  for (CpuCapability c : kAll) {
    if (built(c) && cpu_supports(c)) best = c;
  }
  return best;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

// The capability a name means, or false. ATen's finer AVX-512 levels (avx512_vnni, avx512_bf16, amx, ...)
// all run our AVX512 kernels when `aten_names`.
bool parse(const std::string& name, bool aten_names, CpuCapability& out) {
  const std::string key = lower(name);
  if (key == "default") {
    out = CpuCapability::Default;
  } else if (key == "avx2") {
    out = CpuCapability::Avx2;
  } else if (key == "avx512" || (aten_names && (key.rfind("avx512", 0) == 0 || key.rfind("amx", 0) == 0))) {
    out = CpuCapability::Avx512;
  } else {
    return false;
  }
  return true;
}

// The capability `name` asks for, checked against this build and CPU; `source` names the setting.
CpuCapability checked(const std::string& name, const std::string& source) {
  CpuCapability wanted;
  TORCH_CHECK_VALUE(parse(name, false, wanted), source, "='", name,
                    "' names no CPU capability of sol_ext: use default, avx2 or avx512 (this CPU runs up to ",
                    lower(capability_name(best_available())), ")");
  TORCH_CHECK_VALUE(built(wanted) && cpu_supports(wanted), source, "='", name, "' asks for ",
                    capability_name(wanted), " kernels, but ",
                    built(wanted) ? "this CPU lacks the instructions" : "this build of sol_ext has none (its compiler could not build them)",
                    "; use one up to ", lower(capability_name(best_available())), ", or unset it");
  return wanted;
}

CpuCapability from_environment() {
  if (const char* ours = std::getenv("SOL_EXT_CPU_CAPABILITY"); ours != nullptr && *ours != '\0') {
    return checked(ours, "SOL_EXT_CPU_CAPABILITY");
  }
  const CpuCapability best = best_available();
  if (const char* aten = std::getenv("ATEN_CPU_CAPABILITY"); aten != nullptr && *aten != '\0') {
    CpuCapability wanted;
    // As ATen does: an unknown value is ignored (torch warns about it), one above the CPU's is capped.
    if (parse(aten, true, wanted)) {
      while (!(built(wanted) && cpu_supports(wanted))) wanted = static_cast<CpuCapability>(static_cast<int>(wanted) - 1);
      return wanted;
    }
  }
  return best;
}

std::atomic<int> chosen{-1};  // -1: not chosen yet
std::mutex choosing;

} // namespace

CpuCapability cpu_capability() {
  const int value = chosen.load(std::memory_order_relaxed);
  if (value >= 0) return static_cast<CpuCapability>(value);
  std::lock_guard<std::mutex> lock(choosing);
  if (chosen.load() < 0) chosen.store(static_cast<int>(from_environment()));  // throws: chosen stays unset
  return static_cast<CpuCapability>(chosen.load());
}

const char* capability_name(CpuCapability capability) {
  switch (capability) {
    case CpuCapability::Avx512:
      return "AVX512";
    case CpuCapability::Avx2:
      return "AVX2";
    default:
      return "DEFAULT";
  }
}

std::vector<CapabilitySupport> capability_support() {
  std::vector<CapabilitySupport> table;
  for (CpuCapability c : kAll) table.push_back({c, built(c), cpu_supports(c)});
  return table;
}

void set_cpu_capability(const std::string& name) {
  const CpuCapability wanted = checked(name, "cpu capability");
  std::lock_guard<std::mutex> lock(choosing);
  chosen.store(static_cast<int>(wanted));
}

} // namespace cpu
} // namespace sol_ext
