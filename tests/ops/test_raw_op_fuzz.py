"""A fuzz harness for the op contract of tf_glp's seven raw ops.

A user's graph, a SavedModel or a tf.raw_ops-style call can hand the ops
any tensors and attributes: whatever they are, the process must survive,
a valid input must give the reference numbers and an invalid one a clear
error (TensorFlow's or Python's). Hypothesis generates the calls: a valid
case of each op (small shapes of every float dtype, NaN and infinities
among the values, empty batches, int32-sized strides and dilations; for
Glp>HostApply, every update kind of HOST_UPDATES) or the same case with one
thing broken (a dtype, a rank, a channel count, an attribute, a sizes
vector, a variable's dtype, shape or initialization, a hyper-parameter's
shape or finiteness, aliased or several resource handles, an unknown update
kind, too many or too few slots or hyper-parameters, empty tensors with
dimensions near 2^31, 2^40 or 2^62). Each runs eagerly,
in a tf.function, or in a tf.function that sees no static shapes, in a
child process (tests/ops/raw_op_fuzz.py) that a crash or hang cannot take
the suite with it; a failure is reported with the command that reproduces
it. Valid conv2d and matmul cases also go through the public ops'
pure-TensorFlow fallback, gradients included.

The default run is a fixed-seed sample (DEFAULT_CASES generated calls,
a seventh as many through the fallbacks, and the known crashes) that
takes about half a minute. A long
campaign: `pytest tests/ops/test_raw_op_fuzz.py --fuzz-cases 100000 -s`
(or TF_GLP_FUZZ_CASES; TF_GLP_FUZZ_SEED picks another seed); `-s` shows the
summary line.
"""

from __future__ import annotations

import collections
import json
import os
import select
import shlex
import subprocess
import sys
import tempfile
import time

import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import tf_glp
from raw_op_fuzz import conv_geometry
from tf_glp.ops.host_optimizers import HOST_UPDATES, HOST_UPDATES_BY_KIND, HostUpdate

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "raw_op_fuzz.py")
FUZZ_CASES = int(os.environ.get("TF_GLP_FUZZ_CASES") or 0)
FUZZ_SEED = int(os.environ.get("TF_GLP_FUZZ_SEED") or 20261204)
HANG_SECONDS = 120  # no case of these sizes takes a second; a hang is a hang

BIG = 2**31 - 1  # the largest int32 attribute / size
HUGE_DIMS = [BIG, 2**40, 2**62]
FLOATS = ["float32", "float16", "bfloat16"]
NOT_T = ["float64", "int32"]
MODES = ["eager", "eager", "eager", "function", "function", "function_unknown_shapes"]

pytestmark = pytest.mark.skipif(not tf_glp.native_available(), reason="the native library is not in use")


# -- building cases -----------------------------------------------------------------------

def tensor(dtype: str, shape, seed: int, fill: str = "normal") -> dict:
    return {"dtype": dtype, "shape": list(shape), "seed": seed, "fill": fill}


def ints(values, dtype: str = "int32") -> dict:
    return {"dtype": dtype, "values": values}


def scalar(value: float, dtype: str = "float32") -> dict:
    return {"dtype": dtype, "values": value}


def broken(case: dict, why: str, expect: str = "invalid") -> dict:
    case.update(expect=expect, why=why)
    return case


def _other(draw, choices, current):
    return draw(st.sampled_from([c for c in choices if c != current]))


@st.composite
def huge_empty_shapes(draw) -> list[int]:
    """Rank 1-3, dimensions of 2^31 - 1, 2^40 or 2^62, one of them 0."""
    rank = draw(st.integers(1, 3))
    shape = [draw(st.sampled_from(HUGE_DIMS)) for _ in range(rank)]
    shape[draw(st.integers(0, rank - 1))] = 0
    return shape


