// Interfaces (REGISTER_OP and shape functions) of the layer-concurrency ops
// (GLP4NN). Kernels: cc/tf/kernels/concurrent_kernels.cc (CPU) and
// concurrent_kernels_gpu.cu.cc (CUDA). Gradients: tf_glp/ops/concurrent.py.
#include "cc/core/checked_math.h"
#include "cc/tf/kernels/concurrent_common.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_glp::tf {
namespace {

using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// Output size along one spatial dimension, as TensorFlow computes it, or
// unknown where the kernel reports the error (a filter that does not fit). A
// span that overflows is an error here already (Note [Checked sizes] in
// cc/core/checked_math.h).
absl::Status SpatialOutput(InferenceContext* c, DimensionHandle in, int64_t filter,
                           int64_t stride, int64_t dilation, bool same,
                           DimensionHandle* out) {
  *out = c->UnknownDim();
  if (!c->ValueKnown(in) || filter < 1) return absl::OkStatus();
  const int64_t size = c->Value(in);
  int64_t span;
  if (!core::CheckedMultiply(filter - 1, dilation, &span) || !core::CheckedAdd(span, 1, &span)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "concurrent_conv2d: the dilated filter ((", filter, " - 1) * ", dilation,
        " + 1) overflows 64-bit integers"));
  }
  if (same) {
    *out = c->MakeDim(size / stride + (size % stride != 0));
  } else if (span <= size) {
    *out = c->MakeDim((size - span) / stride + 1);
  }
  return absl::OkStatus();
}

absl::Status Conv2DShapeFn(InferenceContext* c) {
  ShapeHandle input, filter;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &input));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 4, &filter));
  DimensionHandle unused;
  absl::Status channels = c->Merge(c->Dim(input, 3), c->Dim(filter, 2), &unused);
  if (!channels.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "concurrent_conv2d: the input has ", c->DebugString(c->Dim(input, 3)),
        " channels but the filter expects ", c->DebugString(c->Dim(filter, 2))));
  }
  std::vector<int32_t> strides, dilations;
  std::string padding;
  TF_RETURN_IF_ERROR(c->GetAttr("strides", &strides));
  TF_RETURN_IF_ERROR(c->GetAttr("dilations", &dilations));
  TF_RETURN_IF_ERROR(c->GetAttr("padding", &padding));
  TF_RETURN_IF_ERROR(CheckConvAttrs("concurrent_conv2d", strides, dilations));
  const bool same = padding == "SAME";
  std::vector<DimensionHandle> dims = {c->Dim(input, 0)};
  for (int i = 0; i < 2; ++i) {
    DimensionHandle filter_dim = c->Dim(filter, i), out = c->UnknownDim();
    if (c->ValueKnown(filter_dim)) {
      TF_RETURN_IF_ERROR(SpatialOutput(c, c->Dim(input, 1 + i), c->Value(filter_dim),
                                       strides[i], dilations[i], same, &out));
    }
    dims.push_back(out);
  }
  dims.push_back(c->Dim(filter, 3));
  c->set_output(0, c->MakeShape(dims));
  return absl::OkStatus();
}

// The gradient ops' output: the shape their sizes input holds.
absl::Status ConvGradShape(InferenceContext* c, const char* op, int index) {
  std::vector<int32_t> strides, dilations;
  TF_RETURN_IF_ERROR(c->GetAttr("strides", &strides));
  TF_RETURN_IF_ERROR(c->GetAttr("dilations", &dilations));
  TF_RETURN_IF_ERROR(CheckConvAttrs(op, strides, dilations));
  ShapeHandle sizes;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(index), 1, &sizes));
  ShapeHandle shape;
  TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(index, &shape));
  TF_RETURN_IF_ERROR(c->WithRank(shape, 4, &shape));
  c->set_output(0, shape);
  return absl::OkStatus();
}

// Both inputs of the matmul ops must be matrices.
absl::Status MatrixInputs(InferenceContext* c, ShapeHandle* first,
                          ShapeHandle* second) {
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, first));
  return c->WithRank(c->input(1), 2, second);
}

