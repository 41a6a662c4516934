"""Fused host optimizer ops against Keras 3's optimizers and their own
fallbacks: kinds, gradient dtypes, N, odd sizes, schedules, weight decay,
copy-on-write, and bad input."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import tf_glp
from tf_glp.ops import (
    FusedKerasUpdate,
    host_apply_adam,
    host_apply_momentum,
    host_apply_sgd,
    supports_fused_update,
)

SIZES = [1, 7, 1023, (1 << 20) + 3]
GRAD_DTYPES = [tf.float32, tf.bfloat16, tf.float16]


def _normal(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _run_ops(kind, rng_seed, size, dtype, n, decay, native_mode, native):
    rng = np.random.default_rng(rng_seed)
    var = tf.Variable(_normal(rng, [size]))
    slot0 = tf.Variable(_normal(rng, [size], 0.1))
    slot1 = tf.Variable(np.abs(_normal(rng, [size], 0.01)))
    grads = [tf.cast(_normal(rng, [size], 0.5), dtype) for _ in range(n)]
    native_mode("auto" if native else "0")
    decay_args = dict(weight_decay=0.004, decay_learning_rate=0.01) if decay else {}
    for _ in range(3):
        if kind == "sgd":
            host_apply_sgd(var, grads, 0.01, **decay_args)
        elif kind in ("momentum", "nesterov"):
            host_apply_momentum(var, slot0, grads, 0.01, 0.9, nesterov=kind == "nesterov", **decay_args)
        else:
            host_apply_adam(var, slot0, slot1, grads, 0.001, 1 - 0.9, 1 - 0.999, 1e-7, **decay_args)
    return var.numpy(), slot0.numpy(), slot1.numpy()


# Every dtype and N on the small sizes; the large size once per kind, to keep
# the suite fast.
EQUIVALENCE_CASES = [
    (size, dtype, n, decay)
    for size in SIZES
    for dtype in GRAD_DTYPES
    for n, decay in [(1, False), (3, True), (10, False)]
    if size < 2000 or (n == 3 and dtype == tf.float32)
]


@pytest.mark.parametrize("kind", ["sgd", "momentum", "nesterov", "adam"])
@pytest.mark.parametrize("size,dtype,n,decay", EQUIVALENCE_CASES)
def test_native_equals_fallback_bitwise(kind, size, dtype, n, decay, native_mode):
    if not tf_glp.native_available():
        pytest.skip("native library not in use")
    native = _run_ops(kind, size + n, size, dtype, n, decay, native_mode, True)
    fallback = _run_ops(kind, size + n, size, dtype, n, decay, native_mode, False)
    for a, b in zip(native, fallback):
        np.testing.assert_array_equal(a, b)


def _keras_optimizers():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=10, decay_rate=0.5)
    return {
        "sgd": lambda: keras.optimizers.SGD(0.05),
        "sgd_schedule_decay": lambda: keras.optimizers.SGD(schedule, weight_decay=0.01),
        "momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
        "nesterov": lambda: keras.optimizers.SGD(0.05, momentum=0.8, nesterov=True),
        "adam": lambda: keras.optimizers.Adam(1e-3),
        "adam_schedule": lambda: keras.optimizers.Adam(schedule, beta_1=0.8, epsilon=1e-5),
        "adamw": lambda: keras.optimizers.AdamW(1e-3, weight_decay=0.05),
    }


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


@pytest.mark.parametrize("name", list(_keras_optimizers()))
@pytest.mark.parametrize("replicas", [1, 4])
def test_fused_update_matches_keras_over_100_steps(name, replicas, exact_keras):
    make = _keras_optimizers()[name]
    rng = np.random.default_rng(7)
    shapes = [(33, 17), (17,), (1,), (1000, 3)]
    init = [_normal(rng, s) for s in shapes]
    steps = [[[_normal(rng, s) for s in shapes] for _ in range(replicas)] for _ in range(100)]

    keras_vars = [keras.Variable(v, name=f"k{i}") for i, v in enumerate(init)]
    fused_vars = [keras.Variable(v, name=f"f{i}") for i, v in enumerate(init)]
    keras_opt, fused_opt = make(), make()
    if name == "adamw":  # exclusion works as in Keras
        keras_opt.exclude_from_weight_decay(var_list=[keras_vars[1]])
        fused_opt.exclude_from_weight_decay(var_list=[fused_vars[1]])
    keras_opt.build(keras_vars)
    fused = FusedKerasUpdate(fused_opt)

    @tf.function
    def keras_step(grads):
        summed = [tf.add_n(list(g)) if len(g) > 1 else g[0] for g in zip(*grads)]
        keras_opt.apply(summed, keras_vars)

    @tf.function
    def fused_step(grads):
        fused.apply([list(g) for g in zip(*grads)], fused_vars)

    for grads in steps:
        keras_step(grads)
        fused_step(grads)
    assert int(fused_opt.iterations.numpy()) == 100
    for k, f in zip(keras_vars, fused_vars):
        np.testing.assert_array_equal(f.numpy(), k.numpy())


def test_unsupported_optimizers_are_reported():
    assert supports_fused_update(keras.optimizers.Adam())[0]
    assert not supports_fused_update(keras.optimizers.RMSprop())[0]
    ok, why = supports_fused_update(keras.optimizers.Adam(amsgrad=True))
    assert not ok and "amsgrad" in why
    ok, why = supports_fused_update(keras.optimizers.SGD(clipnorm=1.0))
    assert not ok and "clipnorm" in why
    with pytest.raises(ValueError, match="RMSprop has no fused host update"):
        FusedKerasUpdate(keras.optimizers.RMSprop())


def test_update_copies_a_buffer_that_a_reader_holds():
    var = tf.Variable([1.0, 2.0, 3.0])
    before = var.read_value()  # may share the variable's buffer
    host_apply_sgd(var, [tf.ones(3)], 1.0)
    np.testing.assert_array_equal(before.numpy(), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(var.numpy(), [0.0, 1.0, 2.0])


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("size", [7, 1023, (1 << 16) + 3])
def test_update_of_a_buffer_shared_with_another_variable(kind, size):
    """AssignVariableOp makes a variable adopt the assigned buffer (as
    update="host" does for the replicas' copies): the update writes a fresh
    buffer (Note [Writing a shared parameter]) with the same bits as in
    place, and the variable that shares the old buffer keeps its value."""
    rng = np.random.default_rng(size)
    start = _normal(rng, [size])
    grads = [tf.constant(_normal(rng, [size], 0.5)) for _ in range(2)]
    results = {}
    for shared in (False, True):
        var = tf.Variable(start)
        slots = [tf.Variable(tf.zeros([size])) for _ in range(2)]
        other = tf.Variable(tf.zeros([size]))
        if shared:
            other.assign(var)

        @tf.function
        def step():
            if kind == "sgd":
                host_apply_sgd(var, grads, 0.1, weight_decay=0.01, decay_learning_rate=0.1)
            elif kind == "momentum":
                host_apply_momentum(var, slots[0], grads, 0.1, 0.9)
            else:
                host_apply_adam(var, slots[0], slots[1], grads, 0.01, 0.1, 0.001, 1e-7)
            if shared:
                other.assign(var)  # shared again, as after every host step

        for _ in range(3):
            step()
        results[shared] = var.numpy()
        if shared:
            np.testing.assert_array_equal(other.numpy(), results[shared])
    np.testing.assert_array_equal(results[True], results[False])
    var, other = tf.Variable(start), tf.Variable(tf.zeros([size]))
    other.assign(var)
    host_apply_sgd(var, grads, 1.0)
    np.testing.assert_array_equal(other.numpy(), start)  # the shared buffer is left as it was
    np.testing.assert_array_equal(var.numpy(), start - (grads[0].numpy() + grads[1].numpy()))


def test_a_rejected_update_of_a_shared_buffer_leaves_the_variable_as_it_was():
    start = np.arange(1.0, 1024.0, dtype=np.float32)
    var, other = tf.Variable(start), tf.Variable(tf.zeros([1023]))
    other.assign(var)  # shares var's buffer
    with pytest.raises(tf.errors.InvalidArgumentError, match="learning_rate must be finite"):
        host_apply_sgd(var, [tf.ones([1023])], tf.constant(float("nan")))
    np.testing.assert_array_equal(var.numpy(), start)
    np.testing.assert_array_equal(other.numpy(), start)


def test_works_inside_tf_function_with_tensor_hyper_parameters():
    var, m, v = tf.Variable(tf.ones([5])), tf.Variable(tf.zeros([5])), tf.Variable(tf.zeros([5]))
    lr = tf.Variable(0.1)

    @tf.function
    def step(g):
        host_apply_adam(var, m, v, [g, g], lr * 0.5, 0.1, 0.001, 1e-7)

    step(tf.ones([5]))
    np.testing.assert_allclose(m.numpy(), 0.2, rtol=1e-6)
    np.testing.assert_allclose(v.numpy(), 0.004, rtol=1e-6)
    # alpha * m / (sqrt(v) + eps) = 0.05 * 0.2 / (0.0632... + 1e-7)
    np.testing.assert_allclose(var.numpy(), 1 - 0.05 * 0.2 / (math.sqrt(0.004) + 1e-7), rtol=1e-6)


class TestBadInput:
    def test_gradient_shape_mismatch(self):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"grads\[0\] has shape \(4,\) but var has shape \(3,\)"):
            host_apply_sgd(tf.Variable(tf.zeros(3)), [tf.zeros(4)], 0.1)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"grads\[1\] has shape \(4,\) and grads\[0\] has shape \(3,\)"):
            host_apply_sgd(tf.Variable(tf.zeros(3)), [tf.zeros(3), tf.zeros(4)], 0.1)

    def test_slot_shape_mismatch(self):
        with pytest.raises(tf.errors.InvalidArgumentError, match="momentum_slot has shape"):
            host_apply_momentum(tf.Variable(tf.zeros(3)), tf.Variable(tf.zeros(2)), [tf.zeros(3)], 0.1, 0.9)

    def test_wrong_slot_size_with_unknown_static_shape(self):
        var, m = tf.Variable(tf.zeros(3)), tf.Variable(tf.zeros(2), shape=tf.TensorShape(None))
        v = tf.Variable(tf.zeros(3))
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"has shape \[2\] but var has shape \[3\]"):
            host_apply_adam(var, m, v, [tf.zeros(3)], 0.1, 0.1, 0.001, 1e-7)

    def test_float64_variable(self):
        with pytest.raises(tf.errors.InvalidArgumentError, match="var must be float32, got float64"):
            host_apply_sgd(tf.Variable(tf.zeros(3, tf.float64)), [tf.zeros(3)], 0.1)

    def test_no_gradients(self):
        with pytest.raises(tf.errors.InvalidArgumentError, match="empty list"):
            host_apply_sgd(tf.Variable(tf.zeros(3)), [], 0.1)

    @pytest.mark.parametrize("bad", [float("nan"), float("inf")])
    def test_non_finite_python_hyper_parameter(self, bad):
        with pytest.raises(tf.errors.InvalidArgumentError, match="epsilon must be finite"):
            host_apply_adam(tf.Variable(tf.zeros(3)), tf.Variable(tf.zeros(3)), tf.Variable(tf.zeros(3)),
                            [tf.zeros(3)], 0.1, 0.1, 0.001, bad)

    @pytest.mark.parametrize("native", [True, False])
    def test_non_finite_tensor_hyper_parameter(self, native, native_mode):
        native_mode("auto" if native else "0")
        var = tf.Variable(tf.ones(3))
        with pytest.raises(tf.errors.InvalidArgumentError, match="learning_rate must be finite"):
            host_apply_sgd(var, [tf.ones(3)], tf.constant(float("nan")))
        np.testing.assert_array_equal(var.numpy(), 1.0)  # untouched

    def test_non_scalar_hyper_parameter(self):
        with pytest.raises(tf.errors.InvalidArgumentError, match="learning_rate must be a scalar"):
            host_apply_sgd(tf.Variable(tf.zeros(3)), [tf.zeros(3)], tf.zeros([2]))

    def test_weight_decay_needs_its_learning_rate(self):
        with pytest.raises(ValueError, match="decay_learning_rate"):
            host_apply_sgd(tf.Variable(tf.zeros(3)), [tf.zeros(3)], 0.1, weight_decay=0.1)


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(["sgd", "momentum", "adam"]),
    var_shape=st.lists(st.integers(1, 5), min_size=1, max_size=2),
    grad_shapes=st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=2), min_size=0, max_size=3),
    dtype=st.sampled_from([tf.float32, tf.bfloat16, tf.float16, tf.int32]),
)
def test_property_bad_input_raises_cleanly(kind, var_shape, grad_shapes, dtype):
    var = tf.Variable(tf.zeros(var_shape))
    slots = [tf.Variable(tf.zeros(var_shape)) for _ in range(2)]
    grads = [tf.zeros(s, dtype) for s in grad_shapes]
    valid = bool(grads) and dtype != tf.int32 and all(list(s) == list(var_shape) for s in grad_shapes)

    def call():
        if kind == "sgd":
            host_apply_sgd(var, grads, 0.1)
        elif kind == "momentum":
            host_apply_momentum(var, slots[0], grads, 0.1, 0.9)
        else:
            host_apply_adam(var, slots[0], slots[1], grads, 0.1, 0.1, 0.001, 1e-7)

    if valid:
        call()
    else:
        with pytest.raises(tf.errors.InvalidArgumentError):
            call()
