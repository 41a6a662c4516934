"""The fused-update tables: tf_glp/ops/host_optimizers.py's HostUpdate rows
against the native formulas (Note [Update formulas]), keras_fused.py's
FusedOptimizer rows against Keras' optimizers (Note [Fusing a Keras
optimizer]): every row, with settings that choose each of its updates,
gives Keras' numbers over many steps; and FUSED_OPTIMIZERS and
KERAS_UPDATE_ONLY against keras.optimizers."""

import inspect
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_glp
from tf_glp.ops.host_optimizers import HOST_UPDATES, apply_host_update
from tf_glp.ops.keras_fused import (
    FUSED_OPTIMIZER_TABLE,
    FUSED_OPTIMIZERS,
    KERAS_UPDATE_ONLY,
    FusedKerasUpdate,
    fused_optimizer,
    supports_fused_update,
    update_bytes_per_parameter,
)

_FORMULAS = os.path.join(os.path.dirname(__file__), "..", "..", "cc", "core", "update_formulas.h")

TABLE_CLASSES = {row.optimizer_class for row in FUSED_OPTIMIZER_TABLE}

# Optimizer classes that cannot be built without arguments (as in
# tests/strategy/test_drop_in.py).
_OPTIMIZER_ARGUMENTS = {
    "LossScaleOptimizer": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()),
    "MultiOptimizer": lambda: keras.optimizers.MultiOptimizer(lambda variable: keras.optimizers.Adam()),
}

# Settings that choose each of a row's host updates (default: the class's
# defaults only).
_SETTINGS = {
    "SGD": [{}, {"momentum": 0.9}, {"momentum": 0.9, "nesterov": True}],
    "Adam": [{}, {"amsgrad": True}],
    "AdamW": [{}, {"amsgrad": True}],
    "RMSprop": [{}, {"momentum": 0.9}, {"centered": True}, {"centered": True, "momentum": 0.5}],
    "Ftrl": [{}, {"learning_rate_power": -0.6}],
}
# Other settings each class's formula reads, tried once more (with a
# learning-rate schedule and weight decay) in the Keras comparison below.
_MORE_SETTINGS = {
    "SGD": {"momentum": 0.8, "nesterov": True},
    "Adam": {"beta_1": 0.8, "epsilon": 1e-5},
    "RMSprop": {"rho": 0.8, "momentum": 0.3, "centered": True, "epsilon": 1e-5},
    "Adagrad": {"initial_accumulator_value": 0.5, "epsilon": 1e-5},
    "Adamax": {"beta_1": 0.8, "beta_2": 0.99},
    "Adadelta": {"rho": 0.8, "epsilon": 1e-5},
    "Lion": {"beta_1": 0.8, "beta_2": 0.95},
    "Nadam": {"beta_1": 0.8, "beta_2": 0.99},
    "ScheduleFreeAdamW": {"warmup_steps": 5, "beta_1": 0.8},
    "Lamb": {"beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-5},
    "Adafactor": {"beta_2_decay": -0.7, "epsilon_2": 1e-2, "clip_threshold": 0.5, "relative_step": False},
    "Ftrl": {"learning_rate_power": -0.7, "l1_regularization_strength": 0.01, "l2_regularization_strength": 0.02,
             "l2_shrinkage_regularization_strength": 0.03, "beta": 0.1},
}
# Kinds whose formula follows a rewrite Grappler's constant folding makes of
# Keras' line inside a fit but not in this test's tf.function (centered
# RMSprop: (v - a*a) + eps becomes v - (a*a - eps)); they are bitwise
# against Keras inside fit (tests/profiling/test_optimizer_step.py) and
# compared here as the pow rows are.
_FOLLOWS_FIT = {"rmsprop_centered", "rmsprop_centered_momentum"}
# Ftrl's square root where Keras calls TensorFlow's pow(x, 0.5) (see below).
_NOT_KERAS_POW = {"ftrl_sqrt"}
# The rows whose fallback is not exact (HostUpdate.exact is False): Lamb and
# Adafactor (their norms and means are sums in another order than
# TensorFlow's) and Ftrl: Keras'
# update runs TensorFlow's pow, the fused one the C library's powf (TF's
# pow(x, 0.5) differs from the correctly rounded sqrt in 27% of float32
# values here, powf in none). Ftrl subtracts two such powers, which
# amplifies that bit over steps (seen: 2e-4 relative after 30 steps), and
# within a step where the difference is small against the variable's
# largest weight (seen: 6e-6 apart where that is 365). So these rows are
# compared after every step, each step from Keras' state, to this fraction
# of each value or of the variable's largest.
_TO_ROUNDING_RTOL = 1e-5


def _keras_optimizer_names():
    return sorted(name for name, cls in inspect.getmembers(keras.optimizers, inspect.isclass)
                  if issubclass(cls, keras.optimizers.Optimizer) and cls is not keras.optimizers.Optimizer)


def _make(name):
    if name in _OPTIMIZER_ARGUMENTS:
        return _OPTIMIZER_ARGUMENTS[name]()
    return getattr(keras.optimizers, name)()


def test_host_update_rows_are_the_native_kinds(native_mode):
    """One row per formula of cc/core/update_formulas.h, with its slot and
    scalar counts: the kernel refuses a kind it does not know and counts
    that differ from its formula's (HostApplyOp's constructor)."""
    if not tf_glp.native_available():
        pytest.skip("native library not in use")
    native_mode("auto")
    assert len({update.kind for update in HOST_UPDATES}) == len(HOST_UPDATES)
    formulas = open(_FORMULAS).read()
    listed = re.search(r"using UpdateFormulas =(.*?);", formulas, re.S).group(1)
    assert len(re.findall(r"Formula\b", listed)) == len(HOST_UPDATES), "a HostUpdate row per formula"
    for update in HOST_UPDATES:
        assert f'"{update.kind}"' in formulas, update.kind
        var = tf.Variable([1.0, 2.0])
        slots = [tf.Variable(tf.fill(update.slot_shape(k, var.shape), 0.5)) for k in range(len(update.slot_names))]
        apply_host_update(update, var, slots, [tf.ones(2), tf.ones(2)], [0.1] * len(update.scalar_names))
        assert np.all(np.isfinite(var.numpy())) and not np.array_equal(var.numpy(), [1.0, 2.0]), update.kind
        library = tf_glp._native.library()
        values = [tf.constant(0.1)] * len(update.scalar_names)
        handles = [slot.handle for slot in slots]
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"update kind {update.kind} takes"):
            library.glp_host_apply(var.handle, handles, [tf.ones(2)], values + [tf.constant(0.1)], 0.0, 0.0,
                                   kind=update.kind)
        if slots:
            with pytest.raises(tf.errors.InvalidArgumentError, match=f"update kind {update.kind} takes"):
                library.glp_host_apply(var.handle, handles[1:], [tf.ones(2)], values, 0.0, 0.0, kind=update.kind)
    with pytest.raises(tf.errors.InvalidArgumentError, match="unknown update kind 'adamx'"):
        tf_glp._native.library().glp_host_apply(tf.Variable([1.0]).handle, [], [tf.ones(1)], [0.1], 0.0, 0.0,
                                                kind="adamx")


