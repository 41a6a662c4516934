"""The child process of the raw-op fuzz harness (tests/ops/test_raw_op_fuzz.py).

A case is plain JSON: which of tf_glp's seven raw ops to call, how (eagerly,
in a tf.function, in a tf.function that sees no static shapes, or through
the pure-TensorFlow fallback), its tensors, attributes and variables, and
what the caller expects: "valid" (the op must succeed and return the
reference numbers), "invalid" (it must raise a TensorFlow error, TypeError
or ValueError) or "no_crash" (either, but the process survives). Cases run
here, in a child process, so that a crash or a hang is seen as one and
reported with the case that caused it.

    python tests/ops/raw_op_fuzz.py --serve         # one case per stdin line, one verdict per stdout line
    python tests/ops/raw_op_fuzz.py --case 'JSON'   # one case: how the harness's reports are reproduced

References: a direct numpy convolution in float64 (not tf.nn.convolution,
which TensorFlow 2.21 computes wrongly for some shapes on CPU: FACTS,
"Found 2026-12-04"), numpy products for the matmul ops, and tf_glp's own
pure-TensorFlow fallbacks for the host ops (which the suite shows to be
bitwise the native ops on valid input; for the update kinds whose formula
calls pow, HostUpdate.exact False, within HOST_APPLY_RTOL).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import importlib
import json
import os
import sys
import traceback
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_glp  # noqa: E402
from tf_glp import _native  # noqa: E402
from tf_glp.ops.host_optimizers import HOST_UPDATES_BY_KIND, apply_host_update  # noqa: E402

host_reduce_module = importlib.import_module("tf_glp.ops.host_reduce")  # the module, not the op of that name

# Errors an op may raise for bad input: TensorFlow's own (an unknown
# variable is NotFound, an uninitialized one FailedPrecondition, a
# too-large allocation ResourceExhausted) and Python's for bad attributes.
ALLOWED_ERRORS = (
    tf.errors.InvalidArgumentError,
    tf.errors.FailedPreconditionError,
    tf.errors.NotFoundError,
    tf.errors.ResourceExhaustedError,
    tf.errors.OutOfRangeError,
    TypeError,
    ValueError,
)
# Tolerance against the float64 reference, relative to the largest
# reference value (at least 1): float32 accumulation, then one rounding to
# the output dtype (Note [16-bit layers]).
RTOL = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1e-2}
# Glp>HostApply against its fallback where they may differ in the last bits
# (HostUpdate.exact False: Ftrl's pow, Lamb's sums over the variable):
# relative to each value or to the variable's largest (at least 1). The
# fallback then runs with the C
# library's powf, as the kernel does (_c_library_pow): with TensorFlow's pow,
# one bit of difference in Ftrl's `(pow(new) - pow(old)) / lr` grows by 1/lr
# (up to 1e7 here; seen: 1.88 apart where the largest value is 2.6e4).
HOST_APPLY_RTOL = 1e-5

NATIVE_FUNCTIONS = {
    "conv2d": "glp_concurrent_conv2d",
    "conv2d_backprop_input": "glp_concurrent_conv2d_backprop_input",
    "conv2d_backprop_filter": "glp_concurrent_conv2d_backprop_filter",
    "matmul": "glp_concurrent_mat_mul",
    "matmul_grad_weights": "glp_concurrent_mat_mul_grad_weights",
    "host_reduce": "glp_host_reduce",
    "host_apply": "glp_host_apply",  # every update kind of HOST_UPDATES (its `kind` attribute)
}
# The input of the ops with an `N * T` list: an empty one leaves T unknown
# (see run_case).
TYPED_LIST_INPUT = {"host_reduce": 0, "host_apply": 2}


class CaseFailed(Exception):
    """The op broke its contract on this case (wrong numbers, a valid input
    refused, an invalid one accepted, an error of the wrong kind)."""


# -- building the inputs ------------------------------------------------------

def _values(spec: dict) -> np.ndarray:
    """A small tensor's values (float64, before the cast to its dtype)."""
    rng = np.random.default_rng(spec.get("seed", 0))
    shape = spec["shape"]
    fill = spec.get("fill", "normal")
    if fill == "zeros":
        return np.zeros(shape)
    values = rng.standard_normal(shape)
    if fill == "abs":  # non-negative: a slot that an update takes the square root of
        return np.abs(values)
    if fill == "special" and values.size:
        where = rng.random(shape) < 0.15
        values[where] = rng.choice([np.nan, np.inf, -np.inf], size=int(where.sum()))
    return values


