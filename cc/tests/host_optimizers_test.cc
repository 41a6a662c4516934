// Fused host updates against a plain per-element reference written from
// Keras 3's formulas, bitwise, over kinds, gradient dtypes, N, sizes,
// instruction sets and thread counts; and rejection of bad hyper-parameters.
#include "cc/core/host_optimizers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cc/core/thread_pool.h"
#include "cc/tests/test_main.h"
#include "cc/tests/test_util.h"

namespace tf_glp::core {
namespace {

using testing::LoadAsFloat;
using testing::RandomBuffer;

struct State {
  std::vector<float> param, slot0, slot1;
};

State RandomState(int64_t size, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  State s;
  for (int64_t i = 0; i < size; ++i) {
    s.param.push_back(normal(rng));
    s.slot0.push_back(normal(rng) * 0.1f);
    s.slot1.push_back(std::fabs(normal(rng)) * 0.01f);
  }
  return s;
}

// Keras 3 (keras/src/optimizers/sgd.py, adam.py and the TensorFlow
// backend's _apply_weight_decay), one element at a time.
void ReferenceStep(const UpdateArgs& a, const std::vector<const void*>& grads,
                   int64_t size, State* s) {
  for (int64_t i = 0; i < size; ++i) {
    float g = LoadAsFloat(a.grad_dtype, grads[0], i);
    for (int j = 1; j < a.num_grads; ++j) g = g + LoadAsFloat(a.grad_dtype, grads[j], i);
    float w = s->param[i];
    if (a.weight_decay) w = w - w * a.decay_rate * a.decay_learning_rate;
    const float lr = a.learning_rate;
    switch (a.kind) {
      case UpdateKind::kSgd:
        w = w - g * lr;
        break;
      case UpdateKind::kMomentum:
      case UpdateKind::kNesterov: {
        const float m = s->slot0[i] * a.momentum - g * lr;
        s->slot0[i] = m;
        w = a.kind == UpdateKind::kNesterov ? w + (m * a.momentum - g * lr)
                                            : w + m;
        break;
      }
      case UpdateKind::kAdam: {
        float m = s->slot0[i], v = s->slot1[i];
        m = m + (g - m) * a.one_minus_beta_1;
        v = v + (g * g - v) * a.one_minus_beta_2;
        s->slot0[i] = m;
        s->slot1[i] = v;
        w = w - (m * lr) / (std::sqrt(v) + a.epsilon);
        break;
      }
    }
    s->param[i] = w;
  }
}

UpdateArgs MakeArgs(UpdateKind kind, DType grad_dtype, int n, bool decay) {
  UpdateArgs a{};
  a.kind = kind;
  a.num_grads = n;
  a.grad_dtype = grad_dtype;
  a.learning_rate = 0.01f;
  a.momentum = 0.9f;
  a.one_minus_beta_1 = static_cast<float>(1.0 - 0.9);
  a.one_minus_beta_2 = static_cast<float>(1.0 - 0.999);
  a.epsilon = 1e-7f;
  a.weight_decay = decay;
  a.decay_rate = 0.004f;
  a.decay_learning_rate = 0.001f;
  return a;
}

TEST(MatchesKerasFormulasBitwiseOverSteps) {
  SerialRunner serial;
  ThreadPool pool(3);
  for (int kind_index = 0; kind_index < kNumUpdateKinds; ++kind_index) {
    const UpdateKind kind = static_cast<UpdateKind>(kind_index);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (int n : {1, 2, 4}) {
        for (int64_t size : {1, 7, 1023, (1 << 16) + 3}) {
          for (bool decay : {false, true}) {
            std::mt19937 rng(size + n);
            const State start = RandomState(size, rng);
            std::vector<std::vector<uint8_t>> storage;
            std::vector<const void*> grads;
            for (int j = 0; j < n; ++j) {
              storage.push_back(RandomBuffer(dtype, size, rng, 0.5f));
            }
            for (auto& b : storage) grads.push_back(b.data());
            UpdateArgs args = MakeArgs(kind, dtype, n, decay);
            args.grads = grads.data();
            State want = start;
            for (int step = 0; step < 3; ++step) ReferenceStep(args, grads, size, &want);
            for (Isa isa : testing::SupportedIsas()) {
              for (const ParallelRunner* runner :
                   {static_cast<const ParallelRunner*>(&serial),
                    static_cast<const ParallelRunner*>(&pool)}) {
                // In place, and from a separate source buffer into one
                // holding garbage (param_source): the same bits, the source
                // left as it was.
                for (bool separate_source : {false, true}) {
                  State got = start;
                  HostUpdateSpec spec;
                  spec.args = args;
                  spec.args.param = got.param.data();
                  spec.args.slot0 = got.slot0.data();
                  spec.args.slot1 = got.slot1.data();
                  spec.num_elements = size;
                  bool source_kept = true;
                  for (int step = 0; step < 3; ++step) {
                    const std::vector<float> source = got.param, kept = got.param;
                    if (separate_source) {
                      std::fill(got.param.begin(), got.param.end(),
                                std::numeric_limits<float>::quiet_NaN());
                      spec.args.param_source = source.data();
                    }
                    const std::string error = HostApplyUpdate(spec, *runner, isa);
                    if (!error.empty()) throw testing::Failure(error);
                    source_kept = source_kept &&
                                  std::memcmp(source.data(), kept.data(), 4 * size) == 0;
                  }
                  const bool same =
                      std::memcmp(got.param.data(), want.param.data(), 4 * size) == 0 &&
                      std::memcmp(got.slot0.data(), want.slot0.data(), 4 * size) == 0 &&
                      std::memcmp(got.slot1.data(), want.slot1.data(), 4 * size) == 0;
                  if (!same || !source_kept) {
                    throw testing::Failure(
                        std::string(same ? "source written" : "mismatch") + ": kind=" +
                        UpdateKindName(kind) + " dtype=" + DTypeName(dtype) +
                        " n=" + std::to_string(n) + " size=" + std::to_string(size) +
                        " isa=" + IsaName(isa) +
                        " threads=" + std::to_string(runner->NumThreads()) +
                        " separate_source=" + std::to_string(separate_source));
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(BadHyperParametersAndBuffersAreReported) {
  SerialRunner serial;
  float param = 1.0f, slot0 = 0.0f, slot1 = 0.0f, grad = 1.0f;
  const void* grads[] = {&grad};
  HostUpdateSpec spec;
  spec.args = MakeArgs(UpdateKind::kAdam, DType::kFloat32, 1, false);
  spec.args.grads = grads;
  spec.args.param = &param;
  spec.args.slot0 = &slot0;
  spec.args.slot1 = &slot1;
  spec.num_elements = 1;
  EXPECT_EQ(HostApplyUpdate(spec, serial), std::string());
  HostUpdateSpec bad = spec;
  bad.args.learning_rate = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(HostApplyUpdate(bad, serial).find("learning_rate must be finite") !=
              std::string::npos);
  bad = spec;
  bad.args.epsilon = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(HostApplyUpdate(bad, serial).find("epsilon") != std::string::npos);
  bad = spec;
  bad.args.num_grads = 0;
  EXPECT_TRUE(HostApplyUpdate(bad, serial).find("at least one gradient") !=
              std::string::npos);
  bad = spec;
  bad.args.slot1 = nullptr;
  EXPECT_TRUE(HostApplyUpdate(bad, serial).find("null buffer") != std::string::npos);
  bad = spec;
  bad.args.kind = static_cast<UpdateKind>(9);
  EXPECT_TRUE(HostApplyUpdate(bad, serial).find("unknown update kind 9") !=
              std::string::npos);
  // Plain SGD needs no slots.
  bad = spec;
  bad.args.kind = UpdateKind::kSgd;
  bad.args.slot0 = bad.args.slot1 = nullptr;
  EXPECT_EQ(HostApplyUpdate(bad, serial), std::string());
}

// Note [Update kinds]: each kind's row is what the checks and the bytes
// moved use (the numbers below are those of before the table).
TEST(UpdateTraitsDriveTheChecks) {
  EXPECT_EQ(kNumUpdateKinds, 4);
  EXPECT_EQ(std::string(UpdateKindName(UpdateKind::kSgd)), std::string("sgd"));
  EXPECT_EQ(std::string(UpdateKindName(UpdateKind::kAdam)), std::string("adam"));
  EXPECT_EQ(std::string(UpdateKindName(static_cast<UpdateKind>(kNumUpdateKinds))),
            std::string("unknown"));
  EXPECT_TRUE(FindUpdateTraits(static_cast<UpdateKind>(-1)) == nullptr);
  const int64_t expected_bytes[] = {12, 20, 20, 28};  // one float32 gradient
  SerialRunner serial;
  for (int k = 0; k < kNumUpdateKinds; ++k) {
    const UpdateTraits& traits = kUpdateTraits[k];
    EXPECT_EQ(UpdateBytesPerElement(traits, 1, DType::kFloat32), expected_bytes[k]);
    EXPECT_EQ(UpdateBytesPerElement(traits, 3, DType::kBFloat16),
              expected_bytes[k] - 4 + 3 * 2);
    for (int j = 0; j < k; ++j) {
      EXPECT_TRUE(std::string(traits.name) != kUpdateTraits[j].name);
    }
    // Exactly the slots in the row are needed.
    float param = 1.0f, slot0 = 0.0f, slot1 = 0.0f, grad = 1.0f;
    const void* grads[] = {&grad};
    HostUpdateSpec spec;
    spec.args = MakeArgs(traits.kind, DType::kFloat32, 1, false);
    spec.args.grads = grads;
    spec.args.param = &param;
    spec.num_elements = 1;
    for (int given = 0; given <= kMaxSlots; ++given) {
      spec.args.slot0 = given >= 1 ? &slot0 : nullptr;
      spec.args.slot1 = given >= 2 ? &slot1 : nullptr;
      const std::string error = HostApplyUpdate(spec, serial);
      if (given >= traits.slots) {
        EXPECT_EQ(error, std::string());
      } else {
        EXPECT_EQ(error, std::string("host optimizer (") + traits.name + ") got a null buffer");
      }
    }
  }
}

}  // namespace
}  // namespace tf_glp::core

TF_GLP_TEST_MAIN
