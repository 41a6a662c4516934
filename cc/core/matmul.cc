#include "cc/core/matmul.h"

#include <algorithm>
#include <cstring>

#include "cc/core/gemm.h"

namespace tf_glp::core {
namespace {
constexpr int64_t kRowsPerBlock = 16;  // Below this a block is mostly overhead.
// A weight-gradient group's GEMM has its rows as depth; fewer than this many
// and packing plus the final sum of partials cost more than they save.
constexpr int64_t kRowsPerGradGroup = 64;
constexpr int64_t kMaxGradGroups = 32;
constexpr int64_t kPartialBudget = int64_t{64} << 20;
}  // namespace

void ConcurrentMatMul(int64_t m, int64_t n, int64_t k, const float* a,
                      const float* b, bool transpose_b, float* c,
                      int64_t num_lanes, const CpuLanePool& pool) {
  if (m <= 0 || n <= 0) return;
  // Row blocks only change which lane computes a row, never its bits
  // (Note [GEMM determinism]), so their number may follow num_lanes.
  const int64_t blocks = std::max<int64_t>(1, std::min(num_lanes, (m + kRowsPerBlock - 1) / kRowsPerBlock));
  pool.Run(num_lanes, blocks, [&](int, int64_t block) {
    const int64_t first = SplitPoint(m, blocks, block);
    const int64_t last = SplitPoint(m, blocks, block + 1);
    GemmArgs g;
    g.transpose_b = transpose_b;
    g.m = last - first;
    g.n = n;
    g.k = k;
    g.a = a + first * k;
    g.lda = k;
    g.b = b;
    g.ldb = transpose_b ? k : n;
    g.c = c + first * n;
    g.ldc = n;
    Gemm(g);
  });
}

int64_t MatMulGradGroups(int64_t m, int64_t k, int64_t n) {
  const int64_t by_rows = (m + kRowsPerGradGroup - 1) / kRowsPerGradGroup;
  const int64_t by_memory = std::max<int64_t>(1, kPartialBudget / std::max<int64_t>(1, k * n));
  return std::max<int64_t>(1, std::min({by_rows, kMaxGradGroups, by_memory}));
}

int64_t MatMulGradWeightsWorkspace(int64_t m, int64_t k, int64_t n) {
  const int64_t groups = MatMulGradGroups(m, k, n);
  return groups > 1 ? groups * k * n : 0;
}

void MatMulGradWeights(int64_t m, int64_t k, int64_t n, const float* a,
                       const float* output_grad, float* grad_weights,
                       int64_t num_lanes, float* workspace,
                       const CpuLanePool& pool) {
  if (k <= 0 || n <= 0) return;
  if (m <= 0) {
    std::memset(grad_weights, 0, sizeof(float) * k * n);
    return;
  }
  const int64_t groups = MatMulGradGroups(m, k, n);
  float* partials = groups > 1 ? workspace : grad_weights;
  pool.Run(num_lanes, groups, [&](int, int64_t group) {
    const int64_t first = SplitPoint(m, groups, group);
    const int64_t last = SplitPoint(m, groups, group + 1);
    GemmArgs g;
    g.transpose_a = true;
    g.m = k;
    g.n = n;
    g.k = last - first;
    g.a = a + first * k;
    g.lda = k;
    g.b = output_grad + first * n;
    g.ldb = n;
    g.c = partials + group * k * n;
    g.ldc = n;
    Gemm(g);
  });
  if (groups == 1) return;
  const int64_t count = k * n;
  constexpr int64_t kChunk = 16384;
  pool.Run(num_lanes, (count + kChunk - 1) / kChunk, [&](int, int64_t chunk) {
    const int64_t begin = chunk * kChunk;
    const int64_t end = std::min(count, begin + kChunk);
    std::memcpy(grad_weights + begin, partials + begin, sizeof(float) * (end - begin));
    for (int64_t group = 1; group < groups; ++group) {
      const float* part = partials + group * count;
      for (int64_t i = begin; i < end; ++i) grad_weights[i] = grad_weights[i] + part[i];
    }
  });
}

}  // namespace tf_glp::core