def make_tensor(spec: dict) -> tf.Tensor:
    """A tensor from a spec: {"dtype", "shape", "fill", "seed"} or {"dtype", "values"}."""
    dtype = tf.as_dtype(spec["dtype"])
    if "values" in spec:
        values = spec["values"]
        return tf.constant(values if "shape" not in spec else np.reshape(values, spec["shape"]), dtype)
    shape = spec["shape"]
    if int(np.prod([min(d, 2**20) for d in shape], dtype=np.float64)) == 0:
        return tf.zeros(shape, dtype)  # also for shapes too large to hold anything but nothing
    values = _values(spec)
    if dtype.is_integer:
        return tf.constant(np.round(values * 3), dtype)
    return tf.cast(tf.constant(values, tf.float64), dtype)


class Variables:
    """The case's resource variables, and their handles as the op gets them."""

    def __init__(self, specs: list[dict]):
        self.specs = specs
        self.variables = []
        for i, spec in enumerate(specs):
            if spec.get("initialized", True):
                self.variables.append(tf.Variable(make_tensor(spec)))
            else:  # a handle with no variable behind it
                self.variables.append(tf.raw_ops.VarHandleOp(
                    dtype=tf.as_dtype(spec["dtype"]), shape=spec["shape"], shared_name=f"tf_glp_fuzz_{os.getpid()}_{id(self)}_{i}"))

    def handle(self, ref: dict) -> tf.Tensor:
        """ref: {"var": i}, {"stack": [i, j, ...]} (a vector of handles) or {"stack": []} (none)."""
        if "var" in ref:
            return self._handle(ref["var"])
        handles = [self._handle(i) for i in ref["stack"]]
        if handles:
            return tf.stack(handles)
        return tf.stack([self._handle(0)])[:0]

    def _handle(self, i: int) -> tf.Tensor:
        v = self.variables[i]
        return v.handle if isinstance(v, tf.Variable) else v

    def values(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.variables if isinstance(v, tf.Variable)]


def build_arguments(case: dict, variables: Variables) -> list:
    """The op's inputs in order: tensors, resource handles, and lists of
    either (or both)."""
    def build(item: dict) -> tf.Tensor:
        return variables.handle(item["resource"]) if "resource" in item else make_tensor(item)

    return [[build(entry) for entry in item["list"]] if "list" in item else build(item) for item in case["inputs"]]


# -- running the op -----------------------------------------------------------

def _flat(arguments: list) -> tuple[list, callable]:
    """The non-resource tensors of `arguments` (in lists too) and how to
    put them back; resource handles stay as they are (the function captures
    them)."""
    flat = []

    def place(tensor: tf.Tensor):
        if tensor.dtype == tf.resource:
            return ("fixed", tensor)
        flat.append(tensor)
        return ("one", None)

    layout = [("list", [place(t) for t in argument]) if isinstance(argument, list) else place(argument)
              for argument in arguments]

    def rebuild(values) -> list:
        values = iter(values)

        def take(entry):
            kind, extra = entry
            if kind == "list":
                return [take(e) for e in extra]
            return extra if kind == "fixed" else next(values)

        return [take(entry) for entry in layout]

    return flat, rebuild


def run_native(case: dict, arguments: list):
    """Calls the raw op in the case's mode; returns its outputs as numpy."""
    op = getattr(_native.library(), NATIVE_FUNCTIONS[case["op"]])
    attrs = case["attrs"]
    mode = case["mode"]
    if mode == "eager":
        outputs = op(*arguments, **attrs)
    else:
        flat, rebuild = _flat(arguments)
        signature = None
        if mode == "function_unknown_shapes":
            signature = [tf.TensorSpec([None] * t.shape.rank, t.dtype) for t in flat]
        def call(*values):
            result = op(*rebuild(values), **attrs)
            return None if isinstance(result, tf.Operation) else result  # the update ops have no outputs

        function = tf.function(call, input_signature=signature, autograph=False)
        outputs = function(*flat)
    if outputs is None or isinstance(outputs, tf.Operation):
        return []
    if isinstance(outputs, (list, tuple)):
        return [o.numpy() for o in outputs]
    return [outputs.numpy()]


# -- references -----------------------------------------------------------------

