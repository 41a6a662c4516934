"""host_reduce against tf.add_n and its own fallback: dtypes, N, shapes,
eager / tf.function / model.fit, gradients, bad input, determinism."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import tf_glp
from tf_glp.ops import host_reduce

DTYPES = [tf.float32, tf.bfloat16, tf.float16]
SHAPES = [(), (1,), (7,), (3, 5), (1023,), (2, 3, 4, 5)]


def _inputs(rng, n, shape, dtype):
    return [tf.cast(tf.constant(rng.standard_normal(shape).astype(np.float32)), dtype) for _ in range(n)]


def _reference(inputs, op="sum", out_dtype=None):
    total = tf.cast(inputs[0], tf.float32)
    for t in inputs[1:]:
        total = total + tf.cast(t, tf.float32)
    if op == "mean":
        total = total / tf.constant(len(inputs), tf.float32)
    return tf.cast(total, out_dtype or inputs[0].dtype)


def _bits(t):
    return tf.bitcast(t, tf.int16 if t.dtype.size == 2 else tf.int32).numpy() if t.shape.rank else t.numpy().tobytes()


def test_native_library_is_in_use():
    if os.environ.get("TF_GLP_NATIVE") == "0":
        pytest.skip("fallback forced by TF_GLP_NATIVE=0")
    status = tf_glp.native_available()
    assert status.available, status.reason
    assert status.cpu_kernels in ("scalar", "avx2", "avx512")


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("shape", SHAPES)
def test_float32_sum_equals_add_n_bitwise(rng, n, shape):
    inputs = _inputs(rng, n, shape, tf.float32)
    np.testing.assert_array_equal(host_reduce(inputs).numpy(), tf.add_n(inputs).numpy())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("out", ["same", "float32"])
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_every_dtype_matches_float32_accumulation(rng, dtype, op, out, n):
    inputs = _inputs(rng, n, (1023,), dtype)
    out_dtype = tf.float32 if out == "float32" else dtype
    got = host_reduce(inputs, op=op, output_dtype=out_dtype)
    assert got.dtype == out_dtype and got.shape == (1023,)
    np.testing.assert_array_equal(_bits(got), _bits(_reference(inputs, op, out_dtype)))
    # And close to TensorFlow's own add_n in the input dtype (which rounds
    # after every addition, so only approximately equal for 16-bit types).
    plain = tf.add_n(inputs) if op == "sum" else tf.add_n(inputs) / tf.cast(n, dtype)
    tol = 1e-6 if dtype == tf.float32 else 3e-2
    np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), tf.cast(plain, tf.float32).numpy(), rtol=tol, atol=tol * n)


def test_64_megabyte_tensors(rng):
    inputs = [tf.random.stateless_normal([16 << 20], seed=[i, 7]) for i in range(2)]
    np.testing.assert_array_equal(host_reduce(inputs).numpy(), tf.add_n(inputs).numpy())


def test_inside_tf_function_and_with_unknown_shapes(rng):
    inputs = _inputs(rng, 3, (4, 6), tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)] * 3)
    def reduce(a, b, c):
        return host_reduce([a, b, c], op="mean")

    got = reduce(*inputs)
    assert reduce.get_concrete_function().structured_outputs.shape.as_list() == [None, None]
    np.testing.assert_array_equal(got.numpy(), _reference(inputs, "mean").numpy())
    # Shapes unknown when traced: the kernel itself rejects a mismatch.
    with pytest.raises(tf.errors.InvalidArgumentError, match="input 2 has shape"):
        reduce(inputs[0], inputs[1], tf.zeros([4, 5]))


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradient_matches_fallback_and_add_n(rng, op, dtype, native_mode):
    inputs = _inputs(rng, 3, (5, 2), dtype)
    upstream = tf.cast(tf.constant(rng.standard_normal((5, 2)).astype(np.float32)), dtype)

    def grads():
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            y = host_reduce(inputs, op=op)
        return tape.gradient(y, inputs, output_gradients=upstream)

    native = grads()
    native_mode("0")
    fallback = grads()
    for a, b in zip(native, fallback):
        assert a.dtype == dtype
        np.testing.assert_array_equal(_bits(a), _bits(b))
    if op == "sum":
        np.testing.assert_array_equal(_bits(native[0]), _bits(upstream))


def test_trains_inside_model_fit():
    """host_reduce in a layer's call: forward and gradient inside fit."""

    class SumOfBranches(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.branches = [keras.layers.Dense(4, name=f"branch{i}") for i in range(3)]

        def call(self, x):
            return host_reduce([b(x) for b in self.branches], op="mean")

    def train(use_host_reduce):
        keras.utils.set_random_seed(3)
        inputs = keras.Input((6,))
        layer = SumOfBranches()
        if not use_host_reduce:
            layer.call = lambda x: tf.add_n([b(x) for b in layer.branches]) / 3.0
        model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        x = np.random.default_rng(0).standard_normal((64, 6)).astype(np.float32)
        y = x.sum(axis=1, keepdims=True)
        history = model.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False)
        return history.history["loss"], [w.numpy() for w in model.weights]

    losses, weights = train(True)
    ref_losses, ref_weights = train(False)
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for a, b in zip(weights, ref_weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_forced_fallback_gives_identical_numbers(rng, native_mode):
    inputs = _inputs(rng, 5, (333,), tf.bfloat16)
    native = host_reduce(inputs, op="mean")
    native_mode("0")
    assert not tf_glp.native_available()
    assert "TF_GLP_NATIVE=0" in tf_glp.native_available().reason
    np.testing.assert_array_equal(_bits(host_reduce(inputs, op="mean")), _bits(native))


class TestBadInput:
    def test_empty_list(self):
        with pytest.raises(tf.errors.InvalidArgumentError, match="at least one tensor, got an empty list"):
            host_reduce([])

    def test_mismatched_shapes(self):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"tensors\[1\] has shape \(3,\)"):
            host_reduce([tf.zeros([2]), tf.zeros([3])])

    def test_mismatched_dtypes(self):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"tensors\[1\] is float16"):
            host_reduce([tf.zeros([2]), tf.zeros([2], tf.float16)])

    def test_integer_dtype(self):
        with pytest.raises(tf.errors.InvalidArgumentError, match="got int32"):
            host_reduce([tf.zeros([2], tf.int32)])

    def test_not_a_list(self):
        with pytest.raises(tf.errors.InvalidArgumentError, match="must be a list"):
            host_reduce(tf.zeros([2, 2]))

    def test_unknown_op(self):
        with pytest.raises(ValueError, match="'max'"):
            host_reduce([tf.zeros([2])], op="max")

    def test_bad_output_dtype(self):
        with pytest.raises(tf.errors.InvalidArgumentError, match="got float16"):
            host_reduce([tf.zeros([2], tf.bfloat16)], output_dtype=tf.float16)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 16),
    shape=st.lists(st.integers(0, 9), min_size=0, max_size=3),
    dtype=st.sampled_from(DTYPES),
    op=st.sampled_from(["sum", "mean"]),
    seed=st.integers(0, 2**16),
)
def test_property_matches_reference(n, shape, dtype, op, seed):
    inputs = _inputs(np.random.default_rng(seed), n, tuple(shape), dtype)
    np.testing.assert_array_equal(_bits(host_reduce(inputs, op=op)), _bits(_reference(inputs, op)))


