"""Timing each GLP layer at start-up and choosing its concurrency.

For every eligible layer (Conv2D / Dense, float32, channels_last, groups 1),
at its real input shape, dtype and device: TensorFlow's own kernel and each
candidate lane count k (capped by concurrency_model.py) run forward and
backward, `warmup` times untimed, then `trials` times timed. The choice is
the fastest median, except that the simpler candidate (native, then fewer
lanes) wins whenever it is within the measured spread of the fastest: a
level is never chosen unless it measured faster than TensorFlow's kernel.

Profiling reads the layers' variables and writes nothing: weights,
optimizer state, random generators and step counters are untouched (inputs
come from a local NumPy generator).
"""

from __future__ import annotations

import os
import statistics
import warnings
from collections.abc import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

import tf_glp
from tf_glp import plan as plan_lib
from tf_glp.layers import as_glp_layer, is_eligible
from tf_glp.profiling import concurrency_model

WARMUP = 2


def device_kind() -> str:
    return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"


def op_threads() -> int:
    """The threads TensorFlow lets one op use (its intra-op pool)."""
    return tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count() or 1


def gpu_description() -> concurrency_model.GpuDescription | None:
    """The first GPU's properties, from its name (None if unknown)."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "")
    return concurrency_model.known_gpu(name)


def device_string() -> str:
    if device_kind() == "gpu":
        gpus = tf.config.list_physical_devices("GPU")
        return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
    return f"CPU, {op_threads()} op threads"


def plan_header(batch_size: int, candidates="auto") -> dict:
    """The facts a plan must share with this run to be reused."""
    return {
        "schema": plan_lib.SCHEMA,
        "tf_glp": tf_glp.__version__,
        "tensorflow": tf.__version__,
        "device": device_string(),
        "isa": tf_glp.native_available().cpu_kernels,
        "batch_size": int(batch_size),
        "candidates": candidates if candidates == "auto" else sorted(int(k) for k in candidates),
    }


_CONFIG_KEYS = ("units", "filters", "kernel_size", "strides", "padding", "dilation_rate", "use_bias", "activation")


def layer_config(layer: keras.layers.Layer) -> dict:
    """What the layer computes, for matching plans (JSON-friendly)."""
    config = layer.get_config()
    return {key: (list(value) if isinstance(value, tuple) else value)
            for key, value in config.items() if key in _CONFIG_KEYS and isinstance(value, (int, str, bool, tuple, list))}


def layer_input(layer: keras.layers.Layer, batch: int) -> tuple[list[int], str]:
    """The layer's input shape for `batch` samples, and its dtype."""
    try:
        shape = list(layer.input.shape)
    except (AttributeError, ValueError) as error:
        raise ValueError(f"tf_glp: layer {layer.name!r} has not been called on an input yet; build the model "
                         f"first (e.g. start it with keras.Input)") from error
    if any(d is None for d in shape[1:]):
        raise ValueError(f"tf_glp: layer {layer.name!r} has an input shape with unknown sizes {shape}")
    return [int(batch)] + [int(d) for d in shape[1:]], layer.compute_dtype


def layer_work(layer: keras.layers.Layer, input_shape: Sequence[int]) -> concurrency_model.LayerWork:
    if isinstance(layer, keras.layers.Conv2D):
        out = layer.compute_output_shape(tuple(input_shape))
        kh, kw = layer.kernel_size
        cin = input_shape[-1]
        positions = int(out[1]) * int(out[2])
        return concurrency_model.LayerWork("conv2d", int(input_shape[0]), 2.0 * positions * kh * kw * cin * layer.filters,
                                           positions * kh * kw * cin)
    rows = int(np.prod(input_shape[:-1]))
    return concurrency_model.LayerWork("dense", rows, 2.0 * input_shape[-1] * layer.units)


def cap_for(work: concurrency_model.LayerWork) -> tuple[int, str]:
    if device_kind() == "gpu":
        gpu = gpu_description()
        if gpu is None:
            return min(8, work.batch), "unknown GPU: at most 8 lanes"
        return concurrency_model.gpu_cap(work, gpu)
    return concurrency_model.cpu_cap(work, op_threads())


