"""The places where tf_glp.Strategy reaches into Keras 3.

Keras' TensorFlow optimizer sums gradients with a replica-context all-reduce
and then runs its update per variable copy; tf_glp.Strategy takes the whole
optimizer step out of the replicas' step instead (strategy.py): one merge,
the host sum, Keras' own apply once in cross-replica context. Small wrappers
do that, each a no-op unless the model or optimizer belongs to a
tf_glp.Strategy:

- BaseOptimizer.apply (and the `apply` of every keras.optimizers class that
  has its own, such as MultiOptimizer): the step from the replicas
  (Strategy._apply_once).
- LossScaleOptimizer._tf_apply: the same, with its backend-neutral apply
  (finite check, inner step or skip, scale update) as the step.
- An optimizer met unbuilt in the replicas' step (a custom loop) is built
  first, outside the trace, as `fit` builds it
  (Strategy._build_outside_the_trace): in BaseOptimizer.apply's wrapper
  above, and in LossScaleOptimizer.apply, which builds before _tf_apply.
- tf.__internal__.distribute.interim.maybe_merge_call (what Keras' TF
  optimizer calls for weight decay, updates and accumulation): in the
  cross-replica context of a tf_glp.Strategy, where that step runs, it calls
  the function directly instead of failing for want of a replica context.
- TFOptimizer._backend_update_step: the fused host update (update="host",
  SGD / Adam / AdamW; and on one device where it measured faster: without
  a strategy as the start-up profiler chose it,
  tf_glp.profiling.optimizer_step, or under a one-device tf_glp.Strategy,
  one_device.py).
- TFOptimizer._apply_weight_decay: skipped when the fused update applies it.
- Trainer.compile: with replicas, jit_compile="auto" becomes False (the
  host ops run outside XLA) and jit_compile=True is refused with a clear
  message; on one device compile is Keras' own. (Patched
  on Keras' Trainer itself: Keras treats a Model whose compile differs from
  Trainer.compile as custom and then skips compile when loading it.)
- TensorFlowTrainer.train_step, Keras' (un)scale_loss_for_distribution,
  SeedGenerator.next and BatchNormalization._moments: a micro-batched step
  (micro_batches.py), only under micro_batches=M.
- TensorFlowTrainer.fit: refuses a global batch that does not divide by the
  replica count (or, with micro_batches, by M), decides chunking="auto"
  (chunking_decision.py), puts tf_glp's BackupAndRestore in place of a plain
  Keras one (chief-only writes across workers, batch-level resume;
  callbacks/backup_and_restore.py), and on one device adds the optimizer
  step's decision (one_device.py).

A one-device tf_glp.Strategy (no GPUs, no replicas asked for) takes none
of the multi-replica paths: Keras' own step runs, as without a strategy,
with only the fused update where it measured faster.

They are installed once, when the first tf_glp.Strategy is created, after
_keras_compat.require_internals() has checked that the installed Keras still
has every method they wrap (it raises, naming what changed, if not).
"""

from __future__ import annotations

import functools
import inspect
import math
import threading

import keras
import tensorflow as tf

from tf_glp import _keras_compat
from tf_glp.ops import FusedKerasUpdate
from tf_glp.ops.keras_fused import FUSED_FLAG
from tf_glp.strategy import chunking_decision, micro_batches

_installed = False
_lock = threading.Lock()

_MERGE_CALL = ("tensorflow._api.v2.__internal__.distribute", "interim")
_BASE_OPTIMIZER = ("keras.src.optimizers.base_optimizer", "BaseOptimizer")
_TF_OPTIMIZER = ("keras.src.backend.tensorflow.optimizer", "TFOptimizer")
_LOSS_SCALE_OPTIMIZER = ("keras.src.optimizers.loss_scale_optimizer", "LossScaleOptimizer")
_TRAINER = ("keras.src.trainers.trainer", "Trainer")
_TF_TRAINER = ("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer")
_LOSSES = ("keras.src.losses", "loss")
_SEED_GENERATOR = ("keras.src.random.seed_generator", "SeedGenerator")
_BATCH_NORMALIZATION = ("keras.src.layers.normalization.batch_normalization", "BatchNormalization")