def conv_geometry(attrs: dict, in_hw, filter_hw) -> dict:
    """Output size and padding as TensorFlow defines them, in Python ints."""
    same = attrs["padding"] == "SAME"
    geometry = {"out": [], "pad": []}
    for i in range(2):
        stride, dilation = attrs["strides"][i], attrs["dilations"][i]
        span = (filter_hw[i] - 1) * dilation + 1
        if same:
            out = -(-in_hw[i] // stride)
            pad = max(0, (out - 1) * stride + span - in_hw[i]) // 2
        else:
            out, pad = (in_hw[i] - span) // stride + 1, 0
        geometry["out"].append(out)
        geometry["pad"].append(pad)
    return geometry


def _taps(attrs: dict, geometry: dict, in_hw: tuple, filter_hw: tuple):
    """For each filter tap (i, j): the input rows and columns every output
    pixel reads, and which of them lie inside the input (the rest is padding)."""
    for i in range(filter_hw[0]):
        rows = np.arange(geometry["out"][0]) * attrs["strides"][0] - geometry["pad"][0] + i * attrs["dilations"][0]
        for j in range(filter_hw[1]):
            cols = np.arange(geometry["out"][1]) * attrs["strides"][1] - geometry["pad"][1] + j * attrs["dilations"][1]
            yield i, j, rows, (rows >= 0) & (rows < in_hw[0]), cols, (cols >= 0) & (cols < in_hw[1])


def _gather(x: np.ndarray, rows, row_ok, cols, col_ok) -> np.ndarray:
    """x[:, rows, cols, :] with zeros where the pixel is padding: the patch
    matrix as im2col builds it (so 0 * nan in a product is nan here too)."""
    picked = x[:, np.clip(rows, 0, max(x.shape[1] - 1, 0))][:, :, np.clip(cols, 0, max(x.shape[2] - 1, 0))]
    inside = row_ok[None, :, None, None] & col_ok[None, None, :, None]
    return np.where(inside, picked, 0.0)


def conv2d_reference(x, w, attrs):
    geometry = conv_geometry(attrs, x.shape[1:3], w.shape[:2])
    out = np.zeros((x.shape[0], *geometry["out"], w.shape[3]))
    for i, j, rows, row_ok, cols, col_ok in _taps(attrs, geometry, x.shape[1:3], w.shape[:2]):
        out += _gather(x, rows, row_ok, cols, col_ok) @ w[i, j]
    return out


def conv2d_backprop_input_reference(input_shape, w, dy, attrs):
    geometry = conv_geometry(attrs, input_shape[1:3], w.shape[:2])
    dx = np.zeros(input_shape)
    for i, j, rows, row_ok, cols, col_ok in _taps(attrs, geometry, input_shape[1:3], w.shape[:2]):
        contribution = dy[:, row_ok][:, :, col_ok] @ w[i, j].T
        # Rows (and columns) of one tap are distinct: a plain += adds each once.
        dx[:, rows[row_ok][:, None], cols[col_ok][None, :]] += contribution
    return dx


def conv2d_backprop_filter_reference(x, filter_shape, dy, attrs):
    geometry = conv_geometry(attrs, x.shape[1:3], filter_shape[:2])
    dw = np.zeros(filter_shape)
    for i, j, rows, row_ok, cols, col_ok in _taps(attrs, geometry, x.shape[1:3], filter_shape[:2]):
        dw[i, j] = np.einsum("bhwc,bhwo->co", _gather(x, rows, row_ok, cols, col_ok), dy)
    return dw


def _f64(tensor) -> np.ndarray:
    return np.asarray(tensor.numpy() if hasattr(tensor, "numpy") else tensor).astype(np.float64)


def concurrent_reference(case: dict, arguments: list) -> list[np.ndarray]:
    op, attrs = case["op"], case["attrs"]
    if op == "conv2d":
        return [conv2d_reference(_f64(arguments[0]), _f64(arguments[1]), attrs)]
    if op == "conv2d_backprop_input":
        input_shape = tuple(int(size) for size in arguments[0].numpy())
        return [conv2d_backprop_input_reference(input_shape, _f64(arguments[1]), _f64(arguments[2]), attrs)]
    if op == "conv2d_backprop_filter":
        filter_shape = tuple(int(size) for size in arguments[1].numpy())
        return [conv2d_backprop_filter_reference(_f64(arguments[0]), filter_shape, _f64(arguments[2]), attrs)]
    if op == "matmul":
        a, b = _f64(arguments[0]), _f64(arguments[1])
        return [a @ (b.T if attrs.get("transpose_b") else b)]
    if op == "matmul_grad_weights":
        return [_f64(arguments[0]).T @ _f64(arguments[1])]
    raise KeyError(op)


def assert_close(actual: np.ndarray, expected: np.ndarray, dtype: str, what: str) -> None:
    """actual (any float dtype) against a float64 reference: the same shape,
    NaN exactly where the reference has NaN, the same infinities, and the
    finite values within RTOL[dtype] of the largest reference value."""
    actual = np.asarray(actual).astype(np.float64)
    if actual.shape != expected.shape:
        raise CaseFailed(f"{what}: shape {actual.shape}, reference {expected.shape}")
    if not np.array_equal(np.isnan(actual), np.isnan(expected)):
        raise CaseFailed(f"{what}: NaN at {np.argwhere(np.isnan(actual) != np.isnan(expected))[:4].tolist()} "
                         f"differs from the reference")
    infinite = np.isinf(expected)
    if not np.array_equal(actual[infinite], expected[infinite]):
        raise CaseFailed(f"{what}: infinities differ from the reference")
    finite = np.isfinite(expected)
    if not np.all(np.isfinite(actual[finite])):
        raise CaseFailed(f"{what}: non-finite values where the reference is finite")
    if not finite.any():
        return
    scale = max(1.0, float(np.max(np.abs(expected[finite]))))
    error = float(np.max(np.abs(actual[finite] - expected[finite])))
    if error > RTOL[dtype] * scale:
        raise CaseFailed(f"{what}: max |difference| {error:.3g} > {RTOL[dtype]} x {scale:.3g}")


def assert_bitwise(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise CaseFailed(f"{what}: {actual.dtype}{list(actual.shape)}, reference {expected.dtype}{list(expected.shape)}")
    wide_a, wide_e = actual.astype(np.float64), expected.astype(np.float64)
    same = (wide_a == wide_e) | (np.isnan(wide_a) & np.isnan(wide_e))
    if not same.all():
        where = np.argwhere(~same)[:3].tolist()
        raise CaseFailed(f"{what}: differs from the fallback at {where}")


def _without_native():
    """tf_glp's public ops run their pure-TensorFlow fallbacks inside."""
    return mock.patch.object(_native, "library", lambda: None)


def host_reduce_reference(case: dict, arguments: list) -> list[np.ndarray]:
    attrs = case["attrs"]
    with _without_native(), tf.device("/cpu:0"):
        output, all_finite = host_reduce_module._fallback(
            arguments[0], attrs["reduction"], tf.as_dtype(attrs["out_type"]),
            arguments[1] if attrs["divide"] else None, attrs["check_finite"])
    return [output.numpy(), all_finite.numpy()]


def _c_library_pow():
    """tf.pow as the kernel computes it, element by element with the C
    library's powf (kernels_impl.inc); None where that library is not found."""
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    powf = ctypes.CDLL(name).powf
    powf.restype, powf.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    elementwise = np.frompyfunc(lambda x, y: powf(float(x), float(y)), 2, 1)

    def pow_(x, y):
        def compute(a, b):
            return np.asarray(elementwise(a, b), dtype=np.float32).reshape(np.broadcast_shapes(a.shape, b.shape))
        return tf.numpy_function(compute, [x, y], tf.float32)

    return pow_


def host_apply_variables(case: dict) -> list[int]:
    """The indices (in the case's variables) of the op's var and slots."""
    var, slots = case["inputs"][:2]
    return [var["resource"]["var"]] + [slot["resource"]["var"] for slot in slots["list"]]


def host_apply_reference(case: dict, variables: Variables, arguments: list) -> list[np.ndarray]:
    """The same update by tf_glp's fallback (the row of the case's kind) on
    copies of the variables as they were before the call: var, then the
    slots. For a kind whose formula calls pow, with the C library's powf."""
    attrs = case["attrs"]
    update = HOST_UPDATES_BY_KIND[attrs["kind"]]
    copies = [tf.Variable(make_tensor(variables.specs[i])) for i in host_apply_variables(case)]
    _, _, grads, scalars, weight_decay, decay_learning_rate = arguments
    decay = dict(weight_decay=weight_decay, decay_learning_rate=decay_learning_rate) if attrs["use_weight_decay"] else {}
    pow_ = None if update.exact else _c_library_pow()
    with _without_native(), mock.patch.object(tf, "pow", pow_) if pow_ else contextlib.nullcontext():
        apply_host_update(update, copies[0], copies[1:], grads, scalars, **decay)
    return [c.numpy() for c in copies]


def assert_close_to_fallback(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    """For the update kinds whose formula calls pow: the same dtype and
    shape, NaN and infinities where the fallback has them, the finite values
    within HOST_APPLY_RTOL of themselves or of the largest."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise CaseFailed(f"{what}: {actual.dtype}{list(actual.shape)}, reference {expected.dtype}{list(expected.shape)}")
    wide_a, wide_e = actual.astype(np.float64), expected.astype(np.float64)
    if not np.array_equal(np.isnan(wide_a), np.isnan(wide_e)):
        raise CaseFailed(f"{what}: NaN at {np.argwhere(np.isnan(wide_a) != np.isnan(wide_e))[:3].tolist()} "
                         f"differs from the fallback")
    infinite = np.isinf(wide_e)
    if not np.array_equal(wide_a[infinite], wide_e[infinite]) or np.isinf(wide_a[~infinite]).any():
        raise CaseFailed(f"{what}: infinities differ from the fallback")
    finite = np.isfinite(wide_e)
    if not finite.any():
        return
    scale = max(1.0, float(np.max(np.abs(wide_e[finite]))))
    error = np.abs(wide_a[finite] - wide_e[finite])
    bad = error > HOST_APPLY_RTOL * np.maximum(np.abs(wide_e[finite]), scale)
    if bad.any():
        raise CaseFailed(f"{what}: max |difference| {float(error.max()):.3g} > {HOST_APPLY_RTOL} x {scale:.3g} "
                         f"({int(bad.sum())} of {bad.size} values)")


# -- the fallback of the public ops -------------------------------------------------

def run_fallback(case: dict, arguments: list) -> tuple[list, list]:
    """The public op and its gradients through the pure-TensorFlow fallback
    (eagerly, or in a tf.function that sees no static shapes), and the
    numpy references of the same three results."""
    op, attrs = case["op"], case["attrs"]
    x, w = arguments[:2]
    if op == "conv2d":
        def forward(a, b):
            return tf_glp.ops.concurrent_conv2d(a, b, strides=attrs["strides"], padding=attrs["padding"].lower(),
                                                dilations=attrs["dilations"], concurrency=attrs["concurrency"])
        xs, ws = _f64(x), _f64(w)
        y = conv2d_reference(xs, ws, attrs)
        dy = np.random.default_rng(7).standard_normal(y.shape)
        references = [y, conv2d_backprop_input_reference(xs.shape, ws, dy, attrs),
                      conv2d_backprop_filter_reference(xs, ws.shape, dy, attrs)]
    else:
        def forward(a, b):
            return tf_glp.ops.concurrent_matmul(a, b, transpose_b=attrs["transpose_b"], concurrency=attrs["concurrency"])
        a, b = _f64(x), _f64(w)
        bt = b.T if attrs["transpose_b"] else b
        dy = np.random.default_rng(7).standard_normal((a.shape[0], bt.shape[1]))
        db = dy.T @ a if attrs["transpose_b"] else a.T @ dy
        references = [a @ bt, dy @ bt.T, db]

    def forward_and_gradients(a, b, upstream):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            y = forward(a, b)
        return [y, *tape.gradient(y, [a, b], output_gradients=upstream)]

    upstream = tf.cast(tf.constant(dy), x.dtype)
    with _without_native():
        if case["mode"] == "fallback_function_unknown_shapes":
            signature = [tf.TensorSpec([None] * t.shape.rank, t.dtype) for t in (x, w, upstream)]
            results = tf.function(forward_and_gradients, input_signature=signature, autograph=False)(x, w, upstream)
        else:
            results = forward_and_gradients(x, w, upstream)
    return [r.numpy() for r in results], references


# -- one case ---------------------------------------------------------------------

def _check_outputs(case: dict, arguments: list, outputs: list) -> None:
    """The outputs of a valid call (not of the update ops, which run_case
    checks through their variables) against their references."""
    if case["mode"].startswith("fallback"):
        dtype = arguments[0].dtype.name
        for what, actual, expected in zip(["output", "input gradient", "filter gradient"], *outputs):
            assert_close(actual, expected, dtype, what)
        return
    if case["op"] == "host_reduce":
        expected = host_reduce_reference(case, arguments)
        assert_bitwise(outputs[0], expected[0], "output")
        if bool(outputs[1]) != bool(expected[1]):
            raise CaseFailed(f"all_finite is {bool(outputs[1])}, the fallback says {bool(expected[1])}")
        return
    dtype = np.asarray(outputs[0]).dtype.name  # T
    for i, expected in enumerate(concurrent_reference(case, arguments)):
        assert_close(outputs[i], expected, dtype, f"output {i}")


def run_case(case: dict) -> dict:
    """Runs one case; returns its verdict: {"verdict": "ok" | "failed",
    "outcome": "returned" | the error's type, "detail": text}."""
    outcome, detail = "returned", ""
    try:
        variables = Variables(case.get("variables", []))
        arguments = build_arguments(case, variables)
        if case["mode"].startswith("fallback"):
            outputs = run_fallback(case, arguments)
        else:
            before = variables.values()
            try:
                outputs = run_native(case, arguments)
            finally:
                after = variables.values()
        try:
            if case["expect"] == "invalid":
                raise CaseFailed("accepted an invalid input: " + case.get("why", ""))
            if case["expect"] == "valid":
                if case["op"] == "host_apply":
                    # The reference starts from the values the op saw.
                    for spec, value in zip(variables.specs, before):
                        spec.update(values=value.tolist(), dtype=value.dtype.name)
                    exact = HOST_UPDATES_BY_KIND[case["attrs"]["kind"]].exact
                    references = host_apply_reference(case, variables, arguments)
                    for j, (i, expected) in enumerate(zip(host_apply_variables(case), references)):
                        what = f"slot {j} ({case['attrs']['kind']})" if j else f"var ({case['attrs']['kind']})"
                        if exact:
                            assert_bitwise(after[i], expected, what)
                        else:
                            assert_close_to_fallback(after[i], expected, what)
                else:
                    _check_outputs(case, arguments, outputs)
        except CaseFailed as failure:
            return {"verdict": "failed", "outcome": outcome, "detail": str(failure)}
    except IndexError as error:
        # TensorFlow's generated op wrappers cannot infer T from an empty
        # N * T list and raise IndexError eagerly (tf.raw_ops.AddN(inputs=[])
        # does the same); in a tf.function it is a ValueError. Only there:
        # Glp>HostApply's slot list is empty for sgd, and valid.
        typed = TYPED_LIST_INPUT.get(case["op"])
        if typed is None or case["inputs"][typed] != {"list": []}:
            return {"verdict": "failed", "outcome": "IndexError", "detail": f"an error of an unexpected kind: {error}"}
        outcome, detail = "IndexError", str(error)
        if case["expect"] == "valid":
            return {"verdict": "failed", "outcome": outcome, "detail": f"refused a valid input: {detail}"}
    except ALLOWED_ERRORS as error:
        outcome, detail = type(error).__name__, str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
        if case["expect"] == "valid":
            return {"verdict": "failed", "outcome": outcome, "detail": f"refused a valid input: {detail}"}
        if not detail:
            return {"verdict": "failed", "outcome": outcome, "detail": "an error without a message"}
    except Exception as error:  # noqa: BLE001 - any other error breaks the contract
        return {"verdict": "failed", "outcome": type(error).__name__,
                "detail": "an error of an unexpected kind: " + "".join(traceback.format_exception_only(error)).strip()[:600]}
    return {"verdict": "ok", "outcome": outcome, "detail": detail}


def serve() -> None:
    """One case per line on stdin, one verdict per line on the original
    stdout (fd 1 is pointed at stderr, so that nothing else lands there)."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    if not tf_glp.native_available():
        out.write(json.dumps({"verdict": "no_native", "detail": str(tf_glp.native_available())}) + "\n")
        out.flush()
        return
    out.write(json.dumps({"verdict": "ready"}) + "\n")
    out.flush()
    for line in sys.stdin:
        out.write(json.dumps(run_case(json.loads(line))) + "\n")
        out.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--serve", action="store_true", help="run cases from stdin, one JSON per line")
    group.add_argument("--case", help="run one case (JSON) and print its verdict")
    args = parser.parse_args()
    if args.serve:
        serve()
    else:
        print(json.dumps(run_case(json.loads(args.case))))


if __name__ == "__main__":
    main()
