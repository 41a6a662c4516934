// Shared by the CPU and CUDA kernels of the layer-concurrency ops: attribute
// parsing and shape checks, with errors that name the bad value.
#ifndef TF_GLP_CC_TF_KERNELS_CONCURRENT_COMMON_H_
#define TF_GLP_CC_TF_KERNELS_CONCURRENT_COMMON_H_

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "cc/core/conv.h"
#include "cc/core/lane_pool.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_glp::tf {

// A shape built from sizes that come from the op's inputs, or an error naming
// the op and the sizes: TensorShape's Status-returning builder, never its
// CHECKing constructor (Note [Checked sizes] in cc/core/checked_math.h).
inline absl::Status BuildShape(const char* op, const char* what,
                               std::initializer_list<int64_t> sizes,
                               tensorflow::TensorShape* shape) {
  const absl::Status status = tensorflow::TensorShape::BuildTensorShape(sizes, shape);
  if (status.ok()) return status;
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " [", absl::StrJoin(sizes, ", "),
                                                 "] is not a valid shape: ", status.message()));
}

// The strides and dilations attributes: two positive entries each (checked
// by the kernels and, so that a graph with bad ones fails when it is built,
// by the shape functions in cc/tf/ops/concurrent_ops.cc).
inline absl::Status CheckConvAttrs(const char* op, const std::vector<int32_t>& strides,
                                   const std::vector<int32_t>& dilations) {
  if (strides.size() != 2 || dilations.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": strides and dilations must have 2 entries (height, width), got ",
        strides.size(), " and ", dilations.size()));
  }
  if (strides[0] < 1 || strides[1] < 1 || dilations[0] < 1 || dilations[1] < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": strides and dilations must be positive, got strides [", strides[0], ", ",
        strides[1], "] and dilations [", dilations[0], ", ", dilations[1], "]"));
  }
  return absl::OkStatus();
}

inline absl::Status ReadConcurrency(tensorflow::OpKernelConstruction* ctx,
                                    const char* op, int64_t* lanes) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("concurrency", lanes));
  const std::string error = core::CheckLaneCount(*lanes);
  if (!error.empty()) return absl::InvalidArgumentError(absl::StrCat(op, ": ", error));
  return absl::OkStatus();
}

struct ConvAttrs {
  int64_t stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  bool same = false;
  int64_t lanes = 1;

  absl::Status Read(tensorflow::OpKernelConstruction* ctx, const char* op) {
    std::vector<int32_t> strides, dilations;
    std::string padding;
    TF_RETURN_IF_ERROR(ctx->GetAttr("strides", &strides));
    TF_RETURN_IF_ERROR(ctx->GetAttr("dilations", &dilations));
    TF_RETURN_IF_ERROR(ctx->GetAttr("padding", &padding));
    TF_RETURN_IF_ERROR(CheckConvAttrs(op, strides, dilations));
    stride_h = strides[0], stride_w = strides[1];
    dilation_h = dilations[0], dilation_w = dilations[1];
    same = padding == "SAME";
    return ReadConcurrency(ctx, op, &lanes);
  }

  // Fills a core shape from the input and filter shapes.
  absl::Status Shape(const char* op, const tensorflow::TensorShape& input,
                     const tensorflow::TensorShape& filter,
                     core::Conv2DShape* shape) const {
    if (input.dims() != 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": input must be 4-D [batch, height, width, channels], got shape ",
          input.DebugString()));
    }
    if (filter.dims() != 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": filter must be 4-D [height, width, in_channels, out_channels], got shape ",
          filter.DebugString()));
    }
    if (input.dim_size(3) != filter.dim_size(2)) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": the input has ", input.dim_size(3), " channels but the filter expects ",
          filter.dim_size(2), " (input shape ", input.DebugString(), ", filter shape ",
          filter.DebugString(), ")"));
    }
    shape->batch = input.dim_size(0);
    shape->in_h = input.dim_size(1);
    shape->in_w = input.dim_size(2);
    shape->in_c = input.dim_size(3);
    shape->filter_h = filter.dim_size(0);
    shape->filter_w = filter.dim_size(1);
    shape->out_c = filter.dim_size(3);
    shape->stride_h = stride_h, shape->stride_w = stride_w;
    shape->dilation_h = dilation_h, shape->dilation_w = dilation_w;
    // An empty batch is fine (nothing to do); other sizes must be positive.
    const int64_t batch = shape->batch;
    if (batch == 0) shape->batch = 1;
    const std::string error = core::MakeConv2DShape(same, shape);
    shape->batch = batch;
    if (!error.empty()) return absl::InvalidArgumentError(absl::StrCat(op, ": ", error));
    return absl::OkStatus();
  }
};

