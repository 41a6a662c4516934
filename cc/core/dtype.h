// Element types the host engine reads and writes, and their scalar
// conversions.
//
// Note [Rounding to 16 bits]
// Conversions from float32 to bfloat16 and float16 round to nearest even,
// exactly as TensorFlow's Cast (Eigen's bfloat16/half constructors) does, so
// that the native kernels and the pure-TensorFlow fallbacks give bitwise the
// same results. NaN stays NaN (quiet). The vector paths in kernels_*.cc
// implement the same rules; the scalar functions here are the reference.
#ifndef TF_GLP_CC_CORE_DTYPE_H_
#define TF_GLP_CC_CORE_DTYPE_H_

#include <cstdint>
#include <cstring>

// The conversions are also device functions when nvcc compiles this header
// (the CUDA backend's 16-bit conversions, cc/cuda/concurrent_ops.cu): one
// definition of the rounding for both backends.
#if defined(__CUDACC__)
#define TF_GLP_HOST_DEVICE __host__ __device__
#else
#define TF_GLP_HOST_DEVICE
#endif

namespace tf_glp::core {

// The conversion helpers below are `static inline`: the per-ISA kernel files
// (kernels_avx2.cc, kernels_avx512.cc) are compiled with wider -m flags and
// include this header, and an inline function with external linkage could then
// be merged by the linker into one AVX2-compiled copy used everywhere.

enum class DType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

const char* DTypeName(DType dtype);
int DTypeSize(DType dtype);

// Storage-only 16-bit types: distinct C++ types so that kernels overload on
// them, never used for arithmetic.
struct BFloat16 {
  uint16_t bits;
};
struct Float16 {
  uint16_t bits;
};

TF_GLP_HOST_DEVICE static inline uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

TF_GLP_HOST_DEVICE static inline float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

TF_GLP_HOST_DEVICE static inline float ToFloat(float x) { return x; }
TF_GLP_HOST_DEVICE static inline float ToFloat(BFloat16 x) { return BitsToFloat(uint32_t{x.bits} << 16); }

TF_GLP_HOST_DEVICE static inline float ToFloat(Float16 x) {
  const uint32_t h = x.bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {  // Inf, or NaN quieted with its payload, as F16C.
    const uint32_t quiet = mantissa != 0 ? 0x400000u : 0u;
    return BitsToFloat(sign | 0x7f800000u | quiet | (mantissa << 13));
  }
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float32.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return BitsToFloat(sign | FloatBits(magnitude));
  }
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// See Note [Rounding to 16 bits].
TF_GLP_HOST_DEVICE static inline BFloat16 ToBFloat16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return BFloat16{static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7fc0u)};
  }
  const uint32_t lsb = (u >> 16) & 1u;
  return BFloat16{static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16)};
}

// See Note [Rounding to 16 bits]. Integer-only, so it does not depend on the
// floating-point environment (TensorFlow's threads flush denormals).
TF_GLP_HOST_DEVICE static inline Float16 ToFloat16(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {  // NaN: quiet it, keep the top payload bits.
    return Float16{static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};
  }
  if (a >= 0x47800000u) {  // >= 65536: overflows to infinity.
    return Float16{static_cast<uint16_t>(sign | 0x7c00u)};
  }
  if (a < 0x38800000u) {  // Below 2^-14: a float16 subnormal (or zero).
    if (a < 0x33000000u) {  // Below 2^-25: rounds to zero.
      return Float16{static_cast<uint16_t>(sign)};
    }
    const uint32_t exponent = a >> 23;
    const uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // in [14, 24]
    uint32_t result = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (result & 1u))) ++result;
    return Float16{static_cast<uint16_t>(sign | result)};
  }
  const uint32_t mantissa_odd = (a >> 13) & 1u;
  a += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mantissa_odd;
  return Float16{static_cast<uint16_t>(sign | (a >> 13))};
}

TF_GLP_HOST_DEVICE static inline void FromFloat(float x, float* out) { *out = x; }
TF_GLP_HOST_DEVICE static inline void FromFloat(float x, BFloat16* out) { *out = ToBFloat16(x); }
TF_GLP_HOST_DEVICE static inline void FromFloat(float x, Float16* out) { *out = ToFloat16(x); }

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_DTYPE_H_
