"""tf_glp.Strategy(micro_batches=M): the same update whatever the replica count.

Note [Micro-batches]: each global batch is cut into M equal micro-batches,
in order; micro-batch m is the m-th slice of B/M samples. tf.distribute
hands replica r the r-th contiguous share of B/N samples, so with N replicas
dividing M, replica r holds micro-batches r*M/N .. (r+1)*M/N - 1 and runs
them one after another (train_step below). Each micro-batch's gradient is
that of its mean loss times 1/M (the loss Keras scales by 1/N under a
strategy is scaled by 1/M instead, whatever N: scale_for_distribution), so
it is computed from the same samples with the same kernels on any replica.
The host then adds the M gradients of each variable in micro-batch order,
one after the other (in_order_sum), an order that does not depend on N; Keras' own optimizer
step runs once on the sums (Strategy._apply_once's path). So every replica
count dividing M applies the same update, bit for bit, as one device
running the M micro-batches in turn.

Everything else a step touches is invariant the same way (all combined in
the one merge of the step, in micro-batch order, on the host):
- Randomness: the t-th draw of a seed generator (Dropout, noise,
  augmentation layers) in micro-batch m uses the generator's state at the
  step's start plus [0, t*M + m]; the state then moves on by its draws
  times M (seed_next). One stream per (step, micro-batch).
- BatchNormalization normalises with each micro-batch's own statistics (as
  one device running the micro-batches would); its moving averages are
  updated once per step, from the mean of the M micro-batches' means and
  the mean of their variances (in-order sums times 1/M): not stock per-replica
  BatchNormalization, whose averages follow each replica's share.
- The logged loss is the in-order sum of the micro-batches' scaled losses;
  the compiled metrics are updated on every replica with the whole global
  batch's targets and predictions, gathered in order, so each replica's
  metric state is the same (the epoch's logs read their sum over the
  replicas: exact for replica counts that are powers of two).

Across workers the same holds with N the replicas of the whole cluster: each
worker's merge gathers every worker's micro-batch values (one collective
all-gather per value, M times a gradient's bytes per variable and worker
per step, instead of the sum's one), puts them in micro-batch order
(_share_index says which share of the global batch each replica holds) and
combines them exactly as one machine does, so every worker computes the
same bits; 2 workers x 2 replicas train as 1 x 4 and 1 x 1.

Not invariant: per-output loss metrics of multi-output models (updated per
micro-batch and replica inside Keras' loss), BatchNormalization with
renorm, and seed-less random ops (Keras' global generator).
"""

from __future__ import annotations

import threading
import warnings

import keras
import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.ops import host_reduce
from tf_glp.strategy import no_xla

_state = threading.local()


def check_replicas(micro_batches: int | None, replicas: int, workers: int = 1) -> int | None:
    """The setting (None, or a positive int: Settings checks it), once the
    replica count (`replicas` per worker times `workers`) is known to divide it."""
    if micro_batches is None:
        return None
    where = f"{replicas * workers} replicas ({workers} workers x {replicas})" if workers > 1 else f"{replicas} replicas"
    replicas *= workers
    if micro_batches % replicas:
        raise ValueError(
            f"tf_glp.Strategy(micro_batches={micro_batches}): the {where} do not divide "
            f"{micro_batches} micro-batches, so some replica would run more of them than another. Use a "
            f"multiple of {replicas}, e.g. micro_batches={replicas * max(1, round(micro_batches / replicas))}.")
    return micro_batches


