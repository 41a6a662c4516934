"""Applies a Keras optimizer's step through the fused host ops.

`FusedKerasUpdate(optimizer).apply(grads_per_variable, variables)` has the
same effect as `optimizer.apply([sum(g) for g in grads_per_variable],
variables)` for the optimizers of FUSED_OPTIMIZER_TABLE (named, for
messages and docs, by FUSED_OPTIMIZERS; SGD with or without momentum /
Nesterov), but reads each replica's gradient directly and makes one pass
over memory per variable. Hyper-parameters (learning-rate schedule, Adam's
bias correction, weight decay) are computed with the same float32 operations
Keras uses, so the results match Keras to float32 rounding.

Note [Fusing a Keras optimizer]
Each fused Keras optimizer class is one FusedOptimizer row: which HostUpdate
(tf_glp/ops/host_optimizers.py) its settings use, its slot variables in the
op's order, and its scalars computed the way Keras computes them. Classes
match exactly: a subclass may change the update (AdamW, a subclass of Adam,
has its own row). Fusing another Keras optimizer: docs/building.md (Fused
optimizers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.ops.host_optimizers import (
    ADAM_UPDATE,
    HOST_UPDATES_BY_KIND,
    MOMENTUM_UPDATE,
    NESTEROV_UPDATE,
    SGD_UPDATE,
    HostUpdate,
    apply_host_update,
)


@dataclasses.dataclass(frozen=True)
class FusedOptimizer:
    """How one Keras optimizer class runs through a fused host update.

    See Note [Fusing a Keras optimizer].

    Attributes:
        optimizer_class: The Keras class, matched exactly.
        host_updates: Every HostUpdate the class may use.
        host_update: optimizer -> the HostUpdate its settings use.
        slot_attributes: optimizer -> the optimizer's lists of slot
            variables (the names of its attributes, e.g. "_momentums"), in
            the update's `slot_names` order.
        step_scalars: (optimizer, float32 learning rate) -> the update's
            scalars for this step, computed as Keras computes them (once per
            step, before `iterations` is incremented).
        before_step: What Keras' own `_backend_update_step` of the class
            does before its per-variable updates (Nadam's `u_product`); run
            by FusedKerasUpdate when it replaces the whole `apply` (with
            update_step_only, Keras runs it itself). Default: nothing.

    Example:
        >>> row = fused_optimizer(keras.optimizers.SGD(0.1, momentum=0.9))
        >>> row.host_update(keras.optimizers.SGD(0.1, momentum=0.9)).kind
        'momentum'
    """

    optimizer_class: type
    host_updates: tuple[HostUpdate, ...]
    host_update: Callable[[keras.optimizers.Optimizer], HostUpdate]
    slot_attributes: Callable[[keras.optimizers.Optimizer], tuple[str, ...]]
    step_scalars: Callable[[keras.optimizers.Optimizer, tf.Tensor], tuple]
    before_step: Callable[[keras.optimizers.Optimizer], None] = lambda optimizer: None

    @property
    def name(self) -> str:
        return self.optimizer_class.__name__

    def slots(self, optimizer, index: int) -> tuple:
        """The slot variables (tf.Variables) of the optimizer's variable
        `index`, in the update's order."""
        return tuple(compat.optimizer_slot(optimizer, attribute, index).value
                     for attribute in self.slot_attributes(optimizer))


def _one(optimizer_class: type, kind: str, slot_attributes: tuple[str, ...], step_scalars, **extra) -> FusedOptimizer:
    """A row with a single HostUpdate (`kind`)."""
    update = HOST_UPDATES_BY_KIND[kind]
    return FusedOptimizer(optimizer_class, host_updates=(update,), host_update=lambda opt: update,
                          slot_attributes=lambda opt: slot_attributes, step_scalars=step_scalars, **extra)


def _float32(value) -> tf.Tensor:
    return tf.cast(value, tf.float32)


def _local_step(opt, ahead: int = 1) -> tf.Tensor:
    return _float32(opt.iterations + ahead)


# Each function below computes a class's scalars as its update_step does,
# in float32 (Keras casts to the variable's dtype, float32 here); a Python
# number that Keras hands to an op as it is (`1 - self.beta_1`) is passed as
# a Python number, which becomes float32 the same way.

def _sgd(opt, lr) -> tuple:
    return (lr, opt.momentum) if opt.momentum != 0 else (lr,)


def _adam(opt, lr) -> tuple:
    # Keras' bias correction folded into the learning rate (alpha).
    local_step = _local_step(opt)
    beta_1_power = tf.pow(_float32(opt.beta_1), local_step)
    beta_2_power = tf.pow(_float32(opt.beta_2), local_step)
    alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
    return alpha, 1 - opt.beta_1, 1 - opt.beta_2, opt.epsilon


def _rmsprop_update(opt) -> HostUpdate:
    kind = "rmsprop" + ("_centered" if opt.centered else "") + ("_momentum" if opt.momentum > 0 else "")
    return HOST_UPDATES_BY_KIND[kind]


def _rmsprop_slots(opt) -> tuple[str, ...]:
    return (("_velocities",) + (("_average_gradients",) if opt.centered else ())
            + (("_momentums",) if opt.momentum > 0 else ()))


def _adamax(opt, lr) -> tuple:
    beta_1_power = tf.pow(_float32(opt.beta_1), _local_step(opt))
    return lr, 1 - opt.beta_1, opt.beta_2, 1 - beta_1_power, opt.epsilon


def _lion(opt, lr) -> tuple:
    beta_1, beta_2 = _float32(opt.beta_1), _float32(opt.beta_2)
    return lr, beta_1, 1.0 - beta_1, beta_2, 1.0 - beta_2


def _nadam_u_product(opt) -> None:
    # Nadam._backend_update_step, before its per-variable updates.
    u_product = compat.nadam_u_product(opt)
    u_product.assign(u_product * opt.beta_1 * (1.0 - 0.5 * tf.pow(0.96, _local_step(opt))))


def _nadam(opt, lr) -> tuple:
    local_step, next_step = _local_step(opt), _local_step(opt, 2)
    decay = _float32(0.96)
    beta_1, beta_2 = _float32(opt.beta_1), _float32(opt.beta_2)
    u_t = beta_1 * (1.0 - 0.5 * tf.pow(decay, local_step))
    u_t_1 = beta_1 * (1.0 - 0.5 * tf.pow(decay, next_step))
    u_product_t = _float32(compat.nadam_u_product(opt))
    u_product_t_1 = u_product_t * u_t_1
    beta_2_power = tf.pow(beta_2, local_step)
    return (lr, 1 - beta_1, 1 - beta_2, u_t_1, 1 - u_product_t_1, 1 - u_t, 1 - u_product_t,
            1 - beta_2_power, opt.epsilon)


def _ftrl(opt, lr) -> tuple:
    l2_reg = opt.l2_regularization_strength + opt.beta / (2.0 * lr)
    l1 = opt.l1_regularization_strength
    return lr, 2 * opt.l2_shrinkage_regularization_strength, -opt.learning_rate_power, 2 * l2_reg, -l1, l1


def _schedule_free_adamw(opt, lr) -> tuple:
    local_step = _local_step(opt)
    beta_1, beta_2 = _float32(opt.beta_1), _float32(opt.beta_2)
    if opt.warmup_steps > 0:
        lr = lr * tf.minimum(local_step / _float32(opt.warmup_steps), 1.0)
    weight = 1.0 / local_step
    return (lr, 1 - beta_2, 1 - tf.pow(beta_2, local_step), _float32(opt.epsilon), 1 - beta_1, beta_1,
            1.0 / beta_1, 1 - weight, weight)


def _lamb(opt, lr) -> tuple:
    local_step = _local_step(opt)
    beta_1_power = tf.pow(_float32(opt.beta_1), local_step)
    beta_2_power = tf.pow(_float32(opt.beta_2), local_step)
    return lr, 1 - opt.beta_1, 1 - opt.beta_2, 1.0 - beta_1_power, 1.0 - beta_2_power, opt.epsilon


def _adafactor(opt, lr) -> tuple:
    local_step = _local_step(opt)
    if not compat.learning_rate_is_callable(opt) and opt.relative_step:
        lr = tf.minimum(lr, 1 / tf.sqrt(local_step))
    rho_t = tf.minimum(lr, 1 / tf.sqrt(local_step))
    beta_2_t = 1 - tf.pow(local_step, opt.beta_2_decay)
    return rho_t, beta_2_t, 1 - beta_2_t, opt.epsilon_1, opt.epsilon_2, opt.clip_threshold


_ADAM_SLOTS = ("_momentums", "_velocities")
_AMSGRAD = HOST_UPDATES_BY_KIND["adam_amsgrad"]


def _adam_like(optimizer_class: type) -> FusedOptimizer:
    return FusedOptimizer(
        optimizer_class, host_updates=(ADAM_UPDATE, _AMSGRAD),
        host_update=lambda opt: _AMSGRAD if opt.amsgrad else ADAM_UPDATE,
        slot_attributes=lambda opt: _ADAM_SLOTS + (("_velocity_hats",) if opt.amsgrad else ()),
        step_scalars=_adam)


# The Keras optimizers with a fused host update, in the order messages name
# them.
FUSED_OPTIMIZER_TABLE: tuple[FusedOptimizer, ...] = (
    FusedOptimizer(keras.optimizers.SGD, host_updates=(SGD_UPDATE, MOMENTUM_UPDATE, NESTEROV_UPDATE),
                   host_update=lambda opt: (SGD_UPDATE if opt.momentum == 0 else
                                            NESTEROV_UPDATE if opt.nesterov else MOMENTUM_UPDATE),
                   slot_attributes=lambda opt: ("momentums",) if opt.momentum != 0 else (),
                   step_scalars=_sgd),
    _adam_like(keras.optimizers.Adam),
    _adam_like(keras.optimizers.AdamW),  # its weight decay: Keras' own, as for every optimizer
    FusedOptimizer(keras.optimizers.RMSprop,
                   host_updates=tuple(HOST_UPDATES_BY_KIND[kind] for kind in (
                       "rmsprop", "rmsprop_momentum", "rmsprop_centered", "rmsprop_centered_momentum")),
                   host_update=_rmsprop_update, slot_attributes=_rmsprop_slots,
                   step_scalars=lambda opt, lr: (lr, opt.rho, 1 - opt.rho, opt.epsilon, opt.momentum)),
    _one(keras.optimizers.Adagrad, "adagrad", ("_accumulators",), lambda opt, lr: (lr, opt.epsilon)),
    _one(keras.optimizers.Adamax, "adamax", ("_m", "_u"), _adamax),
    _one(keras.optimizers.Adadelta, "adadelta", ("_accumulated_grads", "_accumulated_delta_vars"),
         lambda opt, lr: (lr, opt.rho, 1 - opt.rho, opt.epsilon)),
    _one(keras.optimizers.Lion, "lion", ("_momentums",), _lion),
    _one(keras.optimizers.Nadam, "nadam", _ADAM_SLOTS, _nadam, before_step=_nadam_u_product),
    FusedOptimizer(keras.optimizers.Ftrl,
                   host_updates=(HOST_UPDATES_BY_KIND["ftrl"], HOST_UPDATES_BY_KIND["ftrl_sqrt"]),
                   host_update=lambda opt: HOST_UPDATES_BY_KIND["ftrl_sqrt" if opt.learning_rate_power == -0.5
                                                                else "ftrl"],
                   slot_attributes=lambda opt: ("_accumulators", "_linears"), step_scalars=_ftrl),
    _one(keras.optimizers.ScheduleFreeAdamW, "schedule_free_adamw", _ADAM_SLOTS, _schedule_free_adamw),
    _one(keras.optimizers.Lamb, "lamb", _ADAM_SLOTS, _lamb),
    _one(keras.optimizers.Adafactor, "adafactor", ("_r", "_c", "_v"), _adafactor),
)

# The Keras optimizers left to Keras' own update, and why (explain() and
# docs/strategy.md name them; tests/ops/test_fused_table.py pins the list
# against keras.optimizers).
KERAS_UPDATE_ONLY: dict[str, str] = {
    "Muon": "its Newton-Schulz iterations are matrix products, not an elementwise update",
    "LossScaleOptimizer": "a wrapper: the optimizer it wraps runs its own update, fused where that one is",
    "MultiOptimizer": "a wrapper: each optimizer it holds runs its own update, fused where that one is",
}


FUSED_OPTIMIZERS: str = " and ".join(", ".join(row.name for row in FUSED_OPTIMIZER_TABLE).rsplit(", ", 1))


def fused_optimizer(optimizer) -> FusedOptimizer | None:
    """The FUSED_OPTIMIZER_TABLE row of `optimizer`'s exact class, or None."""
    return next((row for row in FUSED_OPTIMIZER_TABLE if type(optimizer) is row.optimizer_class), None)


def update_bytes_per_parameter(optimizer=None) -> int:
    """Bytes per parameter the fused update of `optimizer` moves (with one
    float32 gradient; tf_glp.strategy.cost_model's update rate). Without an
    optimizer, or for one without a fused update, Adam's: 28.

    Example:
        >>> update_bytes_per_parameter(keras.optimizers.SGD())
        12
    """
    row = fused_optimizer(optimizer)
    return (row.host_update(optimizer) if row is not None else ADAM_UPDATE).bytes_per_parameter

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
    if fused_optimizer(optimizer) is None:
        name = type(optimizer).__name__
        if name in KERAS_UPDATE_ONLY and type(optimizer) is getattr(keras.optimizers, name, None):
            return False, f"{name} has no fused host update: {KERAS_UPDATE_ONLY[name]}"
        return False, f"{name} has no fused host update ({FUSED_OPTIMIZERS} do)"
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
        optimizer: One of FUSED_OPTIMIZERS (a FUSED_OPTIMIZER_TABLE class)
            for which `supports_fused_update` is true.
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
        self._row = fused_optimizer(optimizer)

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
        row = self._row
        if not self.update_step_only:
            row.before_step(opt)
        update, scalars = row.host_update(opt), row.step_scalars(opt, lr)
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
            apply_host_update(update, target, row.slots(opt, index), grads, scalars,
                              weight_decay=decay, decay_learning_rate=lr)
        if increment_iterations:
            opt.iterations.assign_add(1)


def fused_update_step(optimizer: keras.optimizers.Optimizer, grads: Sequence, variables: Sequence) -> tuple[list, list]:
    """Keras' `_backend_update_step` for one device, fused: what runs in its
    place where the fused update measured faster (tf_glp.profiling.
    optimizer_step, a one-device tf_glp.Strategy; installed by
    tf_glp._keras.patches.set_fused_update). Updates the variables whose
    gradient is dense and returns the rest, (gradients, variables): the
    sparse ones (IndexedSlices, an Embedding's), which Keras' own update
    then applies, as Keras would (its ops keep them sparse where they can)."""
    dense = [i for i, g in enumerate(grads) if not isinstance(g, tf.IndexedSlices)]
    if dense:
        FusedKerasUpdate(optimizer, update_step_only=True).apply(
            [[grads[i]] for i in dense], [variables[i] for i in dense], increment_iterations=False)
    rest = [i for i in range(len(grads)) if i not in set(dense)]
    return [grads[i] for i in rest], [variables[i] for i in rest]
