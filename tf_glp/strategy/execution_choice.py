"""How a tf_glp.Strategy runs fit's steps: how many per call (Keras'
`steps_per_execution`) and, on one device and only with the user's consent
(`allow_xla=True`), whether XLA compiles them.

Why: a small model's step is mostly the fixed cost of dispatching it
(docs/performance.md). Several steps per call remove that cost and train
the same weights; Keras 3 does not choose the count by itself. XLA can be
much faster or much slower (benchmarks/RESULTS.md) and rounds differently,
so it is measured, named, and used only where the user allows it (with
replicas it is refused: tf_glp's host ops run outside it, no_xla.py).

Count 1 and the largest of 4 and 16 that Keras runs whole are measured on
the user's own training steps (Note [Counts on the real steps]): the
measurement costs count 1's trace, where its step is short, and the steps
run at the slower count. XLA changes the numbers: it is timed on a scratch
copy before fit (xla_rounds.py). A way wins with the kit's rule
(tuning/rule.py, COUNT_GAIN).

Kept as the user wrote it, not measured, in the cases docs/strategy.md
lists (`_decide`, batch_hook_callbacks).

The ways are set for fit only: when fit ends the user's values and
functions are back, so evaluate() and predict() run as compiled. Weights,
metrics, history and checkpoints are those of the same fit with the count
written in compile (tests/strategy/test_execution_choice.py). The choice
goes to the plan store's "executions" section (tf_glp/tuning/store.py):
the next run reuses it and measures nothing.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import warnings
import weakref

import keras
import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.profiling import optimizer_step
from tf_glp.strategy import xla_rounds
from tf_glp.tuning import rounds as rounds_lib, rule, store

SPE_CANDIDATES = (4, 16)  # the largest Keras runs whole (_whole) is timed against 1
ROUNDS = 5
# Note [Counts on the real steps]: more rounds run only where their steps
# are at most BUDGET of the fit's steps left; a largest count PROBE_WIN or
# more faster in the first round is taken at once.
BUDGET = 0.25
PROBE_WIN = 1.5
# The part of the fit's time measuring XLA may cost without allow_xla (xla_rounds.py).
XLA_HINT = 0.02
# A step of at least this long has no dispatch cost worth removing.
LONG_STEP_S = 0.04
WHO = "tf_glp.Strategy (steps per execution)"
# Callbacks whose batch hooks do the same with N steps per call: Progbar
# draws every call, History keeps epochs; checkpoints saved per epoch
# (their batch hooks count batches only for an int save_freq); TensorBoard
# writing per epoch without profiling (its batch hooks count batches for
# batch summaries, which then have no writer, and for the profiler).
INDIFFERENT = (keras.callbacks.ProgbarLogger, keras.callbacks.History)
PER_EPOCH = (keras.callbacks.ModelCheckpoint, keras.callbacks.BackupAndRestore)
BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end",
               "on_test_batch_begin", "on_test_batch_end")


@dataclasses.dataclass(frozen=True)
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
class RoundsSoFar:
    """Where CountRounds stood when a fit ended undecided: the counts it
    compares, each one's ms per step so far, the counts whose function has
    run (their traces are paid) and the calls still queued."""

    counts: tuple[int, ...]
    times: dict[int, list[float]]
    called: set[int]
    queue: list[int]


@dataclasses.dataclass
class ModelExecution:
    """One model's ways: as compiled, as measured and as chosen."""

    compiled: Way | None  # read from the model at its first fit
    explicit: tuple[str, ...] = ()  # the compile arguments the user gave ("steps_per_execution", "jit_compile")
    best: Way | None = None  # the fastest way without XLA
    xla_wins: bool = False
    xla_steps: int = 1  # the count XLA was measured at
    reason: str = "decided at the start of the first fit"
    times_ms: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    source: str = ""
    final: bool = False  # decided for good (else the next fit may measure: this one was too short, say)
    kept_for: tuple[int, Way] | None = None  # (fit steps, way) decided on a first round: a longer fit measures
    # The count rounds so far, where a fit ended before they decided: the
    # next fit goes on from there (Note [Counts on the real steps]).
    rounds: RoundsSoFar | None = None
    xla_note: str | None = None  # XLA's measurement (or why not): made once per model
    functions: dict = dataclasses.field(default_factory=dict)  # Way -> (train, test function)
    key: dict | None = None  # the plan store's key of this model's entry