def check_fit(model, strategy, global_batch: int | None, samples: int | None = None) -> None:
    """At fit start: a global batch the micro-batches divide (and, for
    arrays, a last batch that does too), Keras' own train_step, and warnings
    for what may break invariance (the devices, layers that are not
    invariant)."""
    m = strategy.micro_batches
    if global_batch and global_batch % m:
        raise ValueError(
            f"tf_glp.Strategy(micro_batches={m}): the global batch size {global_batch} does not divide into "
            f"{m} equal micro-batches. Use a multiple of {m}, e.g. {m * max(1, round(global_batch / m))}.")
    if global_batch and samples and samples % global_batch % m:
        raise ValueError(
            f"tf_glp.Strategy(micro_batches={m}): the {samples} training samples end in a last batch of "
            f"{samples % global_batch}, which does not divide into {m} equal micro-batches. Train on a multiple "
            f"of {m} samples (e.g. {samples - samples % global_batch % m}).")
    if type(model).train_step is not keras.Model.train_step:
        raise ValueError(
            f"tf_glp.Strategy(micro_batches={m}) runs Keras' own train_step once per micro-batch; "
            f"{type(model).__name__} overrides train_step, which computes one gradient for the whole batch. "
            f"Use micro_batches=None with a custom train_step.")
    if type(model).compute_metrics is not keras.Model.compute_metrics:
        warnings.warn(f"tf_glp.Strategy(micro_batches={m}) calls {type(model).__name__}.compute_metrics with the "
                      f"whole global batch's y and y_pred and x=None (the inputs are not gathered)", stacklevel=3)
    gpu_names = [tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
                 for gpu in tf.config.list_physical_devices("GPU")]
    for doubt in invariance_doubts(strategy.extended.worker_devices, gpu_names, compat.op_determinism_enabled()):
        warnings.warn(f"tf_glp.Strategy(micro_batches={m}): {doubt}", stacklevel=3)
    varying = [f"{layer.name} (BatchNormalization with renorm)" for layer in compat.all_layers(model)
               if isinstance(layer, keras.layers.BatchNormalization) and layer.renorm]
    if varying:
        warnings.warn(
            f"tf_glp.Strategy(micro_batches={m}): {', '.join(varying)} still depend on the replica count "
            f"(renorm's moving statistics are updated per micro-batch and replica). See "
            f"tf_glp/strategy/micro_batches.py.", stacklevel=3)


def invariance_doubts(devices, gpu_names: list[str], determinism: bool) -> list[str]:
    """What may break invariance on these replicas (docs/strategy.md, "The
    same model on any replica count"): every replica must run the same kernels."""
    kinds = {"GPU" if "GPU" in tf.DeviceSpec.from_string(d).device_type.upper() else "CPU" for d in devices}
    doubts = []
    if len(kinds) > 1:
        doubts.append(f"the replicas mix CPUs and GPUs ({', '.join(devices)}), whose kernels round differently: "
                      f"training is not the same on other replica counts")
    if "GPU" in kinds:
        if len(set(gpu_names)) > 1:
            doubts.append(f"the GPUs differ ({', '.join(sorted(set(gpu_names)))}), and so may their kernels' "
                          f"rounding: training is the same on any replica count only on identical GPUs")
        if not determinism:
            doubts.append("GPU kernels may add in a different order on every run (atomics); call "
                          "tf.config.experimental.enable_op_determinism() for training that is the same on any "
                          "replica count")
    return doubts


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
        message=f"tf_glp.Strategy(micro_batches={m}): a batch did not divide into {m} equal micro-batches (the "
                f"last, partial batch of the data?); use a data size that divides by the global batch size, or "
                f"drop the remainder (Dataset.batch(..., drop_remainder=True))")
    with tf.control_dependencies([check]):
        return tf.split(tensor, pieces, axis=0)


class _MicroStep:
    """What the hooks record while one replica traces its micro-batches:
    which micro-batch runs (`index`, m of Note [Micro-batches]), each seed
    generator's draws in it, and each BatchNormalization's moments."""

    def __init__(self, micro_batches: int, first_index):
        self.micro_batches = micro_batches
        self.first_index = first_index  # this replica's first m (an int or a scalar tensor)
        self.index = first_index
        self.draws: dict[int, int] = {}
        self.generators: dict[int, object] = {}
        self.moments: dict[int, list] = {}  # id(layer) -> [(mean, variance) per micro-batch]

    def begin(self, j: int) -> None:
        self.index = self.first_index + j
        self.draws = {}


