"""Fused host optimizer updates on float32 resource variables.

Each call reads the N gradients, the variable and its slots once and writes
the variable and slots once (Lamb and Adafactor: in two or three passes,
their norms and means between them), with Keras 3's formulas (see
cc/core/update_formulas.h). Hyper-parameters are float32 scalars (Python
numbers or tensors, so learning-rate schedules work); `one_minus_beta_*` are
passed as Keras computes them (`1 - beta` in double precision, then float32).

Every update runs through one op, Glp>HostApply, and one skeleton,
`apply_host_update`, driven by a `HostUpdate` row (HOST_UPDATES): its kind,
its slots and scalars, and its pure-TensorFlow fallback. The public
`host_apply_*` functions name the arguments of the first rows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

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


def _check_variables(op_name: str, update: HostUpdate, var: tf.Variable, slots: Sequence,
                     grads: list[tf.Tensor]) -> None:
    for k, (name, v) in enumerate([("var", var), *zip(update.slot_names, slots)]):
        if not isinstance(v, tf.Variable):
            raise invalid(f"{op_name}: {name} must be a tf.Variable, got {type(v).__name__}")
        expected = update.slot_shape(k - 1, var.shape) if k > 0 else var.shape
        placeholder = update.factored and 1 <= k <= 2 and expected.rank == 0  # not read: Keras' int32 zeros
        if v.dtype != tf.float32 and not placeholder:
            raise invalid(f"{op_name}: {name} must be float32, got {v.dtype.name}")
        if not v.shape.is_compatible_with(expected):
            must = f", so it must have shape {expected}" if expected != var.shape else ""
            raise invalid(f"{op_name}: {name} has shape {v.shape} but var has shape {var.shape}{must}")
    for i, g in enumerate(grads):
        if not g.shape.is_compatible_with(var.shape):
            raise invalid(f"{op_name}: grads[{i}] has shape {g.shape} but var has shape {var.shape}")


@dataclasses.dataclass(frozen=True)
class HostUpdate:
    """One fused host update kind: its Glp>HostApply `kind` and its fallback.

    Its native side is one formula in cc/core/update_formulas.h (Note [Update
    formulas]); tests/ops/test_fused_table.py checks that the two agree.

    Attributes:
        kind: The formula's name (the op's `kind` attribute).
        slot_names: The slot variables the update takes after `var`, in its
            order.
        scalar_names: Its hyper-parameters, in its order (the formula's
            names); weight_decay and decay_learning_rate follow in every op.
        fallback: The formula in TensorFlow ops: (var, slots, g, scalars),
            called after weight decay with the in-order sum `g`, its lines
            in the formula's order, so that both paths give the same bits.
        exact: Whether the fallback gives the native op's bits (False where
            the formula calls pow: TensorFlow's and the C library's may
            differ in the last bit; or sums over the variable: in another
            order).
        norms: Whether the update needs norms of the whole variable (Note
            [Per-variable norms]): two passes over memory.
        factored: Whether its first two slots are row and column means of a
            variable of rank >= 2 (Note [Factored second moments]; scalars
            for one of rank < 2): three passes.

    Example:
        >>> ADAM_UPDATE.slot_names, ADAM_UPDATE.bytes_per_parameter
        (('m', 'v'), 28)
    """

    kind: str
    slot_names: tuple[str, ...]
    scalar_names: tuple[str, ...]
    fallback: Callable[..., None]
    exact: bool = True
    norms: bool = False
    factored: bool = False

    @property
    def bytes_per_parameter(self) -> int:
        """Bytes one parameter's update reads and writes with one float32
        gradient, over all its passes (as UpdateBytesPerElement in
        cc/core/host_optimizers.h): in one pass the gradient, then the
        parameter and each slot read and written."""
        if self.factored:
            return 3 * 4 + 5 * 4
        if self.norms:
            return 4 + (3 + 3 * len(self.slot_names)) * 4
        return 4 + 2 * 4 * (1 + len(self.slot_names))

    def slot_shape(self, k: int, shape: tf.TensorShape) -> tf.TensorShape:
        """The shape slot `k` has for a variable of `shape` (as ExpectedShape
        in cc/tf/kernels/host_optimizer_kernels.cc)."""
        if not self.factored or k > 1:
            return shape
        if shape.rank is None or shape.rank < 2:
            return tf.TensorShape([])
        return shape[:-1] if k == 0 else shape[:-2].concatenate(shape[-1:])


def _sgd(var, slots, g, s) -> None:
    (lr,) = s
    var.assign(var - g * lr)


def _momentum(nesterov: bool):
    def step(var, slots, g, s) -> None:
        (m,), (lr, momentum) = slots, s
        m.assign(m * momentum - g * lr)
        var.assign(var + (m * momentum - g * lr) if nesterov else var + m)
    return step


def _adam(amsgrad: bool):
    def step(var, slots, g, s) -> None:
        (m, v, *v_hat), (alpha, c1, c2, epsilon) = slots, s
        m.assign(m + (g - m) * c1)
        v.assign(v + (g * g - v) * c2)
        if amsgrad:
            v_hat[0].assign(tf.maximum(v_hat[0], v))
            v = v_hat[0]
        var.assign(var - (m * alpha) / (tf.sqrt(v) + epsilon))
    return step


def _rmsprop(centered: bool, momentum: bool):
    def step(var, slots, g, s) -> None:
        velocity, (lr, rho, one_minus_rho, epsilon, momentum_rate) = slots[0], s
        velocity.assign(rho * velocity + one_minus_rho * (g * g))
        denominator = velocity + epsilon
        if centered:
            average_grad = slots[1]
            average_grad.assign(rho * average_grad + one_minus_rho * g)
            denominator = velocity - (average_grad * average_grad - epsilon)
        increment = (lr * g) / tf.sqrt(denominator)
        if momentum:
            slots[-1].assign(momentum_rate * slots[-1] + increment)
            increment = slots[-1]
        var.assign(var - increment)
    return step


def _adagrad(var, slots, g, s) -> None:
    (accumulator,), (lr, epsilon) = slots, s
    accumulator.assign(accumulator + g * g)
    var.assign(var - (lr * g) / tf.sqrt(accumulator + epsilon))


def _adamax(var, slots, g, s) -> None:
    (m, u), (lr, c1, beta_2, bias, epsilon) = slots, s
    m.assign(m + (g - m) * c1)
    u.assign(tf.maximum(beta_2 * u, tf.abs(g)))
    var.assign(var - (lr * m) / (bias * (u + epsilon)))


def _adadelta(var, slots, g, s) -> None:
    (accumulated_grad, accumulated_delta), (lr, rho, one_minus_rho, epsilon) = slots, s
    accumulated_grad.assign(rho * accumulated_grad + one_minus_rho * (g * g))
    delta = -((tf.sqrt(accumulated_delta + epsilon) * g) / tf.sqrt(accumulated_grad + epsilon))
    accumulated_delta.assign(rho * accumulated_delta + one_minus_rho * (delta * delta))
    var.assign(var + lr * delta)


def _lion(var, slots, g, s) -> None:
    (m,), (lr, beta_1, c1, beta_2, c2) = slots, s
    var.assign(var - lr * tf.sign(m * beta_1 + g * c1))
    m.assign(m * beta_2 + g * c2)


def _nadam(var, slots, g, s) -> None:
    (m, v), (lr, c1, c2, u_t_1, d1, one_minus_u_t, d2, bias_2, epsilon) = slots, s
    m.assign(m + (g - m) * c1)
    v.assign(v + (g * g - v) * c2)
    m_hat = (u_t_1 * m) / d1 + (one_minus_u_t * g) / d2
    v_hat = v / bias_2
    var.assign(var - (m_hat * lr) / (tf.sqrt(v_hat) + epsilon))


def _ftrl(square_root: bool):
    def step(var, slots, g, s) -> None:
        (accumulator, linear), (lr, two_l2_shrinkage, power, two_l2, low, high) = slots, s
        raise_to = (lambda x: tf.sqrt(x)) if square_root else (lambda x: tf.pow(x, power))
        grad_to_use = g + two_l2_shrinkage * var
        new_accumulator = accumulator + g * g
        new_power = raise_to(new_accumulator)
        linear.assign(linear + (grad_to_use - ((new_power - raise_to(accumulator)) / lr) * var))
        quadratic = new_power / lr + two_l2
        linear_clipped = tf.minimum(tf.maximum(linear, low), high)
        var.assign((linear_clipped - linear) / quadratic)
        accumulator.assign(new_accumulator)
    return step


def _schedule_free_adamw(var, slots, g, s) -> None:
    (momentum, velocity), (lr, c2, bias_2, epsilon, c1, beta_1, inverse_beta_1, one_minus_weight, weight) = slots, s
    velocity.assign(velocity + (g * g - velocity) * c2)
    denominator = tf.sqrt(velocity / bias_2) + epsilon
    momentum.assign(momentum - (lr * g) / denominator)
    x_old = (var - c1 * momentum) * inverse_beta_1  # as TensorFlow runs Keras' line (update_formulas.h)
    x_new = one_minus_weight * x_old + weight * momentum
    var.assign(c1 * momentum + beta_1 * x_new)


def _lamb(var, slots, g, s) -> None:
    (m, v), (lr, c1, c2, bias_1, bias_2, epsilon) = slots, s
    m.assign(m + (g - m) * c1)
    v.assign(v + (g * g - v) * c2)
    update = (m / bias_1) / (tf.sqrt(v / bias_2) + epsilon)
    w_norm = tf.sqrt(tf.reduce_sum(var * var))
    g_norm = tf.sqrt(tf.reduce_sum(update * update))
    ratio = tf.where(w_norm > 0, tf.where(g_norm > 0, w_norm / g_norm, 1.0), 1.0)
    var.assign(var - ratio * lr * update)


def _adafactor(var, slots, g, s) -> None:
    (r, c, v), (rho_t, beta_2_t, one_minus_beta_2_t, epsilon_1, epsilon_2, clip_threshold) = slots, s
    square = g * g + epsilon_1
    if var.shape.rank >= 2:
        r.assign(beta_2_t * r + one_minus_beta_2_t * tf.reduce_mean(square, axis=-1))
        c.assign(beta_2_t * c + one_minus_beta_2_t * tf.reduce_mean(square, axis=-2))
        v.assign(tf.expand_dims(r / tf.reduce_mean(r, axis=-1, keepdims=True), -1) * tf.expand_dims(c, -2))
    else:
        v.assign(beta_2_t * v + one_minus_beta_2_t * square)
    alpha_t = tf.maximum(epsilon_2, tf.sqrt(tf.reduce_mean(var * var))) * rho_t
    u = g / tf.sqrt(v)
    var.assign(var - alpha_t * (u / tf.maximum(1.0, tf.sqrt(tf.reduce_mean(u * u)) / clip_threshold)))


_ADAM_SCALARS = ("alpha", "1 - beta_1", "1 - beta_2", "epsilon")
_RMSPROP_SCALARS = ("learning_rate", "rho", "1 - rho", "epsilon", "momentum")
_FTRL_SCALARS = ("learning_rate", "2 * l2_shrinkage", "-learning_rate_power", "2 * l2", "-l1", "l1")
SGD_UPDATE = HostUpdate("sgd", (), ("learning_rate",), _sgd)
MOMENTUM_UPDATE = HostUpdate("momentum", ("momentum_slot",), ("learning_rate", "momentum"), _momentum(False))
NESTEROV_UPDATE = HostUpdate("nesterov", ("momentum_slot",), ("learning_rate", "momentum"), _momentum(True))
ADAM_UPDATE = HostUpdate("adam", ("m", "v"), _ADAM_SCALARS, _adam(False))
HOST_UPDATES = (
    SGD_UPDATE,
    MOMENTUM_UPDATE,
    NESTEROV_UPDATE,
    ADAM_UPDATE,
    HostUpdate("adam_amsgrad", ("m", "v", "v_hat"), _ADAM_SCALARS, _adam(True)),
    HostUpdate("rmsprop", ("velocity",), _RMSPROP_SCALARS, _rmsprop(False, False)),
    HostUpdate("rmsprop_momentum", ("velocity", "momentum"), _RMSPROP_SCALARS, _rmsprop(False, True)),
    HostUpdate("rmsprop_centered", ("velocity", "average_gradient"), _RMSPROP_SCALARS, _rmsprop(True, False)),
    HostUpdate("rmsprop_centered_momentum", ("velocity", "average_gradient", "momentum"), _RMSPROP_SCALARS,
               _rmsprop(True, True)),
    HostUpdate("adagrad", ("accumulator",), ("learning_rate", "epsilon"), _adagrad),
    HostUpdate("adamax", ("m", "u"), ("learning_rate", "1 - beta_1", "beta_2", "1 - beta_1^t", "epsilon"), _adamax),
    HostUpdate("adadelta", ("accumulated_grad", "accumulated_delta_var"),
               ("learning_rate", "rho", "1 - rho", "epsilon"), _adadelta),
    HostUpdate("lion", ("momentum",), ("learning_rate", "beta_1", "1 - beta_1", "beta_2", "1 - beta_2"), _lion),
    HostUpdate("nadam", ("momentum", "velocity"),
               ("learning_rate", "1 - beta_1", "1 - beta_2", "u_t_1", "1 - u_product_t_1", "1 - u_t",
                "1 - u_product_t", "1 - beta_2^t", "epsilon"), _nadam),
    HostUpdate("ftrl", ("accumulator", "linear"), _FTRL_SCALARS, _ftrl(False), exact=False),
    # learning_rate_power -0.5: a square root (cc/core/update_formulas.h).
    HostUpdate("ftrl_sqrt", ("accumulator", "linear"), _FTRL_SCALARS, _ftrl(True)),
    HostUpdate("schedule_free_adamw", ("momentum", "velocity"),
               ("learning_rate", "1 - beta_2", "1 - beta_2^t", "epsilon", "1 - beta_1", "beta_1", "1 / beta_1",
                "1 - 1/t", "1/t"),
               _schedule_free_adamw),
    HostUpdate("lamb", ("m", "v"), ("learning_rate", "1 - beta_1", "1 - beta_2", "1 - beta_1^t", "1 - beta_2^t",
                                    "epsilon"), _lamb, exact=False, norms=True),
    # Row and column means, and rms(var), rms(u_t): sums over the variable.
    HostUpdate("adafactor", ("r", "c", "v"),
               ("rho_t", "beta_2_t", "1 - beta_2_t", "epsilon_1", "epsilon_2", "clip_threshold"), _adafactor,
               exact=False, norms=True, factored=True),
)
HOST_UPDATES_BY_KIND = {update.kind: update for update in HOST_UPDATES}


def apply_host_update(
    update: HostUpdate,
    var: tf.Variable,
    slots: Sequence[tf.Variable],
    grads: Sequence[tf.Tensor],
    scalars: Sequence,
    weight_decay=None,
    decay_learning_rate=None,
) -> None:
    """Runs `update` on `var`: the native op (Glp>HostApply) if loaded, else
    its fallback.

    Args:
        update: The HostUpdate row (one of HOST_UPDATES).
        var: float32 variable on the host.
        slots: One float32 variable per `update.slot_names`, of `var`'s
            shape (or `update.slot_shape`'s), updated in place.
        grads: Non-empty list of gradients (float32/bfloat16/float16), summed
            in float32 in list order.
        scalars: One float32 scalar per `update.scalar_names`.
        weight_decay: If set, first `var -= var * weight_decay *
            decay_learning_rate`, as Keras applies weight decay. Defaults to
            `None` (no weight decay).
        decay_learning_rate: The learning rate Keras uses for weight decay
            (needed when `weight_decay` is set). Defaults to `None`.

    Example:
        >>> v = tf.Variable([1.0, 2.0])
        >>> apply_host_update(SGD_UPDATE, v, [], [tf.ones(2)], [0.5])
    """
    op_name = f"host_apply_{update.kind}"
    if len(slots) != len(update.slot_names) or len(scalars) != len(update.scalar_names):
        raise ValueError(f"{op_name}: takes {len(update.slot_names)} slots and {len(update.scalar_names)} "
                         f"scalars, got {len(slots)} and {len(scalars)}")
    with tf.device("/cpu:0"):
        grads = as_float_tensors(grads, op_name, "grads")
        _check_variables(op_name, update, var, slots, grads)
        values = [_scalar(value, name, op_name) for name, value in zip(update.scalar_names, scalars)]
        use = weight_decay is not None
        rate = _scalar(weight_decay if use else 0.0, "weight_decay", op_name)
        decay_lr = _scalar(decay_learning_rate if use and decay_learning_rate is not None else 0.0,
                           "decay_learning_rate", op_name)
        if use and decay_learning_rate is None:
            raise ValueError(f"{op_name}: weight_decay needs decay_learning_rate (Keras uses the learning rate)")
        native = _native.library()
        if native is not None:
            native.glp_host_apply(var.handle, [slot.handle for slot in slots], grads, values, rate, decay_lr,
                                  kind=update.kind, use_weight_decay=use)
            return
        # The fallback's form of the native op's finiteness check.
        named = [*zip(update.scalar_names, values), ("weight_decay", rate), ("decay_learning_rate", decay_lr)]
        for name, value in named:
            tf.debugging.assert_all_finite(value, f"{op_name}: hyper-parameter {name} must be finite")
        if use:
            var.assign_sub(var * rate * decay_lr)
        update.fallback(var, list(slots), sum_in_order(grads), values)


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
        var, grads, weight_decay, decay_learning_rate: As in
            apply_host_update.
        learning_rate: float32 scalar.

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
        var, grads, weight_decay, decay_learning_rate: As in
            apply_host_update.
        momentum_slot: float32 variable of `var`'s shape: the momentum `m`,
            updated in place.
        learning_rate: float32 scalar.
        momentum: float32 scalar.
        nesterov: Use Nesterov momentum. Defaults to `False`.

    Example:
        >>> v, m = tf.Variable([1.0]), tf.Variable([0.0])
        >>> tf_glp.ops.host_apply_momentum(v, m, [tf.ones(1)], 0.1, 0.9)
        >>> v.numpy(), m.numpy()
        (array([0.9], dtype=float32), array([-0.1], dtype=float32))
    """
    apply_host_update(NESTEROV_UPDATE if nesterov else MOMENTUM_UPDATE, var, [momentum_slot], grads,
                      [learning_rate, momentum], weight_decay=weight_decay,
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
        var, grads, weight_decay, decay_learning_rate: As in
            apply_host_update.
        m: float32 variable of `var`'s shape: the first moment, updated in
            place.
        v: float32 variable of `var`'s shape: the second moment, updated in
            place.
        alpha: float32 scalar: the bias-corrected learning rate above.
        one_minus_beta_1: float32 scalar, `1 - beta_1` as Keras computes it.
        one_minus_beta_2: float32 scalar, `1 - beta_2` as Keras computes it.
        epsilon: float32 scalar.

    Example:
        >>> w, m, v = tf.Variable([1.0]), tf.Variable([0.0]), tf.Variable([0.0])
        >>> tf_glp.ops.host_apply_adam(w, m, v, [tf.ones(1)], 0.001, 0.1, 0.001, 1e-7)
    """
    apply_host_update(ADAM_UPDATE, var, [m, v], grads,
                      [alpha, one_minus_beta_1, one_minus_beta_2, epsilon],
                      weight_decay=weight_decay, decay_learning_rate=decay_learning_rate)