@settings(max_examples=30, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=2), min_size=2, max_size=4),
    dtypes=st.lists(st.sampled_from([tf.float32, tf.bfloat16, tf.float16, tf.int32, tf.float64]), min_size=2, max_size=4),
)
def test_property_bad_input_raises_cleanly(shapes, dtypes):
    k = min(len(shapes), len(dtypes))
    inputs = [tf.zeros(s, d) for s, d in zip(shapes[:k], dtypes[:k])]
    valid = len({tuple(s) for s in shapes[:k]}) == 1 and len(set(dtypes[:k])) == 1 and dtypes[0] in DTYPES
    if valid:
        assert host_reduce(inputs).shape == inputs[0].shape
    else:
        with pytest.raises(tf.errors.InvalidArgumentError):
            host_reduce(inputs)


_DETERMINISM_SCRIPT = textwrap.dedent(
    """
    import os, sys, hashlib, json
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
    import tf_glp
    out = {"isa": tf_glp.native_available().cpu_kernels}
    for dtype in (tf.float32, tf.bfloat16, tf.float16):
        xs = [tf.cast(tf.random.stateless_normal([(1 << 21) + 3], seed=[i, 1]), dtype) for i in range(4)]
        y = tf_glp.ops.host_reduce(xs, op="mean")
        out[dtype.name] = hashlib.sha256(y.numpy().tobytes()).hexdigest()
    print(json.dumps(out))
    """
)


