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
from tf_glp.ops.host_optimizers import HOST_UPDATES, apply_host_update

SIZES = [1, 7, 1023, (1 << 20) + 3]
GRAD_DTYPES = [tf.float32, tf.bfloat16, tf.float16]


def _normal(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _run_ops(update, rng_seed, size, dtype, n, decay, native_mode, native):
    rng = np.random.default_rng(rng_seed)
    # A factored update's variables of rank 2 (of size 1023: 3 x 341) and 1.
    shape = [3, size // 3] if update.factored and size % 3 == 0 else [size]
    var = tf.Variable(_normal(rng, shape))
    # Slots start non-negative: some are running sums of squares.
    slots = [tf.Variable(np.abs(_normal(rng, update.slot_shape(k, var.shape).as_list(), 0.01)))
             for k in range(len(update.slot_names))]
    grads = [tf.cast(_normal(rng, shape, 0.5), dtype) for _ in range(n)]
    scalars = [_SCALAR_VALUES.get(name, 0.01) for name in update.scalar_names]
    native_mode("auto" if native else "0")
    decay_args = dict(weight_decay=0.004, decay_learning_rate=0.01) if decay else {}
    for _ in range(3):
        apply_host_update(update, var, slots, grads, scalars, **decay_args)
    return [var.numpy()] + [slot.numpy() for slot in slots]


# A plausible value for each scalar name of HOST_UPDATES (default 0.01:
# learning rates, bias corrections, regularization).
_SCALAR_VALUES = {"momentum": 0.9, "rho": 0.9, "beta_1": 0.9, "beta_2": 0.999, "1 - rho": 1 - 0.9,
                  "1 - beta_1": 1 - 0.9, "1 - beta_2": 1 - 0.999, "epsilon": 1e-7, "-learning_rate_power": 0.5,
                  "l1": 0.01, "-l1": -0.01, "alpha": 0.001, "beta_2_t": 0.8, "1 - beta_2_t": 1 - 0.8,
                  "epsilon_1": 1e-30, "epsilon_2": 1e-3, "clip_threshold": 1.0}

# Every dtype and N on the small sizes; the large size once per kind, to keep
# the suite fast.
EQUIVALENCE_CASES = [
    (size, dtype, n, decay)
    for size in SIZES
    for dtype in GRAD_DTYPES
    for n, decay in [(1, False), (3, True), (10, False)]
    if size < 2000 or (n == 3 and dtype == tf.float32)
]


@pytest.mark.parametrize("update", HOST_UPDATES, ids=lambda u: u.kind)
@pytest.mark.parametrize("size,dtype,n,decay", EQUIVALENCE_CASES)
def test_native_equals_fallback(update, size, dtype, n, decay, native_mode):
    """Bitwise, except where the formula calls pow (update.exact: the C
    library's powf and TensorFlow's may differ in the last bit, which Ftrl's
    difference of two powers amplifies: within 1e-4 of the variable's
    largest value after 3 steps)."""
    if not tf_glp.native_available():
        pytest.skip("native library not in use")
    native = _run_ops(update, size + n, size, dtype, n, decay, native_mode, True)
    fallback = _run_ops(update, size + n, size, dtype, n, decay, native_mode, False)
    for a, b in zip(native, fallback):
        if update.exact:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(b).max())))


def test_unsupported_optimizers_are_reported():
    assert supports_fused_update(keras.optimizers.Adam())[0]
    assert supports_fused_update(keras.optimizers.Adam(amsgrad=True))[0]
    assert supports_fused_update(keras.optimizers.Adafactor())[0]
    ok, why = supports_fused_update(keras.optimizers.SGD(clipnorm=1.0))
    assert not ok and "clipnorm" in why
    with pytest.raises(ValueError, match="Muon has no fused host update: its Newton-Schulz"):
        FusedKerasUpdate(keras.optimizers.Muon())


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
