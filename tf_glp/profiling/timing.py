"""Timing the layers' candidates (time_layers): each eligible layer's
convolution or matrix product, with TensorFlow's kernel and with each lane
count, at its real shapes and dtype."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.ops.concurrent import concurrent_conv2d, concurrent_matmul
from tf_glp.profiling import device_facts

WARMUP = 1  # untimed rounds: the first instantiates the function and warms the kernels


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


def _forward_backward(core, x: tf.Tensor, w: tf.Tensor, dy: tf.Tensor) -> list[tf.Tensor]:
    """The core op's output and its input and kernel gradients (for output
    gradient `dy`). The gradients run after the forward op, as in a training
    step (they do not read its output; unordered, all three would run at
    once and time another schedule than training's)."""
    with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = core(x, w)
    with tf.control_dependencies([y]):
        return [y, *tape.gradient(y, [x, w], output_gradients=dy)]


@contextlib.contextmanager
def without_graph_optimizer():
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

    Timed by tf.timestamp() inside the graph, or by the host clock under op
    determinism (_rounds_timed_on_the_host).

    A job is (layer, input shape, dtype, concurrencies). Every candidate of
    every layer runs in one traced function, one after the other, each
    bracketed by tf.timestamp() and chained by control dependencies; a call
    of it is one round, so rounds interleave the candidates and a drift of
    the machine's speed hits them alike. One trace and one instantiation for
    the whole model: those, not the kernels, were most of the cost when each
    layer (or candidate) had its own function.
    """
    rng = np.random.default_rng(0)  # local: the global generators stay untouched
    on_gpu = device_facts.device_kind() == "gpu"
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
            with tf.control_dependencies([start]):  # every op _forward_backward makes waits for the stamp
                done = _forward_backward(core, x, w, dy)
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
    with without_graph_optimizer():
        if compat.op_determinism_enabled():
            rounds = _rounds_timed_on_the_host(timed, trials, progress)
        else:
            for _ in range(WARMUP + trials):
                rounds.append(one_round()[0].numpy())
                if progress:
                    progress(1)
    # Each candidate's times, in the order of `timed`, split back per job.
    columns = iter([float(t) for t in column] for column in zip(*rounds[WARMUP:]))
    return [[next(columns) for _ in concurrencies] for *_, concurrencies in jobs]


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
            return [tf.reshape(t, [-1])[0] for t in _forward_backward(core, x, w, dy)]
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
