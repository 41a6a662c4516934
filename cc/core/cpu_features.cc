#include "cc/core/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace tf_glp::core {

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kBest:
      return "best";
  }
  return "unknown";
}

Isa BestSupportedIsa() {
#if defined(__x86_64__) && defined(TF_GLP_HAVE_X86_KERNELS)
  static const Isa best = [] {
    __builtin_cpu_init();
    // FMA too: the GEMM's AVX-512 and AVX2 paths multiply-add fused.
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma")) {
      return Isa::kAvx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
      return Isa::kAvx2;
    }
    return Isa::kScalar;
  }();
  return best;
#else
  return Isa::kScalar;
#endif
}

Isa ActiveIsa() {
  static const Isa active = [] {
    const Isa best = BestSupportedIsa();
    const char* env = std::getenv("TF_GLP_ISA");
    if (env == nullptr || *env == '\0') return best;
    Isa wanted = best;
    if (std::strcmp(env, "scalar") == 0) wanted = Isa::kScalar;
    if (std::strcmp(env, "avx2") == 0) wanted = Isa::kAvx2;
    if (std::strcmp(env, "avx512") == 0) wanted = Isa::kAvx512;
    return static_cast<int>(wanted) < static_cast<int>(best) ? wanted : best;
  }();
  return active;
}

Isa ResolveIsa(Isa requested) {
  if (requested == Isa::kBest) return ActiveIsa();
  const Isa best = BestSupportedIsa();
  return static_cast<int>(requested) < static_cast<int>(best) ? requested : best;
}

}  // namespace tf_glp::core
