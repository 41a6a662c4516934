"""The places where tf_glp.Strategy reaches into Keras 3.

Keras' TensorFlow optimizer sums gradients with a replica-context all-reduce
and then runs `update_step` per variable; to fuse the sum with the update on
the host, tf_glp.Strategy needs the replicas' gradients before they are summed.
Small wrappers do that, each a no-op unless the model or optimizer belongs to
a tf_glp.Strategy:

- TFOptimizer._backend_update_step: the fused host update (HostStrategy).
- TFOptimizer._apply_weight_decay: skipped when the fused update applies it.
- LossScaleOptimizer._tf_apply: dynamic loss scaling inside the host update
  (HostStrategy, loss_scaling.py).
- TFOptimizer._backend_apply_gradients: with gradient_accumulation_steps or
  ema_overwrite_frequency, apply_gradients.py (Keras' own fails under every
  tf.distribute strategy: a merge_call inside its `cond`).
- Trainer.compile: jit_compile="auto" becomes False (the host ops run
  outside XLA); jit_compile=True is refused with a clear message. (Patched
  on Keras' Trainer itself: Keras treats a Model whose compile differs from
  Trainer.compile as custom and then skips compile when loading it.)
- TensorFlowTrainer.fit: refuses a global batch that does not divide by the
  replica count, and decides chunking="auto" (chunking_decision.py).

They are installed once, when the first tf_glp.Strategy is created. If Keras
changes these private methods, install() warns and tf_glp.Strategy falls
back to Keras' own update (still with the native host reduction).
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings

_installed = False
_lock = threading.Lock()


def _glp_strategy(obj):
    """The tf_glp.Strategy that `obj` (a model or optimizer) runs under, if any.

    An optimizer created outside `strategy.scope()` (as in
    `model.compile(optimizer=keras.optimizers.SGD())` written before the
    scope) remembers the default strategy, yet runs its step inside the
    tf_glp.Strategy's replicas: then the current strategy decides.
    """
    import tensorflow as tf  # noqa: PLC0415

    strategy = getattr(obj, "_distribution_strategy", None) or getattr(obj, "_distribute_strategy", None)
    if getattr(strategy, "_is_tf_glp_strategy", False):
        return strategy
    current = tf.distribute.get_strategy()
    return current if getattr(current, "_is_tf_glp_strategy", False) else None


def install() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        _install_optimizer_hooks()
        _install_model_hooks()


_OPTIMIZER_METHODS = ("_backend_update_step", "_apply_weight_decay", "_backend_apply_gradients")


def _install_optimizer_hooks() -> None:
    import tensorflow as tf  # noqa: PLC0415

    from tf_glp.strategy.apply_gradients import apply_gradients, needs_own_apply  # noqa: PLC0415

    try:
        from keras.src.backend.tensorflow.optimizer import TFOptimizer  # noqa: PLC0415
    except ImportError:
        TFOptimizer = None  # noqa: N806
    if TFOptimizer is None or not all(hasattr(TFOptimizer, m) for m in _OPTIMIZER_METHODS):
        warnings.warn("tf_glp: this Keras version has no TFOptimizer._backend_update_step; "
                      "tf_glp.Strategy uses Keras' own optimizer update (no fused host update).", stacklevel=3)
        return
    original_update = TFOptimizer._backend_update_step
    original_decay = TFOptimizer._apply_weight_decay
    original_apply_gradients = TFOptimizer._backend_apply_gradients

    @functools.wraps(original_update)
    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        strategy = _glp_strategy(self)
        if strategy is None:
            return original_update(self, grads, trainable_variables, learning_rate)
        if strategy._apply_update(self, grads, trainable_variables):
            return None
        with strategy._reducing_gradients():  # Keras' all-reduce of the gradients
            return original_update(self, grads, trainable_variables, learning_rate)

    @functools.wraps(original_decay)
    def _apply_weight_decay(self, variables):
        strategy = _glp_strategy(self)
        if strategy is not None and strategy._fuses_update(self, variables):
            return None  # the fused update applies it, with the same learning rate
        return original_decay(self, variables)

    @functools.wraps(original_apply_gradients)
    def _backend_apply_gradients(self, grads, trainable_variables):
        strategy = _glp_strategy(self)
        if strategy is None or not needs_own_apply(self) or tf.distribute.get_replica_context() is None:
            return original_apply_gradients(self, grads, trainable_variables)
        return apply_gradients(self, grads, trainable_variables)

    TFOptimizer._backend_update_step = _backend_update_step
    TFOptimizer._backend_apply_gradients = _backend_apply_gradients
    TFOptimizer._apply_weight_decay = _apply_weight_decay
    _install_loss_scale_hook()


def _install_loss_scale_hook() -> None:
    import tensorflow as tf  # noqa: PLC0415
    from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer  # noqa: PLC0415

    if not hasattr(LossScaleOptimizer, "_tf_apply"):
        warnings.warn("tf_glp: this Keras version has no LossScaleOptimizer._tf_apply; under update='host' "
                      "loss scaling runs Keras' own way (finiteness of the first replica's gradients).",
                      stacklevel=4)
        return
    original_tf_apply = LossScaleOptimizer._tf_apply

    @functools.wraps(original_tf_apply)
    def _tf_apply(self, grads, trainable_variables=None):
        strategy = _glp_strategy(self)
        variables = trainable_variables if trainable_variables is not None else self._trainable_variables
        if (strategy is not None and tf.distribute.get_replica_context() is not None
                and strategy._apply_loss_scaled_update(self, grads, variables)):
            return None
        return original_tf_apply(self, grads, trainable_variables)

    LossScaleOptimizer._tf_apply = _tf_apply


def _install_model_hooks() -> None:
    from tf_glp.strategy import chunking_decision  # noqa: PLC0415
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer  # noqa: PLC0415
    from keras.src.trainers.trainer import Trainer  # noqa: PLC0415

    original_compile = Trainer.compile
    original_fit = TensorFlowTrainer.fit
    compile_signature = inspect.signature(original_compile)
    fit_signature = inspect.signature(original_fit)

    @functools.wraps(original_compile)
    def compile(self, *args, **kwargs):  # noqa: A001 (Keras' name)
        if _glp_strategy(self) is not None:
            bound = compile_signature.bind(self, *args, **kwargs)
            jit = bound.arguments.get("jit_compile", "auto")
            if jit is True:
                raise ValueError(
                    "tf_glp.Strategy does not support jit_compile=True: its host aggregation runs as native "
                    "host ops outside XLA. Compile with jit_compile=False (or leave the default).")
            bound.arguments["jit_compile"] = False
            result = original_compile(*bound.args, **bound.kwargs)
            return result
        return original_compile(self, *args, **kwargs)

    @functools.wraps(original_fit)
    def fit(self, *args, **kwargs):
        strategy = _glp_strategy(self)
        if strategy is not None:
            bound = fit_signature.bind(self, *args, **kwargs)
            _check_global_batch(bound.arguments, strategy.num_replicas_in_sync)
        if strategy is not None and not chunking_decision.decide_without_measuring(strategy):
            callbacks = list(bound.arguments.get("callbacks") or [])
            if not any(isinstance(c, chunking_decision.ChunkingDecision) for c in callbacks):
                callbacks.append(chunking_decision.ChunkingDecision(strategy))
            bound.arguments["callbacks"] = callbacks
            return original_fit(*bound.args, **bound.kwargs)
        return original_fit(self, *args, **kwargs)

    Trainer.compile = compile
    TensorFlowTrainer.fit = fit


def _check_global_batch(arguments: dict, replicas: int) -> None:
    """Each replica must get the same share of every full batch: otherwise
    Keras' per-replica loss scaling weights samples unequally."""
    import tensorflow as tf  # noqa: PLC0415

    x = arguments.get("x")
    batch = arguments.get("batch_size")
    if isinstance(x, tf.data.Dataset):
        batch = _dataset_batch_size(x)
    elif batch is None and (hasattr(x, "shape") or isinstance(x, (list, tuple, dict))):
        batch = 32  # Keras' default batch size for arrays
    if batch and batch % replicas:
        raise ValueError(
            f"tf_glp.Strategy: the global batch size {batch} does not divide by the {replicas} replicas, "
            f"so replicas would get unequal shares and Keras would weight samples unequally. "
            f"Use a multiple of {replicas}, e.g. {replicas * max(1, round(batch / replicas))}.")


def _dataset_batch_size(dataset) -> int | None:
    """The static batch size of a batched tf.data.Dataset, if it has one."""
    spec = dataset.element_spec
    first = spec
    while isinstance(first, (tuple, list)):
        first = first[0] if first else None
    if isinstance(first, dict):
        first = next(iter(first.values()), None)
    shape = getattr(first, "shape", None)
    if shape is not None and shape.rank and shape[0] is not None:
        return int(shape[0])
    size = getattr(dataset, "_batch_size", None)  # BatchDataset keeps it even with a partial last batch
    try:
        return int(size) if size is not None else None
    except TypeError:
        return None
