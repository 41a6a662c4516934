"""Fused host optimizer updates on float32 resource variables.

Each call reads the N gradients, the variable and its slots once and writes
the variable and slots once, with Keras 3's formulas (see
cc/core/host_optimizers.h). Hyper-parameters are float32 scalars (Python
numbers or tensors, so learning-rate schedules work); `one_minus_beta_*` are
passed as Keras computes them (`1 - beta` in double precision, then float32).

Every update runs through one skeleton, `apply_host_update`, driven by a
`HostUpdate` row (HOST_UPDATES): its op, its slots and scalars, and its
pure-TensorFlow fallback. The public `host_apply_*` functions name the
arguments of one row each. See Note [Update kinds] in
cc/core/host_optimizers.h for the C++ side of a row.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import tensorflow as tf

from tf_glp import _native
from tf_glp.ops._common import as_float_tensors, invalid, sum_in_order


def _scalar(value, name: str, op_name: str) -> tf.Tensor:
    if isinstance(value, (int, float)) and not math.isfinite(value):
        raise invalid(f"{op_name}: {name} must be finite, got {value}")
    tensor = tf.convert_to_tensor(value)
    if tensor.shape.rank not in (None, 0):
        raise invalid(f"{op_name}: {name} must be a scalar, got shape {tensor.shape}")
    return tf.cast(tensor, tf.float32)


def _check_variables(op_name: str, variables: dict, grads: list[tf.Tensor]) -> None:
    var = variables["var"]
    for name, v in variables.items():
        if not isinstance(v, tf.Variable):
            raise invalid(f"{op_name}: {name} must be a tf.Variable, got {type(v).__name__}")
        if v.dtype != tf.float32:
            raise invalid(f"{op_name}: {name} must be float32, got {v.dtype.name}")
        if not v.shape.is_compatible_with(var.shape):
            raise invalid(f"{op_name}: {name} has shape {v.shape} but var has shape {var.shape}")
    for i, g in enumerate(grads):
        if not g.shape.is_compatible_with(var.shape):
            raise invalid(f"{op_name}: grads[{i}] has shape {g.shape} but var has shape {var.shape}")


def _decay_inputs(weight_decay, decay_learning_rate, op_name: str):
    use = weight_decay is not None
    rate = _scalar(weight_decay if use else 0.0, "weight_decay", op_name)
    lr = _scalar(decay_learning_rate if use and decay_learning_rate is not None else 0.0,
                 "decay_learning_rate", op_name)
    if use and decay_learning_rate is None:
        raise ValueError(f"{op_name}: weight_decay needs decay_learning_rate (Keras uses the learning rate)")
    return use, rate, lr


def _apply_decay(var: tf.Variable, use: bool, rate: tf.Tensor, lr: tf.Tensor) -> None:
    if use:
        var.assign_sub(var * rate * lr)


# The fallbacks: each row's formula in TensorFlow ops, in the order the
# native kernel evaluates it (Note [Deterministic accumulation] in
# cc/core/kernels.h), so that both paths give the same bits. Called after
# weight decay with the in-order sum `g`, the slots and the float32 scalars.

def _sgd_fallback(var, slots, g, scalars, attrs) -> None:
    (lr,) = scalars
    var.assign_sub(g * lr)


def _momentum_fallback(var, slots, g, scalars, attrs) -> None:
    (momentum_slot,), (lr, mom) = slots, scalars
    momentum_slot.assign(momentum_slot * mom - g * lr)
    if attrs["nesterov"]:
        var.assign_add(momentum_slot * mom - g * lr)
    else:
        var.assign_add(momentum_slot)


def _adam_fallback(var, slots, g, scalars, attrs) -> None:
    (m, v), (a, c1, c2, eps) = slots, scalars
    m.assign_add((g - m) * c1)
    v.assign_add((tf.square(g) - v) * c2)
    var.assign_sub((m * a) / (tf.sqrt(v) + eps))


@dataclasses.dataclass(frozen=True)
class HostUpdate:
    """One fused host update: a Glp>HostApply* op and its fallback.

    Its native side is one row of kUpdateTraits (Note [Update kinds] in
    cc/core/host_optimizers.h); tests/ops/test_fused_table.py checks that the
    two agree.

    Attributes:
        op_name: The public function's name, used in messages.
        op_type: The registered op (cc/tf/ops/host_ops.cc).
        native_function: The op's function in the loaded library.
        slot_names: The slot variables the op takes after `var`, in its
            order (its input names).
        scalar_names: Its hyper-parameters, in its order (its input names);
            weight_decay and decay_learning_rate follow in every op.
        attr_names: Its boolean attributes besides use_weight_decay.
        fallback: The formula in TensorFlow ops (see above).

    Example:
        >>> ADAM_UPDATE.slot_names, ADAM_UPDATE.bytes_per_parameter
        (('m', 'v'), 28)
    """

    op_name: str
    op_type: str
    native_function: str
    slot_names: tuple[str, ...]
    scalar_names: tuple[str, ...]
    fallback: Callable[..., None]
    attr_names: tuple[str, ...] = ()

    @property
    def bytes_per_parameter(self) -> int:
        """Bytes one parameter's update reads and writes with one float32
        gradient: the gradient, then the parameter and each slot read and
        written (as UpdateBytesPerElement in cc/core/host_optimizers.h)."""
        return 4 + 2 * 4 * (1 + len(self.slot_names))


SGD_UPDATE = HostUpdate("host_apply_sgd", "Glp>HostApplySgd", "glp_host_apply_sgd",
                        (), ("learning_rate",), _sgd_fallback)
MOMENTUM_UPDATE = HostUpdate("host_apply_momentum", "Glp>HostApplyMomentum", "glp_host_apply_momentum",
                             ("momentum_slot",), ("learning_rate", "momentum"), _momentum_fallback,
                             attr_names=("nesterov",))
ADAM_UPDATE = HostUpdate("host_apply_adam", "Glp>HostApplyAdam", "glp_host_apply_adam",
                         ("m", "v"), ("alpha", "one_minus_beta_1", "one_minus_beta_2", "epsilon"),
                         _adam_fallback)
HOST_UPDATES = (SGD_UPDATE, MOMENTUM_UPDATE, ADAM_UPDATE)


def apply_host_update(
    update: HostUpdate,
    var: tf.Variable,
    slots: Sequence[tf.Variable],
    grads: Sequence[tf.Tensor],
    scalars: Sequence,
    attrs: Mapping[str, bool] | None = None,
    weight_decay=None,
    decay_learning_rate=None,
) -> None:
    """Runs `update` on `var`: the native op if loaded, else its fallback.

    Args:
        update: The HostUpdate row.
        var: float32 variable on the host.
        slots: One float32 variable of `var`'s shape per
            `update.slot_names`, updated in place.
        grads: Non-empty list of gradients (float32/bfloat16/float16), summed
            in float32 in list order.
        scalars: One float32 scalar per `update.scalar_names`.
        attrs: A bool per `update.attr_names`. Defaults to `None` (none).
        weight_decay: As in host_apply_sgd. Defaults to `None`.
        decay_learning_rate: As in host_apply_sgd. Defaults to `None`.

    Example:
        >>> v = tf.Variable([1.0, 2.0])
        >>> apply_host_update(SGD_UPDATE, v, [], [tf.ones(2)], [0.5])
    """
    op_name = update.op_name
    if len(slots) != len(update.slot_names) or len(scalars) != len(update.scalar_names):
        raise ValueError(f"{op_name}: takes {len(update.slot_names)} slots and {len(update.scalar_names)} "
                         f"scalars, got {len(slots)} and {len(scalars)}")
    attrs = {name: bool((attrs or {}).get(name, False)) for name in update.attr_names}
    with tf.device("/cpu:0"):
        grads = as_float_tensors(grads, op_name, "grads")
        _check_variables(op_name, {"var": var, **dict(zip(update.slot_names, slots))}, grads)
        values = [_scalar(value, name, op_name) for name, value in zip(update.scalar_names, scalars)]
        use, rate, decay_lr = _decay_inputs(weight_decay, decay_learning_rate, op_name)
        native = _native.library()
        if native is not None:
            getattr(native, update.native_function)(
                var.handle, *(slot.handle for slot in slots), grads, *values, rate, decay_lr,
                use_weight_decay=use, **attrs)
            return
        _check_finite_fallback(op_name, **dict(zip(update.scalar_names, values)),
                               weight_decay=rate, decay_learning_rate=decay_lr)
        _apply_decay(var, use, rate, decay_lr)
        update.fallback(var, list(slots), sum_in_order(grads), values, attrs)


@tf.autograph.experimental.do_not_convert  # Note [No AutoGraph in tf_glp]
def host_apply_sgd(
    var: tf.Variable,
    grads: Sequence[tf.Tensor],
    learning_rate,
    weight_decay=None,
    decay_learning_rate=None,
) -> None:
    """`var -= sum(grads) * learning_rate` (keras.optimizers.SGD, momentum 0).

    Args:
        var: float32 variable on the host.
        grads: Non-empty list of gradients (float32/bfloat16/float16), summed
            in float32 in list order.
        learning_rate: float32 scalar.
        weight_decay: If set, first `var -= var * weight_decay *
            decay_learning_rate`, as Keras applies weight decay. Defaults to
            `None` (no weight decay).
        decay_learning_rate: The learning rate Keras uses for weight decay
            (needed when `weight_decay` is set). Defaults to `None`.

    Example:
        >>> v = tf.Variable([1.0, 2.0])
        >>> tf_glp.ops.host_apply_sgd(v, [tf.ones(2)], 0.5)
        >>> v.numpy()
        array([0.5, 1.5], dtype=float32)
    """
    apply_host_update(SGD_UPDATE, var, [], grads, [learning_rate],
                      weight_decay=weight_decay, decay_learning_rate=decay_learning_rate)


@tf.autograph.experimental.do_not_convert  # Note [No AutoGraph in tf_glp]
def host_apply_momentum(
    var: tf.Variable,
    momentum_slot: tf.Variable,
    grads: Sequence[tf.Tensor],
    learning_rate,
    momentum,
    nesterov: bool = False,
    weight_decay=None,
    decay_learning_rate=None,
) -> None:
    """keras.optimizers.SGD with momentum (and Nesterov) on sum(grads).

    `m = m * momentum - g * lr`, then `var += m`, or with Nesterov
    `var += m * momentum - g * lr`.

    Args:
        var: float32 variable on the host.
        momentum_slot: float32 variable of `var`'s shape: the momentum `m`,
            updated in place.
        grads: Non-empty list of gradients (float32/bfloat16/float16), summed
            in float32 in list order.
        learning_rate: float32 scalar.
        momentum: float32 scalar.
        nesterov: Use Nesterov momentum. Defaults to `False`.
        weight_decay: As in host_apply_sgd. Defaults to `None` (no weight
            decay).
        decay_learning_rate: As in host_apply_sgd (needed when
            `weight_decay` is set). Defaults to `None`.

    Example:
        >>> v, m = tf.Variable([1.0]), tf.Variable([0.0])
        >>> tf_glp.ops.host_apply_momentum(v, m, [tf.ones(1)], 0.1, 0.9)
        >>> v.numpy(), m.numpy()
        (array([0.9], dtype=float32), array([-0.1], dtype=float32))
    """
    apply_host_update(MOMENTUM_UPDATE, var, [momentum_slot], grads, [learning_rate, momentum],
                      {"nesterov": nesterov}, weight_decay=weight_decay,
                      decay_learning_rate=decay_learning_rate)


@tf.autograph.experimental.do_not_convert  # Note [No AutoGraph in tf_glp]
def host_apply_adam(
    var: tf.Variable,
    m: tf.Variable,
    v: tf.Variable,
    grads: Sequence[tf.Tensor],
    alpha,
    one_minus_beta_1,
    one_minus_beta_2,
    epsilon,
    weight_decay=None,
    decay_learning_rate=None,
) -> None:
    """keras.optimizers.Adam / AdamW on sum(grads).

    `m += (g - m) * (1 - beta_1)`, `v += (g * g - v) * (1 - beta_2)`,
    `var -= m * alpha / (sqrt(v) + epsilon)`, where
    `alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)` (Keras' bias correction,
    computed by the caller).

    Args:
        var: float32 variable on the host.
        m: float32 variable of `var`'s shape: the first moment, updated in
            place.
        v: float32 variable of `var`'s shape: the second moment, updated in
            place.
        grads: Non-empty list of gradients (float32/bfloat16/float16), summed
            in float32 in list order.
        alpha: float32 scalar: the bias-corrected learning rate above.
        one_minus_beta_1: float32 scalar, `1 - beta_1` as Keras computes it.
        one_minus_beta_2: float32 scalar, `1 - beta_2` as Keras computes it.
        epsilon: float32 scalar.
        weight_decay: As in host_apply_sgd. Defaults to `None` (no weight
            decay).
        decay_learning_rate: As in host_apply_sgd (needed when
            `weight_decay` is set). Defaults to `None`.

    Example:
        >>> w, m, v = tf.Variable([1.0]), tf.Variable([0.0]), tf.Variable([0.0])
        >>> tf_glp.ops.host_apply_adam(w, m, v, [tf.ones(1)], 0.001, 0.1, 0.001, 1e-7)
    """
    apply_host_update(ADAM_UPDATE, var, [m, v], grads,
                      [alpha, one_minus_beta_1, one_minus_beta_2, epsilon],
                      weight_decay=weight_decay, decay_learning_rate=decay_learning_rate)


def _check_finite_fallback(op_name: str, **scalars: tf.Tensor) -> None:
    """The fallback's equivalent of the native op's finiteness check."""
    for name, value in scalars.items():
        tf.debugging.assert_all_finite(
            value, f"{op_name}: hyper-parameter {name} must be finite")