def time_layer(layer, input_shape: Sequence[int], dtype: str, concurrencies: Sequence[int | None],
               trials: int) -> list[list[float]]:
    """Seconds of forward + backward (input and weight gradients) for each
    concurrency, per trial.

    All candidates run in one traced function, one after the other, each
    bracketed by tf.timestamp() and chained by control dependencies: one
    trace per layer instead of one per candidate (tracing, not running, is
    most of the profiling time on small layers).
    """
    rng = np.random.default_rng(0)  # local: the global generators stay untouched
    x = tf.constant(rng.standard_normal(input_shape).astype(dtype))
    dy_shape = layer.compute_output_shape(tuple(input_shape))
    dy = tf.constant(rng.standard_normal([int(d) for d in dy_shape]).astype(dtype))
    weights = [v.value for v in layer.trainable_variables]
    saved = _layer_state(layer)

    @tf.function(autograph=False)
    def run_all():
        durations, kept = [], []
        token = tf.timestamp()
        for concurrency in concurrencies:
            as_glp_layer(layer, concurrency)  # read when the call below is traced
            with tf.control_dependencies([token]):
                start = tf.timestamp()
            with tf.control_dependencies([start]):
                inputs = tf.identity(x)
                with tf.GradientTape() as tape:
                    tape.watch(inputs)
                    outputs = layer(inputs)
                grads = tape.gradient(outputs, [inputs, *weights], output_gradients=dy)
            grads = [g for g in grads if g is not None]
            with tf.control_dependencies(grads):
                token = tf.timestamp()
            durations.append(token - start)
            # Returned, so that Grappler cannot prune the work as unused
            # (a control edge to a timestamp does not keep it alive).
            kept.extend(tf.reshape(g, [-1])[0] for g in grads)
        return tf.stack(durations), kept

    try:
        runs = [run_all()[0].numpy() for _ in range(WARMUP + trials)][WARMUP:]
    finally:
        _restore_layer(layer, saved)
    return [[float(run[i]) for run in runs] for i in range(len(concurrencies))]


def _layer_state(layer) -> tuple:
    return type(layer), "concurrency" in vars(layer), getattr(layer, "concurrency", None)


def _restore_layer(layer, state: tuple) -> None:
    """Puts back the layer's class and concurrency (or its absence)."""
    kind, had_concurrency, concurrency = state
    layer.__class__ = kind
    if had_concurrency:
        layer.concurrency = concurrency
    else:
        vars(layer).pop("concurrency", None)


def _spread(times: list[float]) -> float:
    if len(times) < 2:
        return 0.0
    quartiles = statistics.quantiles(times, n=4)
    return quartiles[2] - quartiles[0]


def choose(candidates: list[plan_lib.Candidate]) -> tuple[int | None, str]:
    """The simplest candidate within the spread of the fastest, among
    TensorFlow's kernel (candidates[0]) and the lane counts that measured
    faster than it (see the module docstring)."""
    native = candidates[0]
    allowed = [native] + [c for c in candidates[1:] if c.median_ms < native.median_ms]
    best = min(allowed, key=lambda c: c.median_ms)
    for candidate in allowed:  # native first, then fewer lanes
        if candidate.median_ms <= best.median_ms + max(best.spread_ms, candidate.spread_ms):
            if candidate is best:
                return candidate.concurrency, f"fastest ({candidate.median_ms:.3f} ms)"
            return candidate.concurrency, (f"within the spread of the fastest ({best.label}, {best.median_ms:.3f} ms), "
                                           f"and simpler")
    return best.concurrency, "fastest"


