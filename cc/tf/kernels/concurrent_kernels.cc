// CPU backend of the layer-concurrency ops (concurrent_kernels.h): the core
// (cc/core/conv.h, matmul.h) with its lanes on TensorFlow's intra-op thread
// pool (Note [Lane pool]).
#include <cstring>
#include <memory>

#include "cc/core/conv.h"
#include "cc/core/dtype.h"
#include "cc/core/lane_pool.h"
#include "cc/core/matmul.h"
#include "cc/tf/kernels/concurrent_kernels.h"
#include "cc/tf/runner.h"

namespace tf_glp::tf {
namespace {

template <class From, class To>
void Convert(const From* input, To* output, int64_t count) {
  for (int64_t i = 0; i < count; ++i) core::FromFloat(core::ToFloat(input[i]), &output[i]);
}

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
    std::memset(output->data(), 0, output->TotalBytes());  // +0.0 in every float type
    return absl::OkStatus();
  }
  // Note [16-bit layers]: exact widening, one rounding (core/dtype.h).
  static absl::Status ToFloat32(const Device&, const void* input, core::DType dtype, float* output, int64_t count) {
    if (dtype == core::DType::kFloat16) {
      Convert(static_cast<const core::Float16*>(input), output, count);
    } else {
      Convert(static_cast<const core::BFloat16*>(input), output, count);
    }
    return absl::OkStatus();
  }
  static absl::Status FromFloat32(const Device&, const float* input, core::DType dtype, void* output,
                                  int64_t count) {
    if (dtype == core::DType::kFloat16) {
      Convert(input, static_cast<core::Float16*>(output), count);
    } else {
      Convert(input, static_cast<core::BFloat16*>(output), count);
    }
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
TF_GLP_REGISTER_CONCURRENT_KERNELS(DEVICE_CPU, CpuBackend, float);
TF_GLP_REGISTER_CONCURRENT_KERNELS(DEVICE_CPU, CpuBackend, Eigen::half);
TF_GLP_REGISTER_CONCURRENT_KERNELS(DEVICE_CPU, CpuBackend, Eigen::bfloat16);

}  // namespace
}  // namespace tf_glp::tf
