"""How a tf_glp.Strategy runs fit's steps: how many per call (Keras'
`steps_per_execution`) and, on one device and only with the user's consent
(`allow_xla=True`), whether XLA compiles them: chosen at the start of the
first fit by timing each way on the user's model and first batch.

Why: a small model's step is mostly the fixed cost of dispatching it (1-2
ms on this project's 2-core machine on one device, more with replicas:
docs/performance.md). Running several steps per call removes that cost and
trains exactly the same weights; Keras 3 does not choose it by itself. XLA
(Keras: `jit_compile`, off by default without GPUs) can be much faster or
much slower (on this project's CPU 2.2x faster on a wide MLP, 4x slower on
MobileNetV2: benchmarks/RESULTS.md); it rounds differently,
so it is measured and named, and used only where the user allows it. (With
replicas XLA is refused: tf_glp's host ops run outside it, no_xla.py.)

The candidates: `steps_per_execution` 1, 4 and 16 (at most the epoch's
steps: Keras runs at most one epoch per call), and on one device XLA
(Keras' own optimizer update: tf_glp's fused ops cannot run inside XLA) at
the largest. A first call of each traces it (XLA compiles it there); then
interleaved rounds of the same number of steps per candidate, timed as in
update_choice.py; a candidate wins with optimizer_step.beats' rule
(beyond the spread and at least 1.05x). The way as compiled and the
largest count go first, and the rest is measured only where it can pay
for itself (Note [Weighing the measurement]). Where one step at 1 takes
LONG_STEP_S or more, dispatch cannot be 1.05x of it: only XLA is measured
then. XLA is measured only with the user's consent (allow_xla=True), or
where its compile is at most XLA_HINT of the fit (for explain()'s hint).
The times are of fit's train function alone, so they overstate the gain
in fit, whose own work per call and per epoch stays.

What is kept as the user wrote it (not measured):
- an explicit `steps_per_execution` (XLA is still measured, at it) or
  `jit_compile` (the count is still measured) in compile;
- a fit with a callback that has batch-level hooks (other than Keras'
  Progbar and History, checkpoints saved per epoch and tf_glp's own
  decisions): with N steps per call Keras calls those hooks every N steps.
  The ways are still measured, and explain() names the callback and the
  speed it keeps on the table;
- a fit shorter than MIN_FIT_STEPS, or one for which the rest of the
  measurement would cost more than the first round shows it saving (Note
  [Weighing the measurement]); a fit of unknown length (an input of
  unknown cardinality without steps_per_epoch) is not measured either. A
  later, longer fit of the same model measures then. A measurement is
  paid once: the next run reuses the plan store's entry;
- inputs that cannot be read twice (update_choice.first_batch), training
  across workers and micro_batches (not measured yet).

The ways are set for fit only: at the start of each fit the chosen
`steps_per_execution` and `jit_compile` are set on the model with their
train and test functions (traced once, kept for the next fit); when fit
ends the user's values and functions are back, so evaluate() and predict()
run as compiled. Weights, metrics, history and checkpoints are those of the
same fit with the value written in compile (tests/strategy/
test_execution_choice.py). The measurement leaves every model and optimizer
variable (each replica's copy) as it found it.

The choice goes to the plan store's "executions" section (tf_glp/tuning/
store.py), reused by the next run with the same key.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
import warnings
import weakref

import keras
import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.profiling import optimizer_step
from tf_glp.strategy import fit_setup, update_choice
from tf_glp.tuning import store

SPE_CANDIDATES = (1, 4, 16)
ROUNDS = 5
# Candidates clearly slower than steps_per_execution=1 after this many
# rounds (fastest round over DROP_RATIO times 1's slowest) are dropped.
DROP_AFTER = 2
DROP_RATIO = 1.5
MIN_FIT_STEPS = 500
# Note [Weighing the measurement]: the rest may cost at most BUDGET times what
# the first round shows the largest count saving; a count PROBE_WIN or more
# faster in that round is taken at once.
BUDGET = 1.0
PROBE_WIN = 1.5
# Without the user's consent XLA is measured (for explain()'s hint) only where
# its compile costs at most this part of the fit's time as compiled.
XLA_HINT = 0.02
XLA_TRACES = 3  # XLA's compile, in traces of the step (about 3x on this machine's models)
# A step of at least this long has no dispatch cost worth removing.
LONG_STEP_S = 0.04
SECTION = store.EXECUTIONS
WHO = "tf_glp.Strategy (steps per execution)"
# Callbacks whose batch hooks do the same with N steps per call: Progbar
# draws every call, History keeps epochs; checkpoints saved per epoch
# (their batch hooks count batches only for an int save_freq).
INDIFFERENT = (keras.callbacks.ProgbarLogger, keras.callbacks.History)
PER_EPOCH = (keras.callbacks.ModelCheckpoint, keras.callbacks.BackupAndRestore)
BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end",
               "on_test_batch_begin", "on_test_batch_end")


@dataclasses.dataclass
class Way:
    """How fit runs its steps."""

    steps_per_execution: int = 1
    xla: bool = False

    @property
    def label(self) -> str:
        return f"{'XLA ' if self.xla else ''}{self.steps_per_execution}"

    @classmethod
    def of(cls, model) -> Way:
        return cls(int(model.steps_per_execution), bool(model.jit_compile))


@dataclasses.dataclass
class ModelExecution:
    """One model's ways: as compiled, as measured and as chosen."""

    compiled: Way | None  # read from the model at its first fit
    explicit: tuple[str, ...] = ()  # the compile arguments the user gave ("steps_per_execution", "jit_compile")
    measured: bool = False
    best: Way | None = None  # the fastest way without XLA (None: not decided yet; see `final`)
    xla_gain: float | None = None  # XLA's gain over best (measured), None where not measured
    xla_wins: bool = False
    xla_steps: int = 1  # the steps per execution XLA was measured at
    reason: str = "decided at the start of the first fit"
    times_ms: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    source: str = ""
    final: bool = False  # decided for good (else the next fit may measure: this one was too short, say)
    over_budget_at: int = 0  # the longest fit found too short for the budget (a longer one tries again)
    functions: dict = dataclasses.field(default_factory=dict)  # (spe, xla) -> (train, test function)