STEP = st.sampled_from([1, 1, 1, 2, 3, BIG])
FILL = st.sampled_from(["normal"] * 6 + ["special", "zeros"])
CONCURRENCY = st.sampled_from([1, 2, 3, 4, 8, 64])
BAD_CONCURRENCY = st.sampled_from([0, -1, 65, BIG, -BIG])


@st.composite
def conv_cases(draw, op: str) -> dict:
    dtype, seed0, fill = draw(st.sampled_from(FLOATS)), draw(st.integers(0, 2**16)), draw(FILL)
    batch = draw(st.integers(0, 4))
    in_hw = [draw(st.integers(1, 7)), draw(st.integers(1, 7))]
    in_c, out_c = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    filter_hw = [draw(st.integers(1, 4)), draw(st.integers(1, 4))]
    strides, dilations = [draw(STEP), draw(STEP)], [draw(STEP), draw(STEP)]
    padding = draw(st.sampled_from(["SAME", "VALID"]))
    fits = all((filter_hw[i] - 1) * dilations[i] + 1 <= in_hw[i] for i in range(2))
    if not fits:
        padding = "SAME"
    out_hw = conv_geometry({"strides": strides, "dilations": dilations, "padding": padding}, in_hw, filter_hw)["out"]
    x = tensor(dtype, [batch, *in_hw, in_c], seed0, fill)
    w = tensor(dtype, [*filter_hw, in_c, out_c], seed0 + 1, fill)
    dy = tensor(dtype, [batch, *out_hw, out_c], seed0 + 2, fill)
    roles = {
        "conv2d": {"input": x, "filter": w},
        "conv2d_backprop_input": {"input_sizes": ints([batch, *in_hw, in_c]), "filter": w, "out_backprop": dy},
        "conv2d_backprop_filter": {"input": x, "filter_sizes": ints([*filter_hw, in_c, out_c]), "out_backprop": dy},
    }[op]
    attrs = {"strides": strides, "padding": padding, "dilations": dilations, "concurrency": draw(CONCURRENCY)}
    case = {"op": op, "mode": draw(st.sampled_from(MODES)), "attrs": attrs, "expect": "valid", "why": "",
            "inputs": list(roles.values())}
    floats = [r for r in roles.values() if "shape" in r]
    sizes = next((r for r in roles.values() if "values" in r), None)
    mutations = ["none"] * 8 + ["wrong_dtype", "not_t", "rank", "channels", "attr_length", "attr_nonpositive",
                                "padding", "concurrency", "valid_does_not_fit", "huge_empty"]
    if sizes is not None:
        mutations += ["sizes_values", "huge_sizes", "sizes_shape", "sizes_dtype", "out_backprop_shape", "batch"]
    mutation = draw(st.sampled_from(mutations))
    if mutation == "none":
        return case
    if mutation == "wrong_dtype":
        target = draw(st.sampled_from(floats))
        target["dtype"] = _other(draw, FLOATS + NOT_T, dtype)
        return broken(case, f"one input is {target['dtype']}, the others {dtype}")
    if mutation == "not_t":
        new = draw(st.sampled_from(NOT_T))
        for t in floats:
            t["dtype"] = new
        return broken(case, f"T = {new}")
    if mutation == "rank":
        target = draw(st.sampled_from(list(roles.values())))
        if "values" in target:
            target["values"] = [target["values"][:2], target["values"][2:]]
        elif draw(st.booleans()):
            target["shape"] = target["shape"] + [1]
        else:
            target["shape"] = target["shape"][:-1]
        return broken(case, "an input of the wrong rank")
    if mutation == "channels":
        if "filter" in roles:
            roles["filter"]["shape"][2] += 1
        else:
            sizes["values"][2] += 1
        return broken(case, "the filter's input channels differ from the input's")
    if mutation == "attr_length":
        attrs[draw(st.sampled_from(["strides", "dilations"]))] = [1] * draw(st.sampled_from([0, 1, 3, 4]))
        return broken(case, "strides or dilations without 2 entries")
    if mutation == "attr_nonpositive":
        attrs[draw(st.sampled_from(["strides", "dilations"]))][draw(st.integers(0, 1))] = draw(st.sampled_from([0, -1, -BIG]))
        return broken(case, "a stride or dilation < 1")
    if mutation == "padding":
        attrs["padding"] = draw(st.sampled_from(["same", "valid", "EXPLICIT", ""]))
        return broken(case, f"padding {attrs['padding']!r}")
    if mutation == "concurrency":
        attrs["concurrency"] = draw(BAD_CONCURRENCY)
        return broken(case, f"concurrency {attrs['concurrency']}")
    if mutation == "valid_does_not_fit":
        attrs.update(padding="VALID", dilations=[1, 1])
        axis = draw(st.integers(0, 1))
        if "filter" in roles:
            roles["filter"]["shape"][axis] = in_hw[axis] + 1
        else:
            sizes["values"][axis] = in_hw[axis] + 1
        return broken(case, "padding VALID with a filter larger than the input")
    if mutation == "huge_empty":
        target = draw(st.sampled_from(floats))
        rank = len(target["shape"])
        target["shape"] = [draw(st.sampled_from(HUGE_DIMS + [1, 3])) for _ in range(rank)]
        target["shape"][draw(st.integers(0, rank - 1))] = 0
        return broken(case, "an empty input with huge dimensions", "no_crash")
    if mutation == "sizes_values":
        sizes["values"] = [draw(st.integers(-3, 9)) for _ in range(4)]
        return broken(case, "other sizes", "invalid" if min(sizes["values"]) < 0 else "no_crash")
    if mutation == "huge_sizes":
        # Two sizes of 2^31 - 1 at least: an output that cannot be allocated
        # (one alone could be an 8 GB gradient of an empty batch).
        sizes["values"] = [draw(st.sampled_from([0, 1, 2, 3, BIG])) for _ in range(4)]
        for axis in draw(st.lists(st.integers(0, 3), min_size=2, max_size=2, unique=True)):
            sizes["values"][axis] = BIG
        target = roles["out_backprop"]
        target["shape"][draw(st.integers(0, 3))] = 0
        return broken(case, "int32-sized sizes with an empty out_backprop", "no_crash")
    if mutation == "sizes_shape":
        sizes["values"] = draw(st.sampled_from([sizes["values"][:3], sizes["values"] + [1], sizes["values"][0]]))
        return broken(case, "a sizes input that is not 4 sizes")
    if mutation == "sizes_dtype":
        sizes["dtype"] = "int64"
        return broken(case, "int64 sizes")
    if mutation == "out_backprop_shape":
        roles["out_backprop"]["shape"][draw(st.integers(1, 3))] += 1
        return broken(case, "out_backprop not of the forward output's shape")
    assert mutation == "batch"
    roles["out_backprop"]["shape"][0] = batch + 1
    return broken(case, "out_backprop's batch differs")


