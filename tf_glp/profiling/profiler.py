"""Timing each GLP layer at start-up and choosing its concurrency.

For every eligible layer (Conv2D / Dense computing in float32, float16 or
bfloat16, channels_last, groups 1), at its real input shape, dtype and
device: the layer's convolution or matrix product with TensorFlow's own
kernel and with each candidate lane count k (capped by
concurrency_model.py), forward and backward, in one function for the whole
model (see time_layers): WARMUP untimed rounds, then `trials` timed ones.
TensorFlow's kernel stays unless a lane count measured clearly faster
(MIN_SPEEDUP times, and outside its spread); then the choice is the fewest
lanes within the measured spread of the fastest lane count (choose()).

Profiling reads only the layers' shapes and configuration: weights,
optimizer state, random generators and step counters are untouched (the
operands come from a local NumPy generator).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
import warnings
from collections.abc import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

import tf_glp
from tf_glp import _keras_compat
from tf_glp import plan as plan_lib
from tf_glp.layers import as_glp_layer, is_eligible
from tf_glp.ops.concurrent import concurrent_conv2d, concurrent_matmul
from tf_glp.profiling import concurrency_model, gpu_device

WARMUP = 1  # untimed rounds: the first instantiates the function and warms the kernels

# A lane count replaces TensorFlow's kernel only if it measured at least this
# much faster alone. A layer timed alone is not the layer inside a training
# step (other ops' threads, caches, fusions): on the 2-core CI machine Dense
# lane counts measured up to 1.54x faster alone ran 6-9% slower in the step,
# while a one-channel convolution measured 1.4-2.9x faster alone made the
# step faster (benchmarks/RESULTS.md, "Start-up profiler", alone vs in the step).
MIN_SPEEDUP = 2.0


def device_kind() -> str:
    return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"


def op_threads() -> int:
    """The threads TensorFlow lets one op use (its intra-op pool)."""
    return tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count() or 1


def gpu_description() -> concurrency_model.GpuDescription | None:
    """The first GPU's properties, from the CUDA driver (None without one)."""
    if not tf.config.list_physical_devices("GPU"):
        return None
    return gpu_device.describe(gpu_device.load_driver())


def gpu_kernel_launch() -> concurrency_model.KernelLaunch:
    """tf_glp's im2col kernel as compiled for the GPU (the op library says,
    once it is loaded), else the documented default."""
    status = tf_glp.native_available()  # loads the library first: see gpu_device.im2col_launch
    launch = gpu_device.im2col_launch(status.path if status.available else None)
    return launch or concurrency_model.IM2COL_LAUNCH


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
        "min_speedup": MIN_SPEEDUP,  # the choice rule: a plan chosen under another is profiled again
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
            return min(8, work.batch), "the CUDA driver did not describe the GPU: at most 8 lanes"
        return concurrency_model.gpu_cap(work, gpu, gpu_kernel_launch())
    return concurrency_model.cpu_cap(work, op_threads())


def _core(layer: keras.layers.Layer, concurrency: int | None) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """What the layer's concurrency changes: its convolution or matrix
    product (Keras' own op for None, tf_glp's over k lanes). Bias and
    activation are the same ops whatever the choice, so they are not timed."""
    if isinstance(layer, keras.layers.Conv2D):
        if concurrency is None:
            return lambda x, w: keras.layers.Conv2D.convolution_op(layer, x, w)
        return lambda x, w: concurrent_conv2d(x, w, strides=list(layer.strides), padding=layer.padding,
                                              dilations=list(layer.dilation_rate), concurrency=concurrency)
    if concurrency is None:
        return tf.matmul  # what keras.layers.Dense runs on rows
    return lambda x, w: concurrent_matmul(x, w, concurrency=concurrency)