def batch_hook_callbacks(callbacks) -> list[str]:
    """The names of the callbacks whose batch-level hooks Keras would call
    less often with several steps per call."""
    names = []
    for callback in callbacks:
        if (isinstance(callback, INDIFFERENT) or type(callback).__module__.startswith("tf_glp.strategy.")
                or (isinstance(callback, PER_EPOCH) and callback.save_freq == "epoch")):
            continue
        if any(getattr(type(callback), hook, None) is not getattr(keras.callbacks.Callback, hook)
               for hook in BATCH_HOOKS):
            names.append(type(callback).__name__)
    return names


class ExecutionChoice:
    """The ways a tf_glp.Strategy runs fit, per model.

    Args:
        strategy: The tf_glp.Strategy (its settings: allow_xla, plan_path;
            XLA only on one device).
        clock: Seconds as a float (tests inject one; `current` names the
            way being timed). Defaults to `time.perf_counter`.
    """

    def __init__(self, strategy, clock=time.perf_counter):
        self._strategy = strategy
        self.allow_xla = strategy.settings.allow_xla and strategy._is_one_device
        self.plan_path = store.resolve(strategy.settings.plan_path)
        self.clock = clock
        self.current = ""  # the label of the way being timed (read by an injected clock)
        self.rounds = ROUNDS
        self.min_fit_steps, self.budget = MIN_FIT_STEPS, BUDGET
        self.probe_win, self.xla_hint = PROBE_WIN, XLA_HINT
        self._models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._last: tuple[ModelExecution, Way, str] | None = None  # (state, way in use, why) of the last fit

    # -- compile and fit ----------------------------------------------------
    def compiled(self, model, arguments: dict) -> None:
        """Called when `model` is compiled: its ways start anew (compile
        makes new step functions)."""
        self._models[model] = ModelExecution(
            None, tuple(name for name in ("steps_per_execution", "jit_compile") if name in arguments))

    def prepare(self, model, arguments: dict, batch: int | None, callbacks: list,
                before_measuring=None) -> list[keras.callbacks.Callback]:
        """At the start of fit (fit_setup.py): decides the ways for `model`
        (once), sets the one this fit may use, and returns the callbacks to
        add (the one that puts the user's way back when fit ends, and the
        announcement)."""
        state = self._models.get(model)
        if state is None:  # compiled before the strategy's patches saw it: its values count as given
            state = ModelExecution(Way.of(model), ("steps_per_execution", "jit_compile"))
            self._models[model] = state
        if state.compiled is None:
            state.compiled = Way.of(model)
        announce = False
        if not state.final:
            self._decide(state, model, arguments, batch, before_measuring)
            announce = state.source == "measured"
        way, why = self._way_for_this_fit(state, callbacks)
        self._last = (state, way, why)
        added = []
        current = Way.of(model)  # (the compiled way, or the chosen one after a fit that raised)
        if way != current:
            _switch(model, state, current, way)
        if way != state.compiled:
            added.append(PutBackExecution(state, way, state.compiled))
        if announce and arguments.get("verbose", "auto") != 0:
            added.append(update_choice.AnnounceChoice(self))
        return added

    def _way_for_this_fit(self, state: ModelExecution, callbacks: list) -> tuple[Way, str]:
        best = state.best
        if self.allow_xla and state.xla_wins:
            best = Way(state.xla_steps, True)  # (as measured)
        if best.steps_per_execution != state.compiled.steps_per_execution:
            hooked = batch_hook_callbacks(callbacks)
            if hooked:
                spe = state.compiled.steps_per_execution
                kept = Way(spe, best.xla and f"XLA {spe}" in state.times_ms)  # (XLA only where measured)
                return kept, (f"steps_per_execution kept at {kept.steps_per_execution}: "
                              f"{', '.join(hooked)} has batch-level hooks, which Keras would call every "
                              f"{best.steps_per_execution} steps{self._left_on_table(state, kept, best)}")
        return best, ""

    @staticmethod
    def _left_on_table(state: ModelExecution, kept: Way, best: Way) -> str:
        if kept.label in state.times_ms and best.label in state.times_ms:
            gain = statistics.median(state.times_ms[kept.label]) / statistics.median(state.times_ms[best.label])
            return f" ({best.steps_per_execution} measured {gain:.2f}x faster)"
        return ""

    # -- the decision -------------------------------------------------------
    def _decide(self, state: ModelExecution, model, arguments: dict, batch: int | None, before_measuring) -> None:
        compiled, strategy = state.compiled, self._strategy
        state.best, state.final = compiled, True
        if compat.in_multi_worker_mode(strategy) or strategy.micro_batches:
            state.reason = ("across workers" if compat.in_multi_worker_mode(strategy) else "with micro_batches")
            state.reason += " fit runs as compiled (not measured)"
            return
        spes = ([compiled.steps_per_execution] if "steps_per_execution" in state.explicit
                else _capped(SPE_CANDIDATES, _epoch_steps(arguments, batch)))
        # (With replicas XLA is refused: no_xla.py.)
        measure_xla = strategy._is_one_device and "jit_compile" not in state.explicit and not compiled.xla
        if len(spes) == 1 and not measure_xla:
            state.reason = "steps_per_execution and jit_compile as given in compile (not measured)"
            return
        fit_steps = _fit_steps(arguments, batch)
        state.final = False  # (below: not measured for this fit only, or measured)
        if fit_steps is None:
            state.reason = ("the fit's length is not known before training (an input of unknown cardinality; "
                            "steps_per_epoch makes it known): its measurement could not be weighed (not measured)")
            return
        if fit_steps <= state.over_budget_at:
            return  # (the reason stays: a fit this short was over the budget)
        if fit_steps < self.min_fit_steps:
            state.reason = (f"this fit runs {fit_steps} steps, fewer than {self.min_fit_steps}: measuring would "
                            f"cost a large part of it (not measured)")
            return
        if model.optimizer is None:
            state.reason = "the model is not compiled with an optimizer (not measured)"
            return
        batch_values, why = update_choice.first_batch(arguments, batch)
        if batch_values is None:
            state.reason = f"{why} (not measured)"
            return
        data = update_choice._packed(batch_values)  # noqa: SLF001 (this package's own helper)
        _build(model, data)
        candidates = [Way(spe, compiled.xla) for spe in spes]
        xla = Way(max(spes), True) if measure_xla else None
        path = self.plan_path
        key = _plan_key(model, strategy, batch, [w.label for w in candidates + ([xla] if xla else [])]) if path else None
        stored = store.read_plan(path, key, SECTION, _valid_entry, WHO) if path else None
        # (A way kept for a fit of some length: a longer fit may measure.)
        if stored is not None and fit_steps <= stored.get("kept_for_fit_steps", fit_steps):
            self._take(state, stored, source=f"reused {path}")
            state.final = "kept_for_fit_steps" not in stored
            state.over_budget_at = stored.get("kept_for_fit_steps", 0)
            return
        if before_measuring is not None:
            before_measuring(model)
        start = time.perf_counter()
        try:
            times, failed, first_s, notes, taken = measure(model, data, candidates, xla, self, fit_steps)
        except OverBudget as over:
            state.reason, state.over_budget_at = f"{over} (not measured further)", fit_steps
            if path:  # the next run of this fit (or a shorter one) need not trace it again
                store.write_entry(path, key, {"steps_per_execution": compiled.steps_per_execution,
                                              "reason": state.reason, "kept_for_fit_steps": fit_steps},
                                  SECTION, _valid_entry, WHO)
            return
        self._conclude(state, times, failed, first_s, time.perf_counter() - start, notes, taken)
        state.final = True
        if path:
            store.write_entry(path, key, {
                "steps_per_execution": state.best.steps_per_execution, "xla_gain": state.xla_gain,
                "xla_wins": state.xla_wins, "xla_steps": state.xla_steps, "reason": state.reason,
                "times_ms": state.times_ms}, SECTION, _valid_entry, WHO)

    def _conclude(self, state: ModelExecution, times: dict, failed: dict, first_s: dict, took_s: float,
                  notes: list[str], taken: Way | None) -> None:
        state.measured, state.source, state.times_ms = True, "measured", times
        base = state.compiled
        best, best_gain = base, 1.0
        for label, ms in times.items():
            way = _way_of(label)
            if way.xla or label == base.label or taken is not None:
                continue
            wins, gain = optimizer_step.beats(times[base.label], ms)
            if wins and gain > best_gain:
                best, best_gain = way, gain
        state.best = taken or best
        spes = [label for label in times if not _way_of(label).xla]
        if taken is not None:
            reason = notes.pop(0)
        elif best != base:
            reason = f"{best_gain:.2f}x faster than {base.steps_per_execution}, beyond the spread"
        elif len(spes) > 1:
            reason = "no other count faster beyond the spread"
        else:
            reason = f"a step takes {statistics.median(times[base.label]):.0f} ms: dispatch is too small a part of it"
        xla = next((label for label in times if _way_of(label).xla), None)
        if xla is not None:
            wins, gain = optimizer_step.beats(times[state.best.label], times[xla])
            state.xla_gain, state.xla_wins, state.xla_steps = gain, wins, _way_of(xla).steps_per_execution
            reason += (f"; XLA at {_way_of(xla).steps_per_execution}: {gain:.2f}x "
                       f"{'faster, beyond the spread' if wins else '(not faster beyond the spread)'}, "
                       f"its compile {first_s[xla]:.1f} s")
        for label, error in failed.items():
            reason += f"; {label} failed and was left out ({error})"
        state.reason = "; ".join([reason, *notes]) + f"; measured in {took_s:.1f} s"

    def _take(self, state: ModelExecution, stored: dict, source: str) -> None:
        state.best = Way(int(stored["steps_per_execution"]), state.compiled.xla)
        state.xla_gain, state.xla_wins = stored.get("xla_gain"), bool(stored.get("xla_wins"))
        state.xla_steps = int(stored.get("xla_steps") or 1)
        state.reason, state.times_ms, state.source = stored["reason"], stored.get("times_ms") or {}, source
        state.measured = True

    # -- what the user reads ------------------------------------------------
    @property
    def xla_in_use(self) -> bool:
        """Whether the last fit ran under XLA (with Keras' optimizer update)."""
        return self._last is not None and self._last[1].xla

    def line(self) -> str:
        """The execution line of explain() and of fit's announcement."""
        if self._last is None:
            return ("execution: decided at the start of the first fit (steps_per_execution measured; XLA "
                    "measured, used only with allow_xla=True)")
        state, way, why = self._last
        parts = [f"execution: steps_per_execution={way.steps_per_execution}, "
                 f"{'XLA (with Keras optimizer update)' if way.xla else 'no XLA'}: {why or state.reason}"]
        if why:
            parts.append(state.reason)
        if state.xla_wins and not way.xla:
            parts.append("XLA rounds differently: pass tf_glp.Strategy(allow_xla=True) to use it")
        if state.source and state.source != "measured":
            parts.append(state.source)
        if state.times_ms:
            parts.append("ms per step, medians: " + ", ".join(
                f"{label} {statistics.median(ms):.2f}" for label, ms in state.times_ms.items()))
        return "; ".join(parts)


