"""tf_glp.Strategy(micro_batches=M): the same update whatever the replica count.

Note [Micro-batches]: each global batch is cut into M equal micro-batches,
in order; micro-batch m is the m-th slice of B/M samples. tf.distribute
hands replica r the r-th contiguous share of B/N samples, so with N replicas
dividing M, replica r holds micro-batches r*M/N .. (r+1)*M/N - 1 and runs
them one after another (train_step below). Each micro-batch's gradient is
that of its mean loss times 1/M (the loss Keras scales by 1/N under a
strategy is scaled by 1/M instead, whatever N: scale_for_distribution), so
it is computed from the same samples with the same kernels on any replica.
The host then adds the M gradients of each variable in one fixed pairwise
order over m (tree_sum), which does not depend on N; Keras' own optimizer
step runs once on the sums (Strategy._apply_once's path). So every replica
count dividing M applies the same update, bit for bit, as one device
running the M micro-batches in turn.

What this module does not make invariant yet (warned at fit start, naming
the layers): BatchNormalization normalises with each micro-batch's
statistics but updates its moving averages per micro-batch, replica by
replica; layers drawing random numbers (Dropout, noise, augmentation) draw
per replica, not per micro-batch. Across workers micro_batches is refused:
the workers' sums meet in TensorFlow's collective all-reduce, whose order
tf_glp does not set.
"""

from __future__ import annotations

import threading
import warnings

import keras
import tensorflow as tf

from tf_glp import _keras_compat

_state = threading.local()


def check_setting(micro_batches, replicas: int) -> int | None:
    """The validated setting: None, or a positive int the replica count divides."""
    if micro_batches is None:
        return None
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"tf_glp.Strategy: micro_batches must be None or a positive int, got {micro_batches!r}")
    if micro_batches % replicas:
        raise ValueError(
            f"tf_glp.Strategy(micro_batches={micro_batches}): the {replicas} replicas do not divide "
            f"{micro_batches} micro-batches, so some replica would run more of them than another. Use a "
            f"multiple of {replicas}, e.g. micro_batches={replicas * max(1, round(micro_batches / replicas))}.")
    return micro_batches


def check_fit(model, strategy, global_batch: int | None) -> None:
    """At fit start: a global batch the micro-batches divide, Keras' own
    train_step, and a warning naming the layers not yet invariant."""
    m = strategy.micro_batches
    if global_batch and global_batch % m:
        raise ValueError(
            f"tf_glp.Strategy(micro_batches={m}): the global batch size {global_batch} does not divide into "
            f"{m} equal micro-batches. Use a multiple of {m}, e.g. {m * max(1, round(global_batch / m))}.")
    if _overrides_train_step(model):
        raise ValueError(
            f"tf_glp.Strategy(micro_batches={m}) runs Keras' own train_step once per micro-batch; "
            f"{type(model).__name__} overrides train_step, which computes one gradient for the whole batch. "
            f"Use micro_batches=None with a custom train_step.")
    varying = [f"{layer.name} ({type(layer).__name__})" for layer in _keras_compat.all_layers(model)
               if isinstance(layer, keras.layers.BatchNormalization) or _keras_compat.seed_generators(layer)]
    if varying:
        warnings.warn(
            f"tf_glp.Strategy(micro_batches={m}): {', '.join(varying)} still depend on the replica count "
            f"(BatchNormalization's moving averages are updated per micro-batch and replica; random layers draw "
            f"per replica): the weights are the same on any replica count only without them. See "
            f"tf_glp/strategy/micro_batches.py.", stacklevel=3)


def _overrides_train_step(model) -> bool:
    trainer = _keras_compat.keras_class("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer")
    return type(model).train_step is not trainer.train_step


def scale_for_distribution(original, inverse: bool):
    """Keras' scale_loss_for_distribution (inverse=False: times 1/N) and
    unscale_loss_for_distribution (True: times N), with M in place of N
    inside a micro-batched step (Note [Micro-batches])."""
    def scaled(value):
        m = getattr(_state, "micro_batches", None)
        if m is None:
            return original(value)
        factor = float(m) if inverse else 1.0 / m
        return keras.ops.multiply(value, keras.ops.cast(factor, value.dtype))
    return scaled


