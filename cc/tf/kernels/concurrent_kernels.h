// The layer-concurrency ops' kernels, written once over a device backend
// (TensorFlow's custom-op Functor<Device> pattern): checks and allocation
// (Prepare* in concurrent_common.h), the workspace, then the backend's core
// call. Only the backend differs between devices:
//   CpuBackend  (concurrent_kernels.cc): cc/core on TensorFlow's intra-op pool;
//   GpuBackend  (concurrent_kernels_gpu.cu.cc): cc/cuda on the op's stream.
// A backend provides
//   struct Device;                                  // per-call state
//   static absl::Status Open(OpKernelContext*, Device*);
//   static absl::Status Zero(const Device&, Tensor* output);
//   static absl::Status Conv2DForward(const Device&, shape, input, filter, output, lanes, workspace);
//   ... Conv2DBackpropInput, Conv2DBackpropFilter, MatMul, MatMulGradWeights
//   static absl::Status ToFloat32(const Device&, const void* input, core::DType, float* output, int64_t count);
//   static absl::Status FromFloat32(const Device&, const float* input, core::DType, void* output, int64_t count);
// with the core's argument order, returning an error status.
//
// Note [16-bit layers]
// ~~~~~~~~~~~~~~~~~~~~
// With T = half or bfloat16 (Keras' mixed_float16 / mixed_bfloat16
// policies) the inputs are widened to float32 (exactly), the float32 core
// computes as for float32 ops, and the result is rounded once to T
// (round to nearest even, as TensorFlow's Cast): float32 accumulation and one
// rounding at the end, as TensorFlow's own CPU kernels do. So a 16-bit op's
// result is bitwise the float32 op's on the widened inputs, rounded, and is
// the same for every lane count.
#ifndef TF_GLP_CC_TF_KERNELS_CONCURRENT_KERNELS_H_
#define TF_GLP_CC_TF_KERNELS_CONCURRENT_KERNELS_H_

#include <algorithm>
#include <type_traits>

#include "cc/core/conv.h"
#include "cc/core/dtype.h"
#include "cc/tf/kernels/concurrent_common.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_glp::tf {

inline absl::Status Workspace(tensorflow::OpKernelContext* ctx, const char* op, int64_t elements,
                              tensorflow::Tensor* out) {
  tensorflow::TensorShape shape;
  TF_RETURN_IF_ERROR(BuildShape(op, "the workspace", {std::max<int64_t>(1, elements)}, &shape));
  return ctx->allocate_temp(tensorflow::DT_FLOAT, shape, out);
}

template <class T>
constexpr core::DType CoreDType() {
  if constexpr (std::is_same_v<T, Eigen::half>) return core::DType::kFloat16;
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) return core::DType::kBFloat16;
  return core::DType::kFloat32;
}

// An input as float32 (Note [16-bit layers]): the tensor itself for float,
// else a widened temporary.
template <class Backend, class T>
absl::Status Float32Input(tensorflow::OpKernelContext* ctx, const typename Backend::Device& device,
                          const tensorflow::Tensor& input, tensorflow::Tensor* temp, const float** data) {
  if constexpr (std::is_same_v<T, float>) {
    *data = input.flat<float>().data();
    return absl::OkStatus();
  } else {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_FLOAT, input.shape(), temp));
    *data = temp->flat<float>().data();
    return Backend::ToFloat32(device, input.data(), CoreDType<T>(), temp->flat<float>().data(),
                              input.NumElements());
  }
}

// The output as float32: the tensor itself for float, else a temporary that
// Finish rounds into it.
template <class Backend, class T>
class Float32Output {
 public:
  absl::Status Init(tensorflow::OpKernelContext* ctx, tensorflow::Tensor* output) {
    output_ = output;
    if constexpr (std::is_same_v<T, float>) {
      data_ = output->flat<float>().data();
      return absl::OkStatus();
    } else {
      TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_FLOAT, output->shape(), &temp_));
      data_ = temp_.flat<float>().data();
      return absl::OkStatus();
    }
  }
  float* data() const { return data_; }
  absl::Status Finish(const typename Backend::Device& device) {
    if constexpr (std::is_same_v<T, float>) return absl::OkStatus();
    return Backend::FromFloat32(device, data_, CoreDType<T>(), output_->data(), output_->NumElements());
  }

 private:
  tensorflow::Tensor* output_ = nullptr;
  tensorflow::Tensor temp_;
  float* data_ = nullptr;
};