def batch_hook_callbacks(callbacks) -> list[str]:
    """The names of the callbacks whose batch-level hooks Keras would call
    less often with several steps per call (a hook set on the instance,
    as keras.callbacks.LambdaCallback sets them, counts too; so does one a
    subclass of a callback that does the same at any count brings)."""
    names = []
    for callback in callbacks:
        if type(callback).__module__.startswith("tf_glp.strategy."):
            continue
        hooks = [getattr(hook, "__func__", hook) for hook in (getattr(callback, name, None) for name in BATCH_HOOKS)]
        if _same_at_any_count(callback):
            minds = any(not getattr(hook, "__module__", "").startswith(("keras.", "tf_glp.")) for hook in hooks)
        else:
            minds = any(hook is not getattr(keras.callbacks.Callback, name) for name, hook in zip(BATCH_HOOKS, hooks))
        if minds:
            names.append(type(callback).__name__)
    return names


def _same_at_any_count(callback) -> bool:
    """Whether Keras' (or tf_glp's) batch hooks of `callback` do the same
    at any number of steps per call (INDIFFERENT above)."""
    return (isinstance(callback, INDIFFERENT) or (isinstance(callback, PER_EPOCH) and callback.save_freq == "epoch")
            or (isinstance(callback, keras.callbacks.TensorBoard) and callback.update_freq == "epoch"
                and not compat.tensorboard_profiles(callback)))


