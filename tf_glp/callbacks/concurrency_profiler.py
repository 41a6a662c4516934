"""ConcurrencyProfiler: chooses each layer's concurrency when training starts."""

from __future__ import annotations

import warnings

import keras
import tensorflow as tf

from tf_glp._keras import patches
from tf_glp.profiling import plan as plan_lib
from tf_glp.profiling import optimizer_step, profiler

_KERAS_DEFAULT_BATCH = 32


class ConcurrencyProfiler(keras.callbacks.Callback):
    """Measures each Conv2D / Dense layer before the first step and runs it
    over lanes where a lane count measures at least 2x faster than
    TensorFlow's own kernel, beyond the spread of the trials; otherwise the
    layer keeps TensorFlow's kernel.

    Add it to an existing `model.fit(...)`; nothing else changes. Eligible
    plain Keras layers become their tf_glp twins in place (same objects,
    same variables). The plan written after profiling (by default in the
    user's cache, one file per model) is reused by later runs with the same
    model, batch size, device and versions, without profiling; any other
    plan is ignored with a warning.

    Args:
        candidates, trials, convert, verbose: As in tf_glp.profile, except
            that `convert` also converts the plain layers (see above) and
            `verbose` defaults to 1, which also prints the table.
        plan_path: Where the plan is read from and written to: "auto", the
            model's file in the user's cache (`~/.cache/tf_glp/layer_plans`,
            or under `$TF_GLP_CACHE_DIR`; the path is printed, and kept in
            `plan_file`); a path; None, neither. Default "auto".
        log_dir: If set, TensorBoard summaries: the table as text, a
            per-layer chart as an image, the chosen levels as scalars.
            Default None.
        batch_size: The global batch size given to fit() (default: the
            model's fixed batch size, else Keras' default of 32). Under a
            tf.distribute strategy each replica's share is profiled.
        strip_path: If set, at the end of training the model is saved there
            with plain Keras layers (tf_glp.layers.strip), for a machine
            without tf_glp. Default None.
        optimizer_step: Also choose the optimizer's step (without a
            tf.distribute strategy, on the CPU, for tf_glp.ops.FUSED_OPTIMIZERS):
            Keras' update or tf_glp's fused native one, whichever measures
            faster on the model's shapes; both compute the same numbers
            from the same gradients (tf_glp.profiling.optimizer_step).
            Recorded in the plan. Default True.

    Example:
        >>> model.fit(x, y, batch_size=64,
        ...           callbacks=[tf_glp.callbacks.ConcurrencyProfiler(batch_size=64)])
    """

    def __init__(self, candidates="auto", trials: int = 5, plan_path: str | None = "auto",
                 log_dir: str | None = None, convert: bool = True, verbose: int = 1,
                 batch_size: int | None = None, strip_path: str | None = None, optimizer_step: bool = True):
        super().__init__()
        if candidates != "auto" and (not isinstance(candidates, (list, tuple)) or not all(
                isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in candidates)):
            raise ValueError(f"candidates must be 'auto' or a list of lane counts >= 1, got {candidates!r}")
        if trials < 1:
            raise ValueError(f"trials must be >= 1, got {trials}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if log_dir is not None:
            try:
                import tensorboard  # noqa: F401, PLC0415 (tf.summary needs it for text and images)
            except ImportError as error:
                raise ValueError("ConcurrencyProfiler(log_dir=...) needs TensorBoard: "
                                 "pip install 'tf_glp[tensorboard]'") from error
        self.candidates = candidates
        self.trials = trials
        self.plan_path = plan_path
        self.log_dir = log_dir
        self.convert = convert
        self.verbose = verbose
        self.batch_size = batch_size
        self.strip_path = strip_path
        self.optimizer_step = optimizer_step
        self._step: dict | None = None
        self.plan: plan_lib.Plan | None = None
        self.plan_file: str | None = None  # the file plan_path names for this model
        self.reused = False
        self._writes = True

    def _replica_batch(self) -> int:
        batch = self.batch_size
        if batch is None:
            fixed = self.model.inputs[0].shape[0] if getattr(self.model, "inputs", None) else None
            batch = int(fixed) if fixed else _KERAS_DEFAULT_BATCH
        replicas = self.model.distribute_strategy.num_replicas_in_sync
        return max(1, batch // replicas)

    def on_train_begin(self, logs=None):
        if getattr(self.model, "jit_compile", False):
            warnings.warn("tf_glp.callbacks.ConcurrencyProfiler: the model is compiled with XLA (jit_compile=True, "
                          "Keras' default on a machine with a GPU); tf_glp's concurrent ops cannot run inside XLA, so "
                          "nothing is profiled and every layer keeps XLA's kernels. To let the profiler choose, "
                          "compile with jit_compile=False.", stacklevel=2)
            return
        if not self.model.built:
            warnings.warn("tf_glp.callbacks.ConcurrencyProfiler: the model is not built when training begins "
                          "(without a strategy Keras builds a model without an Input in its first step, after this "
                          "callback starts), so nothing is profiled. Give it a keras.Input, call "
                          "model.build(input_shape) before fit, or train under tf_glp.Strategy(), which builds it "
                          "from the first batch.", stacklevel=2)
        layers, left_alone = profiler.layers_to_profile(self.model, self.convert)
        if not layers:
            if self._choose_optimizer_step():
                self.model.make_train_function(force=True)
            if (self._step or left_alone) and self.verbose:
                nothing_timed = plan_lib.Plan(header={}, layers=[], optimizer=self._step, left_alone=left_alone)
                print(f"tf_glp: no layer to profile\n{plan_lib.table(nothing_timed)}")
            return
        # Profile outside any replica context, on the first device. Across
        # workers only the chief writes the plan, and every worker runs the
        # chief's choices (agree_with_the_chief).
        extended = self.model.distribute_strategy.extended
        self._writes = getattr(extended, "should_checkpoint", True)
        self.plan, self.reused, self.plan_file = profiler.load_or_profile(
            layers, self._replica_batch(), self.plan_path, self.candidates, self.trials, self.verbose,
            write=self._writes, left_alone=left_alone)
        if hasattr(extended, "agree_with_the_chief"):
            self._take_the_chiefs_choices(extended.agree_with_the_chief)
        self._record_strategy()
        changed = profiler.apply_plan(layers, self.plan)
        changed = self._choose_optimizer_step() or changed
        if changed:
            # fit() made its step functions before this hook but has not
            # traced them yet: new ones trace the new kernels, at no extra cost.
            self.model.make_train_function(force=True)
            self.model.make_test_function(force=True)
            self.model.make_predict_function(force=True)
        if self.verbose:
            source = (f"reused {self.plan_file}" if self.reused
                      else f"profiled, written to {self.plan_file}" if self.plan_file and self._writes else "profiled")
            print(f"tf_glp concurrency plan ({source}):\n{plan_lib.table(self.plan)}")
        if self.log_dir:
            write_summaries(self.plan, self.log_dir)

    def _choose_optimizer_step(self) -> bool:
        """Chooses the optimizer step (the `optimizer_step` argument): reused
        from a matching plan, else decided at the first trace of the update
        on the step's own gradients (optimizer_step.DecidedAtFirstTrace);
        True if the optimizer's step changed."""
        ok, _ = optimizer_step.eligible(self.model)
        if not (ok and self.optimizer_step):
            return False
        optimizer = self.model.optimizer
        stored = self.plan.optimizer if self.plan is not None else None
        if self.reused and stored and stored.get("optimizer_class") == type(optimizer).__name__:
            self._step = stored
            return optimizer_step.take(optimizer, stored)
        patches.set_fused_update(optimizer, optimizer_step.DecidedAtFirstTrace(self._measured_step))
        return True

    def _measured_step(self, optimizer, grads: list, variables: list) -> dict:
        """The optimizer step measured on these gradients, put in the plan
        (and printed: the plan's table went out before the first trace)."""
        self._step = optimizer_step.measured(optimizer, grads, variables, self.trials)
        if self.verbose:
            print(plan_lib.optimizer_line(self._step), flush=True)
        if self.plan is not None:
            self.plan.optimizer = self._step
            if self.plan_file and self._writes:
                profiler.write_plan(self.plan, self.plan_file)
        return self._step

    def _take_the_chiefs_choices(self, agree) -> None:
        """Every worker runs the chief's plan: the same kernels, so the
        same forward pass on every worker (each may have measured otherwise)."""
        mine = [0 if layer.choice is None else layer.choice for layer in self.plan.layers]
        for layer, chief in zip(self.plan.layers, agree(mine)):
            choice = chief or None
            if choice != layer.choice:
                label = "native" if layer.choice is None else f"k={layer.choice}"
                layer.choice, layer.reason = choice, f"the chief's choice (this worker measured {label}: {layer.reason})"

    def _record_strategy(self) -> bool:
        """Puts tf_glp.Strategy's chunking decision (explain()) in the plan's
        notes, and in the plan file when it changed; True if it changed."""
        explain = getattr(self.model.distribute_strategy, "explain", None)
        if explain is None or self.plan.notes == [explain()]:
            return False
        self.plan.notes = [explain()]
        if self.plan_file and self._writes:
            profiler.write_plan(self.plan, self.plan_file)
        return True

    def on_train_end(self, logs=None):
        # On GPUs, chunking="auto" decides during the first steps: the note
        # taken at the start says so, the one taken now says what it chose.
        if self.plan is not None and self._record_strategy() and self.log_dir:
            write_summaries(self.plan, self.log_dir, step=1)
        if self.strip_path:
            from tf_glp.layers import strip  # noqa: PLC0415

            strip(self.model).save(self.strip_path)
            if self.verbose:
                print(f"tf_glp: saved {self.strip_path} with plain Keras layers (loads without tf_glp)")


def write_summaries(plan: plan_lib.Plan, log_dir: str, step: int = 0) -> None:
    """The plan in TensorBoard (ConcurrencyProfiler's `log_dir`)."""
    writer = tf.summary.create_file_writer(log_dir)
    with writer.as_default(step=step):
        tf.summary.text("tf_glp/concurrency_plan", "```\n" + plan_lib.table(plan) + "\n```")
        tf.summary.image("tf_glp/concurrency_chart", plan_lib.bar_chart(plan)[None])
        for layer in plan.layers:
            tf.summary.scalar(f"tf_glp/concurrency/{layer.name}", 0 if layer.choice is None else layer.choice)
    writer.close()  # flushes first
