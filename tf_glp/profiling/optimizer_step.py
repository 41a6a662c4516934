"""The optimizer step chosen at start-up: Keras' own update or tf_glp's fused
native one (for tf_glp.ops.FUSED_OPTIMIZERS), for a model trained without a
tf.distribute strategy on the CPU (or a one-device tf_glp.Strategy).

From the same gradients both compute the same numbers (FusedKerasUpdate
follows Keras' float32 operations), so the choice changes the speed, and
the gradients only by what Grappler's rewriting of a different graph
changes in their rounding (docs/numerics.md, "The fused optimizer update"). The fused update runs
inside Keras' own `apply` (clipping, EMA, constraints and the step counter
stay Keras'), through the `_backend_update_step` patch of
tf_glp/_keras/patches.py; `use_fused_update` turns it on for one optimizer.
It takes the dense gradients; a sparse one (IndexedSlices: an Embedding's)
goes to Keras' own update either way (keras_fused.fused_update_step).

When: at the first trace of the update (DecidedAtFirstTrace), where the
gradients the user's step computes are at hand: their types and shapes are
the ones timed, no trace is added, and fit's step functions trace once.

Timing: a copy of the optimizer (from its config) on scratch variables of
the shapes of the variables whose gradient is dense, at most
MAX_TIMED_PARAMETERS of them (the model and its optimizer are not touched);
the sparse ones run Keras' update in both ways and are not timed. Both
updates traced once, then timed by the host clock in interleaved rounds; a
round's call returns once the update has written the variables. A small
model's update takes a fraction of a millisecond, where a few rounds are
mostly the clock's and the call's jitter: their interquartile ranges
overlapped and a faster update went untaken (1.15x-1.35x by the medians on
the 64-32-10 MLP, whose fit it runs in about 18% less time), so short
updates run more rounds (ROUNDS_BUDGET_S).
"""

from __future__ import annotations

import statistics
import time

import keras
import numpy as np
import tensorflow as tf

from tf_glp._keras import compat, patches
from tf_glp.ops import supports_fused_update
from tf_glp.ops.keras_fused import fused_update_step
from tf_glp.tuning import rule

# The timed step updates at most this many parameters: the cost per
# parameter is what decides, and a copy of a huge model's state would cost
# memory (and start-up time) the user did not ask for. Two million float32
# parameters with two Adam moments are 24 MB, beyond the caches, so the
# timed update streams from memory as the real one does.
MAX_TIMED_PARAMETERS = 2_000_000
# Rounds run until both updates have `trials` and, while their time stays
# under this budget, up to MAX_TRIALS (the traces cost about 0.06 s).
ROUNDS_BUDGET_S = 0.025
MAX_TRIALS = 100


