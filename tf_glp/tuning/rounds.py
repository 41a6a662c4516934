"""What the start-up choices share to time ways on the user's own model."""

from __future__ import annotations

import math
import re

import keras
import tensorflow as tf

from tf_glp._keras import compat


def first_batch(arguments: dict, batch: int | None):
    """fit's first batch as data a train function takes ((x,), (x, y) or
    (x, y, sample_weight) tensors) and "", or (None, why) where it cannot
    be read without consuming the user's input."""
    x = arguments.get("x")
    if isinstance(x, tf.data.Dataset):
        for element in x.take(1):
            return (element if isinstance(element, tuple) else (element,)), ""
        return None, "the dataset is empty"
    if batch and x is not None and all(hasattr(leaf, "shape") for leaf in tf.nest.flatten(x)):
        def head(value):  # (lists become tuples, as Keras' adapter makes them: tf.data would stack a list)
            return keras.tree.lists_to_tuples(tf.nest.map_structure(lambda leaf: leaf[:batch], value))

        y, weights = arguments.get("y"), arguments.get("sample_weight")
        if weights is not None:
            return (head(x), head(y), head(weights)), ""
        return ((head(x),) if y is None else (head(x), head(y))), ""
    return None, "fit's input is not arrays or a tf.data.Dataset (it cannot be read twice)"


def build_without_optimizer(model, data) -> None:
    """Builds the model and its compiled loss and metrics from one batch as
    fit would (their variables then exist before anything is traced),
    leaving the optimizer unbuilt (fit builds it, under the update concept
    chosen)."""
    optimizer, model.optimizer = model.optimizer, None
    try:
        compat.symbolic_build(model, data)
    finally:
        model.optimizer = optimizer


def keyed(model, arguments: dict, batch: int | None) -> bool:
    """Whether `model`'s trainable shapes are known, so that a plan store
    key says which model it is for: an unbuilt model (a Sequential without
    an Input, a subclassed model) is built from fit's first batch where it
    can be read (its key would otherwise be any unbuilt model's)."""
    if not model.built:
        data, _ = first_batch(arguments, batch)
        if data is not None:
            with model.distribute_strategy.scope():
                build_without_optimizer(model, data)
    return model.built


def training_samples(arguments: dict) -> int | None:
    """How many samples an epoch of fit trains on, for array inputs without
    steps_per_epoch (Keras keeps the first floor(n * (1 - validation_split))
    for training); None where that is not known before training."""
    x = arguments.get("x")
    first = tf.nest.flatten(x)[0] if isinstance(x, (list, tuple, dict)) and x else x
    if arguments.get("steps_per_epoch") or isinstance(x, tf.data.Dataset) or not getattr(first, "shape", None):
        return None
    samples = int(first.shape[0])
    split = arguments.get("validation_split") or 0.0
    return int(math.floor(samples * (1.0 - split)))


def epoch_steps(arguments: dict, batch: int | None) -> int | None:
    """fit's steps per epoch where known before training."""
    if arguments.get("steps_per_epoch"):
        return int(arguments["steps_per_epoch"])
    x = arguments.get("x")
    if isinstance(x, tf.data.Dataset):
        cardinality = int(x.cardinality())
        return cardinality if cardinality >= 0 else None
    samples = training_samples(arguments)
    return max(1, math.ceil(samples / batch)) if batch and samples is not None else None


def fit_steps(arguments: dict, batch: int | None) -> int | None:
    """The steps of the whole fit where known (None: an input of unknown length)."""
    steps = epoch_steps(arguments, batch)
    if steps is None:
        return None
    return steps * max(0, int(arguments.get("epochs", 1)) - int(arguments.get("initial_epoch", 0)))


def variables_kept(strategy, variables):
    """Every variable's value, per replica copy (batch statistics differ
    per replica); returns a function that puts them back."""
    kept = [(component, tf.identity(component.read_value())) for variable in variables
            for component in strategy.experimental_local_results(variable.value)]

    def restore():
        for component, value in kept:
            with tf.device(component.device):
                component.assign(value)

    return restore


def sync(result) -> None:
    """Waits for a train function's outputs (its logs, or their Optional)."""
    value = result.get_value() if isinstance(result, tf.experimental.Optional) else result
    for tensor in tf.nest.flatten(value):
        if isinstance(tensor, tf.Tensor):
            tensor.numpy()


def gist(error: Exception) -> str:
    """The line of an error that says what went wrong, at most 200
    characters: a step's error from TensorFlow begins "Graph execution
    error:", the node's Python stack (indented), then "N root error(s)
    found." and "  (0) CODE: what"."""
    text = str(error)
    root = re.search(r"^\s*\(0\) [A-Z_]+:\s*(.+)$", text, re.MULTILINE)
    if root:
        return f"{type(error).__name__}: {root.group(1).strip()[:200]}"
    lines = [line for line in text.splitlines() if line.strip() and not line[0].isspace()
             and not line.startswith(("Graph execution error", "Detected at node"))]
    return f"{type(error).__name__}: {(lines[0].strip() if lines else '')[:200]}"


class Announce(keras.callbacks.Callback):
    """Prints a start-up choice's line once, when training begins (added to
    a fit with verbose not 0 that measured the choice)."""

    def __init__(self, choice):
        super().__init__()
        self._choice = choice

    def on_train_begin(self, logs=None):
        print(f"tf_glp.Strategy: {self._choice.line()}", flush=True)