@st.composite
def matmul_cases(draw, op: str) -> dict:
    dtype, seed0, fill = draw(st.sampled_from(FLOATS)), draw(st.integers(0, 2**16)), draw(FILL)
    m, k, n = draw(st.integers(0, 6)), draw(st.integers(0, 6)), draw(st.integers(0, 6))
    transpose_b = draw(st.booleans())
    a = tensor(dtype, [m, k], seed0, fill)
    if op == "matmul":
        b = tensor(dtype, [n, k] if transpose_b else [k, n], seed0 + 1, fill)
        attrs = {"transpose_b": transpose_b, "concurrency": draw(CONCURRENCY)}
    else:
        b = tensor(dtype, [m, n], seed0 + 1, fill)  # out_backprop
        attrs = {"concurrency": draw(CONCURRENCY)}
    case = {"op": op, "mode": draw(st.sampled_from(MODES)), "attrs": attrs, "expect": "valid", "why": "",
            "inputs": [a, b]}
    mutation = draw(st.sampled_from(["none"] * 6 + ["wrong_dtype", "not_t", "rank", "inner", "concurrency", "huge_empty"]))
    if mutation == "none":
        return case
    if mutation == "wrong_dtype":
        b["dtype"] = _other(draw, FLOATS + NOT_T, dtype)
        return broken(case, f"a is {dtype}, the other input {b['dtype']}")
    if mutation == "not_t":
        a["dtype"] = b["dtype"] = draw(st.sampled_from(NOT_T))
        return broken(case, f"T = {a['dtype']}")
    if mutation == "rank":
        target = draw(st.sampled_from([a, b]))
        target["shape"] = draw(st.sampled_from([target["shape"][:1], target["shape"] + [2], []]))
        return broken(case, "an input that is not a matrix")
    if mutation == "inner":
        inner_axis = (1 if transpose_b else 0) if op == "matmul" else 0
        b["shape"][inner_axis] += 1
        return broken(case, "the inner (or row) sizes differ")
    if mutation == "concurrency":
        attrs["concurrency"] = draw(BAD_CONCURRENCY)
        return broken(case, f"concurrency {attrs['concurrency']}")
    big, other = draw(st.sampled_from(HUGE_DIMS)), draw(st.sampled_from(HUGE_DIMS))
    if op == "matmul":  # [big, 0] @ [0, other]: a product of big x other zeros
        a["shape"], b["shape"] = [big, 0], ([other, 0] if transpose_b else [0, other])
    else:  # [0, big]^T @ [0, other]
        a["shape"], b["shape"] = [0, big], [0, other]
    return broken(case, "empty operands whose product is huge", "no_crash")


