// Which vector instruction set the native core uses — the host kernels and
// the GEMM of the layer-concurrency ops alike, one switch — chosen at run time
// so that one x86-64-v2 build runs everywhere and still uses AVX2 / AVX-512
// where the CPU has them.
#ifndef TF_GLP_CC_CORE_CPU_FEATURES_H_
#define TF_GLP_CC_CORE_CPU_FEATURES_H_

namespace tf_glp::core {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kBest = 3 };

const char* IsaName(Isa isa);

// The widest instruction set this CPU supports (and this build compiled).
Isa BestSupportedIsa();

// The instruction set kernels (and the GEMM) use when asked for kBest:
// BestSupportedIsa(),
// lowered by the environment variable TF_GLP_ISA=scalar|avx2|avx512 (a
// request for an unsupported set falls back to the best supported one).
Isa ActiveIsa();

// Resolves kBest to ActiveIsa() and clamps a request to what is supported.
Isa ResolveIsa(Isa requested);

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_CPU_FEATURES_H_
