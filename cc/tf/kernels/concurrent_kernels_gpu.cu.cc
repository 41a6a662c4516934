// CUDA kernels of the layer-concurrency ops: the same checks and allocation
// as the CPU kernels (concurrent_kernels.cc), then cc/cuda/lane_pool_cuda.h on
// lanes forked from and joined back to the op's TensorFlow stream. Compiled
// only when setup.py finds nvcc.
#if GOOGLE_CUDA
#include <cuda_runtime.h>

#include "cc/core/conv.h"
#include "cc/core/matmul.h"
#include "cc/cuda/lane_pool_cuda.h"
#include "cc/tf/kernels/concurrent_common.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "xla/stream_executor/stream.h"
#include "xla/stream_executor/stream_executor.h"

namespace tf_glp::tf {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

float* Data(Tensor* t) { return t->flat<float>().data(); }
const float* Data(const Tensor& t) { return t.flat<float>().data(); }

// The op's CUDA stream and device ordinal.
absl::Status OpStream(OpKernelContext* ctx, cudaStream_t* stream, int* device) {
  auto* se_stream = ctx->op_device_context() == nullptr ? nullptr : ctx->op_device_context()->stream();
  if (se_stream == nullptr) return absl::InternalError("tf_glp: the op has no GPU stream");
  *stream = static_cast<cudaStream_t>(se_stream->platform_specific_handle().stream);
  *device = se_stream->parent()->device_ordinal();
  if (*stream == nullptr) return absl::InternalError("tf_glp: the GPU stream has no CUDA handle");
  return absl::OkStatus();
}

absl::Status Workspace(OpKernelContext* ctx, int64_t elements, Tensor* out) {
  return ctx->allocate_temp(tensorflow::DT_FLOAT, TensorShape({std::max<int64_t>(1, elements)}), out);
}

absl::Status FromCuda(const char* op, const std::string& error) {
  return error.empty() ? absl::OkStatus() : absl::InternalError(absl::StrCat(op, ": ", error));
}

class ConcurrentConv2DGpuOp : public OpKernel {
 public:
  explicit ConcurrentConv2DGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx, kOp));
  }
  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& filter = ctx->input(1);
    core::Conv2DShape shape;
    OP_REQUIRES_OK(ctx, attrs_.Shape(kOp, input.shape(), filter.shape(), &shape));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({shape.batch, shape.out_h, shape.out_w, shape.out_c}), &output));
    if (shape.batch == 0) return;
    cudaStream_t stream;
    int device;
    OP_REQUIRES_OK(ctx, OpStream(ctx, &stream, &device));
    Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DForwardWorkspace(shape, attrs_.lanes), &workspace));
    OP_REQUIRES_OK(ctx, FromCuda(kOp, cuda::Conv2DForward(shape, Data(input), Data(filter), Data(output),
                                                           attrs_.lanes, Data(&workspace), stream, device)));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d";
  ConvAttrs attrs_;
};

class ConcurrentConv2DBackpropInputGpuOp : public OpKernel {
 public:
  explicit ConcurrentConv2DBackpropInputGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
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
                absl::InvalidArgumentError(absl::StrCat(kOp, ": out_backprop must have shape ", expected.DebugString(),
                                                        ", got ", out_backprop.shape().DebugString())));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, input_shape, &output));
    if (shape.batch == 0) return;
    cudaStream_t stream;
    int device;
    OP_REQUIRES_OK(ctx, OpStream(ctx, &stream, &device));
    Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DBackpropInputWorkspace(shape, attrs_.lanes), &workspace));
    OP_REQUIRES_OK(ctx, FromCuda(kOp, cuda::Conv2DBackpropInput(shape, Data(filter), Data(out_backprop), Data(output),
                                                                 attrs_.lanes, Data(&workspace), stream, device)));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d_backprop_input";
  ConvAttrs attrs_;
};

class ConcurrentConv2DBackpropFilterGpuOp : public OpKernel {
 public:
  explicit ConcurrentConv2DBackpropFilterGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
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
                absl::InvalidArgumentError(absl::StrCat(kOp, ": out_backprop must have shape ", expected.DebugString(),
                                                        ", got ", out_backprop.shape().DebugString())));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, filter_shape, &output));
    cudaStream_t stream;
    int device;
    OP_REQUIRES_OK(ctx, OpStream(ctx, &stream, &device));
    if (shape.batch == 0) {
      OP_REQUIRES_OK(ctx, FromCuda(kOp, cudaMemsetAsync(Data(output), 0, sizeof(float) * shape.FilterElements(), stream) == cudaSuccess
                                            ? "" : "cudaMemsetAsync failed"));
      return;
    }
    Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DBackpropFilterWorkspace(shape, attrs_.lanes), &workspace));
    OP_REQUIRES_OK(ctx, FromCuda(kOp, cuda::Conv2DBackpropFilter(shape, Data(input), Data(out_backprop), Data(output),
                                                                  attrs_.lanes, Data(&workspace), stream, device)));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d_backprop_filter";
  ConvAttrs attrs_;
};