@st.composite
def host_reduce_cases(draw) -> dict:
    dtype, seed0, fill = draw(st.sampled_from(FLOATS)), draw(st.integers(0, 2**16)), draw(FILL)
    shape = [draw(st.integers(0, 5)) for _ in range(draw(st.integers(0, 3)))]
    count = draw(st.integers(1, 10))
    items = [tensor(dtype, shape, seed0 + i, fill) for i in range(count)]
    reduction = draw(st.sampled_from(["sum", "mean"]))
    attrs = {"out_type": draw(st.sampled_from([dtype, "float32"])), "reduction": reduction,
             "divide": reduction == "sum" and draw(st.booleans()), "check_finite": draw(st.booleans())}
    divisor = scalar(draw(st.sampled_from([1.0, 2.0, 0.5, 3.0, -4.0, 0.0])))
    case = {"op": "host_reduce", "mode": draw(st.sampled_from(MODES)), "attrs": attrs, "expect": "valid", "why": "",
            "inputs": [{"list": items}, divisor]}
    mutation = draw(st.sampled_from(["none"] * 6 + ["shape", "dtype", "not_t", "out_type", "mean_divide",
                                                    "divisor_shape", "divisor_dtype", "huge_empty", "no_inputs"]))
    if mutation == "none":
        return case
    if mutation == "shape":
        if count == 1:
            items.append(tensor(dtype, shape, seed0 + 99, fill))
        target = items[draw(st.integers(1, len(items) - 1))]
        target["shape"] = draw(st.sampled_from([shape + [1], shape[:-1] if shape else [2], [d + 1 for d in shape] or [3]]))
        return broken(case, "inputs of different shapes")
    if mutation == "dtype":
        items.append(tensor(_other(draw, FLOATS + NOT_T, dtype), shape, seed0 + 99, fill))
        return broken(case, "inputs of different dtypes")
    if mutation == "not_t":
        new = draw(st.sampled_from(NOT_T))
        for item in items:
            item["dtype"] = new
        attrs["out_type"] = new
        return broken(case, f"T = {new}")
    if mutation == "out_type":
        attrs["out_type"] = _other(draw, FLOATS + ["float64", "int32"], dtype)
        return broken(case, f"out_type {attrs['out_type']} for T {dtype}", "valid" if attrs["out_type"] == "float32" else "invalid")
    if mutation == "mean_divide":
        attrs.update(reduction="mean", divide=True)
        return broken(case, "divide with reduction 'mean'")
    if mutation == "divisor_shape":
        divisor["values"] = draw(st.sampled_from([[1.0], [[2.0]], [1.0, 2.0]]))
        return broken(case, "a divisor that is not a scalar")
    if mutation == "divisor_dtype":
        divisor["dtype"] = draw(st.sampled_from(["float64", "float16", "int32"]))
        return broken(case, "a divisor that is not float32")
    if mutation == "huge_empty":
        huge = draw(huge_empty_shapes())
        for item in items:
            item["shape"] = huge
        return broken(case, "empty inputs with huge dimensions", "no_crash")
    case["inputs"][0] = {"list": []}
    return broken(case, "no inputs")


