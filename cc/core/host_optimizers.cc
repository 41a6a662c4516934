#include "cc/core/host_optimizers.h"

#include <algorithm>
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

// Runs kernel(args, first, last) over [0, tasks), as RunElementwise runs
// elements.
void RunTasks(const ParallelRunner& runner, int64_t tasks, int64_t bytes_moved, RangeKernel kernel,
              const UpdateArgs& args) {
  if (bytes_moved < kSerialBytesThreshold || runner.NumThreads() == 1) {
    kernel(args, 0, tasks);
    return;
  }
  runner.ParallelFor(tasks, [&](int64_t first, int64_t last) { kernel(args, first, last); });
}

constexpr int64_t kFactorTaskElements = 256 << 10;
constexpr int64_t kFactorTaskRows = 256;

// Note [Factored second moments]: the first pass, then r and c updated from
// the means of Square(g) (the column means from the tasks' sums, in order),
// and the row factors r / mean(r), the second pass; returns the two sums of
// squares.
template <class Formula>
void FactoredNormPasses(const HostUpdateSpec& spec, const ParallelRunner& runner, RangeKernel kernel,
                        int64_t bytes_moved, double* totals) {
  const UpdateArgs& a = spec.args;
  const int64_t rows = spec.factor_rows, cols = spec.factor_cols;
  const int64_t matrices = spec.num_elements / (rows * cols);
  UpdateArgs factored = a;
  factored.factor_rows = rows;
  factored.factor_cols = cols;
  // Tasks of about kFactorTaskElements, at most kFactorTaskRows rows: the
  // column sums are float32 over a task's rows.
  factored.rows_per_task = std::clamp<int64_t>(kFactorTaskElements / cols, 1, kFactorTaskRows);
  const int64_t tasks_per_matrix = (rows + factored.rows_per_task - 1) / factored.rows_per_task;
  const int64_t tasks = matrices * tasks_per_matrix;
  std::vector<double> sums(static_cast<size_t>(tasks * Formula::kNorms));
  std::vector<float> column_sums(static_cast<size_t>(tasks * cols));
  std::vector<float> row_factors(static_cast<size_t>(matrices * rows));
  factored.norm_sums = sums.data();
  factored.column_sums = column_sums.data();
  factored.row_factors = row_factors.data();
  factored.pass = UpdatePass::kFactorStats;
  RunTasks(runner, tasks, bytes_moved, kernel, factored);
  const float* s = a.scalars;
  for (int64_t matrix = 0; matrix < matrices; ++matrix) {
    float* r = a.slots[0] + matrix * rows;
    float* c = a.slots[1] + matrix * cols;
    float* factors = row_factors.data() + matrix * rows;
    for (int64_t n = 0; n < cols; ++n) {
      double total = 0.0;
      for (int64_t t = 0; t < tasks_per_matrix; ++t) {
        total += column_sums[(matrix * tasks_per_matrix + t) * cols + n];
      }
      c[n] = Formula::Average(c[n], static_cast<float>(total) / static_cast<float>(rows), s);
    }
    double r_total = 0.0;
    for (int64_t m = 0; m < rows; ++m) {
      r[m] = Formula::Average(r[m], factors[m], s);
      r_total += r[m];
    }
    const float r_mean = static_cast<float>(r_total) / static_cast<float>(rows);
    for (int64_t m = 0; m < rows; ++m) factors[m] = r[m] / r_mean;
  }
  factored.pass = UpdatePass::kFactoredNorms;
  RunTasks(runner, tasks, bytes_moved, kernel, factored);
  for (int64_t t = 0; t < tasks; ++t) {
    for (int n = 0; n < Formula::kNorms; ++n) totals[n] += sums[t * Formula::kNorms + n];
  }
}

// Note [Per-variable norms]: the first pass (or, for a factored kind on a
// variable of rank >= 2, the two of Note [Factored second moments]), the
// norms' totals, the formula's Scales, the second pass.
template <class Formula>
void RunWithNorms(const HostUpdateSpec& spec, const ParallelRunner& runner, RangeKernel kernel,
                  int64_t bytes_moved) {
  const UpdateArgs& a = spec.args;
  double totals[kMaxNorms] = {};
  bool factored = false;
  if constexpr (FactoredOf<Formula>::value) {
    factored = spec.factor_cols > 0;
    if (factored) FactoredNormPasses<Formula>(spec, runner, kernel, bytes_moved, totals);
  }
  if (!factored) {
    // Blocks of kElementsPerTask, the tasks' size, so that a task never
    // shares a block with another.
    static_assert(kElementsPerTask % kNormPartials == 0, "blocks of whole partial groups");
    const int64_t blocks = (spec.num_elements + kElementsPerTask - 1) / kElementsPerTask;
    std::vector<double> sums(static_cast<size_t>(blocks * Formula::kNorms));
    UpdateArgs first = a;
    first.pass = UpdatePass::kNorms;
    first.norm_block = kElementsPerTask;
    first.norm_sums = sums.data();
    RunElementwise(runner, spec.num_elements, bytes_moved,
                   [&](int64_t begin, int64_t end) { kernel(first, begin, end); });
    for (int64_t block = 0; block < blocks; ++block) {
      for (int n = 0; n < Formula::kNorms; ++n) totals[n] += sums[block * Formula::kNorms + n];
    }
  }
  UpdateArgs second = a;
  second.pass = UpdatePass::kFinish;
  Formula::Scales(totals, spec.num_elements, a.scalars, second.norm_scales);
  RunElementwise(runner, spec.num_elements, bytes_moved,
                 [&](int64_t begin, int64_t end) { kernel(second, begin, end); });
}

// Runs the formula at a.kind: in one elementwise pass, or RunWithNorms.
template <class... Formulas>
void RunKind(const HostUpdateSpec& spec, const ParallelRunner& runner, RangeKernel kernel,
                 int64_t bytes_moved, FormulaList<Formulas...>) {
  int index = 0;
  auto run = [&](auto formula) {
    using Formula = decltype(formula);
    if (spec.args.kind != index++) return;
    if constexpr (NormsOf<Formula>::value > 0) {
      RunWithNorms<Formula>(spec, runner, kernel, bytes_moved);
    } else {
      RunElementwise(runner, spec.num_elements, bytes_moved,
                     [&](int64_t begin, int64_t end) { kernel(spec.args, begin, end); });
    }
  };
  (run(Formulas{}), ...);
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
  if (traits->factored && spec.factor_cols > 0 &&
      (spec.factor_rows < 1 || spec.num_elements % (spec.factor_rows * spec.factor_cols) != 0)) {
    return "host optimizer (" + std::string(traits->name) + ") got " +
           std::to_string(spec.num_elements) + " elements, not a stack of " +
           std::to_string(spec.factor_rows) + " x " + std::to_string(spec.factor_cols) + " matrices";
  }
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
  RunKind(spec, runner, kernel, bytes_moved, UpdateFormulas{});
  return "";
}

}  // namespace tf_glp::core