class ConcurrentMatMulGpuOp : public OpKernel {
 public:
  explicit ConcurrentMatMulGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_b", &transpose_b_));
    OP_REQUIRES_OK(ctx, ReadConcurrency(ctx, kOp, &lanes_));
  }
  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    const Tensor& b = ctx->input(1);
    OP_REQUIRES(ctx, a.dims() == 2 && b.dims() == 2,
                absl::InvalidArgumentError(absl::StrCat(kOp, ": a and b must be matrices, got shapes ",
                                                        a.shape().DebugString(), " and ", b.shape().DebugString())));
    const int64_t m = a.dim_size(0), k = a.dim_size(1);
    const int64_t b_inner = b.dim_size(transpose_b_ ? 1 : 0), n = b.dim_size(transpose_b_ ? 0 : 1);
    OP_REQUIRES(ctx, b_inner == k,
                absl::InvalidArgumentError(absl::StrCat(kOp, ": a has ", k, " columns but b", transpose_b_ ? "^T" : "",
                                                        " has ", b_inner, " rows")));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m, n}), &output));
    if (m == 0 || n == 0) return;
    cudaStream_t stream;
    int device;
    OP_REQUIRES_OK(ctx, OpStream(ctx, &stream, &device));
    if (k == 0) {
      OP_REQUIRES_OK(ctx, FromCuda(kOp, cudaMemsetAsync(Data(output), 0, sizeof(float) * m * n, stream) == cudaSuccess
                                            ? "" : "cudaMemsetAsync failed"));
      return;
    }
    OP_REQUIRES_OK(ctx, FromCuda(kOp, cuda::MatMul(m, n, k, Data(a), Data(b), transpose_b_, Data(output), lanes_,
                                                    stream, device)));
  }

 private:
  static constexpr const char* kOp = "concurrent_matmul";
  bool transpose_b_ = false;
  int64_t lanes_ = 1;
};

class ConcurrentMatMulGradWeightsGpuOp : public OpKernel {
 public:
  explicit ConcurrentMatMulGradWeightsGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadConcurrency(ctx, kOp, &lanes_));
  }
  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    const Tensor& dy = ctx->input(1);
    OP_REQUIRES(ctx, a.dims() == 2 && dy.dims() == 2 && a.dim_size(0) == dy.dim_size(0),
                absl::InvalidArgumentError(absl::StrCat(kOp, ": a and out_backprop must be matrices with the same "
                                                        "number of rows, got shapes ", a.shape().DebugString(),
                                                        " and ", dy.shape().DebugString())));
    const int64_t m = a.dim_size(0), k = a.dim_size(1), n = dy.dim_size(1);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({k, n}), &output));
    if (k == 0 || n == 0) return;
    cudaStream_t stream;
    int device;
    OP_REQUIRES_OK(ctx, OpStream(ctx, &stream, &device));
    OP_REQUIRES_OK(ctx, FromCuda(kOp, cuda::MatMulGradWeights(m, k, n, Data(a), Data(dy), Data(output), lanes_,
                                                               stream, device)));
  }

 private:
  static constexpr const char* kOp = "concurrent_matmul_grad_weights";
  int64_t lanes_ = 1;
};

using tensorflow::DEVICE_GPU;
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentConv2D").Device(DEVICE_GPU).TypeConstraint<float>("T"),
                        ConcurrentConv2DGpuOp);
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentConv2DBackpropInput")
                            .Device(DEVICE_GPU)
                            .TypeConstraint<float>("T")
                            .HostMemory("input_sizes"),
                        ConcurrentConv2DBackpropInputGpuOp);
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentConv2DBackpropFilter")
                            .Device(DEVICE_GPU)
                            .TypeConstraint<float>("T")
                            .HostMemory("filter_sizes"),
                        ConcurrentConv2DBackpropFilterGpuOp);
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentMatMul").Device(DEVICE_GPU).TypeConstraint<float>("T"),
                        ConcurrentMatMulGpuOp);
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentMatMulGradWeights").Device(DEVICE_GPU).TypeConstraint<float>("T"),
                        ConcurrentMatMulGradWeightsGpuOp);

}  // namespace
}  // namespace tf_glp::tf
#endif  // GOOGLE_CUDA