def _current():
    return getattr(_state, "step", None)


def scale_for_distribution(original, inverse: bool):
    """Keras' scale_loss_for_distribution (inverse=False: times 1/N) and
    unscale_loss_for_distribution (True: times N), with M in place of N
    inside a micro-batched step (Note [Micro-batches])."""
    def scaled(value):
        step = _current()
        if step is None:
            return original(value)
        factor = float(step.micro_batches) if inverse else 1.0 / step.micro_batches
        return keras.ops.multiply(value, keras.ops.cast(factor, value.dtype))
    return scaled


def seed_next(original):
    """SeedGenerator.next inside a micro-batched step (Note [Micro-batches],
    "Randomness"; the state moves on in train_step)."""
    def next(self, ordered=True):  # noqa: A001 (Keras' name)
        step = _current()
        if step is None or not ordered:
            return original(self, ordered)
        draw = step.draws.get(id(self), 0)
        step.draws[id(self)] = draw + 1
        step.generators[id(self)] = (self, max(draw + 1, step.generators.get(id(self), (None, 0))[1]))
        offset = tf.cast(draw * step.micro_batches + step.index, self.state.dtype)
        return self.state.value + tf.stack([tf.zeros_like(offset), offset])
    return next


def batch_norm_moments(original):
    """BatchNormalization._moments inside a micro-batched step: recorded per
    micro-batch (the moving averages are then set from them: combine, train_step)."""
    def _moments(self, inputs, mask):
        mean, variance = original(self, inputs, mask)
        step = _current()
        if step is not None:
            step.moments.setdefault(id(self), []).append((mean, variance))
        return mean, variance
    return _moments


def _share_index(strategy):
    """Which share of the global batch this replica holds. tf.distribute
    cuts a global batch into one contiguous share per replica of the
    cluster and deals them out worker by worker: share s goes to worker
    s % W, as that worker's replica s // W (seen with Keras' fit, on arrays
    and datasets; a tf.data.Dataset sharded by files or
    distribute_datasets_from_function decides otherwise). Replica r of
    worker w (replica_id_in_sync_group w * R + r) holds share r * W + w."""
    context = tf.distribute.get_replica_context()
    replica = context.replica_id_in_sync_group if context is not None else 0
    workers = strategy._host_ops.across_workers  # (multi_worker_strategy.WorkerSum; None on one machine)
    if workers is None:
        return replica
    local = len(strategy.extended.worker_devices)
    return (replica % local) * workers.num_workers + replica // local