class ExecutionChoice:
    """The ways a tf_glp.Strategy runs fit, per model.

    Args:
        strategy: The tf_glp.Strategy (its settings: allow_xla, plan_path;
            XLA only on one device).
    """

    def __init__(self, strategy):
        self._strategy = strategy
        self.allow_xla = strategy.settings.allow_xla and strategy._is_one_device
        self.plan_path = store.resolve(strategy.settings.plan_path)
        self.clock, self.current = time.perf_counter, ""  # (tests inject a clock; it reads `current`, the way timed)
        self.rounds, self.budget, self.probe_win, self.xla_hint = ROUNDS, BUDGET, PROBE_WIN, XLA_HINT
        self._models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._last: tuple[ModelExecution, Way, str] | None = None  # (state, way in use, why) of the last fit

    # -- compile and fit ----------------------------------------------------
    def compiled(self, model, arguments: dict) -> None:
        """Called when `model` is compiled: its ways start anew (compile
        makes new step functions)."""
        self._models[model] = ModelExecution(
            None, tuple(name for name in ("steps_per_execution", "jit_compile") if name in arguments))

    def prepare(self, model, arguments: dict, batch: int | None, callbacks: list) -> list:
        """At the start of fit (fit_setup.py): decides the ways for `model`
        (the counts, on this fit's steps), sets the one this fit uses, and
        returns the callbacks to add."""
        state = self._models.get(model)
        if state is None:  # compiled before the strategy's patches saw it: its values count as given
            state = ModelExecution(Way.of(model), ("steps_per_execution", "jit_compile"))
            self._models[model] = state
        if state.compiled is None:
            state.compiled = Way.of(model)
        counts = self._decide(state, model, arguments, batch, callbacks) if not state.final else []
        if counts:
            added = [CountRounds(self, state, counts, rounds_lib.fit_steps(arguments, batch),
                                 rounds_lib.epoch_steps(arguments, batch), arguments.get("verbose", "auto") != 0)]
            self._last = (state, Way(counts[-1]), "")
            model.steps_per_execution = counts[-1]  # (Keras' epoch loop calls fit's function every counts[-1] steps)
        else:
            way, why = self._way_for_this_fit(state, callbacks)
            self._last = (state, way, why)
            added = [PutBack(state, way)] if way != state.compiled else []
            _switch(model, state, Way.of(model), way)  # (the chosen way after a fit that raised: as compiled)
        if not counts and state.source == "measured" and arguments.get("verbose", "auto") != 0:
            added.append(rounds_lib.Announce(self))
        return added

    def _way_for_this_fit(self, state: ModelExecution, callbacks: list) -> tuple[Way, str]:
        best = Way(state.xla_steps, True) if self.allow_xla and state.xla_wins else state.best
        spe = state.compiled.steps_per_execution
        hooked = batch_hook_callbacks(callbacks)
        if best.steps_per_execution == spe or not hooked:
            return best, ""
        kept = Way(spe, best.xla and f"XLA {spe}" in state.times_ms)  # (XLA only where measured)
        gain = ""
        if kept.label in state.times_ms and best.label in state.times_ms:
            ratio = statistics.median(state.times_ms[kept.label]) / statistics.median(state.times_ms[best.label])
            gain = f" ({best.steps_per_execution} measured {ratio:.2f}x faster)"
        return kept, (f"steps_per_execution kept at {spe}: {', '.join(hooked)} has batch-level hooks, which Keras "
                      f"would call every {best.steps_per_execution} steps{gain}")

    # -- the decision -------------------------------------------------------
    def _decide(self, state: ModelExecution, model, arguments: dict, batch: int | None, callbacks: list) -> list[int]:
        """Decides what can be before fit; returns the counts to measure on
        this fit's steps ([] for none)."""
        compiled, strategy = state.compiled, self._strategy
        state.best, state.final = compiled, True
        where = ("across workers" if compat.in_multi_worker_mode(strategy)
                 else "with micro_batches" if strategy.micro_batches
                 else "with run_eagerly" if model.run_eagerly else "")
        if where:
            state.reason = f"{where} fit runs as compiled (not measured)"
            return []
        epoch_steps = rounds_lib.epoch_steps(arguments, batch)
        counts = ([compiled.steps_per_execution] if "steps_per_execution" in state.explicit
                  else [1, *_whole(epoch_steps, arguments)[-1:]])
        # (With replicas XLA is refused: no_xla.py.)
        measure_xla = strategy._is_one_device and "jit_compile" not in state.explicit and not compiled.xla
        if len(counts) == 1 and not measure_xla:
            state.reason = "steps_per_execution and jit_compile as given in compile (not measured)"
            return []
        fit_steps = rounds_lib.fit_steps(arguments, batch)
        state.final = False  # (below: not measured for this fit only, or measured)
        if fit_steps is None:
            state.reason = ("the fit's length is not known before training (an input of unknown cardinality; "
                            "steps_per_epoch makes it known): its measurement could not be weighed (not measured)")
            return []
        if state.kept_for and fit_steps <= state.kept_for[0]:
            state.best = state.kept_for[1]  # (the reason stays)
            return []
        if model.optimizer is None:
            state.reason = "the model is not compiled with an optimizer (not measured)"
            return []
        path = self.plan_path if self.plan_path and rounds_lib.keyed(model, arguments, batch) else None
        # (The key: what the measurement depends on; not allow_xla, which only decides whether a win is taken.)
        state.key = store.fit_key(model, strategy, batch, candidates=counts, xla=measure_xla,
                                  update=strategy.update_concept.name) if path else None
        stored = store.read_plan(path, state.key, store.EXECUTIONS, _valid_entry, WHO) if path else None
        # (A way kept for a fit of some length: a longer fit may measure.)
        if stored is not None and fit_steps <= stored.get("kept_for_fit_steps", fit_steps):
            state.best = Way(int(stored["steps_per_execution"]), compiled.xla)
            state.xla_wins, state.xla_steps = bool(stored.get("xla_wins")), int(stored.get("xla_steps") or 1)
            state.reason, state.times_ms = stored["reason"], stored.get("times_ms") or {}
            state.source, state.final = f"reused {path}", "kept_for_fit_steps" not in stored
            state.kept_for = None if state.final else (stored["kept_for_fit_steps"], state.best)
            return []
        notes = []
        if measure_xla:
            # Once per model: a later fit (a loop of short ones) neither traces nor times it again.
            if state.xla_note is None:
                state.xla_note = xla_rounds.measure(self, state, model, arguments, batch, Way(counts[-1]),
                                                    Way(counts[-1], True), fit_steps)
            notes.append(state.xla_note)
            if state.xla_wins and self.allow_xla:
                state.best, state.final, state.source = Way(counts[-1]), True, "measured"
                state.reason = "; ".join(notes)
                self._store(state, {})
                return []
        hooked = batch_hook_callbacks(callbacks)
        if len(counts) > 1 and hooked:
            notes.insert(0, f"steps_per_execution kept at {compiled.steps_per_execution}: {', '.join(hooked)} has "
                            f"batch-level hooks, which Keras would call once per call of several steps (not measured)")
        state.reason = "; ".join(notes)
        if len(counts) == 1 and state.times_ms:  # (XLA measured at the user's count: decided)
            state.final, state.source = True, "measured"
            self._store(state, {})
        return [] if len(counts) == 1 or hooked else counts

    def _store(self, state: ModelExecution, extra: dict) -> None:
        if state.key is not None:
            store.write_entry(self.plan_path, state.key, {
                "steps_per_execution": state.best.steps_per_execution, "xla_wins": state.xla_wins,
                "xla_steps": state.xla_steps, "reason": state.reason, "times_ms": state.times_ms, **extra},
                store.EXECUTIONS, _valid_entry, WHO)

    # -- what the user reads ------------------------------------------------
    @property
    def xla_in_use(self) -> bool:
        """Whether the last fit ran under XLA (with Keras' optimizer update)."""
        return self._last is not None and self._last[1].xla

    def line(self) -> str:
        """The execution line of explain() and of fit's announcement."""
        if self._last is None:
            return ("execution: decided at the start of the first fit (steps_per_execution measured on its "
                    "steps; XLA measured, used only with allow_xla=True)")
        state, way, why = self._last
        if not why and not state.reason:
            return f"execution: steps_per_execution measured on the first steps of the fit (at most {way.label})"
        parts = [f"execution: steps_per_execution={way.steps_per_execution}, "
                 f"{'XLA (with Keras optimizer update)' if way.xla else 'no XLA'}: {why or state.reason}"]
        if why and state.reason:
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


