#include "cc/core/host_optimizers.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

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

const char* UpdateKindName(int kind) {
  const UpdateTraits* traits = FindUpdateTraits(kind);
  return traits != nullptr ? traits->name : "unknown";
}

std::string HostApplyUpdate(const HostUpdateSpec& spec,
                            const ParallelRunner& runner, Isa isa) {
  const UpdateArgs& a = spec.args;
  const UpdateTraits* traits = FindUpdateTraits(a.kind);
  if (traits == nullptr) {
    return "host optimizer got an unknown update kind " +
           std::to_string(a.kind);
  }
  if (a.num_grads < 1) {
    return "host optimizer needs at least one gradient, got " +
           std::to_string(a.num_grads);
  }
  if (spec.num_elements < 0) {
    return "host optimizer got a negative element count " +
           std::to_string(spec.num_elements);
  }
  for (int k = 0; k < traits->scalars; ++k) {
    const std::string error = CheckFinite(traits->scalar_names[k], a.scalars[k]);
    if (!error.empty()) return error;
  }
  for (const auto& [name, value] : {std::pair<const char*, float>{"weight_decay", a.decay_rate},
                                    {"weight decay learning_rate", a.decay_learning_rate}}) {
    const std::string error = CheckFinite(name, value);
    if (!error.empty()) return error;
  }
  if (spec.num_elements == 0) return "";
  bool null_slot = false;
  for (int i = 0; i < traits->slots; ++i) null_slot |= a.slots[i] == nullptr;
  if (a.grads == nullptr || a.param == nullptr || null_slot) {
    return std::string("host optimizer (") + traits->name +
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
      spec.num_elements *
      UpdateBytesPerElement(*traits, a.num_grads, a.grad_dtype);
  if (traits->norms == 0) {
    RunElementwise(runner, spec.num_elements, bytes_moved,
                   [&](int64_t begin, int64_t end) { kernel(a, begin, end); });
    return "";
  }
  // Note [Per-variable norms]: blocks of kElementsPerTask, the tasks'
  // size, so that a task never shares a block with another.
  static_assert(kElementsPerTask % kNormPartials == 0, "blocks of whole partial groups");
  const int64_t blocks = (spec.num_elements + kElementsPerTask - 1) / kElementsPerTask;
  std::vector<double> sums(static_cast<size_t>(blocks * traits->norms));
  UpdateArgs first = a;
  first.norm_pass = true;
  first.norm_block = kElementsPerTask;
  first.norm_sums = sums.data();
  RunElementwise(runner, spec.num_elements, bytes_moved,
                 [&](int64_t begin, int64_t end) { kernel(first, begin, end); });
  double totals[kMaxNorms] = {};
  for (int64_t block = 0; block < blocks; ++block) {
    for (int n = 0; n < traits->norms; ++n) totals[n] += sums[block * traits->norms + n];
  }
  // Keras (lamb.py): ratio = w_norm / g_norm where both are positive, else 1;
  // the update is scaled by ratio * lr (float32, as Keras computes them).
  const float w_norm = std::sqrt(static_cast<float>(totals[0]));
  const float g_norm = std::sqrt(static_cast<float>(totals[1]));
  const float ratio = w_norm > 0.0f && g_norm > 0.0f ? w_norm / g_norm : 1.0f;
  UpdateArgs second = a;
  second.norm_pass = false;
  second.norm_scale = ratio * a.scalars[0];
  RunElementwise(runner, spec.num_elements, bytes_moved,
                 [&](int64_t begin, int64_t end) { kernel(second, begin, end); });
  return "";
}

}  // namespace tf_glp::core
