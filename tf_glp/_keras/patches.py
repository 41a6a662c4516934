"""The methods of Keras 3 that tf_glp wraps: the boundary's patching half
(tf_glp/_keras/; compat.py is the reading half).

Why: tf_glp/strategy/strategy.py's module docstring. What is wrapped:
compat.INTERNALS' "patched:" entries, plus each keras.optimizers class's own
`apply`. Each wrapper is a no-op unless the model or optimizer belongs to a
tf_glp.Strategy, and then calls the hooks StrategyHooks writes down.
install() runs once, when the first tf_glp.Strategy is created (or the
start-up profiler first chooses the fused update), after
compat.require_internals().
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import keras
import tensorflow as tf

from tf_glp._keras import compat

_installed = False
_micro_batch_wrappers_installed = False
# The fused update chosen for an optimizer on one device: set_fused_update.
_FUSED_STEP = "_tf_glp_fused_update"
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


@runtime_checkable
class StrategyHooks(Protocol):
    """What the wrappers below call on a tf_glp.Strategy (tf_glp/strategy/
    strategy.py implements it; this module imports nothing of tf_glp's
    above the boundary, so the contract is written here). Each hook is
    called only where `_glp_strategy` found the strategy; a hook that
    returns a bool says by its name what True means.

    Attributes:
        _is_tf_glp_strategy: True: marks the strategy for `_glp_strategy`.
        _is_one_device: A one-device strategy: Keras' own step runs (as
            without a strategy); only the fused update may replace Keras'
            update, through `set_fused_update`.
        micro_batches: None, or M: Keras' train_step becomes
            `_micro_batch_train_step`.
    """

    _is_tf_glp_strategy: bool
    _is_one_device: bool
    micro_batches: int | None

    def _apply_once(self, optimizer, run: Callable[[list, Any], Any], grads: list, variables,
                    *, loss_scaled: bool = False) -> None:
        """Runs the optimizer step from inside the replicas' step, once per
        step: called by `BaseOptimizer.apply` (and LossScaleOptimizer's
        `_tf_apply`) with the replica's gradients; `run(grads, variables)`
        is Keras' own apply, to be called once in cross-replica context on
        the summed gradients."""

    def _build_outside_the_trace(self, optimizer, variables) -> None:
        """Builds an optimizer met unbuilt in the replicas' step, outside the
        trace, as fit would have built it."""

    def _handled_update(self, optimizer, grads: list, variables: list) -> bool:
        """Called by `_backend_update_step` in the strategy's step: applies
        the update itself (the fused host update) and returns True, or
        returns False and Keras' own update runs."""

    def _fuses_update_here(self, optimizer, variables: list) -> bool:
        """Whether `_handled_update` applies this update here (then Keras'
        `_apply_weight_decay` is skipped: the fused pass applies it)."""

    def _reducing_gradients(self) -> contextlib.AbstractContextManager:
        """Context around Keras' own update when it sums gradients from a
        replica: those reductions are gradient sums (compression applies)."""

    def _prepare_compile(self, model, arguments: dict) -> None:
        """Called by `Trainer.compile` with its bound arguments (those the
        user passed), before Keras' compile; may change them."""

    def _prepare_fit(self, model, arguments: dict) -> None:
        """Called by `fit` with its bound arguments, before Keras' fit; may
        check them and add callbacks."""

    def _fit_failed(self, error: Exception) -> None:
        """Called when Keras' fit raises tf.errors.UnavailableError or
        DeadlineExceededError (across workers: a peer or the coordination
        service stopped answering); may raise a clearer error from it, else
        `error` goes on."""

    def _micro_batch_train_step(self, model, data):
        """Keras' train_step under micro_batches=M; returns the logs."""


def _glp_strategy(obj) -> StrategyHooks | None:
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
    """Installs the wrappers (once; require_internals first)."""
    global _installed
    with _lock:
        if _installed:
            return
        compat.require_internals()
        _install_merge_call_hook()
        _install_optimizer_hooks()
        _install_loss_scale_hook()
        _install_model_hooks()
        _installed = True


def set_fused_update(optimizer, step) -> None:
    """Runs `optimizer`'s update on one device through `step(optimizer,
    grads, variables)` (the fused native update, or what decides for it;
    None: Keras' own), from its next traced step on. The step returns the
    (gradients, variables) it left to Keras' own update."""
    install()
    setattr(optimizer, _FUSED_STEP, step)


def fused_update_of(optimizer):
    """The fused update set for `optimizer` (set_fused_update), or None."""
    return getattr(optimizer, _FUSED_STEP, None)


def _wrap(owner: tuple[str, str], name: str, make_wrapper) -> None:
    """Replaces owner.name by make_wrapper(original), keeping its metadata."""
    cls = compat.internal(*owner)
    original = getattr(cls, name)
    setattr(cls, name, functools.wraps(original)(make_wrapper(original)))


def _in_replicas_step(strategy) -> bool:
    """Whether the caller runs inside `strategy`'s replicas (not in
    cross-replica context, where tf_glp's own step calls Keras)."""
    context = tf.distribute.get_replica_context()
    return strategy is not None and context is not None and context.strategy is strategy


def _install_merge_call_hook() -> None:
    # Keras' TF optimizer calls maybe_merge_call for weight decay, updates and
    # accumulation; in a tf_glp.Strategy's cross-replica context (where its
    # step runs) it would fail for want of a replica context.
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


