// The fused optimizer updates' per-element formulas, one struct each, written
// as Keras 3 writes them (keras/src/optimizers/*.py, update_step).
//
// Note [Update formulas]
// An update kind is one struct below and one entry in UpdateFormulas at the
// bottom: its name (the ops' `kind` attribute), its float32 slot buffers of
// the parameter's size, its scalars (float32, computed per step by the caller
// exactly as Keras computes them: learning-rate schedules, bias corrections,
// `1 - beta` in double then float32) in the order the op takes them, and its
// Step, over `T`, a float32 value (one element or one vector of lanes)
// whose + - * / are the machine's float32 operations, one at a time, in the
// order written (the core is compiled without FMA contraction). So each line
// of a Step is the line of Keras it names, evaluated as TensorFlow evaluates
// it inside a tf.function (where Grappler rewrites a line, the formula says
// so and follows the rewrite), and the results match Keras bitwise wherever
// Keras' own expression has no pow (Ftrl) and no sum over the variable
// (Lamb, Adafactor): those match to rounding (docs/numerics.md; the tests say how
// close). Step receives the parameter after weight decay, the in-order
// float32 sum of the gradients, the slots (read before, written after), and
// the scalars.
//
// A kind whose update needs norms of the whole variable (Lamb's trust ratio,
// Adafactor's rms) declares kNorms, Scales and a Finish, and runs in two
// passes, see Note [Per-variable norms]; one whose slots are means over rows
// and columns (Adafactor) declares kFactored too, see Note [Factored second
// moments].
//
// Everything else (the traits table, range and buffer checks, bytes moved,
// the per-ISA dispatch, the TensorFlow kernel of Glp>HostApply) is generated
// from UpdateFormulas; the Python side of a kind is its HostUpdate row (with
// the pure-TensorFlow fallback) in tf_glp/ops/host_optimizers.py, and the
// Keras classes that use it are rows in tf_glp/ops/keras_fused.py. This
// header includes nothing (it is compiled into the per-ISA kernel files, see
// kernels_impl.inc) and is all templates, so each ISA's instantiation has
// internal linkage.
#ifndef TF_GLP_CC_CORE_UPDATE_FORMULAS_H_
#define TF_GLP_CC_CORE_UPDATE_FORMULAS_H_