HOST_VALUES = st.sampled_from([0.0, 0.001, 0.01, 0.1, 0.5, 0.9, 1.0, 1e-7, -0.5])
# Slots start non-negative (several kinds take square roots or powers of
# theirs, as Adam's v, which the optimizers keep >= 0), the parameter normal.
SLOT_FILL = st.sampled_from(["abs", "abs", "zeros"])


@st.composite
def unknown_kinds(draw) -> str:
    """A `kind` that no row of HOST_UPDATES has: a near miss of one, or any text."""
    kinds = [update.kind for update in HOST_UPDATES]
    near = [k.upper() for k in kinds] + [k + "_" for k in kinds] + [k[:-1] for k in kinds] + \
        [" " + k for k in kinds] + [k + "\x00" for k in kinds] + [""]
    return draw(st.one_of(st.sampled_from(near), st.text(max_size=12)).filter(lambda name: name not in kinds))


@st.composite
def host_apply_cases(draw, update: HostUpdate) -> dict:
    """Glp>HostApply with `update`'s kind: var, its slots (variables 0, 1,
    ...), N gradients, the row's scalars, weight_decay, decay_learning_rate."""
    dtype, seed0, fill = draw(st.sampled_from(FLOATS)), draw(st.integers(0, 2**16)), draw(FILL)
    shape = [draw(st.integers(0, 5)) for _ in range(draw(st.integers(0, 2)))]
    slots = len(update.slot_names)
    # Each slot of the shape the row gives it (Adafactor's row and column
    # means; for a var of rank < 2, Keras' scalar placeholders, of any dtype).
    slot_shapes = [update.slot_shape(i, tf.TensorShape(shape)).as_list() for i in range(slots)]
    placeholders = {1 + i for i in range(slots) if update.factored and i < 2 and len(shape) < 2}
    variables = [tensor("float32", shape, seed0, "normal")]
    variables += [tensor("float32", slot_shapes[i], seed0 + 1 + i, draw(SLOT_FILL)) for i in range(slots)]
    grads = [tensor(dtype, shape, seed0 + 10 + i, fill) for i in range(draw(st.integers(1, 4)))]
    scalars = [scalar(draw(HOST_VALUES)) for _ in update.scalar_names]
    decay = [scalar(draw(HOST_VALUES)), scalar(draw(HOST_VALUES))]  # weight_decay, decay_learning_rate
    attrs = {"kind": update.kind, "use_weight_decay": draw(st.booleans())}
    handles = [{"resource": {"var": i}} for i in range(1 + slots)]
    slot_list, scalar_list = {"list": handles[1:]}, {"list": scalars}
    case = {"op": "host_apply", "mode": draw(st.sampled_from(MODES)), "attrs": attrs, "expect": "valid", "why": "",
            "variables": variables, "inputs": [handles[0], slot_list, {"list": grads}, scalar_list, *decay]}
    mutations = ["none"] * 6 + ["grad_shape", "grad_dtype", "not_t", "var_dtype", "scalar_shape", "scalar_dtype",
                                "scalar_not_finite", "uninitialized", "handles", "huge_empty", "no_grads",
                                "unknown_kind", "other_kind", "slot_count", "scalar_count"]
    if slots:
        mutations += ["slot_shape", "slot_dtype", "alias"]
    mutation = draw(st.sampled_from(mutations))
    if mutation == "none":
        return case
    if mutation == "grad_shape":
        grads[draw(st.integers(0, len(grads) - 1))]["shape"] = shape + [2]
        return broken(case, "a gradient of another shape than var")
    if mutation == "grad_dtype":
        grads.append(tensor(_other(draw, FLOATS + NOT_T, dtype), shape, seed0 + 99, fill))
        return broken(case, "gradients of different dtypes")
    if mutation == "not_t":
        new = draw(st.sampled_from(NOT_T))
        for g in grads:
            g["dtype"] = new
        return broken(case, f"T = {new}")
    if mutation in ("var_dtype", "slot_dtype"):
        index = 0 if mutation == "var_dtype" else draw(st.sampled_from(
            [i for i in range(1, slots + 1) if i not in placeholders] or [0]))
        variables[index]["dtype"] = draw(st.sampled_from(["float64", "float16", "bfloat16", "int32"]))
        return broken(case, f"variable {index} is {variables[index]['dtype']}")
    if mutation == "slot_shape":
        index = draw(st.integers(1, slots))
        expected = slot_shapes[index - 1]
        variables[index]["shape"] = draw(st.sampled_from([expected + [1], [d + 1 for d in expected] or [2]]))
        return broken(case, "a slot of another shape than the row gives it")
    if mutation == "scalar_shape":
        draw(st.sampled_from(scalars + decay))["values"] = draw(st.sampled_from([[0.1], [0.1, 0.2], [[0.1]]]))
        return broken(case, "a hyper-parameter that is not a scalar")
    if mutation == "scalar_dtype":
        draw(st.sampled_from(scalars + decay))["dtype"] = draw(st.sampled_from(["float64", "float16", "int32"]))
        return broken(case, "a hyper-parameter that is not float32")
    if mutation == "scalar_not_finite":
        draw(st.sampled_from(scalars + decay))["values"] = draw(st.sampled_from([float("nan"), float("inf"), float("-inf")]))
        return broken(case, "a hyper-parameter that is not finite")
    if mutation == "uninitialized":
        variables[draw(st.integers(0, slots))]["initialized"] = False
        return broken(case, "an uninitialized variable")
    if mutation == "handles":
        handles[draw(st.integers(0, slots))]["resource"] = {"stack": draw(st.sampled_from([[], [0, 0], [0]]))}
        return broken(case, "a resource input that is not one handle")
    if mutation == "alias":
        first, second = sorted(draw(st.lists(st.integers(0, slots), min_size=2, max_size=2, unique=True)))
        handles[second]["resource"] = {"var": first}
        return broken(case, f"inputs {first} and {second} are the same variable")
    if mutation == "huge_empty":
        huge = draw(huge_empty_shapes())
        for t in variables + grads:
            t["shape"] = huge
        return broken(case, "empty variables and gradients with huge dimensions", "no_crash")
    if mutation == "unknown_kind":
        attrs["kind"] = draw(unknown_kinds())
        return broken(case, f"update kind {attrs['kind']!r}")
    if mutation == "other_kind":
        # Another row's kind: its update if it takes as many slots and
        # scalars (the reference is that row's), else an error.
        other = draw(st.sampled_from([u for u in HOST_UPDATES if u.kind != update.kind]))
        attrs["kind"] = other.kind
        same = (len(other.slot_names), len(other.scalar_names), other.factored) == (slots, len(scalars), update.factored)
        return broken(case, f"the inputs of {update.kind} with kind {other.kind}", "valid" if same else "invalid")
    if mutation == "slot_count":
        if slots and draw(st.booleans()):
            slot_list["list"].pop(draw(st.integers(0, slots - 1)))
            return broken(case, f"{slots - 1} slots for {update.kind}")
        variables.append(tensor("float32", slot_shapes[-1] if slots else shape, seed0 + 9, draw(SLOT_FILL)))
        slot_list["list"].insert(draw(st.integers(0, slots)), {"resource": {"var": 1 + slots}})
        return broken(case, f"{slots + 1} slots for {update.kind}")
    if mutation == "scalar_count":
        if draw(st.booleans()):
            scalars.pop(draw(st.integers(0, len(scalars) - 1)))
        else:
            scalars.insert(draw(st.integers(0, len(scalars))), scalar(draw(HOST_VALUES)))
        return broken(case, f"{len(scalars)} hyper-parameters for {update.kind}")
    case["inputs"][2] = {"list": []}
    return broken(case, "no gradients")