template <class Backend, class T>
class ConcurrentConv2DOp : public tensorflow::OpKernel {
 public:
  explicit ConcurrentConv2DOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx, kOp));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    core::Conv2DShape shape;
    tensorflow::Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareConv2D(ctx, attrs_, kOp, &shape, &output, &work));
    if (work == Work::kNone) return;
    typename Backend::Device device;
    OP_REQUIRES_OK(ctx, Backend::Open(ctx, &device));
    tensorflow::Tensor input_temp, filter_temp, workspace;
    const float *input, *filter;
    OP_REQUIRES_OK(ctx, (Float32Input<Backend, T>(ctx, device, ctx->input(0), &input_temp, &input)));
    OP_REQUIRES_OK(ctx, (Float32Input<Backend, T>(ctx, device, ctx->input(1), &filter_temp, &filter)));
    Float32Output<Backend, T> result;
    OP_REQUIRES_OK(ctx, result.Init(ctx, output));
    OP_REQUIRES_OK(ctx, Workspace(ctx, kOp, core::Conv2DForwardWorkspace(shape, attrs_.lanes), &workspace));
    OP_REQUIRES_OK(ctx, Backend::Conv2DForward(device, shape, input, filter, result.data(), attrs_.lanes,
                                               workspace.flat<float>().data()));
    OP_REQUIRES_OK(ctx, result.Finish(device));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d";
  ConvAttrs attrs_;
};

template <class Backend, class T>
class ConcurrentConv2DBackpropInputOp : public tensorflow::OpKernel {
 public:
  explicit ConcurrentConv2DBackpropInputOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx, kOp));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    core::Conv2DShape shape;
    tensorflow::Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareConv2DBackpropInput(ctx, attrs_, kOp, &shape, &output, &work));
    if (work == Work::kNone) return;
    typename Backend::Device device;
    OP_REQUIRES_OK(ctx, Backend::Open(ctx, &device));
    tensorflow::Tensor filter_temp, dy_temp, workspace;
    const float *filter, *dy;
    OP_REQUIRES_OK(ctx, (Float32Input<Backend, T>(ctx, device, ctx->input(1), &filter_temp, &filter)));
    OP_REQUIRES_OK(ctx, (Float32Input<Backend, T>(ctx, device, ctx->input(2), &dy_temp, &dy)));
    Float32Output<Backend, T> result;
    OP_REQUIRES_OK(ctx, result.Init(ctx, output));
    OP_REQUIRES_OK(ctx, Workspace(ctx, kOp, core::Conv2DBackpropInputWorkspace(shape, attrs_.lanes), &workspace));
    OP_REQUIRES_OK(ctx, Backend::Conv2DBackpropInput(device, shape, filter, dy, result.data(), attrs_.lanes,
                                                     workspace.flat<float>().data()));
    OP_REQUIRES_OK(ctx, result.Finish(device));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d_backprop_input";
  ConvAttrs attrs_;
};

template <class Backend, class T>
class ConcurrentConv2DBackpropFilterOp : public tensorflow::OpKernel {
 public:
  explicit ConcurrentConv2DBackpropFilterOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx, kOp));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    core::Conv2DShape shape;
    tensorflow::Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareConv2DBackpropFilter(ctx, attrs_, kOp, &shape, &output, &work));
    typename Backend::Device device;
    OP_REQUIRES_OK(ctx, Backend::Open(ctx, &device));
    if (work == Work::kZeroOutput) {
      OP_REQUIRES_OK(ctx, Backend::Zero(device, output));
      return;
    }
    tensorflow::Tensor input_temp, dy_temp, workspace;
    const float *input, *dy;
    OP_REQUIRES_OK(ctx, (Float32Input<Backend, T>(ctx, device, ctx->input(0), &input_temp, &input)));
    OP_REQUIRES_OK(ctx, (Float32Input<Backend, T>(ctx, device, ctx->input(2), &dy_temp, &dy)));
    Float32Output<Backend, T> result;
    OP_REQUIRES_OK(ctx, result.Init(ctx, output));
    OP_REQUIRES_OK(ctx, Workspace(ctx, kOp, core::Conv2DBackpropFilterWorkspace(shape, attrs_.lanes), &workspace));
    OP_REQUIRES_OK(ctx, Backend::Conv2DBackpropFilter(device, shape, input, dy, result.data(), attrs_.lanes,
                                                      workspace.flat<float>().data()));
    OP_REQUIRES_OK(ctx, result.Finish(device));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d_backprop_filter";
  ConvAttrs attrs_;
};

