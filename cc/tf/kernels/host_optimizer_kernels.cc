// Glp>HostApply, one kernel for every update kind, shaped by the kind's traits
// (Note [Update formulas] in core/update_formulas.h, traits in
// core/host_optimizers.h):
// lock the variables, check shapes and dtypes, make the buffers safe to
// write (a shared parameter is written to a fresh buffer, Note [Writing a
// shared parameter]), then core::HostApplyUpdate.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "cc/core/host_optimizers.h"
#include "cc/tf/runner.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_glp::tf {
namespace {

using tensorflow::OpInputList;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::Var;

// The variables an update writes, looked up and locked in address order (as
// TensorFlow's own training ops do, so that two updates sharing variables
// cannot deadlock). Released on destruction.
class LockedVariables {
 public:
  // `names` names the inputs in errors.
  absl::Status Lock(OpKernelContext* ctx, int count, const char* const* names) {
    for (int i = 0; i < count; ++i) {
      // One handle, as TensorFlow's own resource ops take it: an empty or
      // longer handle tensor is an error, not a read past its end.
      const Tensor& handle_tensor = ctx->input(i);
      if (!tensorflow::TensorShapeUtils::IsScalar(handle_tensor.shape())) {
        return absl::InvalidArgumentError(absl::StrCat(
            ctx->op_kernel().name(), ": ", names[i], " must be one resource handle (a scalar), got shape ",
            handle_tensor.shape().DebugString()));
      }
      tensorflow::ResourceHandle handle;
      TF_RETURN_IF_ERROR(tensorflow::HandleFromInput(ctx, i, &handle));
      tensorflow::core::RefCountPtr<Var> var;
      TF_RETURN_IF_ERROR(tensorflow::LookupResource(ctx, handle, &var));
      for (int j = 0; j < i; ++j) {
        if (vars_[j].get() == var.get()) {
          return absl::InvalidArgumentError(absl::StrCat(
              ctx->op_kernel().name(), ": ", names[i], " and ", names[j],
              " are the same variable; the update needs a separate variable for each"));
        }
      }
      vars_.push_back(std::move(var));
    }
    std::vector<tsl::mutex*> mutexes;  // distinct: the variables are
    for (auto& var : vars_) mutexes.push_back(var->mu());
    std::sort(mutexes.begin(), mutexes.end());
    for (tsl::mutex* mu : mutexes) locks_.emplace_back(*mu);
    return absl::OkStatus();
  }

  Var* var(int i) const { return vars_[i].get(); }

 private:
  std::vector<tensorflow::core::RefCountPtr<Var>> vars_;
  std::vector<tsl::mutex_lock> locks_;
};

bool Writable(Var* var) {
  return !var->copy_on_read_mode.load() && var->tensor()->RefCountIsOne();
}

// Copy-on-write, as TensorFlow's PrepareToUpdateVariable: if a reader still
// holds the variable's buffer, give the variable a fresh copy to update.
absl::Status MakeWritable(OpKernelContext* ctx, Var* var) {
  if (Writable(var)) return absl::OkStatus();
  Tensor* tensor = var->tensor();
  Tensor copy;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensor->dtype(), tensor->shape(), &copy));
  std::copy_n(tensor->tensor_data().data(), tensor->tensor_data().size(),
              const_cast<char*>(copy.tensor_data().data()));
  *tensor = copy;
  return absl::OkStatus();
}

// Note [Writing a shared parameter]
// TensorFlow's AssignVariableOp never copies: the variable adopts the
// assigned tensor's buffer (writers copy on write). Under update="host" on
// logical CPU replicas the new weights are assigned from the host copy to
// the other replicas, so at the next step the host copy's buffer is shared
// by every replica's variable, and an update in place would first have to
// copy it (MakeWritable: one extra read and write of every weight per step,
// on one thread). Instead the update reads the old value from the shared
// buffer and writes the new one into a fresh buffer in the same pass
// (UpdateArgs::param_source): the memory traffic of an update in place.
// The shared buffer is left as it was, for whoever still holds it.