def _operands(layer: keras.layers.Layer, input_shape: Sequence[int], dtype: str,
              rng: np.random.Generator) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Random input, kernel and output gradient of the layer's core op at
    its real shapes and dtype (the layer's variables are not read)."""
    kernel_shape = [int(d) for d in layer.kernel.shape]
    if isinstance(layer, keras.layers.Conv2D):
        out_shape = [int(d) for d in layer.compute_output_shape(tuple(input_shape))]
    else:  # Dense: the rows its matmul sees
        input_shape = [int(np.prod(input_shape[:-1])), input_shape[-1]]
        out_shape = [input_shape[0], kernel_shape[1]]
    return tuple(tf.constant(rng.random(shape, dtype=np.float32) - 0.5, dtype=dtype)
                 for shape in (input_shape, kernel_shape, out_shape))


@contextlib.contextmanager
def _without_graph_optimizer():
    """Grappler off while the timing function is instantiated and run: its
    passes take longer than the whole measurement on small models, and the
    timed ops are the kernels themselves (restored on exit)."""
    before = tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False)
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": before})


def time_layers(jobs: Sequence[tuple[keras.layers.Layer, Sequence[int], str, Sequence[int | None]]], trials: int,
                progress: Callable[[int], None] | None = None) -> list[list[list[float]]]:
    """Seconds of forward + backward (input and kernel gradients) of each
    job's core op, for each of its concurrencies, per trial.

    Timed by tf.timestamp() inside the graph; under op determinism (which
    refuses tf.timestamp()) by the host clock instead
    (_rounds_timed_on_the_host).

    A job is (layer, input shape, dtype, concurrencies). Every candidate of
    every layer runs in one traced function, one after the other, each
    bracketed by tf.timestamp() and chained by control dependencies; a call
    of it is one round, so rounds interleave the candidates and a drift of
    the machine's speed hits them alike. One trace and one instantiation for
    the whole model: those, not the kernels, were most of the cost when each
    layer (or candidate) had its own function.
    """
    rng = np.random.default_rng(0)  # local: the global generators stay untouched
    on_gpu = device_kind() == "gpu"
    timed = []
    for layer, input_shape, dtype, concurrencies in jobs:
        x, w, dy = _operands(layer, input_shape, dtype, rng)
        timed.extend((_core(layer, concurrency), x, w, dy) for concurrency in concurrencies)

    @tf.function(autograph=False)
    def one_round():
        durations, kept = [], []
        if on_gpu:
            flat, first = tf.constant([-1]), tf.constant(0)
        token = tf.timestamp()
        for core, x, w, dy in timed:
            with tf.control_dependencies([token]):
                start = tf.timestamp()
            with tf.control_dependencies([start]):  # every op below waits for the stamp
                with tf.GradientTape() as tape:
                    tape.watch([x, w])
                    y = core(x, w)
                # The gradients after the forward op, as in a training step
                # (they do not read its output; unordered, all three would
                # run at once and time another schedule than training's).
                with tf.control_dependencies([y]):
                    done = [y, *tape.gradient(y, [x, w], output_gradients=dy)]
            if on_gpu:
                # The kernels run after their launch: the end stamp waits
                # for one element of each output copied to the host.
                firsts = [tf.gather(tf.reshape(t, flat), first) for t in done]
                with tf.device("/device:CPU:0"):
                    done = [tf.identity(t) for t in firsts]
                kept.extend(done)
            # A control edge keeps the work: the stamp is stateful, and the
            # graph optimizer (which would prune it) is off, see above.
            with tf.control_dependencies(done):
                token = tf.timestamp()
            durations.append(token - start)
        return tf.stack(durations), kept

    rounds = []
    with _without_graph_optimizer():
        if _keras_compat.op_determinism_enabled():
            rounds = _rounds_timed_on_the_host(timed, trials, progress)
        else:
            for _ in range(WARMUP + trials):
                rounds.append(one_round()[0].numpy())
                if progress:
                    progress(1)
    rounds = rounds[WARMUP:]
    per_candidate = [[float(r[i]) for r in rounds] for i in range(len(timed))]
    out, at = [], 0
    for *_, concurrencies in jobs:
        out.append(per_candidate[at:at + len(concurrencies)])
        at += len(concurrencies)
    return out