def test_bitwise_identical_across_threads_and_instruction_sets():
    if not tf_glp.native_available():
        pytest.skip("native library not in use")
    # One process per setting, all at once (each is mostly TensorFlow's start-up).
    processes = [subprocess.Popen([sys.executable, "-c", _DETERMINISM_SCRIPT, str(threads)], text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, TF_GLP_ISA=isa))
                 for threads, isa in [(1, "scalar"), (2, "avx2"), (0, "")]]
    runs = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        runs.append(json.loads(out.strip().splitlines()[-1]))
    assert runs[0]["isa"] == "scalar"
    for run in runs[1:]:
        for key in ("float32", "bfloat16", "float16"):
            assert run[key] == runs[0][key], (key, runs)


@pytest.mark.parametrize("mode", ["auto", "0"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_divisor_and_all_finite(rng, dtype, mode, native_mode):
    # The unscaling of loss-scaled gradients: (sum) / scale in float32, and a
    # finite flag that an inf, a NaN or an overflowing sum clears.
    native_mode(mode)
    inputs = _inputs(rng, 3, (1000,), dtype)
    total, finite = host_reduce(inputs, output_dtype=tf.float32, divisor=tf.constant(1024.0),
                                return_all_finite=True)
    expected = _reference(inputs, out_dtype=tf.float32) / 1024.0
    np.testing.assert_array_equal(total.numpy(), expected.numpy())
    assert finite.dtype == tf.bool and bool(finite)
    assert host_reduce(inputs, divisor=2.0).dtype == dtype  # one output without the flag
    big = 6e4 if dtype == tf.float16 else 3e38
    for bad_value, position in ((np.inf, 0), (np.nan, 517), (big, 999)):
        bad = [t.numpy().astype(np.float32) for t in inputs]
        bad[0][position] = bad_value
        if bad_value == big:
            bad[1][position] = big  # finite inputs; their float32 sum overflows unless they are float16
        bad = [tf.cast(tf.constant(b), dtype) for b in bad]
        _, finite = host_reduce(bad, output_dtype=tf.float32, return_all_finite=True)
        assert bool(finite) == (bad_value == big and dtype == tf.float16), (bad_value, dtype)


def test_divisor_bad_input():
    with pytest.raises(ValueError, match="a divisor needs op='sum', got op='mean'"):
        host_reduce([tf.ones(2)], op="mean", divisor=2.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="divisor must be a scalar"):
        host_reduce([tf.ones(2)], divisor=tf.ones(2))


def test_divisor_gradient(rng):
    inputs = [tf.constant(rng.standard_normal(5).astype(np.float32)) for _ in range(2)]
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        loss = tf.reduce_sum(host_reduce(inputs, divisor=4.0) * 2.0)
    grads = tape.gradient(loss, inputs)
    for g in grads:
        np.testing.assert_allclose(g.numpy(), np.full(5, 0.5, np.float32))
