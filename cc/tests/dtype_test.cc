// The scalar 16-bit conversions against an independent reference (exact
// rounding computed in double precision), including ties, subnormals,
// overflow and NaN.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "cc/core/dtype.h"
#include "cc/tests/test_main.h"

namespace tf_glp::core {
namespace {

// Round-to-nearest-even of x onto the grid of a binary format with
// `mantissa_bits` stored bits and minimum normal exponent `min_exponent`,
// computed in double (exact for float32 inputs).
double RoundToFormat(double x, int mantissa_bits, int min_exponent,
                     double max_finite) {
  if (x == 0.0) return x;
  const double a = std::fabs(x);
  int exponent = std::ilogb(a);
  if (exponent < min_exponent) exponent = min_exponent;
  const double quantum = std::ldexp(1.0, exponent - mantissa_bits);
  const double q = a / quantum;
  double r = std::floor(q);
  const double rest = q - r;
  if (rest > 0.5 || (rest == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
  double result = r * quantum;
  // Values at or beyond max_finite + half a quantum overflow to infinity.
  const double top_quantum = std::ldexp(1.0, std::ilogb(max_finite) - mantissa_bits);
  if (a >= max_finite + top_quantum / 2) result = INFINITY;
  return std::copysign(result, x);
}

void CheckOne(float x) {
  if (std::isnan(x)) {
    EXPECT_TRUE(std::isnan(ToFloat(ToBFloat16(x))));
    EXPECT_TRUE(std::isnan(ToFloat(ToFloat16(x))));
    return;
  }
  const double bf16 = RoundToFormat(x, 7, -126, 3.3895313892515355e38);
  const double f16 = RoundToFormat(x, 10, -14, 65504.0);
  if (static_cast<double>(ToFloat(ToBFloat16(x))) != bf16) {
    throw testing::Failure("bfloat16 rounding of " + std::to_string(x));
  }
  if (static_cast<double>(ToFloat(ToFloat16(x))) != f16) {
    throw testing::Failure("float16 rounding of " + std::to_string(x) +
                           ": got " + std::to_string(ToFloat(ToFloat16(x))) +
                           " want " + std::to_string(f16));
  }
}

TEST(ConversionsMatchExactRounding) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) CheckOne(BitsToFloat(bits(rng)));
  // Ties and the edges of the float16 range.
  for (float x : {0.0f, -0.0f, 1.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f,
                  6.103515625e-05f, 6.0975552e-05f, 5.9604645e-08f,
                  2.9802322e-08f, 2.9802326e-08f, 1e-45f,
                  1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 1.0f + 1.0f / 2048,
                  1.0f + 3.0f / 2048, 3.3895314e38f,
                  std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()}) {
    CheckOne(x);
    CheckOne(-x);
  }
}

TEST(SixteenBitValuesRoundTrip) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const Float16 h{static_cast<uint16_t>(b)};
    const float f = ToFloat(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(ToFloat16(f).bits, h.bits);
    const BFloat16 g{static_cast<uint16_t>(b)};
    if (std::isnan(ToFloat(g))) continue;
    EXPECT_EQ(ToBFloat16(ToFloat(g)).bits, g.bits);
  }
}

}  // namespace
}  // namespace tf_glp::core

TF_GLP_TEST_MAIN