def _whole(epoch_steps: int | None, arguments: dict) -> list[int]:
    """The candidates Keras runs whole: at most an epoch per call, and
    divisors of fit's steps_per_epoch and validation_steps where given
    (Keras' loops make calls of N steps also where fewer are left, and the
    input need not end there: training would run more steps than asked,
    validation would average more batches)."""
    given = [int(arguments[name]) for name in ("steps_per_epoch", "validation_steps") if arguments.get(name)]
    return [c for c in SPE_CANDIDATES
            if (epoch_steps is None or c <= epoch_steps) and not any(steps % c for steps in given)]


def _switch(model, state: ModelExecution, old: Way, new: Way) -> None:
    """Sets `new` on the model with its step functions (made by Keras when
    missing), keeping `old`'s for the way back."""
    if old == new:
        return
    state.functions[old] = (model.train_function, model.test_function)
    model.steps_per_execution = new.steps_per_execution
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (Keras warns where a layer does not support XLA: checked when measured)
        model.jit_compile = new.xla
    if new.xla:
        optimizer_step.use_fused_update(model.optimizer, False)  # (fused ops cannot run in XLA)
    model.train_function, model.test_function = state.functions.pop(new, (None, None))


class PutBack(keras.callbacks.Callback):
    """Puts the user's steps_per_execution and jit_compile back when fit ends."""

    def __init__(self, state: ModelExecution, used: Way):
        super().__init__()
        self._state, self._used = state, used

    def on_train_end(self, logs=None):
        _switch(self.model, self._state, self._used, self._state.compiled)


# Note [Counts on the real steps]
# (What and why: docs/strategy.md, "The counts are measured on your own
# training steps".) Keras' epoch loop calls fit's train function every
# `largest` steps; that function is CountRounds, which runs each call's
# steps at the count being timed, on Keras' own train function at that
# count. Count 1 is timed first (LONG_STEP_S or more keeps it); then the
# largest, 1 and the largest: the first round, two calls of each compared
# by their means (_weigh); then up to choice.rounds, where budget allows.
# The weights are count 1's (tested bitwise against the count by hand).
def _weigh(choice: ExecutionChoice, fit_steps: int, rest_steps: int, one: list[float], many: list[float],
           largest: int) -> tuple[int | None, str, bool]:
    """After the first round (`one`, `many`: count 1's and the largest's ms
    per step; see the note above): (None, "", False) to measure on, or the
    count that runs from now, why, and whether for good (else for fits as
    long as this one)."""
    gain = statistics.mean(one) / statistics.mean(many)
    if gain >= choice.probe_win:
        return largest, (f"{gain:.2f}x faster than 1 in a first round, at least {choice.probe_win}x: taken "
                         f"without more rounds"), True
    # The rounds still to run take `largest` steps each at the slower count;
    # deciding right gains that count's difference on every step left.
    rounds_steps = (choice.rounds - 2) * largest
    if rounds_steps <= choice.budget * rest_steps:
        return None, "", False
    count = 1 if rule.beats(many, one, rule.COUNT_GAIN)[0] else largest
    return count, (f"{largest} steps per call {gain:.2f}x as fast as 1 in a first round (1 runs only where it is "
                   f"faster beyond the spread), kept for fits of up to {fit_steps} steps: more rounds would run "
                   f"{rounds_steps} of the {rest_steps} steps left at the slower count, more than {choice.budget} of "
                   f"them"), False


