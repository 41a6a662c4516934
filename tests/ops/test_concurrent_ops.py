"""concurrent_conv2d / concurrent_matmul against TensorFlow's kernels, bitwise
invariance over the number of lanes, gradients, fallbacks and bad input."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import tf_glp
from tf_glp import _native
from tf_glp.ops import concurrent_conv2d, concurrent_matmul

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def close(actual, expected, rtol):
    expected = np.asarray(expected)
    scale = float(np.max(np.abs(expected))) if expected.size else 1.0
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=rtol, atol=rtol * max(scale, 1.0))


def conv_and_grads_tensors(fn, x, w, dy):
    with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = fn(x, w)
    return [y, *tape.gradient(y, [x, w], output_gradients=dy)]


def conv_and_grads(fn, x, w, dy):
    return tuple(t.numpy() for t in conv_and_grads_tensors(fn, x, w, dy))


conv_cases = st.fixed_dictionaries(
    {
        "batch": st.integers(1, 5),
        "height": st.integers(1, 11),
        "width": st.integers(1, 11),
        "in_c": st.integers(1, 6),
        "out_c": st.integers(1, 7),
        "kh": st.integers(1, 4),
        "kw": st.integers(1, 4),
        "stride": st.tuples(st.integers(1, 3), st.integers(1, 3)),
        "dilation": st.tuples(st.integers(1, 3), st.integers(1, 3)),
        "padding": st.sampled_from(["same", "valid"]),
        "k": st.integers(1, 8),
        "seed": st.integers(0, 2**31 - 1),
    }
)


@settings(max_examples=40, deadline=None)
@given(conv_cases)
def test_conv2d_matches_tensorflow(case):
    # Keras (and TensorFlow's CPU kernels) take strides > 1 or dilations > 1,
    # not both.
    if max(case["stride"]) > 1 and max(case["dilation"]) > 1:
        case["dilation"] = (1, 1)
    span_h = (case["kh"] - 1) * case["dilation"][0] + 1
    span_w = (case["kw"] - 1) * case["dilation"][1] + 1
    if case["padding"] == "valid" and (span_h > case["height"] or span_w > case["width"]):
        case["padding"] = "same"
    rng = np.random.default_rng(case["seed"])
    x = tf.constant(rng.standard_normal((case["batch"], case["height"], case["width"], case["in_c"]), np.float32))
    w = tf.constant(rng.standard_normal((case["kh"], case["kw"], case["in_c"], case["out_c"]), np.float32))
    args = dict(strides=case["stride"], padding=case["padding"], dilations=case["dilation"])
    # The reference is TensorFlow's convolution in float64: its float32 CPU
    # path (oneDNN) has wrong outputs for some shapes, e.g. a 2x1 input, a 1x2
    # filter, strides (1, 2), "same" (TF 2.21; right with
    # TF_ENABLE_ONEDNN_OPTS=0).
    def reference_conv(a, b):
        return tf.nn.convolution(tf.cast(a, tf.float64), tf.cast(b, tf.float64), strides=args["strides"],
                                 padding=args["padding"].upper(), dilations=args["dilations"])

    out_shape = reference_conv(x, w).shape
    dy = tf.constant(rng.standard_normal(out_shape, np.float32))
    reference = conv_and_grads(reference_conv, x, w, tf.cast(dy, tf.float64))
    got = conv_and_grads(lambda a, b: concurrent_conv2d(a, b, concurrency=case["k"], **args), x, w, dy)
    assert got[0].shape == reference[0].shape
    close(got[0], reference[0], 1e-5)
    close(got[1], reference[1], 1e-4)
    close(got[2], reference[2], 1e-4)


@pytest.mark.parametrize("padding,strides,dilations", [("same", 1, 1), ("valid", 2, 1), ("same", 1, 2), ("same", (2, 1), 1)])
def test_conv2d_is_bitwise_identical_for_every_concurrency_and_run(rng, padding, strides, dilations):
    x = tf.constant(rng.standard_normal((37, 12, 10, 5), np.float32))  # 37 samples: more than the 32 groups
    w = tf.constant(rng.standard_normal((3, 3, 5, 6), np.float32))
    dy_shape = concurrent_conv2d(x, w, strides, padding, dilations).shape
    dy = tf.constant(rng.standard_normal(dy_shape, np.float32))
    first = conv_and_grads(lambda a, b: concurrent_conv2d(a, b, strides, padding, dilations, concurrency=1), x, w, dy)
    for k in (1, 2, 3, 4, 8, 64):
        got = conv_and_grads(lambda a, b: concurrent_conv2d(a, b, strides, padding, dilations, concurrency=k), x, w, dy)
        for expected, actual in zip(first, got):
            assert expected.tobytes() == actual.tobytes(), f"concurrency={k} differs"


def test_conv2d_in_a_tf_function_with_unknown_batch(rng):
    w = tf.constant(rng.standard_normal((3, 3, 2, 4), np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 2], tf.float32)])
    def run(x):
        y = concurrent_conv2d(x, w, padding="same", concurrency=2)
        assert y.shape.as_list() == [None, 8, 8, 4]
        return y

    x = rng.standard_normal((3, 8, 8, 2)).astype(np.float32)
    close(run(x), tf.nn.convolution(x, w, padding="SAME"), 1e-5)
    assert run(np.zeros((0, 8, 8, 2), np.float32)).shape == (0, 8, 8, 4)


def test_conv2d_numerical_gradient(rng):
    x = tf.constant(rng.standard_normal((2, 5, 4, 2)), tf.float64)
    w = tf.constant(rng.standard_normal((2, 3, 2, 3)), tf.float64)

    def f(x32, w32):
        return concurrent_conv2d(tf.cast(x32, tf.float32), tf.cast(w32, tf.float32), strides=(2, 1), padding="same", concurrency=2)

    theoretical, numerical = tf.test.compute_gradient(f, [x, w], delta=1e-2)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=2e-2, atol=2e-2)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 70), st.integers(1, 40), st.integers(1, 20), st.booleans(), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_matmul_matches_tensorflow(m, k, n, transpose_b, lanes, seed):
    rng = np.random.default_rng(seed)
    a = tf.constant(rng.standard_normal((m, k), np.float32))
    b = tf.constant(rng.standard_normal((n, k) if transpose_b else (k, n), np.float32))
    dy = tf.constant(rng.standard_normal((m, n), np.float32))
    results = []
    for fn in (lambda a, b: concurrent_matmul(a, b, transpose_b, concurrency=lanes), lambda a, b: tf.matmul(a, b, transpose_b=transpose_b)):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            y = fn(a, b)
        results.append([y] + tape.gradient(y, [a, b], output_gradients=dy))
    close(results[0][0], results[1][0], 1e-5)
    close(results[0][1], results[1][1], 1e-4)
    close(results[0][2], results[1][2], 1e-4)


def test_matmul_is_bitwise_identical_for_every_concurrency(rng):
    a = tf.constant(rng.standard_normal((300, 70), np.float32))
    b = tf.constant(rng.standard_normal((70, 33), np.float32))
    dy = tf.constant(rng.standard_normal((300, 33), np.float32))
    outputs = []
    for k in (1, 2, 3, 5, 16, 1, 2):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            y = concurrent_matmul(a, b, concurrency=k)
        outputs.append(b"".join(t.numpy().tobytes() for t in [y] + tape.gradient(y, [a, b], output_gradients=dy)))
    assert len(set(outputs)) == 1


def test_fallback_gives_the_same_results(rng, native_mode):
    x = tf.constant(rng.standard_normal((4, 9, 9, 3), np.float32))
    w = tf.constant(rng.standard_normal((3, 3, 3, 4), np.float32))
    dy = tf.constant(rng.standard_normal((4, 5, 5, 4), np.float32))
    fn = lambda a, b: concurrent_conv2d(a, b, strides=2, padding="same", concurrency=3)  # noqa: E731
    native = conv_and_grads(fn, x, w, dy)
    native_mode("0")
    assert not tf_glp.native_available()
    fallback = conv_and_grads(fn, x, w, dy)
    for n, f in zip(native, fallback):
        close(n, f, 1e-4)
    a = rng.standard_normal((5, 6)).astype(np.float32)
    b = rng.standard_normal((6, 2)).astype(np.float32)
    close(concurrent_matmul(a, b, concurrency=2), a @ b, 1e-5)


@pytest.mark.parametrize("bad", [0, -1, 65, 10**6, True, 2.0, "4"])
def test_bad_concurrency_is_a_value_error_naming_it(bad):
    x, w = tf.zeros([1, 4, 4, 1]), tf.zeros([3, 3, 1, 1])
    with pytest.raises(ValueError, match=repr(bad) if not isinstance(bad, int) or isinstance(bad, bool) else str(bad)):
        concurrent_conv2d(x, w, concurrency=bad)
    with pytest.raises(ValueError, match="concurrency"):
        concurrent_matmul(tf.zeros([2, 2]), tf.zeros([2, 2]), concurrency=bad)


def test_native_op_checks_concurrency_itself():
    native = _native.library()
    if native is None:
        pytest.skip("native library not loaded")
    with pytest.raises(tf.errors.InvalidArgumentError, match="got 0"):
        native.glp_concurrent_conv2d(tf.zeros([1, 4, 4, 1]), tf.zeros([3, 3, 1, 1]), strides=[1, 1], padding="SAME", concurrency=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="got 1000"):
        native.glp_concurrent_mat_mul(tf.zeros([2, 2]), tf.zeros([2, 2]), concurrency=1000)
    with pytest.raises(tf.errors.InvalidArgumentError, match="fit in the input"):
        native.glp_concurrent_conv2d(tf.zeros([1, 2, 2, 1]), tf.zeros([3, 3, 1, 1]), strides=[1, 1], padding="VALID")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"out_backprop must have shape \[1,4,4,1\]"):
        native.glp_concurrent_conv2d_backprop_input([1, 4, 4, 1], tf.zeros([3, 3, 1, 1]), tf.zeros([1, 3, 3, 1]), strides=[1, 1], padding="SAME")


@pytest.mark.parametrize(
    "x_shape,w_shape,dtype,match",
    [
        ([4, 4, 1], [3, 3, 1, 1], tf.float32, "inputs must be 4-D"),
        ([1, 4, 4, 1], [3, 3, 1], tf.float32, "filters must be 4-D"),
        ([1, 4, 4, 2], [3, 3, 1, 1], tf.float32, "2 channels but the filters expect 1"),
        ([1, 4, 4, 1], [3, 3, 1, 1], tf.float64, "float32, float16 or bfloat16, got float64"),
        ([1, 4, 4, 1], [3, 3, 1, 1], tf.int32, "float32, float16 or bfloat16, got int32"),
    ],
)
def test_bad_conv_input_is_an_invalid_argument_error(x_shape, w_shape, dtype, match):
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        concurrent_conv2d(tf.zeros(x_shape, dtype), tf.zeros(w_shape, dtype))


def test_bad_conv_arguments_are_value_errors():
    x, w = tf.zeros([1, 4, 4, 1]), tf.zeros([3, 3, 1, 1])
    with pytest.raises(ValueError, match="'full'"):
        concurrent_conv2d(x, w, padding="full")
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        concurrent_conv2d(x, w, strides=(0, 1))
    with pytest.raises(ValueError, match=r"\[1, 2, 3\]"):
        concurrent_conv2d(x, w, dilations=[1, 2, 3])


def test_bad_matmul_input_is_an_invalid_argument_error():
    with pytest.raises(tf.errors.InvalidArgumentError, match="3 columns but b has 4 rows"):
        concurrent_matmul(tf.zeros([2, 3]), tf.zeros([4, 5]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be 2-D"):
        concurrent_matmul(tf.zeros([2, 3, 1]), tf.zeros([3, 5]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="float32, float16 or bfloat16, got float64"):
        concurrent_matmul(tf.zeros([2, 3], tf.float64), tf.zeros([3, 5], tf.float64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="a and b must have the same dtype, got float16 and float32"):
        concurrent_matmul(tf.zeros([2, 3], tf.float16), tf.zeros([3, 5], tf.float32))


@settings(max_examples=30, deadline=None)
@given(st.one_of(st.integers(max_value=0), st.integers(min_value=65)))
def test_any_out_of_range_concurrency_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=f"got {bad}"):
        concurrent_matmul(tf.zeros([2, 2]), tf.zeros([2, 2]), concurrency=bad)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6))
def test_any_channel_mismatch_is_refused_by_name(in_channels, filter_channels):
    x, w = tf.zeros([1, 5, 5, in_channels]), tf.zeros([3, 3, filter_channels, 2])
    if in_channels == filter_channels:
        assert concurrent_conv2d(x, w, concurrency=2).shape == (1, 3, 3, 2)
        return
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{in_channels} channels but the filters expect {filter_channels}"):
        concurrent_conv2d(x, w, concurrency=2)


GPUS = tf.config.list_physical_devices("GPU")


@pytest.mark.gpu
@pytest.mark.skipif(not GPUS, reason="needs a GPU")
def test_gpu_kernels_match_cpu_and_are_bitwise_identical_for_every_concurrency(rng):
    x = tf.constant(rng.standard_normal((20, 16, 16, 8), np.float32))
    w = tf.constant(rng.standard_normal((3, 3, 8, 16), np.float32))
    dy = tf.constant(rng.standard_normal((20, 8, 8, 16), np.float32))
    fn = lambda k: lambda a, b: concurrent_conv2d(a, b, strides=2, padding="same", concurrency=k)  # noqa: E731
    with tf.device("/cpu:0"):
        cpu = conv_and_grads(fn(1), x, w, dy)
    with tf.device("/gpu:0"):
        first = conv_and_grads(fn(1), x, w, dy)
        for k in (2, 4, 8):
            again = conv_and_grads(fn(k), x, w, dy)
            for a, b in zip(first, again):
                assert a.tobytes() == b.tobytes()
    for a, b in zip(first, cpu):
        close(a, b, 1e-4)


@pytest.mark.parametrize("mode", ["auto", "0"])
def test_right_where_tensorflows_float32_conv_is_wrong(rng, native_mode, mode):
    # TF 2.21's oneDNN float32 convolution gives zeros for the second output
    # row here; native and fallback must both be right (float64 reference).
    native_mode(mode)
    x = rng.standard_normal((2, 2, 1, 1)).astype(np.float32)
    w = rng.standard_normal((1, 2, 1, 1)).astype(np.float32)
    expected = tf.nn.convolution(x.astype(np.float64), w.astype(np.float64), strides=(1, 2), padding="SAME")
    close(concurrent_conv2d(x, w, strides=(1, 2), padding="same", concurrency=2), expected, 1e-5)
    assert concurrent_conv2d(np.zeros((0, 8, 8, 2), np.float32), np.zeros((3, 3, 2, 4), np.float32), padding="same").shape == (0, 8, 8, 4)


# The inputs on which TensorFlow 2.21's own CPU convolution was seen to go
# wrong (FACTS, "Found 2026-12-04"; on a machine with AVX-512): garbage
# around 1e22, and a SIGSEGV for a dilation of 2^31 - 1.
TENSORFLOWS_FAILURES = {
    "garbage": dict(x_shape=(2, 4, 1, 1), w_shape=(9, 9, 1, 1), strides=(1, 2), dilations=(1, 1)),
    "sigsegv": dict(x_shape=(2, 5, 6, 2), w_shape=(2, 3, 2, 3), strides=(1, 1), dilations=(2147483647, 3)),
}


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("failure", sorted(TENSORFLOWS_FAILURES))
def test_fallback_computes_what_tensorflows_conv_gets_wrong(rng, native_mode, monkeypatch, failure, traced):
    """Under TF_GLP_NATIVE=0 the conv's fallback never calls TensorFlow's
    convolutions (Note [The fallback avoids TensorFlow's convolutions]) and
    gives the direct numpy convolution's numbers, gradients included, also
    in a tf.function that knows no shapes."""
    from raw_op_fuzz import conv2d_backprop_filter_reference, conv2d_backprop_input_reference, conv2d_reference

    native_mode("0")

    def refuse(*args, **kwargs):
        raise AssertionError("the fallback called one of TensorFlow's convolutions")

    for module, name in [(tf.nn, "convolution"), (tf.nn, "conv2d"), (tf.image, "extract_patches"), (tf.raw_ops, "Conv2D")]:
        monkeypatch.setattr(module, name, refuse)
    case = TENSORFLOWS_FAILURES[failure]
    x = rng.standard_normal(case["x_shape"]).astype(np.float32)
    w = rng.standard_normal(case["w_shape"]).astype(np.float32)
    attrs = dict(strides=list(case["strides"]), dilations=list(case["dilations"]), padding="SAME")
    expected = conv2d_reference(x.astype(np.float64), w.astype(np.float64), attrs)
    dy = rng.standard_normal(expected.shape).astype(np.float32)
    fn = lambda a, b: concurrent_conv2d(a, b, strides=case["strides"], padding="same", dilations=case["dilations"])  # noqa: E731
    if traced:
        run = tf.function(lambda a, b, g: conv_and_grads_tensors(fn, a, b, g), autograph=False,
                          input_signature=[tf.TensorSpec([None] * 4, tf.float32)] * 3)
        got = [t.numpy() for t in run(x, w, dy)]
    else:
        got = conv_and_grads(fn, tf.constant(x), tf.constant(w), tf.constant(dy))
    close(got[0], expected, 1e-5)
    close(got[1], conv2d_backprop_input_reference(x.shape, w.astype(np.float64), dy.astype(np.float64), attrs), 1e-4)
    close(got[2], conv2d_backprop_filter_reference(x.astype(np.float64), w.shape, dy.astype(np.float64), attrs), 1e-4)



_THREAD_BOUND_SCRIPT = """
import os, sys
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
tf.config.threading.set_inter_op_parallelism_threads(1)
import numpy as np
from tf_glp import native_available
from tf_glp.ops import concurrent_conv2d, concurrent_matmul

def threads():
    return len(os.listdir("/proc/self/task"))

rng = np.random.default_rng(0)
x = tf.constant(rng.normal(size=(16, 12, 12, 8)), tf.float32)
w = tf.constant(rng.normal(size=(3, 3, 8, 16)), tf.float32)
a = tf.constant(rng.normal(size=(64, 96)), tf.float32)
b = tf.constant(rng.normal(size=(96, 80)), tf.float32)
tf.nn.conv2d(x, w, 1, "VALID").numpy(), tf.matmul(a, b).numpy()  # TensorFlow's own threads exist now
before = threads()
reference = (concurrent_conv2d(x, w, concurrency=1).numpy(), concurrent_matmul(a, b, concurrency=1).numpy())
for _ in range(3):
    results = (concurrent_conv2d(x, w, concurrency=8).numpy(), concurrent_matmul(a, b, concurrency=8).numpy())
print(native_available().available, before, threads(),
      all(np.array_equal(r, e) for r, e in zip(results, reference)))
"""


@pytest.mark.parametrize("intra_op_threads", [1, 2])
def test_lanes_run_on_tensorflows_intra_op_pool(intra_op_threads):
    # With 8 lanes asked, the ops create no threads of their own: their lanes
    # are tasks of TensorFlow's intra-op pool, which
    # set_intra_op_parallelism_threads bounds (no second pool next to it).
    done = subprocess.run([sys.executable, "-c", _THREAD_BOUND_SCRIPT, str(intra_op_threads)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr[-2000:]
    native, before, after, equal = done.stdout.split()
    if native != "True":
        pytest.skip("the native op library is not loaded (the fallback uses TensorFlow's own kernels)")
    assert int(after) == int(before)
    assert equal == "True"


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
@pytest.mark.parametrize("native", ["auto", "0"])
def test_16_bit_ops_compute_in_float32_and_round_once(dtype, native, native_mode, rng):
    # Note [16-bit layers]: the result, and both gradients, are the float32
    # op's on the widened inputs, rounded once to the dtype (bitwise), and
    # the same for every concurrency.
    native_mode(native)
    x = tf.cast(tf.constant(rng.standard_normal((5, 9, 8, 3)), tf.float32), dtype)
    w = tf.cast(tf.constant(rng.standard_normal((3, 3, 3, 4)), tf.float32), dtype)
    dy_conv = tf.cast(tf.constant(rng.standard_normal((5, 9, 8, 4)), tf.float32), dtype)
    a = tf.cast(tf.constant(rng.standard_normal((300, 40)), tf.float32), dtype)
    b = tf.cast(tf.constant(rng.standard_normal((40, 290)), tf.float32), dtype)
    dy_mm = tf.cast(tf.constant(rng.standard_normal((300, 290)), tf.float32), dtype)

    def conv(x, w, k):
        return concurrent_conv2d(x, w, padding="same", concurrency=k)

    def matmul(x, w, k):
        return concurrent_matmul(x, w, concurrency=k)

    for fn, inputs, dy in ((conv, (x, w), dy_conv), (matmul, (a, b), dy_mm)):
        wide = [tf.cast(t, tf.float32) for t in inputs]
        expected = [tf.cast(r, dtype).numpy() for r in conv_and_grads(
            lambda p, q: fn(p, q, 1), *wide, tf.cast(dy, tf.float32))]
        for k in (1, 3):
            got = conv_and_grads(lambda p, q, k=k: fn(p, q, k), *inputs, dy)
            for g, e in zip(got, expected):
                assert g.dtype == dtype.as_numpy_dtype
                np.testing.assert_array_equal(g.view(np.uint16), e.view(np.uint16))


_ISA_SCRIPT = """
import numpy as np, tensorflow as tf
import tf_glp
from tf_glp.ops import concurrent_matmul
rng = np.random.default_rng(3)
a = rng.standard_normal((33, 200)).astype(np.float32)
b = rng.standard_normal((200, 17)).astype(np.float32)
c = concurrent_matmul(a, b, concurrency=2).numpy()
# The portable GEMM's sum: c = c + a*b, rounding twice, in index order.
reference = np.zeros((33, 17), np.float32)
for p in range(200):
    reference = (reference + np.outer(a[:, p], b[p]).astype(np.float32)).astype(np.float32)
print(tf_glp.native_available().cpu_kernels, bool(np.array_equal(c, reference)))
"""


def test_one_isa_switch_moves_the_host_kernels_and_the_gemm():
    # TF_GLP_ISA=scalar: native_available() says so, and the concurrent ops'
    # GEMM is the portable one (two roundings per step: bitwise the numpy
    # loop below); by default (FMA here) the GEMM's bits differ from it.
    runs = {}
    for isa in ("scalar", ""):
        done = subprocess.run([sys.executable, "-c", _ISA_SCRIPT], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TF_GLP_ISA": isa, "TF_CPP_MIN_LOG_LEVEL": "2"})
        assert done.returncode == 0, done.stderr[-2000:]
        runs[isa] = done.stdout.split()
    if not runs[""][0]:
        pytest.skip("the native op library is not loaded")
    assert runs["scalar"] == ["scalar", "True"]
    if runs[""][0] != "scalar":
        assert runs[""][1] == "False"  # FMA paths round once per step