def profile_layers(layers: Sequence[keras.layers.Layer], batch: int, header: dict, candidates="auto",
                   trials: int = 5, progress: Callable[[int], None] | None = None) -> plan_lib.Plan:
    """Times every layer; returns the plan (header as given)."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    entries = []
    for layer in layers:
        input_shape, dtype = layer_input(layer, batch)
        cap, cap_reason = cap_for(layer_work(layer, input_shape))
        counts = concurrency_model.candidates(cap) if candidates == "auto" else [k for k in candidates if k <= cap]
        concurrencies = [None, *counts]
        per_candidate = time_layer(layer, input_shape, dtype, concurrencies, trials)
        timed = [plan_lib.Candidate(k, statistics.median(times) * 1e3, _spread(times) * 1e3)
                 for k, times in zip(concurrencies, per_candidate)]
        if progress:
            progress(1)
        choice, reason = choose(timed)
        entries.append(plan_lib.LayerPlan(layer.name, type(layer).__name__, input_shape, dtype, layer_config(layer),
                                          cap, cap_reason, timed, choice, reason))
    return plan_lib.Plan(header=header, layers=entries)


def eligible_layers(model: keras.Model, convert: bool) -> list[keras.layers.Layer]:
    """The model's Conv2D / Dense layers the profiler may set (plain Keras
    ones only with convert=True), in model order, nested models included."""
    found = []

    def visit(layer):
        if isinstance(layer, keras.Model):
            for inner in layer.layers:
                visit(inner)
        elif is_eligible(layer, convert):
            found.append(layer)

    for layer in model.layers:
        visit(layer)
    return found


def profilable(layers) -> list:
    """The layers whose input shape is known (a functional or Sequential
    model's); the others are left alone, with one warning naming them."""
    known, unknown = [], []
    for layer in layers:
        try:
            layer_input(layer, 1)
        except ValueError:
            unknown.append(layer.name)
        else:
            known.append(layer)
    if unknown:
        warnings.warn(f"tf_glp: not profiling {', '.join(unknown)}: their input shapes are unknown (layers of a "
                      f"subclassed model, or never called); they keep their kernels", stacklevel=3)
    return known


def load_or_profile(layers, batch: int, plan_path: str | None, candidates="auto", trials: int = 5,
                    verbose: int = 1) -> tuple[plan_lib.Plan, bool]:
    """The plan for `layers` at `batch`: the file's if it matches this run
    (same header and layers), else a new profile, written atomically.
    Returns (plan, reused)."""
    header = plan_header(batch, candidates)
    described = [(type(layer).__name__, *layer_input(layer, batch), layer_config(layer)) for layer in layers]
    if plan_path and os.path.exists(plan_path):
        try:
            stored = plan_lib.read(plan_path)
        except (OSError, ValueError) as error:
            warnings.warn(f"tf_glp: ignoring the plan {plan_path} ({error}); profiling again", stacklevel=3)
        else:
            why = stored.mismatch(header, described)
            if why is None:
                return stored, True
            warnings.warn(f"tf_glp: the plan {plan_path} is for another run ({why}); profiling again", stacklevel=3)
    bar = keras.utils.Progbar(len(layers), unit_name="layer") if verbose else None
    plan = profile_layers(layers, batch, header, candidates, trials, progress=bar.add if bar else None)
    if plan_path:
        plan_lib.write(plan, plan_path)
    return plan, False


def apply_plan(layers, plan: plan_lib.Plan) -> bool:
    """Sets every layer's concurrency from the plan (entries in model order,
    as load_or_profile matched them); True if any changed. A plain Keras
    layer whose choice is TensorFlow's kernel stays plain, whether the plan
    was profiled or reused, so what model.save writes does not depend on it."""
    changed = False
    for layer, entry in zip(layers, plan.layers):
        plain = not hasattr(layer, "concurrency")
        if plain and entry.choice is None:
            continue
        if plain or layer.concurrency != entry.choice:
            as_glp_layer(layer, entry.choice)
            changed = True
    return changed


def profile(model: keras.Model, sample_batch, candidates="auto", trials: int = 5, plan_path: str | None = None,
            convert: bool = True, verbose: int = 0) -> plan_lib.Plan:
    """The plan ConcurrencyProfiler would make, without training or
    changing the model: each eligible layer timed at the batch size of
    `sample_batch` (an array, or a list/dict of arrays, for the model's inputs).

    Example:
        >>> plan = tf_glp.profile(model, x[:64])
        >>> print(tf_glp.plan.table(plan))
    """
    first = tf.nest.flatten(sample_batch)[0]
    batch = int(np.shape(first)[0])
    layers = profilable(eligible_layers(model, convert))
    plan, _ = load_or_profile(layers, batch, plan_path, candidates, trials, verbose)
    return plan
