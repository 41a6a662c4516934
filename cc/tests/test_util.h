// Helpers shared by the native core tests.
#ifndef TF_GLP_CC_TESTS_TEST_UTIL_H_
#define TF_GLP_CC_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cc/core/cpu_features.h"
#include "cc/core/dtype.h"

namespace tf_glp::testing {

// Every instruction set this machine can run, scalar first.
inline std::vector<core::Isa> SupportedIsas() {
  std::vector<core::Isa> isas = {core::Isa::kScalar};
  if (static_cast<int>(core::BestSupportedIsa()) >= 1) isas.push_back(core::Isa::kAvx2);
  if (static_cast<int>(core::BestSupportedIsa()) >= 2) isas.push_back(core::Isa::kAvx512);
  return isas;
}

// Raw 16- or 32-bit storage for `n` elements of `dtype`, filled with values
// drawn from N(0, scale) (plus a few specials when `specials` is set).
inline std::vector<uint8_t> RandomBuffer(core::DType dtype, int64_t n,
                                         std::mt19937& rng, float scale = 1.0f,
                                         bool specials = false) {
  std::vector<uint8_t> bytes(n * core::DTypeSize(dtype) + 64);
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t i = 0; i < n; ++i) {
    float x = normal(rng);
    if (specials && i % 97 == 5) x = 1e-40f;      // float32 denormal
    if (specials && i % 101 == 7) x = 70000.0f;   // overflows float16
    if (specials && i % 103 == 9) x = 3e-8f;      // float16 subnormal
    switch (dtype) {
      case core::DType::kFloat32:
        std::memcpy(bytes.data() + 4 * i, &x, 4);
        break;
      case core::DType::kBFloat16: {
        const core::BFloat16 b = core::ToBFloat16(x);
        std::memcpy(bytes.data() + 2 * i, &b, 2);
        break;
      }
      case core::DType::kFloat16: {
        const core::Float16 h = core::ToFloat16(x);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
        break;
      }
    }
  }
  return bytes;
}

inline float LoadAsFloat(core::DType dtype, const void* base, int64_t i) {
  const uint8_t* p = static_cast<const uint8_t*>(base);
  switch (dtype) {
    case core::DType::kFloat32: {
      float x;
      std::memcpy(&x, p + 4 * i, 4);
      return x;
    }
    case core::DType::kBFloat16: {
      core::BFloat16 b;
      std::memcpy(&b, p + 2 * i, 2);
      return core::ToFloat(b);
    }
    case core::DType::kFloat16: {
      core::Float16 h;
      std::memcpy(&h, p + 2 * i, 2);
      return core::ToFloat(h);
    }
  }
  return 0.0f;
}

}  // namespace tf_glp::testing

#endif  // TF_GLP_CC_TESTS_TEST_UTIL_H_