def _valid_entry(entry: dict) -> bool:
    spe = entry.get("steps_per_execution")
    return isinstance(spe, int) and spe >= 1 and isinstance(entry.get("reason"), str)


def _plan_key(model, strategy, batch: int | None, candidates: list[str]) -> dict:
    """What the measurement depends on (not allow_xla: consent only decides
    whether a measured XLA win is taken)."""
    return {"schema": update_choice.SCHEMA, **store.machine(),
            "devices": list(strategy.extended.worker_devices), "global_batch": batch, "candidates": candidates,
            "update": strategy.concept,
            "optimizer": type(model.optimizer).__name__,
            "trainable": [[list(v.shape), str(v.dtype)] for v in model.trainable_variables]}


def _way_of(label: str) -> Way:
    xla = label.startswith("XLA ")
    return Way(int(label.split()[-1]), xla)


def _capped(candidates, epoch_steps: int | None) -> list[int]:
    """The candidates Keras would run whole: at most one epoch per call."""
    if epoch_steps is None:
        return list(candidates)
    kept = [c for c in candidates if c <= epoch_steps]
    return kept or [1]


def _epoch_steps(arguments: dict, batch: int | None) -> int | None:
    """fit's steps per epoch where known before training."""
    if arguments.get("steps_per_epoch"):
        return int(arguments["steps_per_epoch"])
    x = arguments.get("x")
    if isinstance(x, tf.data.Dataset):
        cardinality = int(x.cardinality())
        return cardinality if cardinality >= 0 else None
    samples = fit_setup.training_samples(arguments)
    return max(1, math.ceil(samples / batch)) if batch and samples is not None else None


