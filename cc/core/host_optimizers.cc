#include "cc/core/host_optimizers.h"

#include <cmath>
#include <string>

namespace tf_glp::core {
namespace {

using RangeKernel = void (*)(const UpdateArgs&, int64_t, int64_t);

RangeKernel UpdateKernelFor(Isa isa) {
  switch (ResolveIsa(isa)) {
    case Isa::kAvx512:
      return &avx512::UpdateRange;
    case Isa::kAvx2:
      return &avx2::UpdateRange;
    default:
      return &scalar::UpdateRange;
  }
}

std::string CheckFinite(const char* name, float value) {
  if (std::isfinite(value)) return "";
  return std::string("host optimizer hyper-parameter ") + name +
         " must be finite, got " + std::to_string(value);
}

}  // namespace

const char* UpdateKindName(UpdateKind kind) {
  switch (kind) {
    case UpdateKind::kSgd:
      return "sgd";
    case UpdateKind::kMomentum:
      return "momentum";
    case UpdateKind::kNesterov:
      return "nesterov";
    case UpdateKind::kAdam:
      return "adam";
  }
  return "unknown";
}

std::string HostApplyUpdate(const HostUpdateSpec& spec,
                            const ParallelRunner& runner, Isa isa) {
  const UpdateArgs& a = spec.args;
  const int kind = static_cast<int>(a.kind);
  if (kind < 0 || kind > static_cast<int>(UpdateKind::kAdam)) {
    return "host optimizer got an unknown update kind " + std::to_string(kind);
  }
  if (a.num_grads < 1) {
    return "host optimizer needs at least one gradient, got " +
           std::to_string(a.num_grads);
  }
  if (spec.num_elements < 0) {
    return "host optimizer got a negative element count " +
           std::to_string(spec.num_elements);
  }
  for (const std::string& error :
       {CheckFinite("learning_rate", a.learning_rate),
        CheckFinite("momentum", a.momentum),
        CheckFinite("1 - beta_1", a.one_minus_beta_1),
        CheckFinite("1 - beta_2", a.one_minus_beta_2),
        CheckFinite("epsilon", a.epsilon),
        CheckFinite("weight_decay", a.decay_rate),
        CheckFinite("weight decay learning_rate", a.decay_learning_rate)}) {
    if (!error.empty()) return error;
  }
  if (spec.num_elements == 0) return "";
  const bool needs_slot0 = a.kind != UpdateKind::kSgd;
  const bool needs_slot1 = a.kind == UpdateKind::kAdam;
  if (a.grads == nullptr || a.param == nullptr ||
      (needs_slot0 && a.slot0 == nullptr) ||
      (needs_slot1 && a.slot1 == nullptr)) {
    return std::string("host optimizer (") + UpdateKindName(a.kind) +
           ") got a null buffer";
  }
  for (int i = 0; i < a.num_grads; ++i) {
    if (a.grads[i] == nullptr) {
      return "host optimizer gradient " + std::to_string(i) +
             " is a null buffer";
    }
  }

  const RangeKernel kernel = UpdateKernelFor(isa);
  const int64_t bytes_moved =
      spec.num_elements * (a.num_grads * DTypeSize(a.grad_dtype) + 8 +
                           (needs_slot0 ? 8 : 0) + (needs_slot1 ? 8 : 0));
  RunElementwise(runner, spec.num_elements, bytes_moved,
                 [&](int64_t begin, int64_t end) { kernel(a, begin, end); });
  return "";
}

}  // namespace tf_glp::core
