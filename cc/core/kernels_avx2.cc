// AVX2 + F16C kernels (x86-64-v3). Compiled with -mavx2 -mf16c only in this
// file; chosen at run time by cpu_features.cc.
#include <immintrin.h>

#include "cc/core/kernels.h"

namespace tf_glp::core::avx2 {
namespace {
struct VecOps {
  using F = __m256;
  static constexpr int kLanes = 8;
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static F Load(const BFloat16* p) {
    const __m256i widened = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(widened, 16));
  }
  static F Load(const Float16* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // Note [Rounding to 16 bits], in integer arithmetic.
  static __m128i ToBFloat16(F x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i high = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb),
        16);
    const __m256i nan = _mm256_or_si256(
        _mm256_and_si256(high, _mm256_set1_epi32(0x8000)),
        _mm256_set1_epi32(0x7fc0));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, nan, is_nan);
    const __m256i packed =
        _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
    return _mm256_castsi256_si128(packed);
  }
  static __m128i ToFloat16(F x) {
    return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static void Store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static void Store(BFloat16* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), ToBFloat16(x));
  }
  static void Store(Float16* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), ToFloat16(x));
  }
  static void Stream(float* p, F x) { _mm256_stream_ps(p, x); }
  static void Stream(BFloat16* p, F x) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), ToBFloat16(x));
  }
  static void Stream(Float16* p, F x) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), ToFloat16(x));
  }
  static void Fence() { _mm_sfence(); }
  static F Set(float x) { return _mm256_set1_ps(x); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static F Sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F Max(F a, F b) { return _mm256_max_ps(a, b); }
  static F Min(F a, F b) { return _mm256_min_ps(a, b); }
  static F Neg(F a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
  static F Abs(F a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  static F Sign(F a) {
    const F zero = _mm256_setzero_ps();
    const F s = _mm256_or_ps(
        _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_GT_OQ), _mm256_set1_ps(1.0f)),
        _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_LT_OQ), _mm256_set1_ps(-1.0f)));
    return _mm256_blendv_ps(s, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
};
}  // namespace
#include "cc/core/kernels_impl.inc"
}  // namespace tf_glp::core::avx2