def raw_op_cases():
    # Glp>HostApply three times: a third of the cases, as when each of its
    # first three kinds was an op of its own; the kind drawn from the table.
    host_apply = st.sampled_from(HOST_UPDATES).flatmap(host_apply_cases)
    return st.one_of(
        conv_cases("conv2d"), conv_cases("conv2d_backprop_input"), conv_cases("conv2d_backprop_filter"),
        matmul_cases("matmul"), matmul_cases("matmul_grad_weights"), host_reduce_cases(),
        host_apply, host_apply, host_apply,
    )


@st.composite
def fallback_cases(draw) -> dict:
    """Valid conv2d and matmul cases, through the public ops' fallback."""
    case = draw(st.one_of(conv_cases("conv2d"), matmul_cases("matmul")).filter(lambda c: c["expect"] == "valid"))
    case["mode"] = draw(st.sampled_from(["fallback", "fallback_function_unknown_shapes"]))
    return case


# -- the child process ------------------------------------------------------------------------

def case_label(case: dict) -> str:
    """The op, and for Glp>HostApply its kind (one of the table's, or "unknown")."""
    if case["op"] != "host_apply":
        return case["op"]
    kind = case["attrs"]["kind"]
    return f"host_apply[{kind if kind in HOST_UPDATES_BY_KIND else 'unknown'}]"


