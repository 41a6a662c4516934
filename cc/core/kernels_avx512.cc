// AVX-512 (F + BW) kernels. Compiled with -mavx512f -mavx512bw -mf16c only in
// this file; chosen at run time by cpu_features.cc.
#include <immintrin.h>

#include "cc/core/kernels.h"

namespace tf_glp::core::avx512 {
namespace {
struct VecOps {
  using F = __m512;
  static constexpr int kLanes = 16;
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static F Load(const BFloat16* p) {
    const __m512i widened = _mm512_cvtepu16_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(widened, 16));
  }
  static F Load(const Float16* p) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // Note [Rounding to 16 bits], in integer arithmetic (not VCVTNEPS2BF16,
  // which flushes denormals).
  static __m256i ToBFloat16(F x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i high = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb),
        16);
    const __m512i nan = _mm512_or_si512(
        _mm512_and_si512(high, _mm512_set1_epi32(0x7fff)),
        _mm512_set1_epi32(0x7fc0));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_blend_epi32(is_nan, r, nan);
    return _mm512_cvtepi32_epi16(r);
  }
  static __m256i ToFloat16(F x) {
    return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static void Store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static void Store(BFloat16* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), ToBFloat16(x));
  }
  static void Store(Float16* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), ToFloat16(x));
  }
  static void Stream(float* p, F x) { _mm512_stream_ps(p, x); }
  static void Stream(BFloat16* p, F x) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), ToBFloat16(x));
  }
  static void Stream(Float16* p, F x) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), ToFloat16(x));
  }
  static void Fence() { _mm_sfence(); }
  static F Set(float x) { return _mm512_set1_ps(x); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static F Sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F Max(F a, F b) { return _mm512_max_ps(a, b); }
  static F Min(F a, F b) { return _mm512_min_ps(a, b); }
  static F Neg(F a) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x80000000)));
  }
  static F Abs(F a) { return _mm512_abs_ps(a); }
  static F Sign(F a) {
    const F zero = _mm512_setzero_ps();
    F s = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, zero, _CMP_GT_OQ), zero, _mm512_set1_ps(1.0f));
    s = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, zero, _CMP_LT_OQ), s, _mm512_set1_ps(-1.0f));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), s, a);
  }
};
}  // namespace
#include "cc/core/kernels_impl.inc"
}  // namespace tf_glp::core::avx512
