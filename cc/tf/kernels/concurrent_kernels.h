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
// with the core's argument order, returning an error status naming the op.
#ifndef TF_GLP_CC_TF_KERNELS_CONCURRENT_KERNELS_H_
#define TF_GLP_CC_TF_KERNELS_CONCURRENT_KERNELS_H_

#include <algorithm>

#include "cc/core/conv.h"
#include "cc/tf/kernels/concurrent_common.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_glp::tf {

inline float* Data(tensorflow::Tensor* t) { return t->flat<float>().data(); }
inline const float* Data(const tensorflow::Tensor& t) { return t.flat<float>().data(); }

inline absl::Status Workspace(tensorflow::OpKernelContext* ctx, int64_t elements, tensorflow::Tensor* out) {
  return ctx->allocate_temp(tensorflow::DT_FLOAT, tensorflow::TensorShape({std::max<int64_t>(1, elements)}), out);
}

template <class Backend>
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
    tensorflow::Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DForwardWorkspace(shape, attrs_.lanes), &workspace));
    OP_REQUIRES_OK(ctx, Backend::Conv2DForward(device, shape, Data(ctx->input(0)), Data(ctx->input(1)),
                                               Data(output), attrs_.lanes, Data(&workspace)));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d";
  ConvAttrs attrs_;
};

template <class Backend>
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
    tensorflow::Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DBackpropInputWorkspace(shape, attrs_.lanes), &workspace));
    OP_REQUIRES_OK(ctx, Backend::Conv2DBackpropInput(device, shape, Data(ctx->input(1)), Data(ctx->input(2)),
                                                     Data(output), attrs_.lanes, Data(&workspace)));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d_backprop_input";
  ConvAttrs attrs_;
};

template <class Backend>
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
    tensorflow::Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DBackpropFilterWorkspace(shape, attrs_.lanes), &workspace));
    OP_REQUIRES_OK(ctx, Backend::Conv2DBackpropFilter(device, shape, Data(ctx->input(0)), Data(ctx->input(2)),
                                                      Data(output), attrs_.lanes, Data(&workspace)));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d_backprop_filter";
  ConvAttrs attrs_;
};

template <class Backend>
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
    OP_REQUIRES_OK(ctx, Backend::MatMul(device, d.m, d.n, d.k, Data(ctx->input(0)), Data(ctx->input(1)),
                                        transpose_b_, Data(output), lanes_));
  }

 private:
  static constexpr const char* kOp = "concurrent_matmul";
  bool transpose_b_ = false;
  int64_t lanes_ = 1;
};

template <class Backend>
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
    OP_REQUIRES_OK(ctx, Backend::MatMulGradWeights(device, d.m, d.k, d.n, Data(ctx->input(0)),
                                                   Data(ctx->input(1)), Data(output), lanes_));
  }

 private:
  static constexpr const char* kOp = "concurrent_matmul_grad_weights";
  int64_t lanes_ = 1;
};

}  // namespace tf_glp::tf

#endif  // TF_GLP_CC_TF_KERNELS_CONCURRENT_KERNELS_H_
