// Fused host optimizer updates: one pass over memory that reads the replicas'
// gradients, the parameter and its slots, and writes the parameter and slots,
// with Keras 3's formulas (keras.optimizers.SGD, Adam, AdamW). The summed
// gradient is never written out.
#ifndef TF_GLP_CC_CORE_HOST_OPTIMIZERS_H_
#define TF_GLP_CC_CORE_HOST_OPTIMIZERS_H_

#include <cstdint>
#include <string>

#include "cc/core/cpu_features.h"
#include "cc/core/dtype.h"
#include "cc/core/kernels.h"
#include "cc/core/parallel.h"

namespace tf_glp::core {

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