float ScalarInput(OpKernelContext* ctx, int index) {
  return ctx->input(index).scalar<float>()();
}

// The inputs' names in errors: the parameter, then the slots.
constexpr const char* kVariableNames[1 + core::kMaxSlots] = {"var", "slot 1", "slot 2",
                                                             "slot 3"};

// Every input from `first_scalar` on is a scalar (float32: the op's type).
absl::Status CheckScalarInputs(OpKernelContext* ctx, int first_scalar) {
  for (int i = first_scalar; i < ctx->num_inputs(); ++i) {
    if (!tensorflow::TensorShapeUtils::IsScalar(ctx->input(i).shape())) {
      return absl::InvalidArgumentError(absl::StrCat(
          ctx->op_kernel().name(), ": hyper-parameter input ", i,
          " must be a scalar, got shape ", ctx->input(i).shape().DebugString()));
    }
  }
  return absl::OkStatus();
}

// The shape variable `i` (0 the parameter, then the slots) must have: the
// parameter's, except a factored kind's first two slots (Note [Factored
// second moments]): for a parameter of rank >= 2, its shape without the last
// dimension and without the second last; else scalars, not read (Keras'
// placeholders, of any dtype).
tensorflow::TensorShape ExpectedShape(const core::UpdateTraits& traits, int i,
                                      const tensorflow::TensorShape& param) {
  if (!traits.factored || i < 1 || i > 2) return param;
  if (param.dims() < 2) return tensorflow::TensorShape();
  tensorflow::TensorShape shape = param;
  shape.RemoveDim(i == 1 ? param.dims() - 1 : param.dims() - 2);
  return shape;
}

// The parameter and slots are initialized float32 variables of the shapes
// ExpectedShape gives, and every gradient has the parameter's shape.
absl::Status CheckVariablesAndGradients(OpKernelContext* ctx,
                                        const core::UpdateTraits& traits,
                                        const LockedVariables& locked,
                                        int num_variables,
                                        const OpInputList& grads) {
  const std::string& name = ctx->op_kernel().name();
  const Tensor& param = *locked.var(0)->tensor();
  for (int i = 0; i < num_variables; ++i) {
    const Tensor& t = *locked.var(i)->tensor();
    if (!t.IsInitialized()) {
      return absl::FailedPreconditionError(
          absl::StrCat(name, ": ", kVariableNames[i], " is not initialized"));
    }
    const bool placeholder = traits.factored && (i == 1 || i == 2) && param.dims() < 2;
    if (t.dtype() != tensorflow::DT_FLOAT && !placeholder) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": ", kVariableNames[i], " must be float32, got ",
          tensorflow::DataTypeString(t.dtype())));
    }
    const tensorflow::TensorShape expected = ExpectedShape(traits, i, param.shape());
    if (t.shape() != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": ", kVariableNames[i], " has shape ", t.shape().DebugString(), " but var has shape ",
          param.shape().DebugString(), i > 0 && expected != param.shape()
                                           ? absl::StrCat(", so it must have shape ", expected.DebugString())
                                           : ""));
    }
  }
  for (int i = 0; i < grads.size(); ++i) {
    if (grads[i].shape() != param.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": gradient ", i, " has shape ", grads[i].shape().DebugString(),
          " but var has shape ", param.shape().DebugString()));
    }
  }
  return absl::OkStatus();
}

float* Data(const Tensor& tensor) {
  return reinterpret_cast<float*>(const_cast<char*>(tensor.tensor_data().data()));
}

