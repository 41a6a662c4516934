// AVX-512 + FMA GEMM kernel (cc/core/gemm_impl.inc), chosen at run time by
// gemm.cc. See gemm_avx2.cc for why a target pragma and not build flags.
#include <cstdint>
#include <new>

#include "cc/core/gemm.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#include <immintrin.h>

namespace tf_glp::core::gemm_avx512 {
namespace {
struct VecOps {
  using F = __m512;
  static constexpr int kLanes = 16;
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F Zero() { return _mm512_setzero_ps(); }
  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F MulAdd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
};
constexpr int kMr = 8;
constexpr int kNr = 32;
}  // namespace
#include "cc/core/gemm_impl.inc"
}  // namespace tf_glp::core::gemm_avx512

#pragma GCC pop_options
#endif  // __x86_64__
