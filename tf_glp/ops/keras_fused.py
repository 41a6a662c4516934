"""Applies a Keras optimizer's step through the fused host ops.

`FusedKerasUpdate(optimizer).apply(grads_per_variable, variables)` has the
same effect as `optimizer.apply([sum(g) for g in grads_per_variable],
variables)` for keras.optimizers.SGD (with or without momentum / Nesterov),
Adam and AdamW, but reads each replica's gradient directly and makes one pass
over memory per variable. Hyper-parameters (learning-rate schedule, Adam's
bias correction, weight decay) are computed with the same float32 operations
Keras uses, so the results match Keras to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.ops.host_optimizers import host_apply_adam, host_apply_momentum, host_apply_sgd

_FUSED_TYPES = (keras.optimizers.SGD, keras.optimizers.Adam, keras.optimizers.AdamW)
# The optimizer options with which Keras changes the gradients before its
# update step (clipping, accumulation, scaling).
GRADIENT_OPTIONS = ("clipnorm", "clipvalue", "global_clipnorm", "gradient_accumulation_steps", "loss_scale_factor")


def changes_gradients(optimizer: keras.optimizers.Optimizer) -> str | None:
    """The first of GRADIENT_OPTIONS set on `optimizer`, or None."""
    return next((name for name in GRADIENT_OPTIONS if getattr(optimizer, name, None) is not None), None)


def supports_fused_update(optimizer: keras.optimizers.Optimizer, variables=None, *,
                          update_step_only: bool = False) -> tuple[bool, str]:
    """Says whether `optimizer` can run through the fused host ops, and why not.

    Args:
        optimizer: The Keras optimizer.
        variables: The variables it would update (default None: not
            checked); the fused ops update float32 variables only.
        update_step_only: True when the fused ops replace only Keras'
            `_backend_update_step` (as tf_glp.Strategy does): Keras then still
            clips, unscales, accumulates and keeps the EMA itself, so those
            options do not prevent fusing. Default False.

    Returns:
        (True, "") or (False, reason). Other optimizers and features still work
        through the optimizer's own update.

    Example:
        >>> ok, why = tf_glp.ops.supports_fused_update(keras.optimizers.Adam())
        >>> ok
        True
    """
    kind = type(optimizer)
    if kind not in _FUSED_TYPES:
        return False, f"{kind.__name__} has no fused host update (SGD, Adam and AdamW do)"
    if getattr(optimizer, "amsgrad", False):
        return False, "amsgrad=True has no fused host update"
    if variables is not None and any(v.dtype != "float32" for v in variables):
        return False, "not every trainable variable is float32"
    if update_step_only:
        return True, ""
    option = changes_gradients(optimizer)
    if option is not None:
        return False, f"{option} is set"
    if getattr(optimizer, "use_ema", False):
        return False, "use_ema=True"
    return True, ""


class FusedKerasUpdate:
    """One optimizer step over summed replica gradients, through fused host ops.

    Args:
        optimizer: A keras.optimizers.SGD, Adam or AdamW for which
            `supports_fused_update` is true.
        update_step_only: See `supports_fused_update`. Default False.

    Example:
        >>> opt = keras.optimizers.Adam(1e-3)
        >>> w = keras.Variable([1.0, 2.0])
        >>> opt.build([w])
        >>> tf_glp.ops.FusedKerasUpdate(opt).apply([[tf.ones(2), tf.ones(2)]], [w])
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer, *, update_step_only: bool = False):
        ok, reason = supports_fused_update(optimizer, update_step_only=update_step_only)
        if not ok:
            raise ValueError(f"FusedKerasUpdate: {reason}")
        self.optimizer = optimizer
        self.update_step_only = update_step_only

    @tf.autograph.experimental.do_not_convert  # Note [No AutoGraph in tf_glp]
    def apply(self, grads_per_variable: Sequence[Sequence[tf.Tensor]], variables: Sequence,
              increment_iterations: bool = True) -> None:
        """Applies one step; `grads_per_variable[i]` are the gradients of variables[i].

        Pass increment_iterations=False when the caller (Keras' own
        optimizer.apply) increments the optimizer's step counter itself.

        Args:
            grads_per_variable: For each variable, the list of its gradients
                (one per replica; None entries are skipped).
            variables: The variables to update.
            increment_iterations: Increment `optimizer.iterations` after the
                step. Default True.
        """
        opt = self.optimizer
        variables = list(variables)
        if len(grads_per_variable) != len(variables):
            raise ValueError(
                f"FusedKerasUpdate.apply: got {len(grads_per_variable)} gradient lists for {len(variables)} variables")
        if not opt.built:
            opt.build(variables)
        # Keras reads the (scheduled) learning rate once per step, before
        # iterations is incremented; weight decay uses the same value.
        lr = tf.cast(opt.learning_rate, tf.float32)
        if isinstance(opt, keras.optimizers.Adam):
            local_step = tf.cast(opt.iterations + 1, tf.float32)
            beta_1_power = tf.pow(tf.cast(opt.beta_1, tf.float32), local_step)
            beta_2_power = tf.pow(tf.cast(opt.beta_2, tf.float32), local_step)
            alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        for grads, variable in zip(grads_per_variable, variables):
            grads = [g for g in grads if g is not None]
            if not grads:
                continue  # Keras skips variables without gradients too.
            if not self.update_step_only and getattr(variable, "constraint", None) is not None:
                # (With update_step_only, Keras' own apply constrains afterwards.)
                raise ValueError(f"FusedKerasUpdate: variable {variable.path} has a constraint; use the optimizer's own update")
            index = compat.variable_index(opt, variable)
            decay = opt.weight_decay if compat.uses_weight_decay(opt, variable) else None
            # A Keras variable's tf.Variable; a plain tf.Variable as it is
            # (its `.value` is a method).
            target = variable.value if isinstance(variable, keras.Variable) else variable
            if isinstance(opt, keras.optimizers.Adam):  # AdamW too
                first_moment, second_moment = compat.adam_slots(opt, index)
                host_apply_adam(
                    target, first_moment.value, second_moment.value, grads,
                    alpha, 1 - opt.beta_1, 1 - opt.beta_2, opt.epsilon,
                    weight_decay=decay, decay_learning_rate=lr)
            elif opt.momentum != 0:
                host_apply_momentum(
                    target, opt.momentums[index].value, grads, lr, opt.momentum,
                    nesterov=opt.nesterov, weight_decay=decay, decay_learning_rate=lr)
            else:
                host_apply_sgd(target, grads, lr, weight_decay=decay, decay_learning_rate=lr)
        if increment_iterations:
            opt.iterations.assign_add(1)


def fused_update_step(optimizer: keras.optimizers.Optimizer, grads: Sequence, variables: Sequence) -> None:
    """Keras' `_backend_update_step` for one device, fused: what runs in its
    place where the fused update measured faster (tf_glp.profiling.
    optimizer_step, a one-device tf_glp.Strategy; installed by
    tf_glp._keras.patches.set_fused_update)."""
    FusedKerasUpdate(optimizer, update_step_only=True).apply(
        [[g] for g in grads], variables, increment_iterations=False)