def _fit_steps(arguments: dict, batch: int | None) -> int | None:
    """The steps of the whole fit where known (None: an input of unknown length)."""
    steps = _epoch_steps(arguments, batch)
    if steps is None:
        return None
    return steps * max(0, int(arguments.get("epochs", 1)) - int(arguments.get("initial_epoch", 0)))


def _build(model, data) -> None:
    """Builds the model, its metrics and optimizer as fit would."""
    if not compat.nothing_to_build(model):
        with model.distribute_strategy.scope():
            compat.symbolic_build(model, data)


# -- the measurement ---------------------------------------------------------
class OverBudget(Exception):
    """The rest of the measurement would cost more than it can save."""


def measure(model, data, candidates: list[Way], xla: Way | None, choice: ExecutionChoice,
            fit_steps: int | None = None):
    """Times each way on `data` (one batch, repeated) in interleaved rounds
    of the same steps; returns ({label: [ms per step per round]}, {label:
    error} for a way left out, {label: seconds of its first call}, [notes on
    what was not measured and why], the count taken after the first round
    or None).

    The way as compiled and the largest count are traced and timed first, in
    one round (Note [Weighing the measurement]); the rest only where it can
    pay for itself. Raises OverBudget where nothing more is measured and the
    way as compiled stays. Every model and optimizer variable ends as it
    started, the metrics reset."""
    optimizer, strategy = model.optimizer, model.distribute_strategy
    compiled, fused = Way.of(model), optimizer_step.uses_fused_update(optimizer)
    restore = update_choice.variables_kept(strategy, [*model.variables, *optimizer.variables])
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(data).repeat())
    functions, failed, first_s, notes, taken = {}, {}, {}, [], None
    times: dict[str, list[float]] = {}

    def trace(way: Way) -> float:
        """Traces `way` (XLA: compiles); returns one step's seconds from a
        second call. A way other than the user's that fails is left out."""
        try:
            start = time.perf_counter()
            function, iterator = _traced(model, way, fused, dataset)
            first_s[way.label] = time.perf_counter() - start
            update_choice._sync(function(iterator))  # noqa: SLF001 (a second call: the step's time)
            step_s = (time.perf_counter() - start - first_s[way.label]) / way.steps_per_execution
            functions[way.label] = (function, iterator)
            times[way.label] = []
            return step_s
        except Exception as error:  # noqa: BLE001 (a way that cannot run here, e.g. an op XLA lacks)
            if way == candidates[0]:
                raise  # the user's own way: its error is the user's
            failed[way.label] = f"{type(error).__name__}: {update_choice._gist(error)[:200]}"  # noqa: SLF001
            return math.inf

    def one_round(index: int) -> None:
        # The same steps for every way: the largest count traced (1 where
        # only XLA at 1 was, for a long step).
        steps = max(_way_of(label).steps_per_execution for label in functions)
        order = list(functions.items())
        order = order[index % len(order):] + order[:index % len(order)]
        for label, (function, iterator) in order:
            choice.current = label
            start = choice.clock()
            for _ in range(steps // _way_of(label).steps_per_execution):
                result = function(iterator)
            update_choice._sync(result)  # noqa: SLF001
            times[label].append(1e3 * (choice.clock() - start) / steps)

    try:
        base = candidates[0]
        step_s = trace(base)
        fit_s = (fit_steps or 0) * step_s
        if xla is not None and not choice.allow_xla and fit_steps is not None:
            # Its compile and its rounds (of the largest count's steps, or of one for a long step).
            round_steps = 1 if step_s >= LONG_STEP_S else xla.steps_per_execution
            cost_s = XLA_TRACES * first_s[base.label] + choice.rounds * round_steps * step_s
            if cost_s > choice.xla_hint * fit_s:
                notes.append(f"XLA not measured (allow_xla is off, and measuring it, about {cost_s:.1f} s, "
                             f"would be more than {choice.xla_hint:.0%} of this fit)")
                xla = None
        rounds_done = 0
        if step_s < LONG_STEP_S and len(candidates) > 1:
            largest = candidates[-1]
            trace(largest)
            verdict = "measure"
            if largest.label in functions:
                one_round(0)
                rounds_done = 1
                verdict, why = _weigh(choice, fit_steps, times[base.label][0], times[largest.label][0],
                                      first_s[base.label], candidates, xla, largest.steps_per_execution)
                if verdict == "keep":
                    raise OverBudget(why)
                if verdict == "take":
                    taken = largest
                    notes.insert(0, why)  # (the reason of the choice, first)
                    if xla is None:
                        return times, failed, first_s, notes, taken
            if verdict == "measure":
                for way in candidates[1:-1]:
                    trace(way)
        if xla is not None:
            trace(xla if step_s < LONG_STEP_S else Way(base.steps_per_execution, True))
        if len(functions) < 2:  # (one count or a long step, and XLA not measured or failed)
            first = (f"a step takes {1e3 * step_s:.0f} ms: dispatch is too small a part of it"
                     if len(candidates) > 1 else "steps_per_execution as given in compile")
            raise OverBudget("; ".join([first, *notes,
                                        *(f"{label} failed ({error})" for label, error in failed.items())]))
        for index in range(rounds_done, choice.rounds):
            if index == DROP_AFTER:
                slowest = max(times[base.label])
                for label in [n for n in functions if n != base.label]:
                    if min(times[label]) > DROP_RATIO * slowest:
                        del functions[label]
            if len(functions) > 1:
                one_round(index)
        return {label: ms for label, ms in times.items() if ms}, failed, first_s, notes, taken
    finally:
        choice.current = ""
        model.steps_per_execution, model.jit_compile = compiled.steps_per_execution, compiled.xla
        optimizer_step.use_fused_update(optimizer, fused)
        model.train_function = None
        restore()
        model.reset_metrics()


# Note [Weighing the measurement]
# Several steps per call change no number, so measuring them costs only
# time: the traces of each count and the rounds. The way as compiled (which
# fit traces anyway) and the largest count are traced and timed first, in
# one round of the same steps; what that round shows the largest count
# saving over the whole fit is weighed against what the rest would cost
# (the other counts' traces, XLA's compile where it is measured, the other
# rounds). Where the rest costs more than choice.budget times that saving,
# or where the largest count is choice.probe_win or more faster already (the rounds
# cannot change that choice, only confirm it), the measurement stops there:
# the way as compiled stays (OverBudget), a clear win is taken. So a long fit
# of a small model is measured and a fit whose steps are long is not, and a
# short fit pays two traces at most (none below MIN_FIT_STEPS).
def _weigh(choice: ExecutionChoice, fit_steps: int | None, base_ms: float, largest_ms: float, trace_s: float,
           candidates: list[Way], xla: Way | None, steps: int) -> tuple[str, str]:
    """After the first round (see the note above): ("measure", ""), ("keep",
    why: the way as compiled stays) or ("take", why: the largest count)."""
    if fit_steps is None:
        return "measure", ""
    saving_s = fit_steps * (base_ms - largest_ms) / 1e3
    largest, base = candidates[-1].steps_per_execution, candidates[0].steps_per_execution
    if saving_s <= 0:
        return "keep", (f"{largest} steps per call were not faster than {base} in a first round "
                        f"({largest_ms:.2f} against {base_ms:.2f} ms per step)")
    if base_ms >= choice.probe_win * largest_ms:
        return "take", (f"{base_ms / largest_ms:.2f}x faster than {base} in a first round, at least "
                        f"{choice.probe_win}x: taken without more rounds")
    ways = len(candidates) + (1 if xla else 0)
    rest_s = trace_s * (len(candidates) - 2 + (XLA_TRACES if xla else 0))
    rest_s += (choice.rounds - 1) * ways * steps * base_ms / 1e3
    if rest_s > choice.budget * saving_s:
        return "keep", (f"measuring further would take about {rest_s:.1f} s, more than the about {saving_s:.1f} s "
                        f"that {largest} steps per call were seen to save over this fit ({fit_steps} steps)")
    return "measure", ""


def _traced(model, way: Way, fused: bool, dataset) -> tuple:
    """fit's train function for `way` and an iterator over `dataset`, after
    its first call (the trace; XLA's compile)."""
    model.steps_per_execution = way.steps_per_execution
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (Keras warns where a layer does not support XLA: checked below)
        model.jit_compile = way.xla
    if model.jit_compile != way.xla:
        raise ValueError("a layer of this model does not support XLA (Keras' model_supports_jit)")
    optimizer_step.use_fused_update(model.optimizer, fused and not way.xla)  # (fused ops cannot run in XLA)
    model.make_train_function(force=True)
    function, iterator = model.train_function, iter(dataset)
    update_choice._sync(function(iterator))  # noqa: SLF001
    return function, iterator


# -- fit's side --------------------------------------------------------------
def _switch(model, state: ModelExecution, old: Way, new: Way) -> None:
    """Sets `new` on the model with its step functions (made by Keras when
    missing), keeping `old`'s for the way back."""
    state.functions[(old.steps_per_execution, old.xla)] = (model.train_function, model.test_function)
    model.steps_per_execution = new.steps_per_execution
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.jit_compile = new.xla
    if new.xla:
        optimizer_step.use_fused_update(model.optimizer, False)  # (fused ops cannot run in XLA)
    model.train_function, model.test_function = state.functions.pop(
        (new.steps_per_execution, new.xla), (None, None))


class PutBackExecution(keras.callbacks.Callback):
    """Puts the user's steps_per_execution and jit_compile back when fit
    ends (evaluate and predict then run as compiled)."""

    def __init__(self, state: ModelExecution, used: Way, compiled: Way):
        super().__init__()
        self._state, self._used, self._compiled = state, used, compiled

    def on_train_end(self, logs=None):
        _switch(self.model, self._state, self._used, self._compiled)
