// Fused host optimizer updates: one pass over memory that reads the replicas'
// gradients, the parameter and its slots, and writes the parameter and slots,
// with Keras 3's formulas (cc/core/update_formulas.h; the Keras optimizers
// that tf_glp fuses are listed once, in tf_glp.ops.FUSED_OPTIMIZERS). The summed gradient is never
// written out.
#ifndef TF_GLP_CC_CORE_HOST_OPTIMIZERS_H_
#define TF_GLP_CC_CORE_HOST_OPTIMIZERS_H_

#include <array>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>

#include "cc/core/cpu_features.h"
#include "cc/core/dtype.h"
#include "cc/core/kernels.h"
#include "cc/core/parallel.h"

namespace tf_glp::core {

// What the code outside the per-element formula needs to know about an
// update kind, generated from its formula (Note [Update formulas] in
// update_formulas.h): the range check, the null-buffer check and the bytes
// moved (here), the slot variables and scalar inputs the TensorFlow kernel
// reads (cc/tf/kernels/host_optimizer_kernels.cc) and the op's shape
// function all read these traits. The traits live here, not in kernels.h,
// because files compiled with wider -m flags include kernels.h.
struct UpdateTraits {
  const char* name;  // the ops' `kind` attribute
  int slots;         // float32 slot buffers of the parameter's size
  int scalars;       // float32 hyper-parameters, in the op's order
  const char* const* scalar_names;  // for messages
  int norms;  // per-variable norms (Note [Per-variable norms]): 0 or 2
  bool factored;  // slots 0 and 1 are factored (Note [Factored second moments])
};

template <class... Formulas>
constexpr std::array<UpdateTraits, sizeof...(Formulas)> TraitsOf(FormulaList<Formulas...>) {
  return {{{Formulas::kName, Formulas::kSlots, static_cast<int>(std::size(Formulas::kScalars)),
            Formulas::kScalars, NormsOf<Formulas>::value, FactoredOf<Formulas>::value}...}};
}

// Indexed by UpdateArgs::kind.
inline constexpr auto kUpdateTraits = TraitsOf(UpdateFormulas{});
inline constexpr int kNumUpdateKinds = static_cast<int>(kUpdateTraits.size());

constexpr bool UpdateTraitsAreConsistent() {
  for (int i = 0; i < kNumUpdateKinds; ++i) {
    const UpdateTraits& t = kUpdateTraits[i];
    if (t.slots < 0 || t.slots > kMaxSlots) return false;
    if (t.scalars < 1 || t.scalars > kMaxScalars) return false;
    if (t.norms != 0 && t.norms != kMaxNorms) return false;
    for (int j = 0; j < i; ++j) {
      if (std::string_view(t.name) == kUpdateTraits[j].name) return false;
    }
  }
  return true;
}
static_assert(UpdateTraitsAreConsistent(),
              "UpdateFormulas: distinct names, within kMaxSlots, kMaxScalars and kMaxNorms");

// The traits of update kind `kind`, or null for an index outside UpdateFormulas.
inline const UpdateTraits* FindUpdateTraits(int kind) {
  if (kind < 0 || kind >= kNumUpdateKinds) return nullptr;
  return &kUpdateTraits[kind];
}

// The index of the update kind called `name`, or -1.
inline int FindUpdateKind(std::string_view name) {
  for (int i = 0; i < kNumUpdateKinds; ++i) {
    if (name == kUpdateTraits[i].name) return i;
  }
  return -1;
}

// Bytes one element's update reads and writes: each gradient once, the
// parameter and each slot read and written (float32). With one float32
// gradient: sgd 12, momentum 20, adam 28 (tf_glp's cost model uses the
// same figures, tf_glp/ops/host_optimizers.py). A kind with norms reads
// more in its passes: lamb 40, adafactor 32 (its r and c are per row and
// column, not per element).
inline int64_t UpdateBytesPerElement(const UpdateTraits& traits,
                                     int num_grads, DType grad_dtype) {
  const int64_t grad = num_grads * DTypeSize(grad_dtype), value = sizeof(float);
  if (traits.factored) {
    // g and w; g, v written; g, v and w, w written.
    return 3 * grad + 5 * value;
  }
  if (traits.norms > 0) {
    // The first pass reads the gradient, parameter and slots and writes the
    // slots; the second reads the parameter and slots, writes the parameter.
    return grad + (3 + 3 * traits.slots) * value;
  }
  return grad + (1 + traits.slots) * 2 * value;
}

// The update to apply: UpdateArgs' scalars are float32 values already
// computed the way Keras computes them (learning-rate schedules, bias
// corrections), so that this pass is the per-element part only: weight decay
// (if on), then the kind's formula, where g is the in-order float32 sum of
// the gradients.
struct HostUpdateSpec {
  UpdateArgs args{};
  int64_t num_elements = 0;
  // A factored kind on a variable of rank >= 2: its last two dimensions
  // (0 for a variable of rank < 2, which runs unfactored).
  int64_t factor_rows = 0;
  int64_t factor_cols = 0;
};

// Returns an empty string on success, else a message naming the bad argument
// (an unknown kind, null buffers, no gradients, non-finite hyper-parameters).
std::string HostApplyUpdate(const HostUpdateSpec& spec,
                            const ParallelRunner& runner, Isa isa = Isa::kBest);

// Name of an update kind, for messages ("unknown" outside UpdateFormulas).
const char* UpdateKindName(int kind);

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_HOST_OPTIMIZERS_H_