class CountRounds(keras.callbacks.Callback):
    """fit's train function while the counts are measured on its own steps
    (see the note above), and the callback that sets it up and puts the
    user's way back."""

    def __init__(self, choice: ExecutionChoice, state: ModelExecution, counts: list[int], fit_steps: int,
                 epoch_steps: int | None, announce: bool = True):
        super().__init__()
        self._choice, self._state, self._announce = choice, state, announce
        self._largest, self._fit_steps, self._epoch_steps = counts[-1], fit_steps, epoch_steps
        self._times: dict[int, list[float]] = {c: [] for c in counts}
        self._at: dict[int, object] = {}  # count -> Keras' own train function at that count
        self._called: set[int] = set()  # counts whose function has run (a new one traces: untimed)
        self._queue = [1]
        so_far = state.rounds
        if so_far is not None and so_far.counts == tuple(counts):  # an earlier fit's rounds, continued
            self._times = {c: list(ms) for c, ms in so_far.times.items()}
            self._called, self._queue = set(so_far.called), list(so_far.queue)
        self._winner, self._done, self._steps = None, 0, 0

    def on_train_begin(self, logs=None):
        model, state = self.model, self._state
        self._user_test = model.test_function
        # (XLA's weighing traced them on the first batch; else count 1's is the one fit made, untraced)
        largest = self._at[self._largest] = state.functions.pop(self._way(self._largest), (None, None))[0]
        self._called.update([self._largest] if largest else [])
        one = state.functions.pop(self._way(1), (None, None))[0]
        self._called.update([1] if one else [])  # (XLA's weighing ran it: its next call is timed)
        self._at[1] = one or model.train_function
        model.steps_per_execution, model.train_function, model.test_function = self._largest, self, None

    def _function(self, count: int):
        """Keras' own train function at `count` steps per call (made at its
        first use: the largest's trace is paid only where count 1's step was
        short). Keras reads the count where the function traces."""
        if self._at.get(count) is None:
            model = self.model
            model.steps_per_execution = count
            model.make_train_function(force=True)
            self._at[count], model.train_function = model.train_function, self
        return self._at[count]

    def _way(self, count: int) -> Way:
        return Way(count, self._state.compiled.xla)

    def on_epoch_begin(self, epoch, logs=None):
        self._done = 0

    def on_epoch_end(self, epoch, logs=None):
        if self._announce and self._winner is not None:
            print(f"tf_glp.Strategy: {self._choice.line()}", flush=True)
            self._announce = False

    def __call__(self, iterator):
        steps = min(self._largest, self._epoch_steps - self._done) if self._epoch_steps else self._largest
        self._done += steps
        self._steps += steps
        last = self._winner is None and self._steps >= self._fit_steps
        if last and steps < self._largest:
            self._unmeasured()  # (said before fit's callbacks end: the profiler's plan notes explain())
        if steps < self._largest:  # an epoch's last, shorter call (not timed)
            return self._run(self._largest if self._winner != 1 and self._largest in self._called else 1, steps,
                             iterator)
        if self._winner is not None or not self._queue:
            return self._run(self._winner or 1, steps, iterator)
        logs = self._measured_call(steps, iterator)
        if last and self._winner is None:  # (the fit's last call is timed too: a fit of two calls times one)
            self._unmeasured()
        return logs

    def _measured_call(self, steps: int, iterator):
        """Runs the next queued count's call: timed, or its trace."""
        count = self._queue.pop(0)
        if count not in self._called:  # (its first call traces: run, not timed, and queued again)
            self._queue.insert(0, count)
            logs = self._run(count, steps, iterator)
            rounds_lib.sync(logs)
            return logs
        self._choice.current = str(count)
        start = self._choice.clock()
        logs = self._run(count, steps, iterator)
        rounds_lib.sync(logs)
        self._times[count].append(1e3 * (self._choice.clock() - start) / steps)
        self._choice.current = ""
        if not self._queue:
            self._next_round()
        return logs

    def _run(self, count: int, steps: int, iterator):
        """Runs `steps` steps: at 1 per call, or in one call of the largest
        count. An epoch's last, shorter call comes only where the data ends
        the epoch (_whole), so the largest's function stops there, as
        Keras' own loop at that count does."""
        logs, model = None, self.model
        try:
            function, model.steps_per_execution = self._function(count), count
            self._called.add(count)
            for _ in range(1 if count == self._largest else steps):
                logs = function(iterator)
        except (StopIteration, tf.errors.OutOfRangeError):  # the input ended: what ran is this call's (Keras' own multi-step call does so)
            if logs is None:
                raise
        finally:
            model.steps_per_execution = self._largest
        return logs

    def _next_round(self) -> None:
        largest, choice = self._largest, self._choice
        one, many = self._times[1], self._times[largest]
        if not many:  # count 1 timed once
            if one[0] >= 1e3 * LONG_STEP_S:
                return self._decide(1, f"a step takes {one[0]:.0f} ms: dispatch is too small a part of it")
            self._queue = [largest, 1, largest]
            return None
        if len(many) == 2:  # the first round
            count, why, final = _weigh(choice, self._fit_steps, self._fit_steps - self._steps, one, many, largest)
            if count is not None:
                return self._decide(count, why, kept=not final)
        if min(len(one), len(many)) >= choice.rounds:  # (1 only where it is faster beyond the spread)
            wins, gain = rule.beats(many, one, rule.COUNT_GAIN)
            if wins:
                return self._decide(1, f"1 faster than {largest} steps per call beyond the spread ({gain:.2f}x)")
            return self._decide(largest, f"{1 / gain:.2f}x as fast as 1 by the medians (1 runs only where it is "
                                         f"faster beyond the spread)")
        self._queue = [1, largest] if len(one) % 2 else [largest, 1]
        return None

    def _decide(self, count: int, why: str, kept: bool = False) -> None:
        """Runs `count` from the next call on, and keeps the choice (`kept`:
        for fits as long as this one)."""
        choice, state = self._choice, self._state
        self._winner, self._queue, state.rounds = count, [], None
        state.best, state.source, state.final = self._way(count), "measured", not kept
        state.times_ms.update({str(c): ms for c, ms in self._times.items() if ms})
        state.reason = "; ".join([why, *([state.reason] if state.reason else []), "measured on this fit's steps"])
        state.kept_for = (self._fit_steps, state.best) if kept else None
        choice._store(state, {"kept_for_fit_steps": self._fit_steps} if kept else {})
        choice._last = (state, state.best, "")

    def _unmeasured(self) -> None:
        """The fit ends before the rounds do: 1 stays, and the next fit goes
        on with the rounds from where this one stopped."""
        state = self._state
        state.rounds = RoundsSoFar(tuple(self._times), {c: list(ms) for c, ms in self._times.items()},
                                   set(self._called), list(self._queue))
        self._winner, self._queue = 1, []
        timed = sum(len(ms) for ms in self._times.values())
        state.best, state.reason = state.compiled, (f"fit ended before the counts were measured ({timed} calls timed "
                                                    f"so far: the next fit goes on with them)")
        self._choice._last = (state, state.compiled, "")

    def on_train_end(self, logs=None):
        model, state = self.model, self._state
        if self._winner is None:  # (stopped early)
            self._unmeasured()
        if self._at.get(self._largest) is not None:  # (for the next fit, with the test function made at it)
            state.functions[self._way(self._largest)] = (self._at[self._largest], model.test_function)
        model.train_function, model.test_function = self._at[1], self._user_test
        model.steps_per_execution = 1