def train_step(model, data, strategy):
    """Keras' train_step (keras/src/backend/tensorflow/trainer.py), run on
    each of this replica's micro-batches in turn; one merge (`_apply`) then
    combines them as Note [Micro-batches] says. compute_metrics gets x=None
    (the inputs are not gathered)."""
    m = strategy.micro_batches
    pieces = m // strategy.num_replicas_in_sync
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    structure = (x, y, sample_weight)
    split = [_split(t, pieces, m) for t in tf.nest.flatten(structure)]
    micro = [tf.nest.pack_sequence_as(structure, [parts[j] for parts in split]) for j in range(pieces)]
    weights = model.trainable_weights
    norms = [layer for layer in compat.all_layers(model)
             if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable and not layer.renorm]
    # The moving averages as the step found them (read before any micro-batch writes them).
    starts = [(tf.identity(layer.moving_mean.value), tf.identity(layer.moving_variance.value)) for layer in norms]
    step = _MicroStep(m, _share_index(strategy) * pieces)
    gradients, predictions, losses = [], [], []
    _state.step = step
    try:
        for j, (x_j, y_j, weight_j) in enumerate(micro):
            step.begin(j)
            with tf.GradientTape() as tape:
                y_pred = model(x_j, training=True) if compat.call_has_training_arg(model) else model(x_j)
                loss = compat.compute_loss(model, x_j, y_j, y_pred, weight_j)
                losses.append(loss)
                if model.optimizer is not None:
                    loss = model.optimizer.scale_loss(loss)
            gradients.append(tape.gradient(loss, weights) if weights else [])
            predictions.append(y_pred)
    finally:
        _state.step = None
    for generator, draws in step.generators.values():
        generator.state.assign(generator.state.value + tf.constant([0, draws * m], generator.state.dtype))
    # (A layer this step did not call keeps its averages.)
    called = [i for i, layer in enumerate(norms) if step.moments.get(id(layer))]
    norms, starts = [norms[i] for i in called], [starts[i] for i in called]
    moments = [step.moments[id(layer)] for layer in norms]
    if not weights:
        warnings.warn("The model does not have any trainable weights.", stacklevel=2)
    shared = {"losses": losses, "y": [t[1] for t in micro], "y_pred": predictions,
              "sizes": [tf.shape(tf.nest.flatten(y_pred)[0])[0] for y_pred in predictions],
              "sample_weight": [t[2] for t in micro], "moments": moments}
    combined = _apply(strategy, model.optimizer, gradients, weights, shared)
    for layer, (mean_start, variance_start), (mean, variance) in zip(norms, starts, combined["moments"]):
        momentum = layer.momentum
        layer.moving_mean.assign(mean_start * momentum + tf.cast(mean, mean_start.dtype) * (1.0 - momentum))
        layer.moving_variance.assign(variance_start * momentum
                                     + tf.cast(variance, variance_start.dtype) * (1.0 - momentum))
    global_batch = tf.shape(tf.nest.flatten(combined["y_pred"])[0])[0]
    compat.loss_tracker(model).update_state(combined["loss"], sample_weight=global_batch)
    return model.compute_metrics(None, combined["y"], combined["y_pred"], sample_weight=combined["sample_weight"])


def _apply(strategy, optimizer, gradients, variables, shared: dict) -> dict:
    """The host's part of a micro-batched train step (`gradients[j]`: this
    replica's of its j-th micro-batch), in one merge: the sums in
    micro-batch order, Keras' own apply once on them (as in
    Strategy._apply_once), and `combine`'s values, which every replica
    receives."""
    no_xla.check_not_in_xla()

    def merge_fn(strategy, gradients, shared):
        loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        ordered = in_micro_batch_order(strategy, gradients)
        updated = [v for parts, v in zip(ordered, variables) if parts is not None]
        # The fused update adds the M parts in its own pass, in order.
        unsummed = bool(updated) and strategy._takes_gradients_unsummed(optimizer, updated, loss_scaled)
        summed = []
        with tf.device(strategy.host_device):
            for parts in ordered:
                if parts is not None:  # (sparse gradients are added as dense ones)
                    parts = [tf.identity(tf.convert_to_tensor(p)) for p in parts]
                    summed.append(MicroBatchGradients(parts) if unsummed else in_order_sum(parts))
            combined = combine(strategy, shared)
        if updated:
            with strategy.update_concept.optimizer_step(strategy, optimizer, updated):
                if loss_scaled:
                    # (Its own apply insists on a replica context.)
                    compat.apply_loss_scaled(optimizer, summed, updated)
                else:
                    optimizer.apply(summed, updated)
        return combined

    return tf.distribute.get_replica_context().merge_call(merge_fn, args=(gradients, shared))


