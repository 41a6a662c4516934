"""Profiling a model's GLP layers at start-up: which layers, at which
shapes, the plan that is reused or made, and setting the layers from it.

For every eligible layer (tf_glp.layers.is_eligible), at its real input shape,
dtype and device: the candidates are TensorFlow's kernel and each lane count
up to the analytical cap (device_facts.cap_for, concurrency_model.py), timed
forward and backward (timing.py) and chosen by the rule in choice.py.

Profiling reads only the layers' shapes and configuration: weights,
optimizer state, random generators and step counters are untouched (the
operands come from a local NumPy generator).
"""

from __future__ import annotations

import os
import statistics
import warnings
from collections.abc import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from tf_glp.layers import as_glp_layer, is_eligible, why_not_eligible
from tf_glp.profiling import choice as choice_rule
from tf_glp.profiling import concurrency_model, device_facts, timing
from tf_glp.profiling import plan as plan_lib
from tf_glp.tuning import store


def plan_header(batch_size: int, candidates="auto") -> dict:
    """The facts a plan must share with this run to be reused."""
    return {
        "schema": plan_lib.SCHEMA,
        **store.machine(),  # the versions and the CPU (its model too: a CPU's device string names only threads)
        "device": device_facts.device_string(),
        "batch_size": int(batch_size),
        "candidates": candidates if candidates == "auto" else sorted(int(k) for k in candidates),
        "min_speedup": choice_rule.MIN_SPEEDUP,  # the choice rule: a plan chosen under another is profiled again
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


def profile_layers(layers: Sequence[keras.layers.Layer], batch: int, header: dict, candidates="auto",
                   trials: int = 5, progress: Callable[[int], None] | None = None) -> plan_lib.Plan:
    """Times every layer; returns the plan (header as given). `progress` is
    called once per round (timing.WARMUP + trials rounds)."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    jobs, caps = [], []
    for layer in layers:
        input_shape, dtype = layer_input(layer, batch)
        cap, cap_reason = device_facts.cap_for(layer_work(layer, input_shape))
        counts = concurrency_model.candidates(cap) if candidates == "auto" else [k for k in candidates if k <= cap]
        jobs.append((layer, input_shape, dtype, [None, *counts]))
        caps.append((cap, cap_reason))
    entries = []
    for (layer, input_shape, dtype, concurrencies), (cap, cap_reason), per_candidate in zip(
            jobs, caps, timing.time_layers(jobs, trials, progress)):
        timed = [plan_lib.Candidate(k, statistics.median(times) * 1e3, choice_rule.spread(times) * 1e3)
                 for k, times in zip(concurrencies, per_candidate)]
        choice, reason = choice_rule.choose(timed)
        entries.append(plan_lib.LayerPlan(layer.name, type(layer).__name__, input_shape, dtype, layer_config(layer),
                                          cap, cap_reason, timed, choice, reason))
    return plan_lib.Plan(header=header, layers=entries)


def _leaf_layers(model: keras.Model):
    """The model's layers in model order, nested models' included (not the
    nested models themselves)."""
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _leaf_layers(layer)
        else:
            yield layer


def eligible_layers(model: keras.Model, convert: bool) -> list[keras.layers.Layer]:
    """The model's Conv2D / Dense layers the profiler may set (plain Keras
    ones only with convert=True), in model order, nested models included."""
    return [layer for layer in _leaf_layers(model) if is_eligible(layer, convert)]


def _has_a_kernel(layer: keras.layers.Layer) -> bool:
    """A layer of Keras' convolution or dense families (enumerated from
    keras.layers, so a new one joins): one a user may expect the profiler
    to time, named in the table when it is left alone."""
    return any(isinstance(layer, cls) for name, cls in vars(keras.layers).items()
               if isinstance(cls, type) and issubclass(cls, keras.layers.Layer)
               and ("Conv" in name or name.endswith("Dense")))


def layers_to_profile(model: keras.Model, convert: bool) -> tuple[list[keras.layers.Layer], list[dict]]:
    """The eligible layers whose input shape is known (a functional or
    Sequential model's), in model order; and the layers left as they are
    ({"name", "layer_class", "reason"}): the convolution and dense ones the
    concurrent ops cannot run, and eligible ones whose input shape is
    unknown (also named in one warning)."""
    layers, left_alone, unknown = [], [], []
    for layer in _leaf_layers(model):
        why = why_not_eligible(layer, convert)
        if why is None:
            try:
                layer_input(layer, 1)
            except ValueError:
                unknown.append(layer.name)
                why = "input shape unknown (a layer of a subclassed model, or never called)"
            else:
                layers.append(layer)
                continue
        if _has_a_kernel(layer):
            left_alone.append({"name": layer.name, "layer_class": type(layer).__name__, "reason": why})
    if unknown:
        warnings.warn(f"tf_glp: not profiling {', '.join(unknown)}: their input shapes are unknown (layers of a "
                      f"subclassed model, or never called); they keep their kernels", stacklevel=3)
    return layers, left_alone


def load_or_profile(layers, batch: int, plan_path: str | None, candidates="auto", trials: int = 5,
                    verbose: int = 1, write: bool = True, left_alone=()) -> tuple[plan_lib.Plan, bool, str | None]:
    """The plan for `layers` at `batch`: the file's if it matches this run
    (same header and layers), else a new profile, written atomically (if
    `write`). `plan_path` "auto": this model's file in the user's cache
    (tuning/store.py). `left_alone` (see layers_to_profile) is recorded in
    the plan as this run found it. Returns (plan, reused, the file)."""
    header = plan_header(batch, candidates)
    described = [(type(layer).__name__, *layer_input(layer, batch), layer_config(layer)) for layer in layers]
    cached = plan_path == store.AUTO
    if cached:
        plan_path = store.keyed_file(store.LAYER_PLANS, [header, described])
    if plan_path and os.path.exists(plan_path):
        try:
            stored = plan_lib.read(plan_path)
        except (OSError, ValueError) as error:
            warnings.warn(f"tf_glp: ignoring the plan {plan_path} ({error}); profiling again", stacklevel=3)
        else:
            why = stored.mismatch(header, described)
            if why is None:
                stored.left_alone = list(left_alone)
                return stored, True, plan_path
            warnings.warn(f"tf_glp: the plan {plan_path} is for another run ({why}); profiling again", stacklevel=3)
    bar = keras.utils.Progbar(timing.WARMUP + trials, unit_name="round") if verbose else None
    plan = profile_layers(layers, batch, header, candidates, trials, progress=bar.add if bar else None)
    plan.left_alone = list(left_alone)
    if plan_path and write:
        write_plan(plan, plan_path)
        if cached:
            store.prune(store.LAYER_PLANS)
    return plan, False, plan_path


def write_plan(plan: plan_lib.Plan, path: str) -> None:
    """Writes the plan (atomically); a file that cannot be written gives a
    warning, not an error: training goes on, the next run profiles again."""
    try:
        plan_lib.write(plan, path)
    except OSError as error:
        warnings.warn(f"tf_glp: cannot write the plan {path} ({error}); the next run profiles again", stacklevel=3)


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

    Args:
        model: The Keras model; layers whose input shape is unknown (those
            of a subclassed model) are left out, with a warning.
        sample_batch: Inputs for the model; only their batch size is read.
        candidates: "auto" (lane counts up to the analytical cap, see
            tf_glp.profiling.concurrency_model) or a list of lane counts.
            Defaults to `"auto"`.
        trials: Timed runs per candidate (after 1 untimed one); the median
            counts. Defaults to `5`.
        plan_path: Where a matching plan is read from, and a new one written
            to ("auto": the model's file in the user's cache, as
            ConcurrencyProfiler; None: neither). Defaults to `None`.
        convert: Also profile plain keras.layers.Conv2D / Dense (False: only
            layers that are already tf_glp layers). Defaults to `True`.
        verbose: 0 silent; 1 a progress bar while profiling. Defaults to `0`.

    Returns:
        The plan (tf_glp.plan.Plan).

    Example:
        >>> plan = tf_glp.profile(model, x[:64])
        >>> print(tf_glp.plan.table(plan))
    """
    first = tf.nest.flatten(sample_batch)[0]
    batch = int(np.shape(first)[0])
    layers, left_alone = layers_to_profile(model, convert)
    return load_or_profile(layers, batch, plan_path, candidates, trials, verbose, left_alone=left_alone)[0]