// The kernel of Glp>HostApply. Its inputs: the parameter's and the slots'
// resource handles, the N gradients, the kind's scalars, then weight_decay
// and decay_learning_rate.
class HostApplyOp : public OpKernel {
 public:
  explicit HostApplyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string kind;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kind", &kind));
    kind_ = core::FindUpdateKind(kind);
    OP_REQUIRES(ctx, kind_ >= 0,
                absl::InvalidArgumentError(absl::StrCat(name(), ": unknown update kind '", kind, "'")));
    traits_ = &core::kUpdateTraits[kind_];
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_weight_decay", &use_weight_decay_));
    tensorflow::DataType grad_type;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &grad_type));
    grad_dtype_ = *ToCoreDType(grad_type);
    int num_slots, num_scalars;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_scalars", &num_scalars));
    OP_REQUIRES(ctx, num_slots == traits_->slots && num_scalars == traits_->scalars,
                absl::InvalidArgumentError(absl::StrCat(
                    name(), ": update kind ", kind, " takes ", traits_->slots, " slots and ",
                    traits_->scalars, " scalars, got ", num_slots, " and ", num_scalars)));
    num_variables_ = 1 + num_slots;
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    const int first_scalar = num_variables_ + grads.size();
    absl::Status status = CheckScalarInputs(ctx, first_scalar);
    OP_REQUIRES(ctx, status.ok(), status);
    LockedVariables locked;
    OP_REQUIRES_OK(ctx, locked.Lock(ctx, num_variables_, kVariableNames));
    status = CheckVariablesAndGradients(ctx, *traits_, locked, num_variables_, grads);
    OP_REQUIRES(ctx, status.ok(), status);
    const Tensor& param = *locked.var(0)->tensor();
    // The parameter: see Note [Writing a shared parameter]. The slots are
    // the optimizer's own, normally not shared.
    // The fresh buffer replaces the variable's only once the update has
    // succeeded: a rejected update leaves the variable as it was.
    Tensor fresh_param;
    const bool param_shared = !Writable(locked.var(0));
    if (param_shared) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(param.dtype(), param.shape(), &fresh_param));
    }
    for (int i = 1; i < num_variables_; ++i) {
      OP_REQUIRES_OK(ctx, MakeWritable(ctx, locked.var(i)));
    }

    std::vector<const void*> grad_pointers(grads.size());
    for (int i = 0; i < grads.size(); ++i) {
      grad_pointers[i] = grads[i].tensor_data().data();
    }
    core::HostUpdateSpec spec;
    core::UpdateArgs& a = spec.args;
    a.kind = kind_;
    a.grads = grad_pointers.data();
    a.num_grads = grads.size();
    a.grad_dtype = grad_dtype_;
    a.param = Data(param);
    if (param_shared) {
      a.param_source = a.param;
      a.param = Data(fresh_param);
    }
    for (int i = 0; i < traits_->slots; ++i) a.slots[i] = Data(*locked.var(1 + i)->tensor());
    int s = first_scalar;
    for (int k = 0; k < traits_->scalars; ++k) a.scalars[k] = ScalarInput(ctx, s++);
    a.weight_decay = use_weight_decay_;
    a.decay_rate = ScalarInput(ctx, s++);
    a.decay_learning_rate = ScalarInput(ctx, s++);
    spec.num_elements = param.NumElements();
    if (traits_->factored && param.dims() >= 2) {
      spec.factor_rows = param.dim_size(param.dims() - 2);
      spec.factor_cols = param.dim_size(param.dims() - 1);
    }
    const std::string error = core::HostApplyUpdate(spec, IntraOpRunner(ctx));
    OP_REQUIRES(ctx, error.empty(),
                absl::InvalidArgumentError(absl::StrCat(name(), ": ", error)));
    if (param_shared) *locked.var(0)->tensor() = fresh_param;
  }

 private:
  int kind_;
  const core::UpdateTraits* traits_;
  int num_variables_;
  bool use_weight_decay_;
  core::DType grad_dtype_;
};

REGISTER_KERNEL_BUILDER(Name("Glp>HostApply").Device(tensorflow::DEVICE_CPU), HostApplyOp);

}  // namespace
}  // namespace tf_glp::tf
