// Fused host updates: every kind bitwise the same over instruction sets,
// thread counts and source buffers, sgd/momentum/adam against a per-element
// reference written from Keras 3's formulas, over gradient dtypes, N and
// sizes; and rejection of bad hyper-parameters.
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
  std::vector<float> param;
  std::vector<float> slots[kMaxSlots];
};

// Slots start non-negative: some are running sums of squares.
State RandomState(int64_t size, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  State s;
  for (int64_t i = 0; i < size; ++i) {
    s.param.push_back(normal(rng));
    for (auto& slot : s.slots) slot.push_back(std::fabs(normal(rng)) * 0.01f);
  }
  return s;
}

// A plausible value for each scalar, by its name (update_formulas.h).
float ScalarValue(const std::string& name) {
  if (name == "momentum" || name == "rho" || name == "beta_1") return 0.9f;
  if (name == "1 - rho" || name == "1 - beta_1") return static_cast<float>(1.0 - 0.9);
  if (name == "beta_2") return 0.999f;
  if (name == "1 - beta_2") return static_cast<float>(1.0 - 0.999);
  if (name == "epsilon") return 1e-7f;
  if (name == "l1") return 0.01f;
  if (name == "-l1") return -0.01f;
  if (name == "-learning_rate_power") return 0.5f;
  if (name == "beta_2_t") return 0.8f;
  if (name == "1 - beta_2_t") return 1.0f - 0.8f;
  if (name == "epsilon_1") return 1e-30f;
  if (name == "epsilon_2") return 1e-3f;
  if (name == "clip_threshold") return 1.0f;
  return 0.01f;  // learning rates, bias corrections, regularization
}

UpdateArgs MakeArgs(int kind, DType grad_dtype, int n, bool decay) {
  UpdateArgs a{};
  a.kind = kind;
  a.num_grads = n;
  a.grad_dtype = grad_dtype;
  const UpdateTraits& traits = kUpdateTraits[kind];
  for (int k = 0; k < traits.scalars; ++k) a.scalars[k] = ScalarValue(traits.scalar_names[k]);
  a.weight_decay = decay;
  a.decay_rate = 0.004f;
  a.decay_learning_rate = 0.001f;
  return a;
}

// Keras 3 (keras/src/optimizers/sgd.py, adam.py and the TensorFlow
// backend's _apply_weight_decay), one element at a time, for three kinds:
// the formulas of update_formulas.h are checked against Keras itself by
// tests/ops/test_fused_optimizers.py; this pins the skeleton around them.
void ReferenceStep(const UpdateArgs& a, const std::vector<const void*>& grads,
                   int64_t size, State* s) {
  const std::string kind = UpdateKindName(a.kind);
  for (int64_t i = 0; i < size; ++i) {
    float g = LoadAsFloat(a.grad_dtype, grads[0], i);
    for (int j = 1; j < a.num_grads; ++j) g = g + LoadAsFloat(a.grad_dtype, grads[j], i);
    float w = s->param[i];
    if (a.weight_decay) w = w - w * a.decay_rate * a.decay_learning_rate;
    const float lr = a.scalars[0];
    if (kind == "sgd") {
      w = w - g * lr;
    } else if (kind == "momentum") {
      const float m = s->slots[0][i] * a.scalars[1] - g * lr;
      s->slots[0][i] = m;
      w = w + m;
    } else {  // adam
      float m = s->slots[0][i], v = s->slots[1][i];
      m = m + (g - m) * a.scalars[1];
      v = v + (g * g - v) * a.scalars[2];
      s->slots[0][i] = m;
      s->slots[1][i] = v;
      w = w - (m * lr) / (std::sqrt(v) + a.scalars[3]);
    }
    s->param[i] = w;
  }
}

bool SameState(const State& a, const State& b, int slots, int64_t size) {
  bool same = std::memcmp(a.param.data(), b.param.data(), 4 * size) == 0;
  for (int k = 0; k < slots; ++k) {
    same = same && std::memcmp(a.slots[k].data(), b.slots[k].data(), 4 * size) == 0;
  }
  return same;
}