def reproduce_command(case: dict) -> str:
    return f"python tests/ops/raw_op_fuzz.py --case {shlex.quote(json.dumps(case))}"


class FuzzWorker:
    """A child process running cases one at a time (tests/ops/raw_op_fuzz.py
    --serve), restarted after a crash or a hang; it counts what it ran."""

    def __init__(self):
        self.process = None
        self.counts = collections.Counter()
        self.outcomes = collections.Counter()
        self.started = time.monotonic()

    def _start(self) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, CHILD, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(CHILD))))
        self.buffer, self.at_end = b"", False
        line = self._read_line(HANG_SECONDS)
        if line is None or json.loads(line)["verdict"] != "ready":
            raise RuntimeError(f"the fuzz child did not start: {line!r} {self._stderr_tail()}")

    def _read_line(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.process.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                self.at_end = True
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def _stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-2000:]

    def run(self, case: dict) -> dict:
        if self.process is None:
            self._start()
        try:
            self.process.stdin.write(json.dumps(case).encode() + b"\n")
            self.process.stdin.flush()
            line = self._read_line(HANG_SECONDS)
        except BrokenPipeError:
            line, self.at_end = None, True
        if line is None:
            if self.at_end:  # the child closed its output: it is dying
                try:
                    self.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
            if self.process.poll() is None:
                self.process.kill()
                verdict = {"verdict": "hang", "detail": f"no answer in {HANG_SECONDS} s"}
            else:
                verdict = {"verdict": "crash", "detail": f"exit status {self.process.returncode}; stderr: {self._stderr_tail()}"}
            self.process.wait()
            self.process = None
        else:
            verdict = json.loads(line)
        self.counts[(case_label(case), case["expect"], verdict["verdict"])] += 1
        self.outcomes[verdict.get("outcome", verdict["verdict"])] += 1
        return verdict

    def close(self) -> None:
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait(timeout=60)

    def summary(self) -> str:
        total = sum(self.counts.values())
        by_verdict = collections.Counter()
        by_op = collections.Counter()
        by_expect = collections.Counter()
        for (op, expect, verdict), count in self.counts.items():
            by_verdict[verdict] += count
            by_op[op] += count
            by_expect[expect] += count
        return (f"raw-op fuzz: {total} cases in {time.monotonic() - self.started:.0f} s (seed {FUZZ_SEED}); "
                f"verdicts {dict(by_verdict)}; expected {dict(by_expect)}; outcomes {dict(self.outcomes)}; "
                f"per op {dict(sorted(by_op.items()))}")


