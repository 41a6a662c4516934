"""Keras' `_backend_apply_gradients` for the two features whose Keras
implementation puts a cross-replica sum inside a `cond` in the replicas'
step, which tf.distribute forbids (every stock strategy fails at the first
step): gradient accumulation and `use_ema` with `ema_overwrite_frequency`.

Accumulation: tf_glp sums the replicas' gradients first, once per step (the
host reduction), and runs the `cond` in cross-replica context on each copy of
the variables: the host's single copy under update="host" (accumulators live
on the host, beside the optimizer slots), every replica's copy under
update="replicas". Each copy then does exactly what Keras does on one device:

    accumulate:  acc += g
    every n-th:  g' = clip((g + acc) / n); weight decay; update_step(g'); acc = 0

EMA overwrite: the `cond` runs in cross-replica context, where the copy of
the averages into the weights needs no merge.

Everything else follows Keras 3.15's BaseOptimizer._backend_apply_gradients.
"""
from __future__ import annotations

import keras
import tensorflow as tf
from tensorflow.python.distribute import ps_values

from tf_glp import _keras_compat


def _tf_variable(variable):
    """A Keras variable's tf.Variable; a tf.Variable as it is (its `.value` is a method)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def _copies(value) -> tuple:
    """The copies of a value or variable: a replicated one's per device, a
    host variable's single inner variable, anything else itself."""
    if isinstance(value, tf.distribute.DistributedValues):
        return tuple(value.values)
    if isinstance(value, ps_values.AggregatingVariable):
        return (value.get(),)
    return (value,)


def needs_own_apply(optimizer) -> bool:
    """Whether Keras' own _backend_apply_gradients would fail in replica context."""
    return bool(optimizer.gradient_accumulation_steps) or bool(
        optimizer.use_ema and optimizer.ema_overwrite_frequency)


def apply_gradients(optimizer, grads, variables) -> None:
    """Keras' _backend_apply_gradients, from the replica context of a
    tf_glp.Strategy (see the module docstring)."""
    if optimizer.gradient_accumulation_steps:
        apply_with_accumulation(optimizer, grads, variables)
    else:
        grads = _keras_compat.clip_gradients(optimizer, grads)
        _keras_compat.apply_weight_decay(optimizer, variables)
        _keras_compat.update_step(optimizer, grads, variables)
    if optimizer.use_ema:
        _keras_compat.update_ema(optimizer)
        if optimizer.ema_overwrite_frequency:
            _overwrite_with_averages_every(optimizer, optimizer.ema_overwrite_frequency)


def _overwrite_with_averages_every(optimizer, frequency: int) -> None:
    variables = [_tf_variable(v) for v in _keras_compat.built_variables(optimizer)]
    averages = [_tf_variable(a) for a in _keras_compat.ema_averages(optimizer)]

    def merge_fn(strategy):
        def overwrite():
            for variable, average in zip(variables, averages):
                if average is not None:
                    strategy.extended.update(variable, lambda v, a: v.assign(a), args=(average,))
            return tf.constant(True)

        tf.cond((optimizer.iterations + 1) % frequency == 0, overwrite, lambda: tf.constant(False))

    tf.distribute.get_replica_context().merge_call(merge_fn)


def apply_with_accumulation(optimizer, grads, variables) -> None:
    """One step of `optimizer` with gradient accumulation (see the module
    docstring), from the replica context of a tf_glp.Strategy."""
    grads = list(grads)
    accumulators = [_keras_compat.accumulator(optimizer, v).value for v in variables]
    variables = [_tf_variable(v) for v in variables]
    steps = optimizer.gradient_accumulation_steps

    def merge_fn(strategy, grads):
        with strategy._reducing_gradients():
            summed = strategy.extended.batch_reduce_to(
                tf.distribute.ReduceOp.SUM, [(g, v) for g, v in zip(grads, variables)])
        is_update_step = (_keras_compat.step_counter(optimizer) + 1) % steps == 0
        learning_rate = optimizer.learning_rate
        per_copy = zip(*[_copies(v) for v in variables])
        for copy_index, var_copies in enumerate(per_copy):
            grad_copies = [_copies(g)[copy_index] for g in summed]
            acc_copies = [_copies(a)[copy_index] for a in accumulators]
            # UpdateContext: writes to the optimizer's replicated slots go to
            # this copy only (as in MirroredExtended._update and
            # ParameterServerStrategyExtended._update).
            device = var_copies[0].device
            replicated = isinstance(variables[0], tf.distribute.DistributedValues)
            with tf.device(device), _keras_compat.update_context(copy_index if replicated else device):
                _accumulate_or_update(optimizer, grad_copies, list(var_copies), acc_copies,
                                      is_update_step, steps, learning_rate)

    tf.distribute.get_replica_context().merge_call(merge_fn, args=(grads,))


def _accumulate_or_update(optimizer, grads, variables, accumulators, is_update_step, steps, learning_rate):
    grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]

    def update():
        new_grads = [(g + a) / steps for g, a in zip(grads, accumulators)]
        new_grads = _keras_compat.clip_gradients(optimizer, new_grads)
        _keras_compat.apply_weight_decay_to_copy(optimizer, variables)
        for g, v in zip(new_grads, variables):
            optimizer.update_step(g, v, learning_rate)
        for a in accumulators:
            a.assign(tf.zeros_like(a))
        return tf.constant(True)

    def accumulate():
        for g, a in zip(grads, accumulators):
            a.assign(a + tf.cast(g, a.dtype))
        return tf.constant(False)

    tf.cond(is_update_step, update, accumulate)
