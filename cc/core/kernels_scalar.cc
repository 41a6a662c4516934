// The portable kernels: compiled for the baseline ISA, used when the CPU has
// neither AVX2 nor AVX-512 (or TF_GLP_ISA=scalar asks for them).
#include "cc/core/kernels.h"

#define TF_GLP_KERNELS_SCALAR_ONLY
namespace tf_glp::core::scalar {
#include "cc/core/kernels_impl.inc"
}  // namespace tf_glp::core::scalar
