// The CPU kernels for the architecture's baseline (SSE2 on x86-64): cpu_capability.h.
#include "prelude.h"

#define SOL_EXT_CPU_NS DEFAULT
#define SOL_EXT_VECTOR_BYTES 16
#include "kernels.h"
