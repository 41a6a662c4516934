// CPU backend of the layer-concurrency ops (concurrent_kernels.h): the core
// (cc/core/conv.h, matmul.h) with its lanes on TensorFlow's intra-op thread
// pool (Note [Lane pool]).
#include <memory>

#include "cc/core/conv.h"
#include "cc/core/lane_pool.h"
#include "cc/core/matmul.h"
#include "cc/tf/kernels/concurrent_kernels.h"
#include "cc/tf/runner.h"

namespace tf_glp::tf {
namespace {

struct CpuBackend {
  struct Device {
    std::unique_ptr<IntraOpRunner> threads;
    std::unique_ptr<core::CpuLanePool> lanes;
  };

  static absl::Status Open(tensorflow::OpKernelContext* ctx, Device* device) {
    device->threads = std::make_unique<IntraOpRunner>(ctx);
    device->lanes = std::make_unique<core::CpuLanePool>(*device->threads);
    return absl::OkStatus();
  }
  static absl::Status Zero(const Device&, tensorflow::Tensor* output) {
    output->flat<float>().setZero();
    return absl::OkStatus();
  }
  static absl::Status Conv2DForward(const Device& d, const core::Conv2DShape& s, const float* input,
                                    const float* filter, float* output, int64_t lanes, float* workspace) {
    core::Conv2DForward(s, input, filter, output, lanes, workspace, *d.lanes);
    return absl::OkStatus();
  }
  static absl::Status Conv2DBackpropInput(const Device& d, const core::Conv2DShape& s, const float* filter,
                                          const float* output_grad, float* input_grad, int64_t lanes,
                                          float* workspace) {
    core::Conv2DBackpropInput(s, filter, output_grad, input_grad, lanes, workspace, *d.lanes);
    return absl::OkStatus();
  }
  static absl::Status Conv2DBackpropFilter(const Device& d, const core::Conv2DShape& s, const float* input,
                                           const float* output_grad, float* filter_grad, int64_t lanes,
                                           float* workspace) {
    core::Conv2DBackpropFilter(s, input, output_grad, filter_grad, lanes, workspace, *d.lanes);
    return absl::OkStatus();
  }
  static absl::Status MatMul(const Device& d, int64_t m, int64_t n, int64_t k, const float* a, const float* b,
                             bool transpose_b, float* c, int64_t lanes) {
    core::ConcurrentMatMul(m, n, k, a, b, transpose_b, c, lanes, *d.lanes);
    return absl::OkStatus();
  }
  static absl::Status MatMulGradWeights(const Device& d, int64_t m, int64_t k, int64_t n, const float* a,
                                        const float* output_grad, float* grad_weights, int64_t lanes) {
    core::MatMulGradWeights(m, k, n, a, output_grad, grad_weights, lanes, *d.lanes);
    return absl::OkStatus();
  }
};

using tensorflow::DEVICE_CPU;
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentConv2D").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        ConcurrentConv2DOp<CpuBackend>);
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentConv2DBackpropInput").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        ConcurrentConv2DBackpropInputOp<CpuBackend>);
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentConv2DBackpropFilter").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        ConcurrentConv2DBackpropFilterOp<CpuBackend>);
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentMatMul").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        ConcurrentMatMulOp<CpuBackend>);
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentMatMulGradWeights").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        ConcurrentMatMulGradWeightsOp<CpuBackend>);

}  // namespace
}  // namespace tf_glp::tf