def _glp_strategy(obj):
    """The tf_glp.Strategy that `obj` (a model or optimizer) runs under, if any.

    An optimizer created outside `strategy.scope()` (as in
    `model.compile(optimizer=keras.optimizers.SGD())` written before the
    scope) remembers the default strategy, yet runs its step inside the
    tf_glp.Strategy's replicas: then the current strategy decides.
    """
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
        _keras_compat.require_internals()
        _install_merge_call_hook()
        _install_optimizer_hooks()
        _install_loss_scale_hook()
        _install_model_hooks()
        _install_micro_batch_hooks()
        _installed = True


def _wrap(owner: tuple[str, str], name: str, make_wrapper) -> None:
    """Replaces owner.name by make_wrapper(original), keeping its metadata."""
    cls = _keras_compat.keras_class(*owner)
    original = getattr(cls, name)
    setattr(cls, name, functools.wraps(original)(make_wrapper(original)))


def _in_replicas_step(strategy) -> bool:
    """Whether the caller runs inside `strategy`'s replicas (not in
    cross-replica context, where tf_glp's own step calls Keras)."""
    context = tf.distribute.get_replica_context()
    return strategy is not None and context is not None and context.strategy is strategy


def _install_merge_call_hook() -> None:
    def maybe_merge_call(original):
        def maybe_merge_call(fn, strategy, *args, **kwargs):
            if tf.distribute.get_replica_context() is None and getattr(strategy, "_is_tf_glp_strategy", False):
                return fn(strategy, *args, **kwargs)  # already where the merge would go
            return original(fn, strategy, *args, **kwargs)
        return maybe_merge_call

    _wrap(_MERGE_CALL, "maybe_merge_call", maybe_merge_call)


def _one_device(strategy) -> bool:
    """Whether `strategy` is a one-device tf_glp.Strategy: plain Keras' path."""
    return getattr(strategy, "_is_one_device", False)


def _fused_on_one_device(optimizer) -> bool:
    """Whether the fused update was chosen for this optimizer on one device:
    by the start-up profiler (tf_glp.profiling.optimizer_step) without a
    strategy, or by a one-device tf_glp.Strategy; never inside XLA."""
    if not getattr(optimizer, FUSED_FLAG, False) or _keras_compat.in_xla_context():
        return False
    strategy = _glp_strategy(optimizer)
    return _one_device(strategy) if strategy is not None else not tf.distribute.has_strategy()


def _install_optimizer_hooks() -> None:
    def apply(original):
        def apply(self, grads, trainable_variables=None):
            strategy = _glp_strategy(self)
            if not _in_replicas_step(strategy) or len(grads) == 0:
                return original(self, grads, trainable_variables)
            if not self.built and trainable_variables is not None:
                strategy._build_outside_the_trace(self, trainable_variables)
            if _one_device(strategy):  # nothing to sum: Keras' own step, as without a strategy
                return original(self, grads, trainable_variables)
            return strategy._apply_once(self, lambda g, v: original(self, g, v), grads, trainable_variables)
        return apply

    def backend_update_step(original):
        def _backend_update_step(self, grads, trainable_variables, learning_rate):
            strategy = _glp_strategy(self)
            if _fused_on_one_device(self):
                if not any(isinstance(g, tf.IndexedSlices) for g in grads):
                    FusedKerasUpdate(self, update_step_only=True).apply(
                        [[g] for g in grads], trainable_variables, increment_iterations=False)
                    return None
                # Sparse gradients: Keras' own update, with the weight decay
                # the hook below skipped.
                _keras_compat.apply_weight_decay_to_copy(self, trainable_variables)
            if strategy is None or _one_device(strategy):
                return original(self, grads, trainable_variables, learning_rate)
            if strategy._apply_update(self, grads, trainable_variables):
                return None
            with strategy._reducing_gradients():  # Keras' all-reduce, if called from a replica
                return original(self, grads, trainable_variables, learning_rate)
        return _backend_update_step

    def apply_weight_decay(original):
        def _apply_weight_decay(self, variables):
            strategy = _glp_strategy(self)
            if _fused_on_one_device(self) or (strategy is not None and strategy._fusing_now(self, variables)):
                return None  # the fused update applies it, with the same learning rate
            return original(self, variables)
        return _apply_weight_decay

    _wrap(_BASE_OPTIMIZER, "apply", apply)
    # Keras optimizers with an `apply` of their own (MultiOptimizer): the
    # same step, so that what their apply writes (its own step counter) is
    # written once. LossScaleOptimizer's is wrapped at `_tf_apply` instead.
    loss_scale_optimizer = _keras_compat.keras_class(*_LOSS_SCALE_OPTIMIZER)
    classes = {id(c): c for c in vars(keras.optimizers).values() if isinstance(c, type)}
    for cls in classes.values():
        if (issubclass(cls, keras.optimizers.Optimizer) and "apply" in vars(cls)
                and not issubclass(cls, loss_scale_optimizer)):
            _wrap((cls.__module__, cls.__name__), "apply", apply)
    _wrap(_TF_OPTIMIZER, "_backend_update_step", backend_update_step)
    _wrap(_TF_OPTIMIZER, "_apply_weight_decay", apply_weight_decay)


