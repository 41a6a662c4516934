#include "cc/core/matmul.h"

#include <cstring>

#include "cc/core/gemm.h"
#include "cc/core/work_plan.h"

namespace tf_glp::core {

GemmArgs MatMulTileGemm(int64_t n, int64_t k, const float* a, const float* b, bool transpose_b, float* c,
                        const Tile& t) {
  GemmArgs g;  // c[tile] = a[tile rows, :] op(b)[:, tile columns]
  g.transpose_b = transpose_b;
  g.m = t.rows();
  g.n = t.columns();
  g.k = k;
  g.a = a + t.row_begin * k;
  g.lda = k;
  g.b = transpose_b ? b + t.column_begin * k : b + t.column_begin;
  g.ldb = transpose_b ? k : n;
  g.c = c + t.row_begin * n + t.column_begin;
  g.ldc = n;
  return g;
}

GemmArgs MatMulGradWeightsTileGemm(int64_t m, int64_t k, int64_t n, const float* a, const float* output_grad,
                                   float* grad_weights, const Tile& t) {
  GemmArgs g;  // grad_weights[tile] = a[:, tile rows]^T output_grad[:, tile columns]
  g.transpose_a = true;
  g.m = t.rows();
  g.n = t.columns();
  g.k = m;
  g.a = a + t.row_begin;
  g.lda = k;
  g.b = output_grad + t.column_begin;
  g.ldb = n;
  g.c = grad_weights + t.row_begin * n + t.column_begin;
  g.ldc = n;
  return g;
}

void ConcurrentMatMul(int64_t m, int64_t n, int64_t k, const float* a,
                      const float* b, bool transpose_b, float* c,
                      int64_t num_lanes, const CpuLanePool& pool) {
  pool.Run(num_lanes, NumTiles(m, n), [&](int, int64_t item) {
    Gemm(MatMulTileGemm(n, k, a, b, transpose_b, c, TileAt(m, n, item)));
  });
}

void MatMulGradWeights(int64_t m, int64_t k, int64_t n, const float* a,
                       const float* output_grad, float* grad_weights,
                       int64_t num_lanes, const CpuLanePool& pool) {
  if (k <= 0 || n <= 0) return;
  if (m <= 0) {
    std::memset(grad_weights, 0, sizeof(float) * k * n);
    return;
  }
  pool.Run(num_lanes, NumTiles(k, n), [&](int, int64_t item) {
    Gemm(MatMulGradWeightsTileGemm(m, k, n, a, output_grad, grad_weights, TileAt(k, n, item)));
  });
}

}  // namespace tf_glp::core
