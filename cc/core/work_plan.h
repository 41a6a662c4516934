// The work plan of the layer-concurrency ops: how an op's output is cut into
// work items, shared by the CPU lanes (cc/core/matmul.cc, conv.cc) and the
// CUDA lanes (cc/cuda/concurrent_ops.cu).
//
// Note [Work plan]
// ~~~~~~~~~~~~~~~~
// Item boundaries depend on the shapes only, never on the number of lanes;
// lanes only decide which lane runs which item. Each item is computed by one
// GEMM (or one sample's im2col + GEMM) whose problem is the same whatever the
// lane count, so its bits are too: on the CPU by Note [GEMM determinism]
// (gemm.h), and on the GPU because cuBLAS, with a workspace of its own per
// stream and no atomics-based algorithms, gives identical bits for an
// identical problem — it does not promise that across different splits of
// one product, which is why the split may not follow the lane count.
// * Matrix products (Dense forward, input gradient, weight gradient): the
//   output is cut into tiles of at most kTileRows x kTileColumns; each tile's
//   elements are full in-order sums over the inner dimension.
// * Convolutions: one item per sample (forward, input gradient); the filter
//   gradient's FilterGradGroups(shape) groups of samples (conv.h).
#ifndef TF_GLP_CC_CORE_WORK_PLAN_H_
#define TF_GLP_CC_CORE_WORK_PLAN_H_

#include <cstdint>

namespace tf_glp::core {

// Large enough that a tile's GEMM amortises packing, small enough that a
// Dense layer of a usual size has several tiles to spread over lanes.
constexpr int64_t kTileRows = 128;
constexpr int64_t kTileColumns = 256;

struct Tile {
  int64_t row_begin = 0, row_end = 0, column_begin = 0, column_end = 0;
  int64_t rows() const { return row_end - row_begin; }
  int64_t columns() const { return column_end - column_begin; }
};

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Number of tiles of a [rows, columns] output (0 when it is empty).
inline int64_t NumTiles(int64_t rows, int64_t columns) {
  if (rows <= 0 || columns <= 0) return 0;
  return CeilDiv(rows, kTileRows) * CeilDiv(columns, kTileColumns);
}

// Tile `index` (0 <= index < NumTiles) in row-major tile order.
inline Tile TileAt(int64_t rows, int64_t columns, int64_t index) {
  const int64_t per_row = CeilDiv(columns, kTileColumns);
  Tile t;
  t.row_begin = index / per_row * kTileRows;
  t.column_begin = index % per_row * kTileColumns;
  t.row_end = t.row_begin + kTileRows < rows ? t.row_begin + kTileRows : rows;
  t.column_end = t.column_begin + kTileColumns < columns ? t.column_begin + kTileColumns : columns;
  return t;
}

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_WORK_PLAN_H_
