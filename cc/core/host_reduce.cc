#include "cc/core/host_reduce.h"

#include <atomic>
#include <string>

#include "cc/core/kernels.h"

namespace tf_glp::core {
namespace {

// Outputs larger than this are written with non-temporal stores: they would
// not stay in the last-level cache anyway, and streaming saves the read that a
// normal store does first.
constexpr int64_t kStreamingOutputBytes = 8 << 20;

using RangeKernel = bool (*)(const ReduceArgs&, int64_t, int64_t);

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
  if (spec.divisor != nullptr && spec.op != ReduceOp::kSum) {
    return "host_reduce takes a divisor only for a sum, not a mean";
  }
  if (spec.all_finite != nullptr) *spec.all_finite = true;
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
  args.divide = spec.op == ReduceOp::kMean || spec.divisor != nullptr;
  args.divisor = spec.op == ReduceOp::kMean ? static_cast<float>(spec.num_inputs)
                 : spec.divisor != nullptr  ? *spec.divisor
                                            : 1.0f;
  args.check_finite = spec.all_finite != nullptr;
  const int64_t output_bytes = spec.num_elements * DTypeSize(spec.output_dtype);
  args.streaming_stores = output_bytes >= kStreamingOutputBytes;
  const RangeKernel kernel = ReduceKernelFor(isa);

  const int64_t bytes_moved =
      output_bytes + spec.num_elements * spec.num_inputs * DTypeSize(spec.input_dtype);
  // Ranges run concurrently; any of them may clear the flag.
  std::atomic<bool> all_finite{true};
  RunElementwise(runner, spec.num_elements, bytes_moved,
                 [&](int64_t begin, int64_t end) {
                   if (!kernel(args, begin, end)) {
                     all_finite.store(false, std::memory_order_relaxed);
                   }
                 });
  if (spec.all_finite != nullptr) *spec.all_finite = all_finite.load();
  return "";
}

}  // namespace tf_glp::core
