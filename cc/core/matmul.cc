#include "cc/core/matmul.h"

#include <algorithm>
#include <cstring>

#include "cc/core/gemm.h"

namespace tf_glp::core {
namespace {
constexpr int64_t kRowsPerBlock = 16;  // Below this a block is mostly overhead.
constexpr int64_t kColumnsPerBlock = 32;
}  // namespace

void ConcurrentMatMul(int64_t m, int64_t n, int64_t k, const float* a,
                      const float* b, bool transpose_b, float* c,
                      int64_t num_lanes, const CpuLanePool& pool) {
  if (m <= 0 || n <= 0) return;
  // Blocks only change which lane computes an element, never its bits
  // (Note [GEMM determinism]), so their shape may follow num_lanes. Each
  // block packs its own copy of the operand it shares with the others: rows
  // of a (the batch) when b is the larger operand to repack, otherwise
  // column blocks (multiples of 32 columns) that each pack a once.
  const bool by_rows = m >= n;
  const int64_t blocks =
      by_rows ? std::max<int64_t>(1, std::min(num_lanes, (m + kRowsPerBlock - 1) / kRowsPerBlock))
              : std::max<int64_t>(1, std::min(num_lanes, (n + kColumnsPerBlock - 1) / kColumnsPerBlock));
  pool.Run(num_lanes, blocks, [&](int, int64_t block) {
    GemmArgs g;
    g.transpose_b = transpose_b;
    g.k = k;
    g.lda = k;
    g.ldb = transpose_b ? k : n;
    g.ldc = n;
    if (by_rows) {
      const int64_t first = SplitPoint(m, blocks, block);
      const int64_t last = SplitPoint(m, blocks, block + 1);
      g.m = last - first;
      g.n = n;
      g.a = a + first * k;
      g.b = b;
      g.c = c + first * n;
    } else {
      // Column block boundaries on multiples of kColumnsPerBlock.
      const int64_t units = (n + kColumnsPerBlock - 1) / kColumnsPerBlock;
      const int64_t first = std::min(n, SplitPoint(units, blocks, block) * kColumnsPerBlock);
      const int64_t last = std::min(n, SplitPoint(units, blocks, block + 1) * kColumnsPerBlock);
      g.m = m;
      g.n = last - first;
      g.a = a;
      g.b = transpose_b ? b + first * k : b + first;
      g.c = c + first;
    }
    Gemm(g);
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
  const int64_t blocks = std::max<int64_t>(1, std::min(num_lanes, (k + kRowsPerBlock - 1) / kRowsPerBlock));
  pool.Run(num_lanes, blocks, [&](int, int64_t block) {
    const int64_t first = SplitPoint(k, blocks, block);
    const int64_t last = SplitPoint(k, blocks, block + 1);
    GemmArgs g;  // grad_weights[first:last, :] = a[:, first:last]^T output_grad
    g.transpose_a = true;
    g.m = last - first;
    g.n = n;
    g.k = m;
    g.a = a + first;
    g.lda = k;
    g.b = output_grad;
    g.ldb = n;
    g.c = grad_weights + first * n;
    g.ldc = n;
    Gemm(g);
  });
}

}  // namespace tf_glp::core