template <class Backend, class T>
class ConcurrentMatMulOp : public tensorflow::OpKernel {
 public:
  explicit ConcurrentMatMulOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_b", &transpose_b_));
    OP_REQUIRES_OK(ctx, ReadConcurrency(ctx, kOp, &lanes_));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    MatMulDims d;
    tensorflow::Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareMatMul(ctx, kOp, transpose_b_, &d, &output, &work));
    if (work == Work::kNone) return;
    typename Backend::Device device;
    OP_REQUIRES_OK(ctx, Backend::Open(ctx, &device));
    if (work == Work::kZeroOutput) {
      OP_REQUIRES_OK(ctx, Backend::Zero(device, output));
      return;
    }
    tensorflow::Tensor a_temp, b_temp;
    const float *a, *b;
    OP_REQUIRES_OK(ctx, (Float32Input<Backend, T>(ctx, device, ctx->input(0), &a_temp, &a)));
    OP_REQUIRES_OK(ctx, (Float32Input<Backend, T>(ctx, device, ctx->input(1), &b_temp, &b)));
    Float32Output<Backend, T> result;
    OP_REQUIRES_OK(ctx, result.Init(ctx, output));
    OP_REQUIRES_OK(ctx, Backend::MatMul(device, d.m, d.n, d.k, a, b, transpose_b_, result.data(), lanes_));
    OP_REQUIRES_OK(ctx, result.Finish(device));
  }

 private:
  static constexpr const char* kOp = "concurrent_matmul";
  bool transpose_b_ = false;
  int64_t lanes_ = 1;
};

template <class Backend, class T>
class ConcurrentMatMulGradWeightsOp : public tensorflow::OpKernel {
 public:
  explicit ConcurrentMatMulGradWeightsOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadConcurrency(ctx, kOp, &lanes_));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    MatMulDims d;
    tensorflow::Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareMatMulGradWeights(ctx, kOp, &d, &output, &work));
    if (work == Work::kNone) return;
    typename Backend::Device device;
    OP_REQUIRES_OK(ctx, Backend::Open(ctx, &device));
    tensorflow::Tensor a_temp, dy_temp;
    const float *a, *dy;
    OP_REQUIRES_OK(ctx, (Float32Input<Backend, T>(ctx, device, ctx->input(0), &a_temp, &a)));
    OP_REQUIRES_OK(ctx, (Float32Input<Backend, T>(ctx, device, ctx->input(1), &dy_temp, &dy)));
    Float32Output<Backend, T> result;
    OP_REQUIRES_OK(ctx, result.Init(ctx, output));
    OP_REQUIRES_OK(ctx, Backend::MatMulGradWeights(device, d.m, d.k, d.n, a, dy, result.data(), lanes_));
    OP_REQUIRES_OK(ctx, result.Finish(device));
  }

 private:
  static constexpr const char* kOp = "concurrent_matmul_grad_weights";
  int64_t lanes_ = 1;
};

// Registers the five ops' kernels for one backend and one T (the gradient
// ops' size inputs live in host memory, which changes nothing on the CPU).
#define TF_GLP_REGISTER_CONCURRENT_KERNELS(device, Backend, T)                                            \
  REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentConv2D").Device(device).TypeConstraint<T>("T"),          \
                          ::tf_glp::tf::ConcurrentConv2DOp<Backend, T>);                              \
  REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentConv2DBackpropInput")                                   \
                              .Device(device)                                                         \
                              .TypeConstraint<T>("T")                                                 \
                              .HostMemory("input_sizes"),                                             \
                          ::tf_glp::tf::ConcurrentConv2DBackpropInputOp<Backend, T>);                 \
  REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentConv2DBackpropFilter")                                  \
                              .Device(device)                                                         \
                              .TypeConstraint<T>("T")                                                 \
                              .HostMemory("filter_sizes"),                                            \
                          ::tf_glp::tf::ConcurrentConv2DBackpropFilterOp<Backend, T>);                \
  REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentMatMul").Device(device).TypeConstraint<T>("T"),          \
                          ::tf_glp::tf::ConcurrentMatMulOp<Backend, T>);                              \
  REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentMatMulGradWeights").Device(device).TypeConstraint<T>("T"), \
                          ::tf_glp::tf::ConcurrentMatMulGradWeightsOp<Backend, T>)

}  // namespace tf_glp::tf

#endif  // TF_GLP_CC_TF_KERNELS_CONCURRENT_KERNELS_H_