def _fused_on_one_device(optimizer):
    """The fused update chosen for this optimizer on one device, if any: by
    the start-up profiler (tf_glp.profiling.optimizer_step) without a
    strategy, or by a one-device tf_glp.Strategy; never inside XLA."""
    step = fused_update_of(optimizer)
    if step is None or compat.in_xla_context():
        return None
    strategy = _glp_strategy(optimizer)
    on_one_device = _one_device(strategy) if strategy is not None else not tf.distribute.has_strategy()
    return step if on_one_device else None


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
            fused = _fused_on_one_device(self)
            if fused is not None:
                # The fused step updates what it takes and returns the rest
                # (sparse gradients; all, where it chose Keras' update): Keras'
                # own update, with the weight decay the hook below skipped.
                grads, trainable_variables = fused(self, grads, trainable_variables)
                if not grads:
                    return None
                compat.apply_weight_decay_to_copy(self, trainable_variables)
            if strategy is None or _one_device(strategy):
                return original(self, grads, trainable_variables, learning_rate)
            if strategy._handled_update(self, grads, trainable_variables):
                return None
            with strategy._reducing_gradients():  # Keras' all-reduce, if called from a replica
                return original(self, grads, trainable_variables, learning_rate)
        return _backend_update_step

    def apply_weight_decay(original):
        def _apply_weight_decay(self, variables):
            strategy = _glp_strategy(self)
            if _fused_on_one_device(self) is not None or (strategy is not None and strategy._fuses_update_here(self, variables)):
                return None  # the fused update applies it, with the same learning rate
            return original(self, variables)
        return _apply_weight_decay

    _wrap(_BASE_OPTIMIZER, "apply", apply)
    # Keras optimizers with an `apply` of their own (MultiOptimizer): the
    # same step, so that what their apply writes (its own step counter) is
    # written once. LossScaleOptimizer's is wrapped at `_tf_apply` instead.
    loss_scale_optimizer = compat.internal(*_LOSS_SCALE_OPTIMIZER)
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
            if _one_device(strategy) and tf.distribute.in_cross_replica_context():
                # A custom loop's apply: its step as plain Keras (no strategy) runs it, where Keras' own
                # refuses any strategy's cross-replica context.
                return compat.apply_loss_scaled(self, grads, trainable_variables)
            if not _in_replicas_step(strategy) or _one_device(strategy):
                return original(self, grads, trainable_variables)
            return strategy._apply_once(
                self, lambda g, v: compat.apply_loss_scaled(self, g, v), grads, trainable_variables,
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
    def with_bound_arguments(prepare):
        def make_wrapper(original):
            signature = inspect.signature(original)

            def wrapper(self, *args, **kwargs):
                strategy = _glp_strategy(self)
                if strategy is None:
                    return original(self, *args, **kwargs)
                bound = signature.bind(self, *args, **kwargs)
                prepare(strategy, self, bound.arguments)
                return original(*bound.args, **bound.kwargs)
            return wrapper
        return make_wrapper

    compile_wrapper = with_bound_arguments(lambda strategy, m, a: strategy._prepare_compile(m, a))
    prepared_fit = with_bound_arguments(lambda strategy, m, a: strategy._prepare_fit(m, a))

    def fit_wrapper(original):
        prepared = prepared_fit(original)

        def fit(self, *args, **kwargs):
            try:
                return prepared(self, *args, **kwargs)
            except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError) as error:
                strategy = _glp_strategy(self)
                if strategy is not None:
                    strategy._fit_failed(error)
                raise
        return fit

    def symbolic_build_wrapper(original):
        # Keras runs this at the start of every fit and evaluate under a
        # strategy: it makes a new (distributed) iterator and reads a batch
        # from it, only to find nothing left to build once the first fit
        # built everything. Plain Keras (no strategy) skips it, building
        # the optimizer and the compiled metrics in the step's trace; so
        # does tf_glp on one device once the layers are built (a layer
        # built first in the trace would be built after fit's callbacks
        # began: the concurrency profiler needs it before), and on replicas
        # once nothing is left (10-15 ms per call on one device, more on
        # replicas). (Under a strategy it also fails where a generator
        # yields None for an optional input: Keras' tests show it.)
        def _maybe_symbolic_build(self, iterator=None, data_batch=None):
            strategy = _glp_strategy(self)
            if strategy is not None and (compat.nothing_to_build(self) or (
                    _one_device(strategy) and all(layer.built for layer in compat.all_layers(self)))):
                return None
            return original(self, iterator=iterator, data_batch=data_batch)
        return _maybe_symbolic_build

    # compile is patched on Keras' Trainer itself: Keras treats a Model whose
    # compile differs from Trainer.compile as custom and skips compile on load.
    _wrap(_TRAINER, "compile", compile_wrapper)
    _wrap(_TF_TRAINER, "fit", fit_wrapper)
    _wrap(_TF_TRAINER, "_maybe_symbolic_build", symbolic_build_wrapper)


def install_micro_batch_wrappers(seed_next, batch_norm_moments, scale_for_distribution) -> None:
    """Wraps what a micro-batched step changes, once
    (tf_glp/strategy/micro_batches.py gives the wrappers, each a no-op outside
    such a step)."""
    global _micro_batch_wrappers_installed
    install()
    with _lock:
        if _micro_batch_wrappers_installed:
            return

        def train_step(original):
            def train_step(self, data):
                strategy = _glp_strategy(self)
                if strategy is None or not strategy.micro_batches:
                    return original(self, data)
                return strategy._micro_batch_train_step(self, data)
            return train_step

        _wrap(_TF_TRAINER, "train_step", train_step)
        _wrap(_SEED_GENERATOR, "next", seed_next)
        _wrap(_BATCH_NORMALIZATION, "_moments", batch_norm_moments)
        _wrap(_LOSSES, "scale_loss_for_distribution", functools.partial(scale_for_distribution, inverse=False))
        _wrap(_LOSSES, "unscale_loss_for_distribution", functools.partial(scale_for_distribution, inverse=True))
        _micro_batch_wrappers_installed = True
