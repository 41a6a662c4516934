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

// A Glp>HostApply* op of update kind `kind` (Note [Update kinds] in
// cc/core/host_optimizers.h): gradients start after the parameter's and the
// slots' resource inputs; the kind's hyper-parameters and the two of weight
// decay follow them.
std::function<absl::Status(InferenceContext*)> ApplyShapeFn(core::UpdateKind kind) {
  const core::UpdateTraits& traits = core::kUpdateTraits[static_cast<int>(kind)];
  const int num_resources = 1 + traits.slots;
  const int num_scalars = traits.scalars + 2;
  return [=](InferenceContext* c) {
    int n;
    TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
    ShapeHandle grad_shape;
    TF_RETURN_IF_ERROR(MergeAllInputShapes(c, num_resources, n, &grad_shape));
    return ScalarInputs(c, num_resources + n, num_scalars);
  };
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

REGISTER_OP("Glp>HostApplySgd")
    .Input("var: resource")
    .Input("grads: N * T")
    .Input("learning_rate: float")
    .Input("weight_decay: float")
    .Input("decay_learning_rate: float")
    .Attr("N: int >= 1")
    .Attr("T: {float, bfloat16, half}")
    .Attr("use_weight_decay: bool = false")
    .SetShapeFn(ApplyShapeFn(core::UpdateKind::kSgd))
    .Doc("var -= sum(grads) * learning_rate, as keras.optimizers.SGD.");

REGISTER_OP("Glp>HostApplyMomentum")
    .Input("var: resource")
    .Input("momentum_slot: resource")
    .Input("grads: N * T")
    .Input("learning_rate: float")
    .Input("momentum: float")
    .Input("weight_decay: float")
    .Input("decay_learning_rate: float")
    .Attr("N: int >= 1")
    .Attr("T: {float, bfloat16, half}")
    .Attr("nesterov: bool = false")
    .Attr("use_weight_decay: bool = false")
    .SetShapeFn(ApplyShapeFn(core::UpdateKind::kMomentum))
    .Doc("keras.optimizers.SGD with momentum (and nesterov) on sum(grads).");

REGISTER_OP("Glp>HostApplyAdam")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("grads: N * T")
    .Input("alpha: float")
    .Input("one_minus_beta_1: float")
    .Input("one_minus_beta_2: float")
    .Input("epsilon: float")
    .Input("weight_decay: float")
    .Input("decay_learning_rate: float")
    .Attr("N: int >= 1")
    .Attr("T: {float, bfloat16, half}")
    .Attr("use_weight_decay: bool = false")
    .SetShapeFn(ApplyShapeFn(core::UpdateKind::kAdam))
    .Doc("keras.optimizers.Adam / AdamW on sum(grads); alpha includes the bias correction.");

}  // namespace tf_glp::tf
