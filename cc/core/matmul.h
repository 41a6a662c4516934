// Concurrent matrix products for Dense layers (GLP4NN): the output's tiles
// (Note [Work plan] in work_plan.h) run on k lanes (Note [Lane pool] in
// lane_pool.h), results bitwise identical for every k.
#ifndef TF_GLP_CC_CORE_MATMUL_H_
#define TF_GLP_CC_CORE_MATMUL_H_

#include <cstdint>

#include "cc/core/gemm.h"
#include "cc/core/lane_pool.h"
#include "cc/core/work_plan.h"

namespace tf_glp::core {

// c[m, n] = a[m, k] * b, b being [k, n] or, when transpose_b, [n, k].
void ConcurrentMatMul(int64_t m, int64_t n, int64_t k, const float* a,
                      const float* b, bool transpose_b, float* c,
                      int64_t num_lanes, const CpuLanePool& pool);

// grad_weights[k, n] = a[m, k]^T * output_grad[m, n]. Each element is the
// in-order sum over all m batch rows, so no partial sums are needed. (Unlike
// a convolution's filter gradient, splitting the output here duplicates no
// work.)
void MatMulGradWeights(int64_t m, int64_t k, int64_t n, const float* a,
                       const float* output_grad, float* grad_weights,
                       int64_t num_lanes, const CpuLanePool& pool);

// The GEMM of one tile of each product: the items both backends run.
GemmArgs MatMulTileGemm(int64_t n, int64_t k, const float* a, const float* b, bool transpose_b, float* c,
                        const Tile& tile);
GemmArgs MatMulGradWeightsTileGemm(int64_t m, int64_t k, int64_t n, const float* a, const float* output_grad,
                                   float* grad_weights, const Tile& tile);

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_MATMUL_H_
