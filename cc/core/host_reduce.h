// host_reduce: the sum (or mean) of N same-sized buffers into one, on the
// host CPU, at memory bandwidth. This is the gradient aggregation step of
// CPU-assisted data parallelism (ICPE 2018): every replica's gradient is read
// once and the result written once.
#ifndef TF_GLP_CC_CORE_HOST_REDUCE_H_
#define TF_GLP_CC_CORE_HOST_REDUCE_H_

#include <cstdint>
#include <string>

#include "cc/core/cpu_features.h"
#include "cc/core/dtype.h"
#include "cc/core/parallel.h"

namespace tf_glp::core {

enum class ReduceOp : int { kSum = 0, kMean = 1 };

struct HostReduceSpec {
  const void* const* inputs = nullptr;  // num_inputs pointers
  int num_inputs = 0;
  DType input_dtype = DType::kFloat32;
  void* output = nullptr;
  DType output_dtype = DType::kFloat32;  // input_dtype or kFloat32
  int64_t num_elements = 0;
  ReduceOp op = ReduceOp::kSum;
  // Optional (kSum only): divide the float32 sum by *divisor, as Keras
  // unscales loss-scaled gradients (g / scale).
  const float* divisor = nullptr;
  // Optional: set to whether every element of the float32 result (after the
  // division, before any cast to output_dtype) is finite. Checked in the same
  // pass that sums, so a loss-scaled step costs no extra read of the data.
  bool* all_finite = nullptr;
};

// Sums in float32 whatever the input type, in a fixed order per element
// (Note [Deterministic accumulation]), so the output is bitwise the same for
// any runner and instruction set. The output may alias an input.
// Returns an empty string on success, else a message naming the bad argument.
std::string HostReduce(const HostReduceSpec& spec, const ParallelRunner& runner,
                       Isa isa = Isa::kBest);

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_HOST_REDUCE_H_
