// Concurrent matrix products for Dense layers (GLP4NN): the rows of the batch
// split over k lanes (Note [Lane pool] in lane_pool.h), results bitwise
// identical for every k (Note [Concurrent determinism] in conv.h).
#ifndef TF_GLP_CC_CORE_MATMUL_H_
#define TF_GLP_CC_CORE_MATMUL_H_

#include <cstdint>

#include "cc/core/lane_pool.h"

namespace tf_glp::core {

// c[m, n] = a[m, k] * b, b being [k, n] or, when transpose_b, [n, k]. Row
// blocks of a (or, when c has more columns than rows, column blocks) run on
// the lanes.
void ConcurrentMatMul(int64_t m, int64_t n, int64_t k, const float* a,
                      const float* b, bool transpose_b, float* c,
                      int64_t num_lanes, const CpuLanePool& pool);

// grad_weights[k, n] = a[m, k]^T * output_grad[m, n]. The lanes take blocks
// of rows of grad_weights (input features); each element is the in-order sum
// over all m batch rows (Note [GEMM determinism]), so no partial sums are
// needed and the bits do not depend on num_lanes. (Unlike a convolution's
// filter gradient, splitting the output here duplicates no work.)
void MatMulGradWeights(int64_t m, int64_t k, int64_t n, const float* a,
                       const float* output_grad, float* grad_weights,
                       int64_t num_lanes, const CpuLanePool& pool);

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_MATMUL_H_
