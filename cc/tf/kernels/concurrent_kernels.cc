// CPU kernels of the layer-concurrency ops: checks and allocation (Prepare* in
// concurrent_common.h, shared with the CUDA kernels), then the core
// (cc/core/conv.h, matmul.h) with its lanes on TensorFlow's intra-op thread
// pool (Note [Lane pool]).
#include "cc/core/conv.h"
#include "cc/core/lane_pool.h"
#include "cc/core/matmul.h"
#include "cc/tf/kernels/concurrent_common.h"
#include "cc/tf/runner.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_glp::tf {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

float* Data(Tensor* t) { return t->flat<float>().data(); }
const float* Data(const Tensor& t) { return t.flat<float>().data(); }

// The kernel's lanes: tasks of TensorFlow's intra-op pool (Note [Lane pool]).
class Lanes {
 public:
  explicit Lanes(OpKernelContext* ctx) : threads_(ctx), lanes_(threads_) {}
  operator const core::CpuLanePool&() const { return lanes_; }  // NOLINT (passed to the core as its pool)

 private:
  IntraOpRunner threads_;
  core::CpuLanePool lanes_;
};

absl::Status Workspace(OpKernelContext* ctx, int64_t elements, Tensor* out) {
  return ctx->allocate_temp(tensorflow::DT_FLOAT, TensorShape({std::max<int64_t>(1, elements)}), out);
}

class ConcurrentConv2DOp : public OpKernel {
 public:
  explicit ConcurrentConv2DOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx, kOp));
  }

  void Compute(OpKernelContext* ctx) override {
    core::Conv2DShape shape;
    Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareConv2D(ctx, attrs_, kOp, &shape, &output, &work));
    if (work == Work::kNone) return;
    Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DForwardWorkspace(shape, attrs_.lanes), &workspace));
    core::Conv2DForward(shape, Data(ctx->input(0)), Data(ctx->input(1)), Data(output), attrs_.lanes,
                        Data(&workspace), Lanes(ctx));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d";
  ConvAttrs attrs_;
};

class ConcurrentConv2DBackpropInputOp : public OpKernel {
 public:
  explicit ConcurrentConv2DBackpropInputOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx, kOp));
  }

  void Compute(OpKernelContext* ctx) override {
    core::Conv2DShape shape;
    Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareConv2DBackpropInput(ctx, attrs_, kOp, &shape, &output, &work));
    if (work == Work::kNone) return;
    Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DBackpropInputWorkspace(shape, attrs_.lanes), &workspace));
    core::Conv2DBackpropInput(shape, Data(ctx->input(1)), Data(ctx->input(2)), Data(output),
                              attrs_.lanes, Data(&workspace), Lanes(ctx));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d_backprop_input";
  ConvAttrs attrs_;
};

class ConcurrentConv2DBackpropFilterOp : public OpKernel {
 public:
  explicit ConcurrentConv2DBackpropFilterOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx, kOp));
  }

  void Compute(OpKernelContext* ctx) override {
    core::Conv2DShape shape;
    Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareConv2DBackpropFilter(ctx, attrs_, kOp, &shape, &output, &work));
    if (work == Work::kZeroOutput) {
      output->flat<float>().setZero();
      return;
    }
    Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DBackpropFilterWorkspace(shape, attrs_.lanes), &workspace));
    core::Conv2DBackpropFilter(shape, Data(ctx->input(0)), Data(ctx->input(2)), Data(output),
                               attrs_.lanes, Data(&workspace), Lanes(ctx));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d_backprop_filter";
  ConvAttrs attrs_;
};

class ConcurrentMatMulOp : public OpKernel {
 public:
  explicit ConcurrentMatMulOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_b", &transpose_b_));
    OP_REQUIRES_OK(ctx, ReadConcurrency(ctx, kOp, &lanes_));
  }

  void Compute(OpKernelContext* ctx) override {
    MatMulDims d;
    Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareMatMul(ctx, kOp, transpose_b_, &d, &output, &work));
    if (work == Work::kNone) return;
    if (work == Work::kZeroOutput) {
      output->flat<float>().setZero();
      return;
    }
    core::ConcurrentMatMul(d.m, d.n, d.k, Data(ctx->input(0)), Data(ctx->input(1)), transpose_b_,
                           Data(output), lanes_, Lanes(ctx));
  }

 private:
  static constexpr const char* kOp = "concurrent_matmul";
  bool transpose_b_ = false;
  int64_t lanes_ = 1;
};

class ConcurrentMatMulGradWeightsOp : public OpKernel {
 public:
  explicit ConcurrentMatMulGradWeightsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadConcurrency(ctx, kOp, &lanes_));
  }

  void Compute(OpKernelContext* ctx) override {
    MatMulDims d;
    Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareMatMulGradWeights(ctx, kOp, &d, &output, &work));
    if (work == Work::kNone) return;
    core::MatMulGradWeights(d.m, d.k, d.n, Data(ctx->input(0)), Data(ctx->input(1)), Data(output),
                            lanes_, Lanes(ctx));
  }

 private:
  static constexpr const char* kOp = "concurrent_matmul_grad_weights";
  int64_t lanes_ = 1;
};

using tensorflow::DEVICE_CPU;
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentConv2D").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        ConcurrentConv2DOp);
REGISTER_KERNEL_BUILDER(
    Name("Glp>ConcurrentConv2DBackpropInput").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    ConcurrentConv2DBackpropInputOp);
REGISTER_KERNEL_BUILDER(
    Name("Glp>ConcurrentConv2DBackpropFilter").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    ConcurrentConv2DBackpropFilterOp);
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentMatMul").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        ConcurrentMatMulOp);
REGISTER_KERNEL_BUILDER(
    Name("Glp>ConcurrentMatMulGradWeights").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    ConcurrentMatMulGradWeightsOp);

}  // namespace
}  // namespace tf_glp::tf
