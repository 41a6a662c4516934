// Interfaces (REGISTER_OP and shape functions) of the host engine's ops.
// Kernels are in cc/tf/kernels/.
#include "cc/core/host_optimizers.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_glp::tf {
namespace {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

absl::Status MergeAllInputShapes(InferenceContext* c, int first, int count,
                                 ShapeHandle* merged) {
  *merged = c->input(first);
  for (int i = first + 1; i < first + count; ++i) {
    ShapeHandle next;
    absl::Status status = c->Merge(*merged, c->input(i), &next);
    if (!status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all inputs must have the same shape, but input ", i - first,
          " has shape ", c->DebugString(c->input(i)), " and input 0 has ",
          c->DebugString(c->input(first))));
    }
    *merged = next;
  }
  return absl::OkStatus();
}

absl::Status ScalarInputs(InferenceContext* c, int first, int count) {
  ShapeHandle unused;
  for (int i = first; i < first + count; ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
  }
  return absl::OkStatus();
}

// Glp>HostApply: the parameter's and the slots' resource inputs, the N
// gradients (all of one shape), the kind's scalars, the two of weight decay.
// The kind's own counts are checked by the kernel (an unknown kind or a
// count that differs from its traits is an InvalidArgument there).
absl::Status ApplyShapeFn(InferenceContext* c) {
  int num_slots, n, num_scalars;
  TF_RETURN_IF_ERROR(c->GetAttr("num_slots", &num_slots));
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  TF_RETURN_IF_ERROR(c->GetAttr("num_scalars", &num_scalars));
  const int num_resources = 1 + num_slots;
  ShapeHandle grad_shape;
  TF_RETURN_IF_ERROR(MergeAllInputShapes(c, num_resources, n, &grad_shape));
  return ScalarInputs(c, num_resources + n, num_scalars + 2);
}

}  // namespace

REGISTER_OP("Glp>HostReduce")
    .Input("inputs: N * T")
    .Input("divisor: float")
    .Output("output: out_type")
    .Output("all_finite: bool")
    .Attr("N: int >= 1")
    .Attr("T: {float, bfloat16, half}")
    .Attr("out_type: {float, bfloat16, half}")
    .Attr("reduction: {'sum', 'mean'} = 'sum'")
    .Attr("divide: bool = false")
    .Attr("check_finite: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      ShapeHandle merged;
      TF_RETURN_IF_ERROR(MergeAllInputShapes(c, 0, n, &merged));
      TF_RETURN_IF_ERROR(ScalarInputs(c, n, 1));
      c->set_output(0, merged);
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Sum (or mean) of N same-shaped tensors on the host CPU, accumulated in
float32 in input order. out_type is T or float. With divide (sum only), the
float32 sum is divided by `divisor` (Keras' unscaling of loss-scaled
gradients). With check_finite, all_finite says whether every float32 result
is finite, checked in the same pass; without it, all_finite is true.
)doc");

REGISTER_OP("Glp>HostApply")
    .Input("var: resource")
    .Input("slots: num_slots * resource")
    .Input("grads: N * T")
    .Input("scalars: num_scalars * float")
    .Input("weight_decay: float")
    .Input("decay_learning_rate: float")
    .Attr("kind: string")
    .Attr("num_slots: int >= 0")
    .Attr("N: int >= 1")
    .Attr("T: {float, bfloat16, half}")
    .Attr("num_scalars: int >= 1")
    .Attr("use_weight_decay: bool = false")
    .SetShapeFn(ApplyShapeFn)
    .Doc(R"doc(
One fused optimizer step of update kind `kind` (cc/core/update_formulas.h) on
a float32 variable and its slots, from the in-order float32 sum of the
gradients; with use_weight_decay, first var -= var * weight_decay *
decay_learning_rate, as Keras applies weight decay.
)doc");

}  // namespace tf_glp::tf
