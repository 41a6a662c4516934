// The per-instruction-set kernels behind host_reduce.h and
// host_optimizers.h. Each kernel works on one element range [begin, end) of
// plain arrays; splitting into ranges, threading and validation happen in the
// callers. This header includes nothing from the C++ library on purpose: it is
// included by files compiled with -mavx2 / -mavx512f, see kernels_impl.inc.
//
// Note [Deterministic accumulation]
// Every element's result is computed by the same sequence of float32
// operations whatever the range split, the thread count or the instruction set:
// inputs are summed in index order (((x0 + x1) + x2) + ...), the optimizer
// formulas are evaluated in the order Keras writes them, no fused multiply-add
// is formed (the core is compiled with -ffp-contract=off) and conversions to
// 16 bits follow Note [Rounding to 16 bits]. So results are bitwise
// reproducible, and match TensorFlow's add_n and Keras' optimizers, which
// evaluate the same expressions.
#ifndef TF_GLP_CC_CORE_KERNELS_H_
#define TF_GLP_CC_CORE_KERNELS_H_

#include <cstdint>

#include "cc/core/dtype.h"
#include "cc/core/update_formulas.h"

namespace tf_glp::core {

struct ReduceArgs {
  const void* const* inputs;  // num_inputs arrays of input_dtype
  int num_inputs;
  DType input_dtype;
  void* output;  // output_dtype: input_dtype or kFloat32
  DType output_dtype;
  bool divide;            // divide the float32 sum by divisor
  float divisor;          // num_inputs for a mean, Keras' loss scale, ...
  bool check_finite;      // ReduceRange reports whether all results are finite
  bool streaming_stores;  // write the output around the caches
};

// One fused optimizer update (Note [Update formulas] in update_formulas.h).
// The passes of a kind with norms (elementwise kinds have one pass and
// ignore UpdateArgs::pass).
enum class UpdatePass { kNorms, kFinish, kFactorStats, kFactoredNorms };

struct UpdateArgs {
  int kind;  // an index into UpdateFormulas
  const void* const* grads;  // num_grads arrays of grad_dtype, summed in order
  int num_grads;
  DType grad_dtype;
  float* param;  // the new parameter is written here
  // Where the old parameter is read from: null reads `param` (an update in
  // place); else another buffer of the same size, left unchanged. Lets a
  // caller whose parameter buffer others still read write the new value to a
  // fresh buffer in the same pass, instead of copying the old one first.
  const float* param_source;
  float* slots[kMaxSlots];     // the kind's slot buffers, in its order
  float scalars[kMaxScalars];  // the kind's scalars, in its order
  // Decoupled weight decay as Keras applies it before the update:
  // param -= param * decay_rate * decay_learning_rate.
  bool weight_decay;
  float decay_rate;
  float decay_learning_rate;
  // Kinds with norms (Note [Per-variable norms] in update_formulas.h): the
  // pass to run; the first pass (kNorms) writes, for each block of
  // norm_block elements from 0, its sums of squares to
  // norm_sums[block * kNorms + k]; the second (kFinish) takes the scalars
  // Formula::Scales computed from them.
  UpdatePass pass;
  int64_t norm_block;
  double* norm_sums;
  float norm_scales[kMaxNormScales];
  // Factored kinds on a variable of rank >= 2 (Note [Factored second
  // moments] in kernels_impl.inc): its last two dimensions, the rows per
  // task (the ranges of kFactorStats and kFactoredNorms are tasks), the
  // per-task column sums and the row factors.
  int64_t factor_rows;
  int64_t factor_cols;
  int64_t rows_per_task;
  float* column_sums;
  float* row_factors;
};

#define TF_GLP_DECLARE_KERNELS(isa)                                      \
  namespace isa {                                                        \
  /* Returns false if check_finite and a result in the range is not     \
     finite (true otherwise). */                                        \
  bool ReduceRange(const ReduceArgs& args, int64_t begin, int64_t end);  \
  void UpdateRange(const UpdateArgs& args, int64_t begin, int64_t end);  \
  }

TF_GLP_DECLARE_KERNELS(scalar)
TF_GLP_DECLARE_KERNELS(avx2)
TF_GLP_DECLARE_KERNELS(avx512)

#undef TF_GLP_DECLARE_KERNELS

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_KERNELS_H_