def _rounds_timed_on_the_host(timed, trials: int, progress) -> list[list[float]]:
    """The rounds of time_layers under op determinism, where tf.timestamp()
    refuses to run: each candidate in its own traced function, timed by the
    host clock around a call that returns once the candidate's work is done
    (one element of each output copied to the host, which also waits for a
    GPU's kernels). Rounds still interleave the candidates. The call's
    dispatch (tens of microseconds, the same for every candidate of a layer)
    is counted too, which can only make a lane count look less of a gain:
    the choice stays on the side of TensorFlow's kernel."""

    def candidate_function(core, x, w, dy):
        @tf.function(autograph=False)
        def run():
            with tf.GradientTape() as tape:
                tape.watch([x, w])
                y = core(x, w)
            with tf.control_dependencies([y]):  # gradients after the forward op, as in training
                done = [y, *tape.gradient(y, [x, w], output_gradients=dy)]
            return [tf.reshape(t, [-1])[0] for t in done]
        return run

    functions = [candidate_function(*job) for job in timed]
    rounds = []
    for _ in range(WARMUP + trials):
        durations = []
        for run in functions:
            start = time.perf_counter()
            for value in run():
                value.numpy()
            durations.append(time.perf_counter() - start)
        rounds.append(durations)
        if progress:
            progress(1)
    return rounds


def _spread(times: list[float]) -> float:
    if len(times) < 2:
        return 0.0
    quartiles = statistics.quantiles(times, n=4)
    return quartiles[2] - quartiles[0]


def _within_spread(a: plan_lib.Candidate, b: plan_lib.Candidate) -> bool:
    """Whether the two candidates' interquartile ranges overlap (each taken
    as its median +- half its spread): the measurements cannot tell them apart."""
    return abs(a.median_ms - b.median_ms) <= (a.spread_ms + b.spread_ms) / 2


def choose(candidates: list[plan_lib.Candidate]) -> tuple[int | None, str]:
    """TensorFlow's kernel (candidates[0]) unless a lane count measured
    clearly faster (at least MIN_SPEEDUP times, and outside its spread);
    then the fewest lanes within the spread of the fastest lane count."""
    native, lanes = candidates[0], candidates[1:]
    clear = [c for c in lanes if c.median_ms * MIN_SPEEDUP <= native.median_ms and not _within_spread(c, native)]
    if not clear:
        fastest = min(candidates, key=lambda c: c.median_ms)
        if fastest is native:
            return None, f"fastest ({native.median_ms:.3f} ms)"
        return None, (f"no lane count clearly faster ({fastest.label}: {native.median_ms / fastest.median_ms:.2f}x, "
                      f"needs {MIN_SPEEDUP}x outside the spread)")
    best = min(clear, key=lambda c: c.median_ms)
    simplest = next(c for c in clear if c is best or _within_spread(c, best))  # fewer lanes first
    if simplest is best:
        return best.concurrency, f"fastest ({best.median_ms:.3f} ms, {native.median_ms / best.median_ms:.2f}x native)"
    return simplest.concurrency, (f"within the spread of the fastest ({best.label}, {best.median_ms:.3f} ms), "
                                  f"and simpler")


def profile_layers(layers: Sequence[keras.layers.Layer], batch: int, header: dict, candidates="auto",
                   trials: int = 5, progress: Callable[[int], None] | None = None) -> plan_lib.Plan:
    """Times every layer; returns the plan (header as given). `progress` is
    called once per round (WARMUP + trials rounds)."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    jobs, caps = [], []
    for layer in layers:
        input_shape, dtype = layer_input(layer, batch)
        cap, cap_reason = cap_for(layer_work(layer, input_shape))
        counts = concurrency_model.candidates(cap) if candidates == "auto" else [k for k in candidates if k <= cap]
        jobs.append((layer, input_shape, dtype, [None, *counts]))
        caps.append((cap, cap_reason))
    entries = []
    for (layer, input_shape, dtype, concurrencies), (cap, cap_reason), per_candidate in zip(
            jobs, caps, time_layers(jobs, trials, progress)):
        timed = [plan_lib.Candidate(k, statistics.median(times) * 1e3, _spread(times) * 1e3)
                 for k, times in zip(concurrencies, per_candidate)]
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
                    verbose: int = 1, write: bool = True) -> tuple[plan_lib.Plan, bool]:
    """The plan for `layers` at `batch`: the file's if it matches this run
    (same header and layers), else a new profile, written atomically (if
    `write`). Returns (plan, reused)."""
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
    bar = keras.utils.Progbar(WARMUP + trials, unit_name="round") if verbose else None
    plan = profile_layers(layers, batch, header, candidates, trials, progress=bar.add if bar else None)
    if plan_path and write:
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
