"""tf_glp.Strategy on one device: what `tf_glp.Strategy()` is on a machine
without GPUs (unless replicas are asked for).

Logical CPU replicas share the same cores: they add no compute, only the
fixed cost of a distributed step (the distributed iterator, the merge, the
reductions of the logs, a second replica's ops on the same cores: 1-2 ms
per step over plain Keras on a tiny model on this project's 2-core machine,
docs/performance.md). So without GPUs tf_glp trains on one
device through the path plain Keras takes, with one change where it pays:
the optimizer step runs through tf_glp's fused native update
(tf_glp.ops.FusedKerasUpdate, on float32 weights, for the dense gradients)
where that measured faster at the first trace of the update, on the
shapes and types of the step's own gradients (tf_glp.profiling.
optimizer_step), Keras' own update otherwise; and fit's steps run
several per call where that measured faster and no callback minds
(execution_choice.py; XLA too, with allow_xla=True).

The strategy is a OneDeviceStrategy whose datasets are not wrapped: Keras
then iterates them as it does without a strategy (OneDeviceStrategy's
distributed iterator costs about 0.3 ms per step), and its step holds no
merge and no reduction.
"""

from __future__ import annotations

import warnings

import keras
import tensorflow as tf

from tf_glp._keras import compat, patches
from tf_glp.ops.keras_fused import fused_optimizer
from tf_glp.profiling import optimizer_step, plan as plan_lib
from tf_glp.strategy import concepts
from tf_glp.strategy.strategy import HOST_DEVICE, ONE_DEVICE, Strategy
from tf_glp.tuning import store


class OneDeviceExtended(compat.one_device_extended_class()):
    """OneDeviceStrategy's extended object, datasets left as they are."""

    def _experimental_distribute_dataset(self, dataset, options):
        del options  # nothing to place: the one device reads the pipeline as plain Keras does
        return dataset


class OptimizerStepChoice:
    """The optimizer step of a one-device tf_glp.Strategy: Keras' update or
    the fused one, decided once per optimizer at the first trace of its
    update, on the gradients the user's step computes
    (optimizer_step.DecidedAtFirstTrace), and kept in the plan store, so
    that the next run trains as this one did."""

    def __init__(self, strategy):
        self._strategy = strategy
        self.record: dict | None = None  # the last decided optimizer's, for explain()

    def prepare(self, model, arguments: dict, batch: int | None, callbacks: list) -> list:
        """The start-up choice (tf_glp/tuning): an optimizer not decided yet
        gets the step that decides at its first trace (or Keras' update,
        with the reason, where the fused one cannot run)."""
        optimizer = model.optimizer
        if optimizer is None or patches.fused_update_of(optimizer) is not None or getattr(
                optimizer, _DECIDED, False):
            return []
        ok, why = optimizer_step.eligible(model, one_device_strategy=self._strategy)
        if not ok:
            self.record = {"optimizer_class": type(optimizer).__name__, "choice": "native", "reason": why}
            setattr(optimizer, _DECIDED, True)
            return []
        key = _step_key(model)
        patches.set_fused_update(optimizer, optimizer_step.DecidedAtFirstTrace(
            lambda optimizer, grads, variables: self._decide(key, optimizer, grads, variables)))
        return []

    def _decide(self, key: dict, optimizer, grads: list, variables: list) -> dict:
        """The record for `optimizer`: the stored one for this key, else
        measured on these gradients (and stored)."""
        setattr(optimizer, _DECIDED, True)
        key = {**key, "sparse": [isinstance(g, tf.IndexedSlices) for g in grads]}
        path = store.resolve(self._strategy.settings.plan_path)
        stored = store.read_plan(path, key, store.OPTIMIZER_STEPS, _valid_step, WHO) if path else None
        if stored is not None:
            self.record = {**{k: v for k, v in stored.items() if k != "key"}, "source": f"reused {path}"}
        else:
            self.record = optimizer_step.measured(optimizer, grads, variables)
            if path:
                store.write_entry(path, key, self.record, store.OPTIMIZER_STEPS, _valid_step, WHO)
        return self.record

    def explain_line(self) -> str:
        if self.record is None:
            return ("  optimizer step: decided at the first trace of the update in the first fit (Keras' update "
                    "or the fused one, timed on the step's own gradients)")
        return f"  {plan_lib.optimizer_line(self.record)}"


# Set on an optimizer whose step is decided (its record is the choice's).
_DECIDED = "_tf_glp_step_decided"
WHO = "tf_glp.Strategy (optimizer step)"


def _step_key(model: keras.Model) -> dict:
    """What the optimizer-step timing depends on: the update kind the
    optimizer's settings choose, the shapes it updates, the machine."""
    return store.model_key(model, update=fused_optimizer(model.optimizer).host_update(model.optimizer).kind)


def _valid_step(entry: dict) -> bool:
    return entry.get("choice") in ("fused", "native") and all(
        isinstance(entry.get(field), (int, float)) for field in ("parameters", "sparse_parameters")) and (
        entry["choice"] == "native" or all(isinstance(entry.get(field), (int, float))
                                           for field in ("native_ms", "fused_ms", "timed_parameters")))


class SingleDeviceStrategy(Strategy, tf.distribute.OneDeviceStrategy, placement=ONE_DEVICE,
                           serves=concepts.SERVED):
    """tf_glp.Strategy on one device: `tf_glp.Strategy()` on a machine
    without GPUs (see the module docstring). Any `update=` is accepted:
    with one device there is nothing to sum.

    Example:
        >>> strategy = tf_glp.Strategy()  # no GPUs: one device
        >>> with strategy.scope():
        ...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        ...     model.compile(optimizer="adam", loss="mse")
        >>> model.fit(x, y, batch_size=32)
        >>> print(strategy.explain())
    """

    _is_one_device = True

    def _init_distribution(self) -> None:
        self._set_up([HOST_DEVICE])
        if self.compression:
            warnings.warn(f"tf_glp.Strategy: compression={self.compression!r} has nothing to compress on one device "
                          f"(no gradient crosses to the host); pass cpu_replicas=N to train N replicas.", stacklevel=4)
        self._step_choice = OptimizerStepChoice(self)
        tf.distribute.Strategy.__init__(self, OneDeviceExtended(self, HOST_DEVICE))

    def _own_choices(self) -> dict:
        return {"optimizer step": self._step_choice}

    def _prepare_compile(self, model, arguments: dict) -> None:
        self._choices["execution"].compiled(model, arguments)  # (XLA: the user's jit_compile stands)

    def _fuses_update(self, optimizer, variables) -> bool:
        # Never inside a multi-replica step: on one device the fused update
        # is the optimizer-step choice's (patches.set_fused_update).
        return False

    def explain(self) -> str:
        """Why one device, which optimizer step runs and how many steps per
        call (with their timings)."""
        return "\n".join([
            f"tf_glp.Strategy({self.settings.describe()}) on one device ({HOST_DEVICE}): no GPUs, so it trains on "
            f"Keras' own path (its train step and input pipeline) with the optimizer step and execution below; "
            f"logical CPU replicas would share these cores and only add tf.distribute's fixed "
            f"cost per step (cpu_replicas=N trains N replicas, to try multi-replica code)",
            ("  optimizer step: Keras' own (XLA compiles the step, and tf_glp's fused ops cannot run inside it)"
             if self._choices["execution"].xla_in_use else self._step_choice.explain_line()),
            f"  {self._choices['execution'].line()}"])
