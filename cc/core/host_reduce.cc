#include "cc/core/host_reduce.h"

#include <string>

#include "cc/core/kernels.h"

namespace tf_glp::core {
namespace {

// Outputs larger than this are written with non-temporal stores: they would
// not stay in the last-level cache anyway, and streaming saves the read that a
// normal store does first.
constexpr int64_t kStreamingOutputBytes = 8 << 20;

using RangeKernel = void (*)(const ReduceArgs&, int64_t, int64_t);

RangeKernel ReduceKernelFor(Isa isa) {
  switch (ResolveIsa(isa)) {
    case Isa::kAvx512:
      return &avx512::ReduceRange;
    case Isa::kAvx2:
      return &avx2::ReduceRange;
    default:
      return &scalar::ReduceRange;
  }
}

}  // namespace

std::string HostReduce(const HostReduceSpec& spec, const ParallelRunner& runner,
                       Isa isa) {
  if (spec.num_inputs < 1) {
    return "host_reduce needs at least one input, got " +
           std::to_string(spec.num_inputs);
  }
  if (spec.num_elements < 0) {
    return "host_reduce got a negative element count " +
           std::to_string(spec.num_elements);
  }
  if (spec.output_dtype != spec.input_dtype &&
      spec.output_dtype != DType::kFloat32) {
    return std::string("host_reduce output dtype must be the input dtype (") +
           DTypeName(spec.input_dtype) + ") or float32, got " +
           DTypeName(spec.output_dtype);
  }
  if (spec.num_elements == 0) return "";
  if (spec.inputs == nullptr || spec.output == nullptr) {
    return "host_reduce got a null buffer";
  }
  for (int i = 0; i < spec.num_inputs; ++i) {
    if (spec.inputs[i] == nullptr) {
      return "host_reduce input " + std::to_string(i) + " is a null buffer";
    }
  }

  ReduceArgs args;
  args.inputs = spec.inputs;
  args.num_inputs = spec.num_inputs;
  args.input_dtype = spec.input_dtype;
  args.output = spec.output;
  args.output_dtype = spec.output_dtype;
  args.mean = spec.op == ReduceOp::kMean;
  const int64_t output_bytes = spec.num_elements * DTypeSize(spec.output_dtype);
  args.streaming_stores = output_bytes >= kStreamingOutputBytes;
  const RangeKernel kernel = ReduceKernelFor(isa);

  const int64_t bytes_moved =
      output_bytes + spec.num_elements * spec.num_inputs * DTypeSize(spec.input_dtype);
  RunElementwise(runner, spec.num_elements, bytes_moved,
                 [&](int64_t begin, int64_t end) { kernel(args, begin, end); });
  return "";
}

}  // namespace tf_glp::core