def _install_loss_scale_hook() -> None:
    def tf_apply(original):
        def _tf_apply(self, grads, trainable_variables=None):
            strategy = _glp_strategy(self)
            if not _in_replicas_step(strategy) or _one_device(strategy):
                return original(self, grads, trainable_variables)
            return strategy._apply_once(
                self, lambda g, v: _keras_compat.apply_loss_scaled(self, g, v), grads, trainable_variables,
                loss_scaled=True)
        return _tf_apply

    def apply(original):
        # Its own apply builds it (in the replicas' step) before _tf_apply.
        def apply(self, grads, trainable_variables=None):
            strategy = _glp_strategy(self)
            if _in_replicas_step(strategy) and not self.built and trainable_variables is not None:
                strategy._build_outside_the_trace(self, trainable_variables)
            return original(self, grads, trainable_variables)
        return apply

    _wrap(_LOSS_SCALE_OPTIMIZER, "_tf_apply", tf_apply)
    _wrap(_LOSS_SCALE_OPTIMIZER, "apply", apply)


def _install_model_hooks() -> None:
    compile_signature = inspect.signature(_keras_compat.keras_class(*_TRAINER).compile)
    fit_signature = inspect.signature(_keras_compat.keras_class(*_TF_TRAINER).fit)

    def compile_wrapper(original):
        # Patched on Keras' Trainer itself: Keras treats a Model whose compile
        # differs from Trainer.compile as custom and skips compile on load.
        def compile(self, *args, **kwargs):  # noqa: A001 (Keras' name)
            strategy = _glp_strategy(self)
            if strategy is None or _one_device(strategy):  # (one device: the fused update stays out of XLA)
                return original(self, *args, **kwargs)
            bound = compile_signature.bind(self, *args, **kwargs)
            if bound.arguments.get("jit_compile", "auto") is True:
                raise ValueError(
                    "tf_glp.Strategy does not support jit_compile=True: its host aggregation runs as native "
                    "host ops outside XLA. Compile with jit_compile=False (or leave the default).")
            bound.arguments["jit_compile"] = False
            return original(*bound.args, **bound.kwargs)
        return compile

    def fit_wrapper(original):
        def fit(self, *args, **kwargs):
            strategy = _glp_strategy(self)
            if strategy is None:
                return original(self, *args, **kwargs)
            bound = fit_signature.bind(self, *args, **kwargs)
            batch = _global_batch(bound.arguments)
            _check_global_batch(batch, strategy.num_replicas_in_sync)
            if strategy.micro_batches:
                micro_batches.check_fit(self, strategy, batch, _training_samples(bound.arguments))
            if _keras_compat.in_multi_worker_mode(strategy):
                strategy.extended.check_same_on_every_worker(
                    [batch or 0], "the workers' global batch sizes differ ({low} to {high}; 0: not known before "
                    "training): every worker must use the same global batch size.")
            given = bound.arguments.get("callbacks")
            callbacks = list(given or [])
            if not isinstance(given, keras.callbacks.CallbackList):  # a CallbackList is the user's, whole
                callbacks = [_upgraded(c) for c in callbacks]
            if not chunking_decision.decide_without_measuring(strategy):
                if not any(isinstance(c, chunking_decision.ChunkingDecision) for c in callbacks):
                    callbacks.append(chunking_decision.ChunkingDecision(strategy))
            if _one_device(strategy) and not strategy.optimizer_step_decided(self.optimizer):
                callbacks.append(strategy.optimizer_step_decision())
            if callbacks != list(given or []):
                bound.arguments["callbacks"] = callbacks
            return original(*bound.args, **bound.kwargs)
        return fit

    _wrap(_TRAINER, "compile", compile_wrapper)
    _wrap(_TF_TRAINER, "fit", fit_wrapper)


