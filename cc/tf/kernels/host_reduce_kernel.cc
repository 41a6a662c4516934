// Glp>HostReduce: shape and dtype checks, allocation, then core::HostReduce.
#include <string>
#include <vector>

#include "cc/core/host_reduce.h"
#include "cc/tf/runner.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_glp::tf {
namespace {

using tensorflow::DataTypeString;
using tensorflow::OpInputList;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

class HostReduceOp : public OpKernel {
 public:
  explicit HostReduceOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    tensorflow::DataType in_type, out_type;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &in_type));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("out_type", &out_type));
    std::string reduction;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reduction", &reduction));
    OP_REQUIRES(ctx, out_type == in_type || out_type == tensorflow::DT_FLOAT,
                absl::InvalidArgumentError(absl::StrCat(
                    "host_reduce: out_type must be the input dtype (",
                    DataTypeString(in_type), ") or float32, got ",
                    DataTypeString(out_type))));
    input_dtype_ = *ToCoreDType(in_type);
    output_dtype_ = *ToCoreDType(out_type);
    op_ = reduction == "mean" ? core::ReduceOp::kMean : core::ReduceOp::kSum;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("divide", &divide_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("check_finite", &check_finite_));
    OP_REQUIRES(ctx, !(divide_ && op_ == core::ReduceOp::kMean),
                absl::InvalidArgumentError(
                    "host_reduce: divide=True needs reduction='sum', got 'mean'"));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList inputs;
    OP_REQUIRES_OK(ctx, ctx->input_list("inputs", &inputs));
    const Tensor& first = inputs[0];
    for (int i = 1; i < inputs.size(); ++i) {
      OP_REQUIRES(ctx, inputs[i].shape() == first.shape(),
                  absl::InvalidArgumentError(absl::StrCat(
                      "host_reduce: all inputs must have the same shape, but "
                      "input ",
                      i, " has shape ", inputs[i].shape().DebugString(),
                      " and input 0 has ", first.shape().DebugString())));
    }
    const Tensor& divisor = ctx->input(inputs.size());
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(divisor.shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    "host_reduce: divisor must be a scalar, got shape ",
                    divisor.shape().DebugString())));
    const float divisor_value = divisor.scalar<float>()();
    Tensor* all_finite = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, {}, &all_finite));
    Tensor* output = nullptr;
    if (output_dtype_ == input_dtype_) {
      // Reuse an input buffer nobody else holds: the kernel reads each
      // element before writing it.
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                              {0}, 0, first.shape(), &output));
    } else {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, first.shape(), &output));
    }
    std::vector<const void*> pointers(inputs.size());
    for (int i = 0; i < inputs.size(); ++i) {
      pointers[i] = inputs[i].tensor_data().data();
    }
    core::HostReduceSpec spec;
    spec.inputs = pointers.data();
    spec.num_inputs = inputs.size();
    spec.input_dtype = input_dtype_;
    spec.output = const_cast<char*>(output->tensor_data().data());
    spec.output_dtype = output_dtype_;
    spec.num_elements = first.NumElements();
    spec.op = op_;
    if (divide_) spec.divisor = &divisor_value;
    bool finite = true;
    if (check_finite_) spec.all_finite = &finite;
    const std::string error = core::HostReduce(spec, IntraOpRunner(ctx));
    OP_REQUIRES(ctx, error.empty(), absl::InvalidArgumentError(error));
    all_finite->scalar<bool>()() = finite;
  }

 private:
  core::DType input_dtype_;
  core::DType output_dtype_;
  core::ReduceOp op_;
  bool divide_ = false;
  bool check_finite_ = false;
};

REGISTER_KERNEL_BUILDER(Name("Glp>HostReduce").Device(tensorflow::DEVICE_CPU),
                        HostReduceOp);

}  // namespace
}  // namespace tf_glp::tf
