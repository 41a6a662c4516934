// Integer arithmetic on sizes that come from a user's tensors and attributes.
//
// Note [Checked sizes]
// ~~~~~~~~~~~~~~~~~~~~
// Every size, offset and loop bound the core derives from its inputs (a
// convolution's span, output size, patch size, per-sample element counts,
// workspace) is computed with these functions, which report an overflow of
// int64 instead of wrapping (undefined behaviour in C++, and in practice a
// negative size that a caller turns into a crash or a short allocation).
// The TensorFlow bindings do the same for shapes with TensorShape's
// Status-returning builders, never the CHECKing constructors (a CHECK failure
// kills the user's process: TensorFlow's CVE-2022-23567/23568 class).
#ifndef TF_GLP_CC_CORE_CHECKED_MATH_H_
#define TF_GLP_CC_CORE_CHECKED_MATH_H_

#include <cstdint>
#include <initializer_list>

namespace tf_glp::core {

// *out = a * b; false (and *out untouched) on int64 overflow.
inline bool CheckedMultiply(int64_t a, int64_t b, int64_t* out) {
  int64_t product;
  if (__builtin_mul_overflow(a, b, &product)) return false;
  *out = product;
  return true;
}

// *out = a + b; false (and *out untouched) on int64 overflow.
inline bool CheckedAdd(int64_t a, int64_t b, int64_t* out) {
  int64_t sum;
  if (__builtin_add_overflow(a, b, &sum)) return false;
  *out = sum;
  return true;
}

// *out = the product of all factors; false on int64 overflow.
inline bool CheckedProduct(std::initializer_list<int64_t> factors, int64_t* out) {
  int64_t product = 1;
  for (int64_t factor : factors) {
    if (!CheckedMultiply(product, factor, &product)) return false;
  }
  *out = product;
  return true;
}

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_CHECKED_MATH_H_