def _install_micro_batch_hooks() -> None:
    def train_step(original):
        def train_step(self, data):
            strategy = _glp_strategy(self)
            if strategy is None or not strategy.micro_batches:
                return original(self, data)
            return micro_batches.train_step(self, data, strategy)
        return train_step

    _wrap(_TF_TRAINER, "train_step", train_step)
    _wrap(_SEED_GENERATOR, "next", micro_batches.seed_next)
    _wrap(_BATCH_NORMALIZATION, "_moments", micro_batches.batch_norm_moments)
    _wrap(_LOSSES, "scale_loss_for_distribution",
          lambda original: micro_batches.scale_for_distribution(original, inverse=False))
    _wrap(_LOSSES, "unscale_loss_for_distribution",
          lambda original: micro_batches.scale_for_distribution(original, inverse=True))


def _upgraded(callback):
    """A plain keras.callbacks.BackupAndRestore becomes tf_glp's, with the
    same arguments: chief-only writes across workers, batch-level resume,
    atomic backups (tf_glp/callbacks/backup_and_restore.py)."""
    from tf_glp.callbacks.backup_and_restore import BackupAndRestore  # noqa: PLC0415 (imports Keras callbacks)

    if type(callback) is keras.callbacks.BackupAndRestore:
        return BackupAndRestore.from_keras(callback)
    return callback


def _global_batch(arguments: dict) -> int | None:
    """fit's global batch size, where it can be known before training."""
    x = arguments.get("x")
    batch = arguments.get("batch_size")
    if isinstance(x, tf.data.Dataset):
        batch = _keras_compat.dataset_batch_size(x)
    elif batch is None and (hasattr(x, "shape") or isinstance(x, (list, tuple, dict))):
        batch = 32  # Keras' default batch size for arrays
    return batch


def _training_samples(arguments: dict) -> int | None:
    """How many samples an epoch of fit trains on, for array inputs without
    steps_per_epoch (Keras keeps the first floor(n * (1 - validation_split))
    for training); None where that is not known before training."""
    x = arguments.get("x")
    first = tf.nest.flatten(x)[0] if isinstance(x, (list, tuple, dict)) and x else x
    if arguments.get("steps_per_epoch") or isinstance(x, tf.data.Dataset) or not getattr(first, "shape", None):
        return None
    samples = int(first.shape[0])
    split = arguments.get("validation_split") or 0.0
    return int(math.floor(samples * (1.0 - split)))


def _check_global_batch(batch: int | None, replicas: int) -> None:
    """Each replica must get the same share of every full batch: otherwise
    Keras' per-replica loss scaling weights samples unequally."""
    if batch and batch % replicas:
        raise ValueError(
            f"tf_glp.Strategy: the global batch size {batch} does not divide by the {replicas} replicas, "
            f"so replicas would get unequal shares and Keras would weight samples unequally. "
            f"Use a multiple of {replicas}, e.g. {replicas * max(1, round(batch / replicas))}.")