@pytest.fixture(scope="module")
def fuzz_worker():
    worker = FuzzWorker()
    yield worker
    worker.close()
    print("\n" + worker.summary())


def check(worker: FuzzWorker, case: dict) -> None:
    verdict = worker.run(case)
    if verdict["verdict"] != "ok":
        pytest.fail(f"{verdict['verdict']} ({case_label(case)}, {case['mode']}, expected {case['expect']}"
                    f"{': ' + case['why'] if case['why'] else ''}): {verdict['detail']}\n"
                    f"reproduce: {reproduce_command(case)}", pytrace=False)


DEFAULT_CASES = 1000
FUZZ_SETTINGS = settings(max_examples=FUZZ_CASES or DEFAULT_CASES, deadline=None, database=None,
                         suppress_health_check=list(HealthCheck))


# -- the tests ----------------------------------------------------------------------------------

@FUZZ_SETTINGS
@seed(FUZZ_SEED)
@given(case=raw_op_cases())
def test_raw_ops_keep_their_contract(fuzz_worker, case):
    check(fuzz_worker, case)


@settings(FUZZ_SETTINGS, max_examples=max(1, (FUZZ_CASES or DEFAULT_CASES) // 7))
@seed(FUZZ_SEED)
@given(case=fallback_cases())
def test_fallbacks_compute_the_reference(fuzz_worker, case):
    check(fuzz_worker, case)


# Inputs that killed the process before the op contract was kept (each
# aborted on a CHECK in TensorShape's constructor); each must now be a clean
# error.
KNOWN_CRASHES = {
    # The abort the first fuzzing found: 2 x (2^31 - 1)^2 x 2 output elements.
    "conv2d_backprop_input_int32_sizes": {
        "op": "conv2d_backprop_input", "inputs": [
            ints([2, BIG, BIG, 1]), tensor("float32", [1, 1, 1, 2], 0), tensor("float32", [2, 0, 1, 2], 1)],
        "attrs": {"strides": [1, 1], "padding": "SAME", "dilations": [1, 1], "concurrency": 1}},
    "matmul_huge_empty_operands": {
        "op": "matmul", "inputs": [tensor("float32", [2**40, 0], 0), tensor("float32", [0, 2**40], 1)],
        "attrs": {"transpose_b": False, "concurrency": 1}},
    "matmul_grad_weights_huge_empty_operands": {
        "op": "matmul_grad_weights", "inputs": [tensor("float32", [0, 2**40], 0), tensor("float32", [0, 2**40], 1)],
        "attrs": {"concurrency": 1}},
}


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("name", sorted(KNOWN_CRASHES))
def test_known_crashes_are_clean_errors(fuzz_worker, name, mode):
    check(fuzz_worker, dict(KNOWN_CRASHES[name], mode=mode, expect="invalid", why=name))