// A 4-entry int32 shape tensor (input_sizes / filter_sizes) as a TensorShape.
inline absl::Status SizesToShape(const char* op, const char* what,
                                 const tensorflow::Tensor& sizes,
                                 tensorflow::TensorShape* shape) {
  if (sizes.dims() != 1 || sizes.NumElements() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", what, " must be a vector of 4 sizes, got shape ", sizes.shape().DebugString()));
  }
  auto v = sizes.vec<int32_t>();
  for (int i = 0; i < 4; ++i) {
    if (v(i) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, "[", i, "] is negative: ", v(i)));
    }
  }
  return BuildShape(op, what, {v(0), v(1), v(2), v(3)}, shape);
}

// What is left for the device once a Prepare* function has checked the
// inputs and allocated the output. Zeroing is device work (setZero on the CPU,
// cudaMemsetAsync on the op's stream), so the caller does it.
enum class Work {
  kNone,        // The output is empty.
  kZeroOutput,  // The output is a sum over nothing: all zeros.
  kCompute,     // Run the core.
};

// The Prepare* functions below hold the steps that the CPU and CUDA kernels of
// each op share, so that both report the same errors and agree on when there
// is nothing to compute.

// Glp>ConcurrentConv2D: output [batch, out_h, out_w, out_c].
inline absl::Status PrepareConv2D(tensorflow::OpKernelContext* ctx,
                                  const ConvAttrs& attrs, const char* op,
                                  core::Conv2DShape* shape,
                                  tensorflow::Tensor** output, Work* work) {
  TF_RETURN_IF_ERROR(
      attrs.Shape(op, ctx->input(0).shape(), ctx->input(1).shape(), shape));
  tensorflow::TensorShape output_shape;
  TF_RETURN_IF_ERROR(BuildShape(op, "the output shape",
                                {shape->batch, shape->out_h, shape->out_w, shape->out_c},
                                &output_shape));
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, output_shape, output));
  *work = shape->batch == 0 ? Work::kNone : Work::kCompute;
  return absl::OkStatus();
}

// out_backprop of the conv gradient ops must have the forward output's shape.
inline absl::Status CheckOutBackprop(const char* op,
                                     const core::Conv2DShape& shape,
                                     const tensorflow::Tensor& out_backprop) {
  tensorflow::TensorShape expected;
  TF_RETURN_IF_ERROR(BuildShape(op, "the forward output shape",
                                {shape.batch, shape.out_h, shape.out_w, shape.out_c}, &expected));
  if (out_backprop.shape() == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": out_backprop must have shape ",
                   expected.DebugString(), ", got ",
                   out_backprop.shape().DebugString()));
}

// Glp>ConcurrentConv2DBackpropInput: output of shape input_sizes.
inline absl::Status PrepareConv2DBackpropInput(
    tensorflow::OpKernelContext* ctx, const ConvAttrs& attrs, const char* op,
    core::Conv2DShape* shape, tensorflow::Tensor** output, Work* work) {
  tensorflow::TensorShape input_shape;
  TF_RETURN_IF_ERROR(
      SizesToShape(op, "input_sizes", ctx->input(0), &input_shape));
  TF_RETURN_IF_ERROR(
      attrs.Shape(op, input_shape, ctx->input(1).shape(), shape));
  TF_RETURN_IF_ERROR(CheckOutBackprop(op, *shape, ctx->input(2)));
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, input_shape, output));
  *work = shape->batch == 0 ? Work::kNone : Work::kCompute;
  return absl::OkStatus();
}

