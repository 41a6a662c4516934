// Glp>HostApplySgd / HostApplyMomentum / HostApplyAdam: lock the variables,
// check shapes and dtypes, make the buffers safe to write (a shared
// parameter is written to a fresh buffer, Note [Writing a shared
// parameter]), then core::HostApplyUpdate.
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

template <core::UpdateKind kKind>
class HostApplyOp : public OpKernel {
 public:
  static constexpr int kNumVariables = kKind == core::UpdateKind::kSgd    ? 1
                                       : kKind == core::UpdateKind::kAdam ? 3
                                                                          : 2;

  explicit HostApplyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_weight_decay", &use_weight_decay_));
    tensorflow::DataType grad_type;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &grad_type));
    grad_dtype_ = *ToCoreDType(grad_type);
    kind_ = kKind;
    if (kKind == core::UpdateKind::kMomentum) {
      bool nesterov;
      OP_REQUIRES_OK(ctx, ctx->GetAttr("nesterov", &nesterov));
      if (nesterov) kind_ = core::UpdateKind::kNesterov;
    }
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    const int first_scalar = kNumVariables + grads.size();
    for (int i = first_scalar; i < ctx->num_inputs(); ++i) {
      OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(ctx->input(i).shape()),
                  absl::InvalidArgumentError(absl::StrCat(
                      name(), ": hyper-parameter input ", i,
                      " must be a scalar, got shape ",
                      ctx->input(i).shape().DebugString())));
    }
    static const char* const kVariableNames[] = {"var", "slot 1", "slot 2"};
    LockedVariables locked;
    OP_REQUIRES_OK(ctx, locked.Lock(ctx, kNumVariables, kVariableNames));
    const Tensor& param = *locked.var(0)->tensor();
    for (int i = 0; i < kNumVariables; ++i) {
      const Tensor& t = *locked.var(i)->tensor();
      OP_REQUIRES(ctx, t.IsInitialized(),
                  absl::FailedPreconditionError(absl::StrCat(
                      name(), ": ", kVariableNames[i], " is not initialized")));
      OP_REQUIRES(ctx, t.dtype() == tensorflow::DT_FLOAT,
                  absl::InvalidArgumentError(absl::StrCat(
                      name(), ": ", kVariableNames[i], " must be float32, got ",
                      tensorflow::DataTypeString(t.dtype()))));
      OP_REQUIRES(ctx, t.shape() == param.shape(),
                  absl::InvalidArgumentError(absl::StrCat(
                      name(), ": ", kVariableNames[i], " has shape ",
                      t.shape().DebugString(), " but var has shape ",
                      param.shape().DebugString())));
    }
    for (int i = 0; i < grads.size(); ++i) {
      OP_REQUIRES(ctx, grads[i].shape() == param.shape(),
                  absl::InvalidArgumentError(absl::StrCat(
                      name(), ": gradient ", i, " has shape ",
                      grads[i].shape().DebugString(), " but var has shape ",
                      param.shape().DebugString())));
    }
    // The parameter: see Note [Writing a shared parameter]. The slots are
    // the optimizer's own, normally not shared.
    // The fresh buffer replaces the variable's only once the update has
    // succeeded: a rejected update leaves the variable as it was.
    Tensor fresh_param;
    const bool param_shared = !Writable(locked.var(0));
    if (param_shared) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(param.dtype(), param.shape(), &fresh_param));
    }
    for (int i = 1; i < kNumVariables; ++i) {
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
    auto data = [&](int i) {
      return reinterpret_cast<float*>(
          const_cast<char*>(locked.var(i)->tensor()->tensor_data().data()));
    };
    a.param = data(0);
    if (param_shared) {
      a.param_source = a.param;
      a.param = reinterpret_cast<float*>(const_cast<char*>(fresh_param.tensor_data().data()));
    }
    if (kNumVariables > 1) a.slot0 = data(1);
    if (kNumVariables > 2) a.slot1 = data(2);
    int s = first_scalar;
    a.learning_rate = ScalarInput(ctx, s++);
    if (kKind == core::UpdateKind::kMomentum) a.momentum = ScalarInput(ctx, s++);
    if (kKind == core::UpdateKind::kAdam) {
      a.one_minus_beta_1 = ScalarInput(ctx, s++);
      a.one_minus_beta_2 = ScalarInput(ctx, s++);
      a.epsilon = ScalarInput(ctx, s++);
    }
    a.weight_decay = use_weight_decay_;
    a.decay_rate = ScalarInput(ctx, s++);
    a.decay_learning_rate = ScalarInput(ctx, s++);
    spec.num_elements = param.NumElements();
    const std::string error = core::HostApplyUpdate(spec, IntraOpRunner(ctx));
    OP_REQUIRES(ctx, error.empty(),
                absl::InvalidArgumentError(absl::StrCat(name(), ": ", error)));
    if (param_shared) *locked.var(0)->tensor() = fresh_param;
  }

 private:
  bool use_weight_decay_;
  core::DType grad_dtype_;
  core::UpdateKind kind_;
};

REGISTER_KERNEL_BUILDER(
    Name("Glp>HostApplySgd").Device(tensorflow::DEVICE_CPU),
    HostApplyOp<core::UpdateKind::kSgd>);
REGISTER_KERNEL_BUILDER(
    Name("Glp>HostApplyMomentum").Device(tensorflow::DEVICE_CPU),
    HostApplyOp<core::UpdateKind::kMomentum>);
REGISTER_KERNEL_BUILDER(
    Name("Glp>HostApplyAdam").Device(tensorflow::DEVICE_CPU),
    HostApplyOp<core::UpdateKind::kAdam>);

}  // namespace
}  // namespace tf_glp::tf