def _split(tensor, pieces: int, m: int):
    """`pieces` equal slices along the batch axis, with an error naming the
    sizes when the replica's share does not divide."""
    if tensor is None:
        return [None] * pieces
    size = tensor.shape[0]
    if size is not None:
        if size % pieces:
            raise ValueError(f"tf_glp.Strategy(micro_batches={m}): a replica's share of {size} samples does not "
                             f"divide into its {pieces} micro-batches (the global batch must divide by {m})")
        return tf.split(tensor, pieces, axis=0)
    check = tf.debugging.assert_equal(
        tf.math.floormod(tf.shape(tensor)[0], pieces), 0,
        message=f"tf_glp.Strategy(micro_batches={m}): a batch does not divide into {m} equal micro-batches "
                f"(the last, partial batch of the data?); use a data size that divides, or drop the remainder")
    with tf.control_dependencies([check]):
        return tf.split(tensor, pieces, axis=0)


def train_step(model, data, strategy):
    """Keras' train_step (keras/src/backend/tensorflow/trainer.py), run on
    each of this replica's micro-batches in turn; the gradients go to the
    host as they are (Strategy._apply_micro_batches)."""
    m = strategy.micro_batches
    pieces = m // strategy.num_replicas_in_sync
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    structure = (x, y, sample_weight)
    split = [_split(t, pieces, m) for t in tf.nest.flatten(structure)]
    micro = [tf.nest.pack_sequence_as(structure, [parts[j] for parts in split]) for j in range(pieces)]
    weights = model.trainable_weights
    gradients, predictions = [], []
    _state.micro_batches = m
    try:
        for x_j, y_j, weight_j in micro:
            with tf.GradientTape() as tape:
                y_pred = model(x_j, training=True) if _keras_compat.call_has_training_arg(model) else model(x_j)
                loss = _keras_compat.compute_loss(model, x_j, y_j, y_pred, weight_j)
                _keras_compat.loss_tracker(model).update_state(
                    loss * float(m), sample_weight=tf.shape(tf.nest.flatten(x_j)[0])[0])
                if model.optimizer is not None:
                    loss = model.optimizer.scale_loss(loss)
            gradients.append(tape.gradient(loss, weights) if weights else [])
            predictions.append(y_pred)
    finally:
        _state.micro_batches = None
    if weights:
        strategy._apply_micro_batches(model.optimizer, gradients, weights)
    else:
        warnings.warn("The model does not have any trainable weights.", stacklevel=2)
    y_pred = tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0), *predictions)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def tree_sum(values: list):
    """The sum of `values` in one fixed pairwise order: neighbours first,
    level by level (an odd last value moves up a level as it is)."""
    values = list(values)
    while len(values) > 1:
        paired = [values[i] + values[i + 1] for i in range(0, len(values) - 1, 2)]
        if len(values) % 2:
            paired.append(values[-1])
        values = paired
    return values[0]


def in_micro_batch_order(strategy, gradients_per_replica_step: list) -> list[list]:
    """Per variable, its M gradients in micro-batch order m = r * M/N + j
    (replica r's j-th micro-batch), from the merge's per-replica values:
    gradients_per_replica_step[j][i] is variable i's gradient of each
    replica's j-th micro-batch. None where a variable has no gradient."""
    replicas = strategy.num_replicas_in_sync
    count = len(gradients_per_replica_step[0]) if gradients_per_replica_step else 0
    out = []
    for i in range(count):
        ordered = []
        for r in range(replicas):
            for step in gradients_per_replica_step:
                local = strategy.experimental_local_results(step[i])
                ordered.append(local[r] if len(local) == replicas else local[0])
        out.append(None if any(g is None for g in ordered) else ordered)
    return out