@pytest.mark.parametrize("row", FUSED_OPTIMIZER_TABLE, ids=lambda r: r.name)
def test_table_rows_give_their_updates_what_they_take(row):
    settings = _SETTINGS.get(row.name, [{}])
    chosen = set()
    for kwargs in settings:
        opt = row.optimizer_class(**kwargs)
        var = keras.Variable(np.ones([3], np.float32))
        opt.build([var])
        assert fused_optimizer(opt) is row
        update = row.host_update(opt)
        assert update in row.host_updates
        chosen.add(update)
        slots = row.slots(opt, 0)
        assert len(slots) == len(update.slot_names)
        assert all(isinstance(s, tf.Variable) and s.shape == update.slot_shape(k, var.shape)
                   for k, s in enumerate(slots))
        assert len({id(s) for s in slots}) == len(slots)
        assert len(row.step_scalars(opt, tf.constant(0.01))) == len(update.scalar_names)
        assert update_bytes_per_parameter(opt) == update.bytes_per_parameter
    assert chosen == set(row.host_updates), "add settings to _SETTINGS that choose each update"


def test_fused_optimizers_names_exactly_the_table():
    names = [row.name for row in FUSED_OPTIMIZER_TABLE]
    assert len(set(names)) == len(names)
    assert FUSED_OPTIMIZERS == ", ".join(names[:-1]) + " and " + names[-1]
    assert FUSED_OPTIMIZERS == ("SGD, Adam, AdamW, RMSprop, Adagrad, Adamax, Adadelta, Lion, Nadam, Ftrl, "
                                "ScheduleFreeAdamW, Lamb and Adafactor")  # today's table; update with it
    assert tf_glp.ops.FUSED_OPTIMIZERS is FUSED_OPTIMIZERS and "FUSED_OPTIMIZERS" in tf_glp.ops.__all__


@pytest.mark.parametrize("name", _keras_optimizer_names())
def test_every_keras_optimizer_is_fused_or_left_to_keras_with_its_reason(name):
    opt = _make(name)
    ok, why = supports_fused_update(opt)
    assert ok == (type(opt) in TABLE_CLASSES), (name, why)
    assert ok != (name in KERAS_UPDATE_ONLY), name
    if not ok:
        assert why == f"{name} has no fused host update: {KERAS_UPDATE_ONLY[name]}"


def test_the_list_left_to_keras_is_pinned():
    assert set(KERAS_UPDATE_ONLY) == {"Muon", "LossScaleOptimizer", "MultiOptimizer"}
    assert set(KERAS_UPDATE_ONLY) | {row.name for row in FUSED_OPTIMIZER_TABLE} == set(_keras_optimizer_names())