// Glp>ConcurrentConv2DBackpropFilter: output of shape filter_sizes, zero for
// an empty batch (the filter itself is not empty).
inline absl::Status PrepareConv2DBackpropFilter(
    tensorflow::OpKernelContext* ctx, const ConvAttrs& attrs, const char* op,
    core::Conv2DShape* shape, tensorflow::Tensor** output, Work* work) {
  tensorflow::TensorShape filter_shape;
  TF_RETURN_IF_ERROR(
      SizesToShape(op, "filter_sizes", ctx->input(1), &filter_shape));
  TF_RETURN_IF_ERROR(
      attrs.Shape(op, ctx->input(0).shape(), filter_shape, shape));
  TF_RETURN_IF_ERROR(CheckOutBackprop(op, *shape, ctx->input(2)));
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, filter_shape, output));
  *work = shape->batch == 0 ? Work::kZeroOutput : Work::kCompute;
  return absl::OkStatus();
}

// Sizes of the matmul ops: the product is [m, n], summed over k.
struct MatMulDims {
  int64_t m = 0, n = 0, k = 0;
};

// Glp>ConcurrentMatMul: a [m, k] times b [k, n] (or b^T with b [n, k]).
inline absl::Status PrepareMatMul(tensorflow::OpKernelContext* ctx,
                                  const char* op, bool transpose_b,
                                  MatMulDims* dims,
                                  tensorflow::Tensor** output, Work* work) {
  const tensorflow::Tensor& a = ctx->input(0);
  const tensorflow::Tensor& b = ctx->input(1);
  if (a.dims() != 2 || b.dims() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": a and b must be matrices, got shapes ", a.shape().DebugString(),
        " and ", b.shape().DebugString()));
  }
  dims->m = a.dim_size(0), dims->k = a.dim_size(1);
  dims->n = b.dim_size(transpose_b ? 0 : 1);
  const int64_t b_inner = b.dim_size(transpose_b ? 1 : 0);
  if (b_inner != dims->k) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": a has ", dims->k, " columns but b", transpose_b ? "^T" : "",
        " has ", b_inner, " rows (shapes ", a.shape().DebugString(), " and ",
        b.shape().DebugString(), ")"));
  }
  tensorflow::TensorShape output_shape;
  TF_RETURN_IF_ERROR(BuildShape(op, "the product's shape", {dims->m, dims->n}, &output_shape));
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, output_shape, output));
  if (dims->m == 0 || dims->n == 0) {
    *work = Work::kNone;
  } else {
    *work = dims->k == 0 ? Work::kZeroOutput : Work::kCompute;
  }
  return absl::OkStatus();
}

// Glp>ConcurrentMatMulGradWeights: a^T [k, m] times out_backprop [m, n]; the
// output is [k, n].
inline absl::Status PrepareMatMulGradWeights(tensorflow::OpKernelContext* ctx,
                                             const char* op, MatMulDims* dims,
                                             tensorflow::Tensor** output,
                                             Work* work) {
  const tensorflow::Tensor& a = ctx->input(0);
  const tensorflow::Tensor& dy = ctx->input(1);
  if (a.dims() != 2 || dy.dims() != 2 || a.dim_size(0) != dy.dim_size(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op,
        ": a and out_backprop must be matrices with the same number of rows, "
        "got shapes ",
        a.shape().DebugString(), " and ", dy.shape().DebugString()));
  }
  dims->m = a.dim_size(0), dims->k = a.dim_size(1), dims->n = dy.dim_size(1);
  tensorflow::TensorShape output_shape;
  TF_RETURN_IF_ERROR(BuildShape(op, "the weight gradient's shape", {dims->k, dims->n}, &output_shape));
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, output_shape, output));
  *work = dims->k == 0 || dims->n == 0 ? Work::kNone : Work::kCompute;
  return absl::OkStatus();
}

}  // namespace tf_glp::tf

#endif  // TF_GLP_CC_TF_KERNELS_CONCURRENT_COMMON_H_
