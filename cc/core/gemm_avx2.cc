// AVX2 + FMA GEMM kernel (cc/core/gemm_impl.inc), chosen at run time by
// gemm.cc. The instruction set is enabled by a target pragma rather than by
// build flags, so the file builds the same under setup.py, CMake and
// tools/gpu_check.sh; only code after the pragma uses it.
#include <cstdint>
#include <new>

#include "cc/core/gemm.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

namespace tf_glp::core::gemm_avx2 {
namespace {
struct VecOps {
  using F = __m256;
  static constexpr int kLanes = 8;
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F Zero() { return _mm256_setzero_ps(); }
  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F MulAdd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
};
constexpr int kMr = 6;
constexpr int kNr = 16;
}  // namespace
#include "cc/core/gemm_impl.inc"
}  // namespace tf_glp::core::gemm_avx2

#pragma GCC pop_options
#endif  // __x86_64__