def test_subclasses_are_not_fused_unless_listed():
    class MyAdam(keras.optimizers.Adam):
        pass

    assert issubclass(keras.optimizers.AdamW, keras.optimizers.Adam)
    assert fused_optimizer(keras.optimizers.AdamW()).optimizer_class is keras.optimizers.AdamW
    ok, why = supports_fused_update(MyAdam())
    assert not ok and why == f"MyAdam has no fused host update ({FUSED_OPTIMIZERS} do)"


def test_bytes_per_parameter_for_the_cost_model():
    assert update_bytes_per_parameter() == 28  # no optimizer known: Adam's, as before the table
    assert update_bytes_per_parameter(keras.optimizers.Muon()) == 28  # not fused: Adam's
    assert update_bytes_per_parameter(keras.optimizers.Lamb()) == 40  # two passes
    assert update_bytes_per_parameter(keras.optimizers.Adafactor()) == 32  # three passes
    assert update_bytes_per_parameter(keras.optimizers.RMSprop()) == 20
    assert update_bytes_per_parameter(keras.optimizers.RMSprop(centered=True, momentum=0.9)) == 36
    assert update_bytes_per_parameter(keras.optimizers.Adam()) == 28
    assert update_bytes_per_parameter(keras.optimizers.AdamW()) == 28
    assert update_bytes_per_parameter(keras.optimizers.SGD()) == 12
    assert update_bytes_per_parameter(keras.optimizers.SGD(momentum=0.9)) == 20


def _keras_cases():
    """(id, make) for every row: each of _SETTINGS, and _MORE_SETTINGS with a
    learning-rate schedule and weight decay."""
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=10, decay_rate=0.5)
    cases = []
    for row in FUSED_OPTIMIZER_TABLE:
        cls = row.optimizer_class
        for kwargs in _SETTINGS.get(row.name, [{}]):
            cases.append((f"{row.name}{kwargs or ''}", lambda cls=cls, kwargs=kwargs: cls(0.01, **kwargs)))
        more = dict(_MORE_SETTINGS.get(row.name, {}), weight_decay=0.05)
        cases.append((f"{row.name}-schedule-decay{more}", lambda cls=cls, more=more: cls(schedule, **more)))
    return cases


@pytest.fixture
def exact_keras():
    """Grappler's arithmetic optimizer regroups Keras' float32 expressions
    (seen here: 1-2 ulp per step once a model has a few variables), so Keras
    itself then no longer computes its own formulas exactly. With it off,
    Keras evaluates them as written, and the fused ops must match bitwise."""
    saved = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    yield
    tf.config.optimizer.set_experimental_options(saved)


@pytest.mark.parametrize("case", _keras_cases(), ids=lambda case: case[0])
def test_fused_update_matches_keras_over_30_steps(case, exact_keras):
    """FusedKerasUpdate over 2 replicas' gradients against Keras' own apply
    of their sum: bitwise (the rows compared to rounding: step by step, _TO_ROUNDING_RTOL), slots included, with
    one variable excluded from weight decay."""
    _, make = case
    rng = np.random.default_rng(7)
    shapes = [(33, 17), (17,), (1,), (1000, 3), (2, 5, 4)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    steps = [[[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(2)] for _ in range(30)]

    keras_vars = [keras.Variable(v, name=f"k{i}") for i, v in enumerate(init)]
    fused_vars = [keras.Variable(v, name=f"f{i}") for i, v in enumerate(init)]
    keras_opt, fused_opt = make(), make()
    keras_opt.exclude_from_weight_decay(var_list=[keras_vars[1]])
    fused_opt.exclude_from_weight_decay(var_list=[fused_vars[1]])
    keras_opt.build(keras_vars)
    fused_opt.build(fused_vars)  # outside the step, as fit builds it (ScheduleFreeAdamW's build assigns)
    fused = FusedKerasUpdate(fused_opt)
    row = fused_optimizer(fused_opt)

    @tf.function
    def keras_step(grads):
        keras_opt.apply([tf.add_n(list(g)) for g in zip(*grads)], keras_vars)

    @tf.function
    def fused_step(grads):
        fused.apply([list(g) for g in zip(*grads)], fused_vars)

    update = row.host_update(fused_opt)
    exact = update.exact and update.kind not in _FOLLOWS_FIT | _NOT_KERAS_POW
    keras_state, fused_state = keras_vars + keras_opt.variables, fused_vars + fused_opt.variables
    assert len(keras_state) == len(fused_state)
    for grads in steps:
        keras_step(grads)
        fused_step(grads)
        if not exact:  # each step from Keras' state: the last bit is not amplified over steps
            for k, f in zip(keras_state, fused_state):
                scale = max(1.0, float(np.abs(k.numpy()).max()))
                np.testing.assert_allclose(f.numpy(), k.numpy(), rtol=_TO_ROUNDING_RTOL, atol=_TO_ROUNDING_RTOL * scale)
                f.assign(k)
    assert int(fused_opt.iterations.numpy()) == 30
    for k, f in zip(keras_state, fused_state):
        np.testing.assert_array_equal(f.numpy(), k.numpy())