def combine(strategy, shared) -> dict:
    """In the merge: the replicas' micro-batch values combined on the host
    as Note [Micro-batches] says (the loss, BatchNormalization's moments;
    targets, predictions and sample weights concatenated in order)."""
    m = strategy.micro_batches

    def on_host(per_step):
        return [tf.identity(value) for value in _in_order(strategy, per_step)]

    def gather(per_step):
        """The global batch of one structured value (None stays None)."""
        leaves = [tf.nest.flatten(value) for value in per_step]
        if all(leaf is None for leaves_j in leaves for leaf in leaves_j):
            return None
        columns = [tf.concat(on_host(list(column)), 0) for column in zip(*leaves)]
        return tf.nest.pack_sequence_as(per_step[0], columns)

    # Unequal micro-batches (a last, partial batch that does not divide by
    # M, which tf.distribute shares out unevenly) would weight samples by
    # the replica count: refused, naming the sizes.
    # Checked first (everything below waits for it): gathering unequal
    # micro-batches across workers would fail with an error naming nothing.
    sizes = on_host(shared["sizes"])
    equal = tf.debugging.assert_equal(
        tf.stack(sizes), sizes[0], summarize=m,
        message=f"tf_glp.Strategy(micro_batches={m}): a batch did not divide into {m} equal micro-batches (the "
                f"last, partial batch of the data?); use a data size that divides by the global batch size, or "
                f"drop the remainder (Dataset.batch(..., drop_remainder=True)). Micro-batch sizes:")
    with tf.control_dependencies([equal]):
        loss = in_order_sum(on_host(shared["losses"]))
        moments = []
        for per_layer in shared["moments"]:
            means = in_order_sum(on_host([mean for mean, _ in per_layer]))
            variances = in_order_sum(on_host([variance for _, variance in per_layer]))
            moments.append((means * (1.0 / m), variances * (1.0 / m)))
        return {"loss": loss, "moments": moments,
                "y": gather(shared["y"]), "y_pred": gather(shared["y_pred"]),
                "sample_weight": gather(shared["sample_weight"])}


class MicroBatchGradients(compat.per_replica_class()):
    """One variable's M micro-batch gradients, in micro-batch order, every
    worker's: handed unsummed to the fused host update, whose own pass adds
    them in list order (Note [Deterministic accumulation]), bitwise what
    in_order_sum gives, without writing the sum out and reading it back.
    Complete: nothing is to be added across workers."""


def in_order_sum(values: list):
    """The sum of `values` (same-shaped float tensors) in list order, one
    after the other, in float32: ((v0 + v1) + v2) + ... The host engine's
    reduction (tf_glp.ops.host_reduce) computes exactly that in one pass,
    bitwise the same whatever the thread count and instruction set."""
    return host_reduce(list(values))


def _in_order(strategy, per_step: list) -> list:
    """One value of each of this replica's micro-batches (per replica in the
    merge), as [replica 0's micro-batches..., replica 1's, ...]: micro-batch
    order (Note [Micro-batches]). Across workers, every worker's, gathered
    (one collective) and put in micro-batch order: see _share_index."""
    count_r = len(strategy.extended.worker_devices)
    results = [strategy.experimental_local_results(value) for value in per_step]
    out = [local[r] if len(local) > 1 else local[0] for r in range(count_r) for local in results]
    workers = strategy._host_ops.across_workers
    if workers is None:
        return out
    count_w, pieces = workers.num_workers, len(per_step)
    if any(value is None for value in out):  # (a variable without gradients: the same on every worker)
        return [None] * (count_w * len(out))
    with tf.device(strategy.host_device):
        every = tf.unstack(workers.gather(tf.stack([tf.identity(value) for value in out])), num=count_w * len(out))
    # every[(w * R + r) * P + j] is worker w's replica r's j-th micro-batch,
    # which is micro-batch (r * W + w) * P + j: taken share by share.
    ordered = []
    for share in range(count_w * count_r):
        first = ((share % count_w) * count_r + share // count_w) * pieces
        ordered += every[first:first + pieces]
    return ordered


def in_micro_batch_order(strategy, gradients_per_step: list) -> list:
    """Per variable, its M gradients in micro-batch order, from the merge's
    per-replica values: gradients_per_step[j][i] is variable i's gradient of
    each replica's j-th micro-batch. None where a variable has no gradient."""
    per_variable = [_in_order(strategy, list(column)) for column in zip(*gradients_per_step)]
    return [None if any(g is None for g in ordered) else ordered for ordered in per_variable]
