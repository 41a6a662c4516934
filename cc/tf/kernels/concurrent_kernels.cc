// CPU kernels of the layer-concurrency ops: checks, allocation, then the core
// (cc/core/conv.h, matmul.h) on the process-wide CPU lane pool.
#include "cc/core/conv.h"
#include "cc/core/lane_pool.h"
#include "cc/core/matmul.h"
#include "cc/tf/kernels/concurrent_common.h"
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

absl::Status Workspace(OpKernelContext* ctx, int64_t elements, Tensor* out) {
  return ctx->allocate_temp(tensorflow::DT_FLOAT, TensorShape({std::max<int64_t>(1, elements)}), out);
}

class ConcurrentConv2DOp : public OpKernel {
 public:
  explicit ConcurrentConv2DOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx, "concurrent_conv2d"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& filter = ctx->input(1);
    core::Conv2DShape shape;
    OP_REQUIRES_OK(ctx, attrs_.Shape("concurrent_conv2d", input.shape(), filter.shape(), &shape));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({shape.batch, shape.out_h, shape.out_w, shape.out_c}),
                            &output));
    if (shape.batch == 0) return;
    Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DForwardWorkspace(shape, attrs_.lanes), &workspace));
    core::Conv2DForward(shape, Data(input), Data(filter), Data(output), attrs_.lanes,
                        Data(&workspace), core::CpuLanePool::Global());
  }

 private:
  ConvAttrs attrs_;
};

class ConcurrentConv2DBackpropInputOp : public OpKernel {
 public:
  explicit ConcurrentConv2DBackpropInputOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx, kOp));
  }

  void Compute(OpKernelContext* ctx) override {
    TensorShape input_shape;
    OP_REQUIRES_OK(ctx, SizesToShape(kOp, "input_sizes", ctx->input(0), &input_shape));
    const Tensor& filter = ctx->input(1);
    const Tensor& out_backprop = ctx->input(2);
    core::Conv2DShape shape;
    OP_REQUIRES_OK(ctx, attrs_.Shape(kOp, input_shape, filter.shape(), &shape));
    const TensorShape expected({shape.batch, shape.out_h, shape.out_w, shape.out_c});
    OP_REQUIRES(ctx, out_backprop.shape() == expected,
                absl::InvalidArgumentError(absl::StrCat(
                    kOp, ": out_backprop must have shape ", expected.DebugString(),
                    ", got ", out_backprop.shape().DebugString())));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, input_shape, &output));
    if (shape.batch == 0) return;
    Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DBackpropInputWorkspace(shape, attrs_.lanes), &workspace));
    core::Conv2DBackpropInput(shape, Data(filter), Data(out_backprop), Data(output),
                              attrs_.lanes, Data(&workspace), core::CpuLanePool::Global());
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
    const Tensor& input = ctx->input(0);
    TensorShape filter_shape;
    OP_REQUIRES_OK(ctx, SizesToShape(kOp, "filter_sizes", ctx->input(1), &filter_shape));
    const Tensor& out_backprop = ctx->input(2);
    core::Conv2DShape shape;
    OP_REQUIRES_OK(ctx, attrs_.Shape(kOp, input.shape(), filter_shape, &shape));
    const TensorShape expected({shape.batch, shape.out_h, shape.out_w, shape.out_c});
    OP_REQUIRES(ctx, out_backprop.shape() == expected,
                absl::InvalidArgumentError(absl::StrCat(
                    kOp, ": out_backprop must have shape ", expected.DebugString(),
                    ", got ", out_backprop.shape().DebugString())));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, filter_shape, &output));
    if (shape.batch == 0) {
      output->flat<float>().setZero();
      return;
    }
    Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DBackpropFilterWorkspace(shape, attrs_.lanes), &workspace));
    core::Conv2DBackpropFilter(shape, Data(input), Data(out_backprop), Data(output),
                               attrs_.lanes, Data(&workspace), core::CpuLanePool::Global());
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d_backprop_filter";
  ConvAttrs attrs_;
};

class ConcurrentMatMulOp : public OpKernel {
 public:
  explicit ConcurrentMatMulOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_b", &transpose_b_));
    OP_REQUIRES_OK(ctx, ReadConcurrency(ctx, "concurrent_matmul", &lanes_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    const Tensor& b = ctx->input(1);
    OP_REQUIRES(ctx, a.dims() == 2 && b.dims() == 2,
                absl::InvalidArgumentError(absl::StrCat(
                    "concurrent_matmul: a and b must be matrices, got shapes ",
                    a.shape().DebugString(), " and ", b.shape().DebugString())));
    const int64_t m = a.dim_size(0), k = a.dim_size(1);
    const int64_t b_inner = b.dim_size(transpose_b_ ? 1 : 0);
    const int64_t n = b.dim_size(transpose_b_ ? 0 : 1);
    OP_REQUIRES(ctx, b_inner == k,
                absl::InvalidArgumentError(absl::StrCat(
                    "concurrent_matmul: a has ", k, " columns but b",
                    transpose_b_ ? "^T" : "", " has ", b_inner, " rows (shapes ",
                    a.shape().DebugString(), " and ", b.shape().DebugString(), ")")));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m, n}), &output));
    if (m == 0 || n == 0) return;
    if (k == 0) {
      output->flat<float>().setZero();
      return;
    }
    core::ConcurrentMatMul(m, n, k, Data(a), Data(b), transpose_b_, Data(output), lanes_,
                           core::CpuLanePool::Global());
  }

 private:
  bool transpose_b_ = false;
  int64_t lanes_ = 1;
};

class ConcurrentMatMulGradWeightsOp : public OpKernel {
 public:
  explicit ConcurrentMatMulGradWeightsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadConcurrency(ctx, kOp, &lanes_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    const Tensor& dy = ctx->input(1);
    OP_REQUIRES(ctx, a.dims() == 2 && dy.dims() == 2 && a.dim_size(0) == dy.dim_size(0),
                absl::InvalidArgumentError(absl::StrCat(
                    kOp, ": a and out_backprop must be matrices with the same number of "
                    "rows, got shapes ", a.shape().DebugString(), " and ",
                    dy.shape().DebugString())));
    const int64_t m = a.dim_size(0), k = a.dim_size(1), n = dy.dim_size(1);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({k, n}), &output));
    if (k == 0 || n == 0) return;
    core::MatMulGradWeights(m, k, n, Data(a), Data(dy), Data(output), lanes_,
                            core::CpuLanePool::Global());
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