constexpr char kConvAttrsDoc[] = R"doc(
strides: [stride_height, stride_width].
padding: "SAME" or "VALID", as tf.nn.conv2d.
dilations: [dilation_height, dilation_width].
concurrency: Number of lanes (CPU threads / CUDA streams), 1..64.
)doc";

}  // namespace

REGISTER_OP("Glp>ConcurrentConv2D")
    .Input("input: T")
    .Input("filter: T")
    .Output("output: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("strides: list(int)")
    .Attr("padding: {'SAME', 'VALID'}")
    .Attr("dilations: list(int) = [1, 1]")
    .Attr("concurrency: int = 1")
    .SetShapeFn(Conv2DShapeFn)
    .Doc(R"doc(
NHWC 2-D convolution with the batch's samples split over `concurrency` lanes
(im2col + GEMM per sample). Bitwise identical for every concurrency.
)doc");

REGISTER_OP("Glp>ConcurrentConv2DBackpropInput")
    .Input("input_sizes: int32")
    .Input("filter: T")
    .Input("out_backprop: T")
    .Output("output: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("strides: list(int)")
    .Attr("padding: {'SAME', 'VALID'}")
    .Attr("dilations: list(int) = [1, 1]")
    .Attr("concurrency: int = 1")
    .SetShapeFn([](InferenceContext* c) { return ConvGradShape(c, "concurrent_conv2d_backprop_input", 0); })
    .Doc("Gradient of Glp>ConcurrentConv2D with respect to its input.");

REGISTER_OP("Glp>ConcurrentConv2DBackpropFilter")
    .Input("input: T")
    .Input("filter_sizes: int32")
    .Input("out_backprop: T")
    .Output("output: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("strides: list(int)")
    .Attr("padding: {'SAME', 'VALID'}")
    .Attr("dilations: list(int) = [1, 1]")
    .Attr("concurrency: int = 1")
    .SetShapeFn([](InferenceContext* c) { return ConvGradShape(c, "concurrent_conv2d_backprop_filter", 1); })
    .Doc(R"doc(
Gradient of Glp>ConcurrentConv2D with respect to its filter, summed over fixed
groups of samples in index order (bitwise identical for every concurrency).
)doc");

REGISTER_OP("Glp>ConcurrentMatMul")
    .Input("a: T")
    .Input("b: T")
    .Output("product: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("transpose_b: bool = false")
    .Attr("concurrency: int = 1")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle a, b;
      TF_RETURN_IF_ERROR(MatrixInputs(c, &a, &b));
      bool transpose_b;
      TF_RETURN_IF_ERROR(c->GetAttr("transpose_b", &transpose_b));
      DimensionHandle inner;
      absl::Status merged = c->Merge(c->Dim(a, 1), c->Dim(b, transpose_b ? 1 : 0), &inner);
      if (!merged.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "concurrent_matmul: a has ", c->DebugString(c->Dim(a, 1)),
            " columns but b has ", c->DebugString(c->Dim(b, transpose_b ? 1 : 0)),
            transpose_b ? " columns" : " rows"));
      }
      c->set_output(0, c->Matrix(c->Dim(a, 0), c->Dim(b, transpose_b ? 0 : 1)));
      return absl::OkStatus();
    })
    .Doc("a @ b (or a @ b^T) with the rows of a split over `concurrency` lanes.");

REGISTER_OP("Glp>ConcurrentMatMulGradWeights")
    .Input("a: T")
    .Input("out_backprop: T")
    .Output("grad_weights: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("concurrency: int = 1")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle a, dy;
      TF_RETURN_IF_ERROR(MatrixInputs(c, &a, &dy));
      DimensionHandle rows;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(a, 0), c->Dim(dy, 0), &rows));
      c->set_output(0, c->Matrix(c->Dim(a, 1), c->Dim(dy, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
a^T @ out_backprop, blocks of output rows split over `concurrency` lanes,
each element summed over all rows in order (bitwise identical for every
concurrency).
)doc");

}  // namespace tf_glp::tf