// Three steps of `args` on `state` with `isa` and `runner`, in place or from
// a separate source buffer (into one holding garbage); false if the source
// was written.
bool RunSteps(UpdateArgs args, int64_t size, State* state, Isa isa, const ParallelRunner& runner,
              bool separate_source) {
  HostUpdateSpec spec;
  spec.args = args;
  spec.args.param = state->param.data();
  for (int k = 0; k < kMaxSlots; ++k) spec.args.slots[k] = state->slots[k].data();
  spec.num_elements = size;
  bool source_kept = true;
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> source = state->param, kept = state->param;
    if (separate_source) {
      std::fill(state->param.begin(), state->param.end(), std::numeric_limits<float>::quiet_NaN());
      spec.args.param_source = source.data();
    }
    const std::string error = HostApplyUpdate(spec, runner, isa);
    if (!error.empty()) throw testing::Failure(error);
    source_kept = source_kept && std::memcmp(source.data(), kept.data(), 4 * size) == 0;
  }
  return source_kept;
}

// Every kind gives the same bits whatever the instruction set, the thread
// count and the source buffer (Note [Deterministic accumulation]); sgd,
// momentum and adam also those of the reference above.
TEST(EveryKindIsBitwiseReproducibleAndMatchesTheReference) {
  SerialRunner serial;
  ThreadPool pool(3);
  for (int kind = 0; kind < kNumUpdateKinds; ++kind) {
    const UpdateTraits& traits = kUpdateTraits[kind];
    const std::string name = traits.name;
    const bool has_reference = name == "sgd" || name == "momentum" || name == "adam";
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
            if (has_reference) {
              for (int step = 0; step < 3; ++step) ReferenceStep(args, grads, size, &want);
            } else {
              RunSteps(args, size, &want, Isa::kScalar, serial, false);
            }
            for (Isa isa : testing::SupportedIsas()) {
              for (const ParallelRunner* runner :
                   {static_cast<const ParallelRunner*>(&serial),
                    static_cast<const ParallelRunner*>(&pool)}) {
                for (bool separate_source : {false, true}) {
                  State got = start;
                  const bool source_kept = RunSteps(args, size, &got, isa, *runner, separate_source);
                  const bool same = SameState(got, want, traits.slots, size);
                  if (!same || !source_kept) {
                    throw testing::Failure(
                        std::string(same ? "source written" : "mismatch") + ": kind=" + name +
                        " dtype=" + DTypeName(dtype) + " n=" + std::to_string(n) +
                        " size=" + std::to_string(size) + " isa=" + IsaName(isa) +
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
  const int adam = FindUpdateKind("adam");
  float param = 1.0f, slot0 = 0.0f, slot1 = 0.0f, grad = 1.0f;
  const void* grads[] = {&grad};
  HostUpdateSpec spec;
  spec.args = MakeArgs(adam, DType::kFloat32, 1, false);
  spec.args.grads = grads;
  spec.args.param = &param;
  spec.args.slots[0] = &slot0;
  spec.args.slots[1] = &slot1;
  spec.num_elements = 1;
  EXPECT_EQ(HostApplyUpdate(spec, serial), std::string());
  HostUpdateSpec bad = spec;
  bad.args.scalars[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(HostApplyUpdate(bad, serial).find("alpha must be finite") != std::string::npos);
  bad = spec;
  bad.args.scalars[3] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(HostApplyUpdate(bad, serial).find("epsilon") != std::string::npos);
  bad = spec;
  bad.args.decay_rate = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(HostApplyUpdate(bad, serial).find("weight_decay must be finite") != std::string::npos);
  bad = spec;
  bad.args.num_grads = 0;
  EXPECT_TRUE(HostApplyUpdate(bad, serial).find("at least one gradient") !=
              std::string::npos);
  bad = spec;
  bad.args.slots[1] = nullptr;
  EXPECT_TRUE(HostApplyUpdate(bad, serial).find("null buffer") != std::string::npos);
  bad = spec;
  bad.args.kind = kNumUpdateKinds;
  EXPECT_TRUE(HostApplyUpdate(bad, serial).find("unknown update kind " + std::to_string(kNumUpdateKinds)) !=
              std::string::npos);
  // Plain SGD needs no slots.
  bad = spec;
  bad.args.kind = FindUpdateKind("sgd");
  bad.args.slots[0] = bad.args.slots[1] = nullptr;
  EXPECT_EQ(HostApplyUpdate(bad, serial), std::string());
}

// Each kind's traits (generated from its formula) are what the checks and
// the bytes moved use.
TEST(UpdateTraitsDriveTheChecks) {
  EXPECT_EQ(FindUpdateKind("sgd"), 0);
  EXPECT_EQ(FindUpdateKind("no such kind"), -1);
  EXPECT_EQ(std::string(UpdateKindName(FindUpdateKind("adam"))), std::string("adam"));
  EXPECT_EQ(std::string(UpdateKindName(kNumUpdateKinds)), std::string("unknown"));
  EXPECT_TRUE(FindUpdateTraits(-1) == nullptr);
  EXPECT_EQ(UpdateBytesPerElement(kUpdateTraits[FindUpdateKind("sgd")], 1, DType::kFloat32), 12);
  EXPECT_EQ(UpdateBytesPerElement(kUpdateTraits[FindUpdateKind("momentum")], 1, DType::kFloat32), 20);
  EXPECT_EQ(UpdateBytesPerElement(kUpdateTraits[FindUpdateKind("adam")], 1, DType::kFloat32), 28);
  EXPECT_EQ(UpdateBytesPerElement(kUpdateTraits[FindUpdateKind("adam_amsgrad")], 1, DType::kFloat32), 36);
  EXPECT_EQ(UpdateBytesPerElement(kUpdateTraits[FindUpdateKind("lamb")], 1, DType::kFloat32), 40);
  EXPECT_EQ(UpdateBytesPerElement(kUpdateTraits[FindUpdateKind("adafactor")], 1, DType::kFloat32), 32);
  SerialRunner serial;
  for (int k = 0; k < kNumUpdateKinds; ++k) {
    const UpdateTraits& traits = kUpdateTraits[k];
    const int gradient_reads = traits.factored ? 3 : 1;
    EXPECT_EQ(UpdateBytesPerElement(traits, 3, DType::kBFloat16),
              UpdateBytesPerElement(traits, 1, DType::kFloat32) + gradient_reads * (3 * 2 - 4));
    EXPECT_EQ(FindUpdateKind(traits.name), k);
    // Exactly the slots in the row are needed.
    float param = 1.0f, slots[kMaxSlots] = {}, grad = 1.0f;
    const void* grads[] = {&grad};
    HostUpdateSpec spec;
    spec.args = MakeArgs(k, DType::kFloat32, 1, false);
    spec.args.grads = grads;
    spec.args.param = &param;
    spec.num_elements = 1;
    for (int given = 0; given <= kMaxSlots; ++given) {
      for (int j = 0; j < kMaxSlots; ++j) spec.args.slots[j] = j < given ? &slots[j] : nullptr;
      const std::string error = HostApplyUpdate(spec, serial);
      if (given >= traits.slots) {
        EXPECT_EQ(error, std::string());
      } else {
        EXPECT_EQ(error, std::string("host optimizer (") + traits.name + ") got a null buffer");
      }
    }
  }
}


// Adafactor on stacks of matrices (Note [Factored second moments]): the same
// bits whatever the instruction set, threads and source buffer, and Keras'
// formulas (adafactor.py, with sums in double) to rounding.
struct Factored {
  int64_t matrices, rows, cols;
  int64_t size() const { return matrices * rows * cols; }
};

void ReferenceAdafactorStep(const UpdateArgs& a, const Factored& f, const float* g, State* s) {
  const float* k = a.scalars;  // rho_t, beta_2_t, 1 - beta_2_t, epsilon_1, epsilon_2, clip
  const int64_t size = f.size();
  std::vector<float> w(s->param), v(size);
  double w_squares = 0.0;
  for (int64_t i = 0; i < size; ++i) {
    if (a.weight_decay) w[i] = w[i] - w[i] * a.decay_rate * a.decay_learning_rate;
    w_squares += static_cast<double>(w[i] * w[i]);
  }
  for (int64_t b = 0; b < f.matrices; ++b) {
    float* r = s->slots[0].data() + b * f.rows;
    float* c = s->slots[1].data() + b * f.cols;
    const float* gb = g + b * f.rows * f.cols;
    auto square = [&](int64_t m, int64_t n) { return gb[m * f.cols + n] * gb[m * f.cols + n] + k[3]; };
    for (int64_t m = 0; m < f.rows; ++m) {
      double sum = 0.0;
      for (int64_t n = 0; n < f.cols; ++n) sum += square(m, n);
      r[m] = k[1] * r[m] + k[2] * (static_cast<float>(sum) / static_cast<float>(f.cols));
    }
    for (int64_t n = 0; n < f.cols; ++n) {
      double sum = 0.0;
      for (int64_t m = 0; m < f.rows; ++m) sum += square(m, n);
      c[n] = k[1] * c[n] + k[2] * (static_cast<float>(sum) / static_cast<float>(f.rows));
    }
    double r_sum = 0.0;
    for (int64_t m = 0; m < f.rows; ++m) r_sum += r[m];
    const float r_mean = static_cast<float>(r_sum) / static_cast<float>(f.rows);
    for (int64_t m = 0; m < f.rows; ++m) {
      for (int64_t n = 0; n < f.cols; ++n) v[(b * f.rows + m) * f.cols + n] = (r[m] / r_mean) * c[n];
    }
  }
  double u_squares = 0.0;
  for (int64_t i = 0; i < size; ++i) {
    const float u = g[i] / std::sqrt(v[i]);
    u_squares += static_cast<double>(u * u);
  }
  const float rms_w = std::sqrt(static_cast<float>(w_squares) / static_cast<float>(size));
  const float rms_u = std::sqrt(static_cast<float>(u_squares) / static_cast<float>(size));
  const float alpha = std::max(k[4], rms_w) * k[0];
  const float divisor = std::max(1.0f, rms_u / k[5]);
  for (int64_t i = 0; i < size; ++i) {
    s->param[i] = w[i] - alpha * ((g[i] / std::sqrt(v[i])) / divisor);
    s->slots[2][i] = v[i];
  }
}

TEST(AdafactorFactorsMatricesReproduciblyAndAsKerasDoes) {
  SerialRunner serial;
  ThreadPool pool(3);
  const int kind = FindUpdateKind("adafactor");
  for (const Factored& f : {Factored{1, 7, 5}, Factored{3, 4, 33}, Factored{2, 1500, 40},
                            Factored{1, 3, 20000}}) {
    for (bool decay : {false, true}) {
      std::mt19937 rng(f.size());
      State start = RandomState(f.size(), rng);
      std::vector<uint8_t> grad = RandomBuffer(DType::kFloat32, f.size(), rng, 0.5f);
      const void* grads[] = {grad.data()};
      UpdateArgs args = MakeArgs(kind, DType::kFloat32, 1, decay);
      args.grads = grads;
      auto run = [&](Isa isa, const ParallelRunner& runner, bool separate_source) {
        State state = start;
        std::vector<float> source;
        HostUpdateSpec spec;
        spec.args = args;
        spec.args.param = state.param.data();
        if (separate_source) {
          source = state.param;
          spec.args.param_source = source.data();
        }
        for (int j = 0; j < kMaxSlots; ++j) spec.args.slots[j] = state.slots[j].data();
        spec.num_elements = f.size();
        spec.factor_rows = f.rows;
        spec.factor_cols = f.cols;
        const std::string error = HostApplyUpdate(spec, runner, isa);
        if (!error.empty()) throw testing::Failure(error);
        return state;
      };
      const State want = run(Isa::kScalar, serial, false);
      for (Isa isa : testing::SupportedIsas()) {
        for (const ParallelRunner* runner : {static_cast<const ParallelRunner*>(&serial),
                                             static_cast<const ParallelRunner*>(&pool)}) {
          for (bool separate_source : {false, true}) {
            const State got = run(isa, *runner, separate_source);
            const bool same =
                std::memcmp(got.param.data(), want.param.data(), 4 * f.size()) == 0 &&
                std::memcmp(got.slots[0].data(), want.slots[0].data(), 4 * f.matrices * f.rows) == 0 &&
                std::memcmp(got.slots[1].data(), want.slots[1].data(), 4 * f.matrices * f.cols) == 0 &&
                std::memcmp(got.slots[2].data(), want.slots[2].data(), 4 * f.size()) == 0;
            if (!same) {
              throw testing::Failure("adafactor mismatch: rows=" + std::to_string(f.rows) + " cols=" +
                                     std::to_string(f.cols) + " isa=" + IsaName(isa) + " threads=" +
                                     std::to_string(runner->NumThreads()));
            }
          }
        }
      }
      State reference = start;
      ReferenceAdafactorStep(args, f, reinterpret_cast<const float*>(grad.data()), &reference);
      for (int64_t i = 0; i < f.size(); ++i) {
        const float step = std::fabs(start.param[i] - reference.param[i]);
        EXPECT_TRUE(std::fabs(want.param[i] - reference.param[i]) <= 1e-5f * step + 1e-7f * std::fabs(start.param[i]));
        EXPECT_TRUE(std::fabs(want.slots[2][i] - reference.slots[2][i]) <= 1e-5f * reference.slots[2][i]);
      }
    }
  }
  // Rank < 2 (unfactored): r and c are Keras' one-element placeholders,
  // neither read nor written (the sanitizer build sees any access past them).
  {
    std::mt19937 rng(5);
    State state = RandomState(1000, rng);
    std::vector<uint8_t> grad = RandomBuffer(DType::kFloat32, 1000, rng, 0.5f);
    const void* grads[] = {grad.data()};
    float r = 7.0f, c = 8.0f;
    HostUpdateSpec spec;
    spec.args = MakeArgs(kind, DType::kFloat32, 1, false);
    spec.args.grads = grads;
    spec.args.param = state.param.data();
    spec.args.slots[0] = &r;
    spec.args.slots[1] = &c;
    spec.args.slots[2] = state.slots[2].data();
    spec.num_elements = 1000;
    EXPECT_EQ(HostApplyUpdate(spec, pool), std::string());
    EXPECT_TRUE(r == 7.0f && c == 8.0f);
  }
  // A shape that is not a stack of the given matrices is refused.
  float param = 1.0f, slots[kMaxSlots] = {}, grad = 1.0f;
  const void* grads[] = {&grad};
  HostUpdateSpec spec;
  spec.args = MakeArgs(kind, DType::kFloat32, 1, false);
  spec.args.grads = grads;
  spec.args.param = &param;
  for (int j = 0; j < kMaxSlots; ++j) spec.args.slots[j] = &slots[j];
  spec.num_elements = 1;
  spec.factor_rows = 2;
  spec.factor_cols = 3;
  EXPECT_EQ(HostApplyUpdate(spec, serial),
            std::string("host optimizer (adafactor) got 1 elements, not a stack of 2 x 3 matrices"));
}

}  // namespace
}  // namespace tf_glp::core

TF_GLP_TEST_MAIN
