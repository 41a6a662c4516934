// Concurrent 2-D convolution (GLP4NN): NHWC float32, groups = 1, the strides,
// paddings and dilations of keras.layers.Conv2D. Each sample is an
// independent work item (im2col + GEMM) run on one of k lanes
// (Note [Lane pool] in lane_pool.h). The CUDA backend
// (cc/cuda/concurrent_ops.cu) computes the same thing with the same work
// items (Note [Work plan] in work_plan.h).
//
// Note [Concurrent determinism]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every output and gradient is bitwise identical for every number of lanes
// and every run:
// * forward and input gradient: each sample's result is computed by one lane
//   alone with a GEMM whose per-element result does not depend on the split
//   (Note [GEMM determinism] in gemm.h), and col2im adds in a fixed loop
//   order;
// * Dense layers (matmul.h): each element is one GEMM element, the in-order
//   sum over the whole inner dimension; lanes take fixed tiles of the output
//   (Note [Work plan]);
// * filter gradient: a sum over samples. The batch is cut
//   into FilterGradGroups() contiguous groups, a number that depends on the
//   shapes only, never on k; a group's partial sum is accumulated sample by
//   sample in index order by whichever lane takes the group, and the partials
//   are then added in group order ((g0 + g1) + g2) + ... element by element.
#ifndef TF_GLP_CC_CORE_CONV_H_
#define TF_GLP_CC_CORE_CONV_H_

#include <cstdint>
#include <string>

#include "cc/core/lane_pool.h"

namespace tf_glp::core {

struct Conv2DShape {
  int64_t batch = 0, in_h = 0, in_w = 0, in_c = 0;
  int64_t filter_h = 0, filter_w = 0, out_c = 0;
  int64_t stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  // Filled in by MakeConv2DShape:
  int64_t pad_top = 0, pad_left = 0, out_h = 0, out_w = 0;

  int64_t OutputPixels() const { return out_h * out_w; }
  // Rows of the flattened filter [filter_h * filter_w * in_c, out_c].
  int64_t PatchSize() const { return filter_h * filter_w * in_c; }
  int64_t FilterElements() const { return PatchSize() * out_c; }
  int64_t InputSampleElements() const { return in_h * in_w * in_c; }
  int64_t OutputSampleElements() const { return OutputPixels() * out_c; }
  // A 1x1 convolution with stride 1 needs no im2col: the input is the patch
  // matrix.
  bool IsPointwise() const {
    return filter_h == 1 && filter_w == 1 && stride_h == 1 && stride_w == 1;
  }
};

// Checks the sizes (all positive, the filter fits for "VALID") and computes
// padding and output size as TensorFlow does for padding "SAME" (same_padding)
// or "VALID". Returns "" or a message naming the bad value.
std::string MakeConv2DShape(bool same_padding, Conv2DShape* shape);

// Number of groups the batch is cut into for the filter gradient
// (Note [Concurrent determinism]); depends on the shape only.
int64_t FilterGradGroups(const Conv2DShape& shape);

// Float workspace each call needs (the caller allocates; num_lanes as passed
// to the call).
int64_t Conv2DForwardWorkspace(const Conv2DShape& shape, int64_t num_lanes);
int64_t Conv2DBackpropInputWorkspace(const Conv2DShape& shape, int64_t num_lanes);
int64_t Conv2DBackpropFilterWorkspace(const Conv2DShape& shape, int64_t num_lanes);

// output[batch, out_h, out_w, out_c] = conv(input[batch, in_h, in_w, in_c],
// filter[filter_h, filter_w, in_c, out_c]).
void Conv2DForward(const Conv2DShape& shape, const float* input,
                   const float* filter, float* output, int64_t num_lanes,
                   float* workspace, const CpuLanePool& pool);

// input_grad = d(sum(output * output_grad)) / d(input).
void Conv2DBackpropInput(const Conv2DShape& shape, const float* filter,
                         const float* output_grad, float* input_grad,
                         int64_t num_lanes, float* workspace,
                         const CpuLanePool& pool);

// filter_grad = d(sum(output * output_grad)) / d(filter).
void Conv2DBackpropFilter(const Conv2DShape& shape, const float* input,
                          const float* output_grad, float* filter_grad,
                          int64_t num_lanes, float* workspace,
                          const CpuLanePool& pool);

// The patch matrix of one sample: col[out_h * out_w, PatchSize()], patch
// entries ordered (kh, kw, c) like the flattened filter; zeros for padding.
void Im2Col(const Conv2DShape& shape, const float* sample, float* col);
// Adds the patch-matrix gradient back into one sample's input gradient
// (which the caller zeroes), in a fixed order.
void Col2ImAdd(const Conv2DShape& shape, const float* col, float* sample);

// Plain loops, for tests: the same sums in a different order.
void ReferenceConv2D(const Conv2DShape& shape, const float* input,
                     const float* filter, float* output);

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_CONV_H_