namespace tf_glp::core {

// The most slot buffers / scalars an update kind may have.
inline constexpr int kMaxSlots = 3;
inline constexpr int kMaxScalars = 10;

struct SgdFormula {
  static constexpr const char* kName = "sgd";
  static constexpr int kSlots = 0;
  static constexpr const char* kScalars[] = {"learning_rate"};
  template <class T>
  static void Step(T& w, const T& g, T*, const T* s) {
    const T& lr = s[0];
    w = w - g * lr;
  }
};

// keras.optimizers.SGD(momentum > 0), with and without nesterov.
template <bool kNesterov>
struct MomentumFormula {
  static constexpr const char* kName = kNesterov ? "nesterov" : "momentum";
  static constexpr int kSlots = 1;
  static constexpr const char* kScalars[] = {"learning_rate", "momentum"};
  template <class T>
  static void Step(T& w, const T& g, T* slot, const T* s) {
    T& m = slot[0];
    const T &lr = s[0], &momentum = s[1];
    m = m * momentum - g * lr;
    if constexpr (kNesterov) {
      w = w + (m * momentum - g * lr);
    } else {
      w = w + m;
    }
  }
};

// keras.optimizers.Adam / AdamW; alpha = lr * sqrt(1 - beta_2^t) /
// (1 - beta_1^t). With amsgrad, a third slot keeps max(v_hat, v).
template <bool kAmsgrad>
struct AdamFormula {
  static constexpr const char* kName = kAmsgrad ? "adam_amsgrad" : "adam";
  static constexpr int kSlots = kAmsgrad ? 3 : 2;
  static constexpr const char* kScalars[] = {"alpha", "1 - beta_1", "1 - beta_2", "epsilon"};
  template <class T>
  static void Step(T& w, const T& g, T* slot, const T* s) {
    T &m = slot[0], &v = slot[1];
    const T &alpha = s[0], &c1 = s[1], &c2 = s[2], &epsilon = s[3];
    m = m + (g - m) * c1;
    v = v + (g * g - v) * c2;
    if constexpr (kAmsgrad) {
      T& v_hat = slot[2];
      v_hat = max(v_hat, v);
      w = w - (m * alpha) / (sqrt(v_hat) + epsilon);
    } else {
      w = w - (m * alpha) / (sqrt(v) + epsilon);
    }
  }
};

// keras.optimizers.RMSprop: slots velocity, then average_gradient (centered),
// then momentum (momentum > 0). Centered, Keras writes
// `velocity - square(average_grad) + epsilon`; inside a Keras fit,
// Grappler's constant folding pushes the constant down to
// `velocity - (square(average_grad) - epsilon)`, and that is followed here
// (found by trying; tests/profiling/test_optimizer_step.py).
template <bool kCentered, bool kMomentum>
struct RmspropFormula {
  static constexpr const char* kName =
      kCentered ? (kMomentum ? "rmsprop_centered_momentum" : "rmsprop_centered")
                : (kMomentum ? "rmsprop_momentum" : "rmsprop");
  static constexpr int kSlots = 1 + kCentered + kMomentum;
  static constexpr const char* kScalars[] = {"learning_rate", "rho", "1 - rho", "epsilon",
                                             "momentum"};
  template <class T>
  static void Step(T& w, const T& g, T* slot, const T* s) {
    T& velocity = slot[0];
    const T &lr = s[0], &rho = s[1], &one_minus_rho = s[2], &epsilon = s[3];
    velocity = rho * velocity + one_minus_rho * (g * g);
    T denominator = velocity + epsilon;
    if constexpr (kCentered) {
      T& average_grad = slot[1];
      average_grad = rho * average_grad + one_minus_rho * g;
      denominator = velocity - (average_grad * average_grad - epsilon);
    }
    const T increment = (lr * g) / sqrt(denominator);
    if constexpr (kMomentum) {
      T& momentum = slot[kSlots - 1];
      momentum = s[4] * momentum + increment;
      w = w - momentum;
    } else {
      w = w - increment;
    }
  }
};

struct AdagradFormula {
  static constexpr const char* kName = "adagrad";
  static constexpr int kSlots = 1;
  static constexpr const char* kScalars[] = {"learning_rate", "epsilon"};
  template <class T>
  static void Step(T& w, const T& g, T* slot, const T* s) {
    T& accumulator = slot[0];
    const T &lr = s[0], &epsilon = s[1];
    accumulator = accumulator + g * g;
    w = w - (lr * g) / sqrt(accumulator + epsilon);
  }
};

struct AdamaxFormula {
  static constexpr const char* kName = "adamax";
  static constexpr int kSlots = 2;
  static constexpr const char* kScalars[] = {"learning_rate", "1 - beta_1", "beta_2",
                                             "1 - beta_1^t", "epsilon"};
  template <class T>
  static void Step(T& w, const T& g, T* slot, const T* s) {
    T &m = slot[0], &u = slot[1];
    const T &lr = s[0], &c1 = s[1], &beta_2 = s[2], &bias = s[3], &epsilon = s[4];
    m = m + (g - m) * c1;
    u = max(beta_2 * u, abs(g));
    w = w - (lr * m) / (bias * (u + epsilon));
  }
};

struct AdadeltaFormula {
  static constexpr const char* kName = "adadelta";
  static constexpr int kSlots = 2;
  static constexpr const char* kScalars[] = {"learning_rate", "rho", "1 - rho", "epsilon"};
  template <class T>
  static void Step(T& w, const T& g, T* slot, const T* s) {
    T &accumulated_grad = slot[0], &accumulated_delta = slot[1];
    const T &lr = s[0], &rho = s[1], &one_minus_rho = s[2], &epsilon = s[3];
    accumulated_grad = rho * accumulated_grad + one_minus_rho * (g * g);
    const T delta = -((sqrt(accumulated_delta + epsilon) * g) / sqrt(accumulated_grad + epsilon));
    accumulated_delta = rho * accumulated_delta + one_minus_rho * (delta * delta);
    w = w + lr * delta;
  }
};

struct LionFormula {
  static constexpr const char* kName = "lion";
  static constexpr int kSlots = 1;
  static constexpr const char* kScalars[] = {"learning_rate", "beta_1", "1 - beta_1", "beta_2",
                                             "1 - beta_2"};
  template <class T>
  static void Step(T& w, const T& g, T* slot, const T* s) {
    T& m = slot[0];
    const T &lr = s[0], &beta_1 = s[1], &c1 = s[2], &beta_2 = s[3], &c2 = s[4];
    w = w - lr * sign(m * beta_1 + g * c1);
    m = m * beta_2 + g * c2;
  }
};

// keras.optimizers.Nadam; its `_u_product` is updated by Keras' own
// _backend_update_step before this runs, once per step.
struct NadamFormula {
  static constexpr const char* kName = "nadam";
  static constexpr int kSlots = 2;
  static constexpr const char* kScalars[] = {
      "learning_rate", "1 - beta_1", "1 - beta_2", "u_t_1", "1 - u_product_t_1",
      "1 - u_t",       "1 - u_product_t", "1 - beta_2^t", "epsilon"};
  template <class T>
  static void Step(T& w, const T& g, T* slot, const T* s) {
    T &m = slot[0], &v = slot[1];
    const T &lr = s[0], &c1 = s[1], &c2 = s[2], &u_t_1 = s[3], &d1 = s[4], &one_minus_u_t = s[5],
            &d2 = s[6], &bias_2 = s[7], &epsilon = s[8];
    m = m + (g - m) * c1;
    v = v + (g * g - v) * c2;
    const T m_hat = (u_t_1 * m) / d1 + (one_minus_u_t * g) / d2;
    const T v_hat = v / bias_2;
    w = w - (m_hat * lr) / (sqrt(v_hat) + epsilon);
  }
};

// keras.optimizers.Ftrl: its pow is the C library's powf, not Eigen's (see
// the note above), lane by lane and so slow; with Keras' default
// learning_rate_power -0.5 (kSqrt) the power is a square root, correctly
// rounded and vectorized (TensorFlow's pow(x, 0.5) is neither).
template <bool kSqrt>
struct FtrlFormula {
  static constexpr const char* kName = kSqrt ? "ftrl_sqrt" : "ftrl";
  static constexpr int kSlots = 2;
  static constexpr const char* kScalars[] = {
      "learning_rate", "2 * l2_shrinkage", "-learning_rate_power", "2 * l2",
      "-l1",           "l1"};
  template <class T>
  static void Step(T& w, const T& g, T* slot, const T* s) {
    T &accumulator = slot[0], &linear = slot[1];
    const T &lr = s[0], &two_l2_shrinkage = s[1], &power = s[2], &two_l2 = s[3], &low = s[4],
            &high = s[5];
    const T grad_to_use = g + two_l2_shrinkage * w;
    const T new_accumulator = accumulator + g * g;
    const T new_power = Power(new_accumulator, power);
    linear = linear + (grad_to_use - ((new_power - Power(accumulator, power)) / lr) * w);
    const T quadratic = new_power / lr + two_l2;
    const T linear_clipped = min(max(linear, low), high);
    w = (linear_clipped - linear) / quadratic;
    accumulator = new_accumulator;
  }
  template <class T>
  static T Power(const T& x, const T& power) {
    if constexpr (kSqrt) {
      return sqrt(x);
    } else {
      return pow(x, power);
    }
  }
};

// keras.optimizers.ScheduleFreeAdamW: the parameter is y, slot 0 the
// momentum z (started at the parameter by Keras' build), slot 1 the velocity.
// Two details of how TensorFlow runs Keras' lines, followed here: Keras'
// `momentum_old = momentum.value` is the variable itself, read where it is
// used, after the momentum's update (so x_old uses the new momentum); and
// inside a tf.function Grappler's constant folding turns Keras' division by
// the constant beta_1 into a multiplication by its float32 reciprocal.
struct ScheduleFreeAdamWFormula {
  static constexpr const char* kName = "schedule_free_adamw";
  static constexpr int kSlots = 2;
  static constexpr const char* kScalars[] = {
      "learning_rate", "1 - beta_2", "1 - beta_2^t", "epsilon", "1 - beta_1", "beta_1",
      "1 / beta_1",    "1 - 1/t",    "1/t"};
  template <class T>
  static void Step(T& w, const T& g, T* slot, const T* s) {
    T &momentum = slot[0], &velocity = slot[1];
    const T &lr = s[0], &c2 = s[1], &bias_2 = s[2], &epsilon = s[3], &c1 = s[4], &beta_1 = s[5],
            &inverse_beta_1 = s[6], &one_minus_weight = s[7], &weight = s[8];
    velocity = velocity + (g * g - velocity) * c2;
    const T denominator = sqrt(velocity / bias_2) + epsilon;
    momentum = momentum - (lr * g) / denominator;
    const T x_old = (w - c1 * momentum) * inverse_beta_1;
    const T x_new = one_minus_weight * x_old + weight * momentum;
    w = c1 * momentum + beta_1 * x_new;
  }
};

// keras.optimizers.Lamb. Note [Per-variable norms]: the first pass updates
// the slots and sums, per block of elements, the squares of the weight
// (after weight decay) and of the update (Accumulate); the caller adds the
// blocks up in order (double); Scales takes Keras' ratio (w_norm / g_norm
// where both are positive, else 1) times the learning rate; the second pass
// recomputes the update from the new slots (the same operations, so the same
// bits) and subtracts it scaled (Finish). The sums are in another order than
// TensorFlow's reduce_sum, so the result matches Keras to rounding, not
// bitwise; whatever the threads and instruction set, it is the same (element
// i adds to partial i % 16 of its block).
struct LambFormula {
  static constexpr const char* kName = "lamb";
  static constexpr int kSlots = 2;
  static constexpr int kNorms = 2;
  static constexpr bool kFinishReadsGradient = false;
  static constexpr const char* kScalars[] = {"learning_rate", "1 - beta_1", "1 - beta_2",
                                             "1 - beta_1^t", "1 - beta_2^t", "epsilon"};
  template <class T>
  static T Update(const T* slot, const T* s) {
    const T m_t_hat = slot[0] / s[3];
    const T v_sqrt = sqrt(slot[1] / s[4]) + s[5];
    return m_t_hat / v_sqrt;
  }
  template <class T>
  static void Accumulate(const T& w, const T& g, T* slot, const T* s, T* norm) {
    T &m = slot[0], &v = slot[1];
    m = m + (g - m) * s[1];
    v = v + (g * g - v) * s[2];
    norm[0] = w;
    norm[1] = Update(slot, s);
  }
  // `sums`: the sums of squares of the norm values over the variable's
  // `count` elements; `scale`: Finish's scalars (float32, as Keras computes
  // them).
  static void Scales(const double* sums, long long /*count*/, const float* s, float* scale) {
    const float w_norm = __builtin_sqrtf(static_cast<float>(sums[0]));
    const float g_norm = __builtin_sqrtf(static_cast<float>(sums[1]));
    const float ratio = w_norm > 0.0f && g_norm > 0.0f ? w_norm / g_norm : 1.0f;
    scale[0] = ratio * s[0];  // ratio * lr
  }
  template <class T>
  static void Finish(T& w, const T& /*g*/, const T* slot, const T* s, const T* scale) {
    w = w - scale[0] * Update(slot, s);
  }
};

// keras.optimizers.Adafactor. Slots r, c (the factored second moments: row
// and column means, of shapes var.shape[:-1] and var.shape[:-2] +
// var.shape[-1:]; Keras' scalar placeholders for a variable of rank < 2) and
// v (the second moment, the variable's shape); Keras' rms(variable) and
// rms(u_t) are its two norms. A variable of rank < 2 runs as Lamb does
// (Accumulate, Scales, Finish); one of rank >= 2, as a stack of matrices,
// in the three passes of Note [Factored second moments] (kernels_impl.inc),
// which use Square, Average, Velocity and Update. The means are sums in
// double (another order than TensorFlow's), so the result matches Keras to
// rounding; whatever the threads and instruction set, it is the same.
struct AdafactorFormula {
  static constexpr const char* kName = "adafactor";
  static constexpr int kSlots = 3;
  static constexpr int kFirstElementSlot = 2;  // r and c are not per element
  static constexpr int kNorms = 2;
  static constexpr bool kFactored = true;
  static constexpr bool kFinishReadsGradient = true;
  static constexpr const char* kScalars[] = {"rho_t",     "beta_2_t",  "1 - beta_2_t",
                                             "epsilon_1", "epsilon_2", "clip_threshold"};
  // regulated_grad_square
  template <class T>
  static T Square(const T& g, const T* s) {
    return g * g + s[3];
  }
  // The running average of r, c (from their means of Square) or v.
  template <class T>
  static T Average(const T& old, const T& term, const T* s) {
    return s[1] * old + s[2] * term;
  }
  // v = (r / mean(r))[row] * c[column], `row_factor` the first.
  template <class T>
  static T Velocity(const T& row_factor, const T& c) {
    return row_factor * c;
  }
  template <class T>
  static T Update(const T& g, const T& v) {
    return g / sqrt(v);  // u_t
  }
  template <class T>
  static void Accumulate(const T& w, const T& g, T* slot, const T* s, T* norm) {
    T& v = slot[2];
    v = Average(v, Square(g, s), s);
    norm[0] = w;
    norm[1] = Update(g, v);
  }
  // alpha_t = max(epsilon_2, rms(w)) * rho_t; the divisor of u_t_hat,
  // max(1, rms(u_t) / clip_threshold).
  static void Scales(const double* sums, long long count, const float* s, float* scale) {
    const float n = static_cast<float>(count);
    const float rms_w = __builtin_sqrtf(static_cast<float>(sums[0]) / n);
    const float rms_u = __builtin_sqrtf(static_cast<float>(sums[1]) / n);
    scale[0] = (s[4] > rms_w ? s[4] : rms_w) * s[0];
    const float clipped = rms_u / s[5];
    scale[1] = 1.0f > clipped ? 1.0f : clipped;
  }
  template <class T>
  static void Finish(T& w, const T& g, const T* slot, const T* s, const T* scale) {
    w = w - scale[0] * (Update(g, slot[2]) / scale[1]);
  }
};

template <class... Formulas>
struct FormulaList {};

// Every update kind; a kind's index here is its UpdateArgs::kind.
using UpdateFormulas =
    FormulaList<SgdFormula, MomentumFormula<false>, MomentumFormula<true>, AdamFormula<false>,
                AdamFormula<true>, RmspropFormula<false, false>, RmspropFormula<false, true>,
                RmspropFormula<true, false>, RmspropFormula<true, true>, AdagradFormula,
                AdamaxFormula, AdadeltaFormula, LionFormula, NadamFormula, FtrlFormula<false>,
                FtrlFormula<true>, ScheduleFreeAdamWFormula, LambFormula, AdafactorFormula>;

template <class...>
using VoidOf = void;
// kNorms of a formula (0 where it declares none).
template <class Formula, class = void>
struct NormsOf {
  static constexpr int value = 0;
};
template <class Formula>
struct NormsOf<Formula, VoidOf<decltype(Formula::kNorms)>> {
  static constexpr int value = Formula::kNorms;
};
// kFactored of a formula (false where it declares none).
template <class Formula, class = void>
struct FactoredOf {
  static constexpr bool value = false;
};
template <class Formula>
struct FactoredOf<Formula, VoidOf<decltype(Formula::kFactored)>> {
  static constexpr bool value = Formula::kFactored;
};
// kFirstElementSlot of a formula: its slots from this one on are per
// element, of the parameter's size (0 where it declares none); the skeleton
// reads and writes only those.
template <class Formula, class = void>
struct FirstElementSlotOf {
  static constexpr int value = 0;
};
template <class Formula>
struct FirstElementSlotOf<Formula, VoidOf<decltype(Formula::kFirstElementSlot)>> {
  static constexpr int value = Formula::kFirstElementSlot;
};
inline constexpr int kMaxNorms = 2;
// Scalars a second pass takes from the norms (Formula::Scales).
inline constexpr int kMaxNormScales = 2;
// Elements per partial sum of Note [Per-variable norms], per block.
inline constexpr int kNormPartials = 16;

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_UPDATE_FORMULAS_H_
