// Shared by the CPU and CUDA kernels of the layer-concurrency ops: attribute
// parsing and shape checks, with errors that name the bad value.
#ifndef TF_GLP_CC_TF_KERNELS_CONCURRENT_COMMON_H_
#define TF_GLP_CC_TF_KERNELS_CONCURRENT_COMMON_H_

#include <string>
#include <vector>

#include "cc/core/conv.h"
#include "cc/core/lane_pool.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_glp::tf {

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
    if (strides.size() != 2 || dilations.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": strides and dilations must have 2 entries (height, width), got ",
          strides.size(), " and ", dilations.size()));
    }
    for (int i = 0; i < 2; ++i) {
      if (strides[i] < 1 || dilations[i] < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            op, ": strides and dilations must be positive, got strides [",
            strides[0], ", ", strides[1], "] and dilations [", dilations[0], ", ",
            dilations[1], "]"));
      }
    }
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
  return tensorflow::TensorShape::BuildTensorShape({v(0), v(1), v(2), v(3)}, shape);
}

}  // namespace tf_glp::tf

#endif  // TF_GLP_CC_TF_KERNELS_CONCURRENT_COMMON_H_
