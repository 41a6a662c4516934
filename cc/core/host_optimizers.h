// Fused host optimizer updates: one pass over memory that reads the replicas'
// gradients, the parameter and its slots, and writes the parameter and slots,
// with Keras 3's formulas (the Keras optimizers that tf_glp fuses are listed
// once, in tf_glp.ops.FUSED_OPTIMIZERS). The summed gradient is never
// written out.
#ifndef TF_GLP_CC_CORE_HOST_OPTIMIZERS_H_
#define TF_GLP_CC_CORE_HOST_OPTIMIZERS_H_

#include <cstdint>
#include <string>

#include "cc/core/cpu_features.h"
#include "cc/core/dtype.h"
#include "cc/core/kernels.h"
#include "cc/core/parallel.h"

namespace tf_glp::core {

// Note [Update kinds]
// What the code outside the per-element formula needs to know about an
// update kind is one row of kUpdateTraits below: its name, how many float32
// slot buffers it reads and writes, and which hyper-parameters it takes, in
// the order its op takes them. The range check, the null-buffer check and
// the bytes moved (here), the number of slot variables and scalar inputs the
// TensorFlow kernel reads, and the ops' shape functions
// (cc/tf/kernels/host_optimizer_kernels.cc, cc/tf/ops/host_ops.cc) all read
// it. A new kind adds: its UpdateKind value (and any new UpdateArgs field,
// with a row in kHyperParameters), a row here, its formula in UpdateAt and
// a case in UpdateRange (kernels_impl.inc), its op registration and kernel
// builder, and a row in tf_glp/ops' tables (host_optimizers.py,
// keras_fused.py). The traits live here, not in kernels.h, because files
// compiled with wider -m flags include kernels.h (see kernels_impl.inc).

// A float32 hyper-parameter of UpdateArgs and its name in messages.
struct HyperParameter {
  const char* name;
  float UpdateArgs::*field;
};

// Every float32 hyper-parameter of UpdateArgs: all are checked for
// finiteness whatever the kind (unused ones are zero).
inline constexpr HyperParameter kHyperParameters[] = {
    {"learning_rate", &UpdateArgs::learning_rate},
    {"momentum", &UpdateArgs::momentum},
    {"1 - beta_1", &UpdateArgs::one_minus_beta_1},
    {"1 - beta_2", &UpdateArgs::one_minus_beta_2},
    {"epsilon", &UpdateArgs::epsilon},
    {"weight_decay", &UpdateArgs::decay_rate},
    {"weight decay learning_rate", &UpdateArgs::decay_learning_rate},
};

// Slot buffers an update kind may use (UpdateArgs::slot0, slot1).
inline constexpr int kMaxSlots = 2;
// Hyper-parameters an update kind may take besides the two of weight decay.
inline constexpr int kMaxKindScalars = 4;

// See Note [Update kinds].
struct UpdateTraits {
  UpdateKind kind;  // the row's own kind (checked below: rows in enum order)
  const char* name;  // for messages
  // Float32 slot buffers of the parameter's size it reads and writes:
  // slot0, then slot1.
  int slots;
  // Its hyper-parameters, in the order its op takes them (the two weight
  // decay scalars follow them in every op).
  int scalars;
  float UpdateArgs::*scalar_fields[kMaxKindScalars];
};

inline constexpr UpdateTraits kUpdateTraits[] = {
    {UpdateKind::kSgd, "sgd", 0, 1, {&UpdateArgs::learning_rate}},
    {UpdateKind::kMomentum, "momentum", 1, 2,
     {&UpdateArgs::learning_rate, &UpdateArgs::momentum}},
    {UpdateKind::kNesterov, "nesterov", 1, 2,
     {&UpdateArgs::learning_rate, &UpdateArgs::momentum}},
    {UpdateKind::kAdam, "adam", 2, 4,
     {&UpdateArgs::learning_rate, &UpdateArgs::one_minus_beta_1,
      &UpdateArgs::one_minus_beta_2, &UpdateArgs::epsilon}},
};

inline constexpr int kNumUpdateKinds =
    static_cast<int>(sizeof(kUpdateTraits) / sizeof(kUpdateTraits[0]));

constexpr bool UpdateTraitsAreConsistent() {
  for (int i = 0; i < kNumUpdateKinds; ++i) {
    const UpdateTraits& t = kUpdateTraits[i];
    if (static_cast<int>(t.kind) != i) return false;
    if (t.slots < 0 || t.slots > kMaxSlots) return false;
    if (t.scalars < 1 || t.scalars > kMaxKindScalars) return false;
    for (int k = 0; k < t.scalars; ++k) {
      if (t.scalar_fields[k] == nullptr) return false;
    }
  }
  return true;
}
static_assert(UpdateTraitsAreConsistent(),
              "kUpdateTraits: one row per UpdateKind, in enum order, within "
              "kMaxSlots and kMaxKindScalars");

// The traits of `kind`, or null for a value outside UpdateKind.
inline const UpdateTraits* FindUpdateTraits(UpdateKind kind) {
  const int index = static_cast<int>(kind);
  if (index < 0 || index >= kNumUpdateKinds) return nullptr;
  return &kUpdateTraits[index];
}

// Bytes one element's update reads and writes: each gradient once, the
// parameter and each slot read and written (float32). With one float32
// gradient: sgd 12, momentum 20, adam 28 (tf_glp's cost model uses the
// same figures, tf_glp/ops/host_optimizers.py).
inline int64_t UpdateBytesPerElement(const UpdateTraits& traits,
                                     int num_grads, DType grad_dtype) {
  return num_grads * DTypeSize(grad_dtype) +
         (1 + traits.slots) * 2 * static_cast<int64_t>(sizeof(float));
}

// The update to apply. Scalars are float32 values already computed the way
// Keras computes them (learning-rate schedules, Adam's alpha with its bias
// correction), so that this pass is the per-element part only:
//   weight decay (if on):  w -= w * decay_rate * decay_learning_rate
//   kSgd:       w -= g * lr
//   kMomentum:  m = m * momentum - g * lr;  w += m
//   kNesterov:  m = m * momentum - g * lr;  w += m * momentum - g * lr
//   kAdam:      m += (g - m) * (1 - beta_1);  v += (g * g - v) * (1 - beta_2)
//               w -= m * alpha / (sqrt(v) + epsilon)      (alpha in lr)
// where g is the in-order float32 sum of the gradients.
struct HostUpdateSpec {
  UpdateArgs args{};
  int64_t num_elements = 0;
};

// Returns an empty string on success, else a message naming the bad argument
// (null buffers, no gradients, non-finite hyper-parameters).
std::string HostApplyUpdate(const HostUpdateSpec& spec,
                            const ParallelRunner& runner, Isa isa = Isa::kBest);

// Name of an update kind, for messages.
const char* UpdateKindName(UpdateKind kind);

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_HOST_OPTIMIZERS_H_