def eligible(model: keras.Model, one_device_strategy=None) -> tuple[bool, str]:
    """Whether the optimizer step can be chosen for this model, and why not:
    trained without a tf.distribute strategy, or under
    `one_device_strategy` (a one-device tf_glp.Strategy, which trains
    through plain Keras' path)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return False, "the model has no optimizer"
    under = model.distribute_strategy
    if under is not one_device_strategy and (
            tf.distribute.has_strategy() or not compat.is_default_strategy(under)):
        return False, "under a tf.distribute strategy (tf_glp.Strategy fuses the host update itself)"
    if getattr(model, "jit_compile", False) is True:
        return False, "XLA compiles the step (jit_compile=True): the fused ops cannot run inside XLA"
    if tf.config.list_logical_devices("GPU"):
        return False, "a GPU holds the variables"
    ok, why = supports_fused_update(optimizer, model.trainable_variables, update_step_only=True)
    if not ok:
        return False, why
    if not model.trainable_variables:
        return False, "no trainable variables"
    return True, ""


def use_fused_update(optimizer, fused: bool = True) -> None:
    """Runs `optimizer`'s update through the fused native ops (outside any
    tf.distribute strategy), from the next traced step on."""
    patches.set_fused_update(optimizer, fused_update_step if fused else None)


def uses_fused_update(optimizer) -> bool:
    """Whether `optimizer`'s update runs through the fused native ops (its
    dense gradients; for a DecidedAtFirstTrace, once it chose them)."""
    step = patches.fused_update_of(optimizer)
    if isinstance(step, DecidedAtFirstTrace):
        return step.record is not None and step.record["choice"] == "fused"
    return step is not None


def take(optimizer, record: dict) -> bool:
    """Sets the update `record` (see `record`) chose on `optimizer`; True if
    its step changed (a traced train function must then be traced anew)."""
    fused = record["choice"] == "fused"
    if fused == (patches.fused_update_of(optimizer) is fused_update_step):
        return False
    use_fused_update(optimizer, fused)
    return True


def _timed_shapes(variables) -> list[tuple[int, ...]]:
    """The scratch variables' shapes: the model's, largest first, while they
    fit in MAX_TIMED_PARAMETERS; a variable larger than that is timed on as
    many of its leading rows as fit (the update is elementwise, so rows
    cost what they cost in the whole variable)."""
    shapes, total = [], 0
    for variable in sorted(variables, key=lambda v: -int(np.prod(v.shape))):
        shape = [int(d) for d in variable.shape]
        if int(np.prod(shape)) > MAX_TIMED_PARAMETERS:
            shape[0] = max(1, MAX_TIMED_PARAMETERS // int(np.prod(shape[1:])))
        size = int(np.prod(shape))
        if shapes and total + size > MAX_TIMED_PARAMETERS:
            continue
        shapes.append(tuple(shape))
        total += size
    return shapes


def dense_gradient_variables(grads, variables) -> list:
    """The variables whose gradient is dense: those the fused update takes
    (an IndexedSlices one goes to Keras' update in both ways)."""
    return [v for g, v in zip(grads, variables) if g is not None and not isinstance(g, tf.IndexedSlices)]


def time_updates(optimizer, variables, trials: int = 5) -> tuple[list[float], list[float]]:
    """Seconds of one step of Keras' update and of the fused one, per trial
    (at least `trials`; more for short updates, see ROUNDS_BUDGET_S), on
    scratch variables of these variables' shapes with dense gradients."""
    patches.install()
    rng = np.random.default_rng(0)  # local: the global generators stay untouched
    shapes = _timed_shapes(variables)
    scratch = [keras.Variable(rng.random(shape, dtype=np.float32) - 0.5, name=f"scratch_{i}")
               for i, shape in enumerate(shapes)]
    grads = [tf.constant(rng.random(shape, dtype=np.float32) - 0.5) for shape in shapes]
    copy = type(optimizer).from_config(optimizer.get_config())
    copy.build(scratch)

    def step_function(fused: bool):
        @tf.function(autograph=False)
        def step():
            patches.set_fused_update(copy, fused_update_step if fused else None)  # read while tracing
            copy.apply(grads, scratch)
            return tf.reshape(scratch[0].value, [-1])[0]
        return step

    steps = {"native": step_function(False), "fused": step_function(True)}
    times = {"native": [], "fused": []}
    index = 0  # (round 0 is untimed: tracing and warm-up)
    while index <= trials or (index <= MAX_TRIALS and sum(times["native"]) + sum(times["fused"]) < ROUNDS_BUDGET_S):
        for name in (("native", "fused") if index % 2 == 0 else ("fused", "native")):
            start = time.perf_counter()
            steps[name]().numpy()
            if index:
                times[name].append(time.perf_counter() - start)
        index += 1
    patches.set_fused_update(copy, None)
    return times["native"], times["fused"]


def choose(native: list[float], fused: list[float]) -> tuple[str, str]:
    """("fused" | "native", why): fused where it beats Keras' update (the
    kit's rule, OPTIMIZER_STEP_GAIN)."""
    needed = rule.OPTIMIZER_STEP_GAIN
    wins, gain = rule.beats(native, fused, needed)
    if wins:
        return "fused", f"{gain:.2f}x faster than Keras' update"
    if gain >= needed:  # fast enough by the medians, but the timings overlap
        return "native", (f"the fused update measured {gain:.2f}x by the medians, but its timings overlap "
                          f"Keras' (it needs {needed}x with the interquartile ranges apart)")
    return "native", f"the fused update measured {gain:.2f}x (needs {needed}x, beyond the spread)"


def record(optimizer, native: list[float], fused: list[float], variables, all_variables=None) -> dict:
    """The plan's optimizer entry for these timings (of time_updates on
    `variables`, the dense-gradient ones of `all_variables`: all when not
    given; `measured` adds how many have sparse gradients)."""
    all_variables = variables if all_variables is None else all_variables
    choice, reason = choose(native, fused)
    return {"optimizer_class": type(optimizer).__name__, "choice": choice, "reason": reason,
            "native_ms": 1e3 * statistics.median(native), "fused_ms": 1e3 * statistics.median(fused),
            "timed_parameters": sum(int(np.prod(shape)) for shape in _timed_shapes(variables)),
            "parameters": _parameters(all_variables), "sparse_parameters": 0}


def _parameters(variables) -> int:
    return sum(int(np.prod(v.shape)) for v in variables)


def measured(optimizer, grads, variables, trials: int = 5) -> dict:
    """The record (see `record`) for the update of `variables` by these
    gradients (the user's, as the step computes them: only their types and
    shapes are read): Keras' update against the fused one on the variables
    whose gradient is dense."""
    dense = dense_gradient_variables(grads, variables)
    sparse = _parameters([v for g, v in zip(grads, variables) if isinstance(g, tf.IndexedSlices)])
    if not dense:
        return {"optimizer_class": type(optimizer).__name__, "choice": "native",
                "reason": "every gradient is sparse (IndexedSlices): Keras' update runs them either way",
                "parameters": _parameters(variables), "sparse_parameters": sparse}
    native, fused = time_updates(optimizer, dense, trials)
    return {**record(optimizer, native, fused, dense, variables), "sparse_parameters": sparse}


class DecidedAtFirstTrace:
    """An optimizer's step (patches.set_fused_update) until the first trace
    of its update, which decides it on the gradients it is given (see the
    module docstring): `decide(optimizer, grads, variables)` returns the
    record (`measured`'s, or a stored one); then the chosen update runs, in
    that trace and every later one.

    Args:
        decide: Returns the record; called once, outside the trace
            (tf.init_scope), with the optimizer, its gradients as the trace
            holds them, and the variables.
    """

    def __init__(self, decide):
        self._decide = decide
        self.record: dict | None = None

    def __call__(self, optimizer, grads, variables) -> tuple[list, list]:
        if self.record is None:
            with tf.init_scope():  # (the timing runs eagerly, beside the trace)
                self.record = self._decide(optimizer, list(grads), list(variables))
        if self.record["choice"] == "fused":
            return fused_update_step(optimizer, grads, variables)
        return list(grads), list(variables)
