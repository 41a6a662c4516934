"""tf_glp.Strategy: CPU-assisted data parallelism as a tf.distribute.Strategy.

    with tf_glp.Strategy().scope():
        model = ...; model.compile(...)
    model.fit(...)

update="host" (a CentralStorageStrategy whose extended object gives each
variable a home, host_extended.py): weights and optimizer slots live on the
host; the replicas' gradients are summed there and the optimizer runs once
per step. For keras.optimizers.SGD / Adam / AdamW the sum and the update are
one fused native pass per variable (tf_glp.ops.FusedKerasUpdate); other
optimizers get the sum from the native host_reduce and run their own update
on the host. Metric variables, batch statistics, random-generator state and
loss-scale counters live on the replicas, exactly as under MirroredStrategy,
so every model MirroredStrategy trains trains here, to the same numbers.
Dynamic loss scaling runs inside the host update (loss_scaling.py); gradient
accumulation and EMA overwrites, which fail under every stock strategy, have
their own step (apply_gradients.py).

update="replicas" (a MirroredStrategy): variables mirrored on the devices;
gradients are summed on the host by the native host_reduce and sent back;
every replica applies the update.

Both group variables into chunks (chunking.py) so the host can work on the
last layers while the devices still compute the gradients of earlier ones;
chunking="auto" decides the chunk count at the start of the first fit, with
the cost model (cost_model.py) and at most one confirming retrace
(chunking_decision.py).
"""

from __future__ import annotations

import math
import time

import keras
import tensorflow as tf

from tf_glp import _keras_compat
from tf_glp.ops import FusedKerasUpdate, host_reduce, supports_fused_update
from tf_glp.strategy import chunking as chunking_lib
from tf_glp.strategy import cost_model, devices as devices_lib, hooks, loss_scaling, multi_worker
from tf_glp.strategy.host_extended import HostExtended
from tf_glp.strategy.cross_device_ops import (
    HostCrossDeviceOps,
    byte_sizes,
    compress,
    concat_on_host,
    is_sparse,
    local_components,
)

_UPDATES = ("host", "replicas")
HOST_DEVICE = "/cpu:0"


class Strategy(tf.distribute.Strategy):
    """Data-parallel training with the host CPUs aggregating gradients.

    `Strategy(...)` returns a `HostStrategy` (update="host", a
    CentralStorageStrategy) or a `ReplicaStrategy` (update="replicas", a
    MirroredStrategy); both are instances of `tf_glp.Strategy`.

    Args:
        devices: Compute devices. Default: all GPUs; without GPUs,
            `cpu_replicas` logical CPU devices.
        update: "host" (optimizer runs once, on the host) or "replicas"
            (every replica applies the host-summed gradients).
        chunking: "auto" (decided at the start of the first fit: one chunk
            on CPU replicas, where chunking cannot help; on GPUs the cost
            model calibrated on the first steps, with at most one confirming
            retrace), "none" (one chunk), an int number of chunks, or a byte
            size such as "4MB" (10^6 bytes), "4MiB" (2^20) or "4194304".
        compression: None, "bf16" or "fp16": gradients (and nothing else:
            metrics and losses stay exact) cross to the host in 16 bits and
            are accumulated in float32 (results then differ from float32
            training by the rounding of the gradients). A finite gradient
            beyond float16's range raises InvalidArgumentError, except where
            update="host" runs the loss scaling itself ('mixed_float16' with
            SGD / Adam / AdamW, no clipping): there the step is skipped and
            the scale lowered.
        cpu_replicas: Number of logical CPU replicas when there are no GPUs
            (default 2), or to force CPU replicas on a GPU machine. Per
            worker when training across workers.
        cluster_resolver: A tf.distribute.cluster_resolver.ClusterResolver
            (e.g. SlurmClusterResolver) to train across workers; without
            it, TF_CONFIG's cluster when that variable is set (as
            `python -m tf_glp.launch` sets it). Across workers, each
            worker's host sums its replicas and the workers' sums meet in
            TensorFlow's collective all-reduce (multi_worker.py).

    Raises:
        ValueError: for an unknown update, chunking or compression.
        RuntimeError: if logical CPU devices are needed but TensorFlow has
            already initialised its devices with fewer.

    Example:
        >>> strategy = tf_glp.Strategy(cpu_replicas=2)
        >>> with strategy.scope():
        ...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        ...     model.compile(optimizer="adam", loss="mse")
        >>> model.fit(x, y, batch_size=32)
        >>> print(strategy.explain())
    """

    def __new__(cls, devices=None, *, update: str = "host", chunking="auto", compression=None, cpu_replicas=None,
                cluster_resolver=None):
        if cls is Strategy:
            if update not in _UPDATES:
                raise ValueError(f"update must be 'host' or 'replicas', got {update!r}")
            if multi_worker.resolve_cluster(cluster_resolver) is not None:
                cls = MultiWorkerHostStrategy if update == "host" else MultiWorkerReplicaStrategy
            else:
                cls = HostStrategy if update == "host" else ReplicaStrategy
        return object.__new__(cls)

    # Marks tf_glp strategies for hooks.py (which must not import this module).
    _is_tf_glp_strategy = True

    def _glp_setup(self, devices, update, chunking, compression, cpu_replicas) -> list[str]:
        # Each setting is validated and kept by its owner: the chunk plan and
        # the host reductions (which compress).
        chunking_state = chunking_lib.Chunking(chunking)
        host_ops = HostCrossDeviceOps(HOST_DEVICE, compression, chunking_state.plan)
        if devices is None:
            devices = devices_lib.default_devices(cpu_replicas)
        elif cpu_replicas is not None:
            raise ValueError("pass either devices or cpu_replicas, not both")
        devices = list(devices)
        if not devices:
            raise ValueError("devices must not be empty")
        self.update = update
        self.chunking_state = chunking_state
        self._host_ops = host_ops
        self._rates: cost_model.HostRates | None = None
        hooks.install()
        return devices

    @property
    def chunking(self):
        """The chunking setting ("auto", "none", a count or a byte size)."""
        return self.chunking_state.setting

    @property
    def compression(self) -> str | None:
        """None, "bf16" or "fp16" (see the class docstring)."""
        return self._host_ops.compression

    # -- cost model -------------------------------------------------------
    def host_rates(self) -> cost_model.HostRates:
        """Measures (once) the host speeds the cost model uses."""
        if self._rates is None:
            self._rates = _measure_host_rates(self.uses_gpus())
        return self._rates

    def uses_gpus(self) -> bool:
        """Whether every replica is a GPU (only then can the host's work
        overlap the replicas' compute)."""
        return all("gpu" in d.lower() for d in self.extended.worker_devices)

    def explain(self) -> str:
        """How the chunk count in use was chosen: the reason, and for
        chunking="auto" on GPUs the predicted and measured step time of each
        candidate with the cost model's components, in milliseconds.

        Example:
            >>> print(strategy.explain())
        """
        where = f"{len(self.extended.worker_devices)} replicas"
        if self.extended._in_multi_worker_mode():  # noqa: SLF001
            where += f" x {self.extended.num_workers} workers"
        lines = [f"tf_glp.Strategy(update={self.update!r}, chunking={self.chunking!r}, "
                 f"compression={self.compression!r}) on {where}"]
        if not self.chunking_state.decided and not self.chunking_state.trials:
            lines.append(f"  chunks in use: {self.chunking_state.in_use()} (chunking='auto' decides at the start "
                         f"of the first fit)")
            return "\n".join(lines)
        lines.extend(self.chunking_state.explain_lines())
        return "\n".join(lines)

    def _reducing_gradients(self):
        """Context for gradient reductions: the only ones `compression` applies to."""
        return self._host_ops.reducing_gradients()

    # -- host update (update="host" only) -----------------------------------
    def _fuses_update(self, optimizer, variables) -> bool:
        return False

    def _apply_update(self, optimizer, grads, variables) -> bool:
        return False

    def _apply_loss_scaled_update(self, loss_scale_optimizer, grads, variables) -> bool:
        return False


def _apply_sparse_update(strategy, optimizer, grad: tf.IndexedSlices, variable) -> None:
    """Keras' weight decay and update_step for one variable, on its host
    copy: what Keras' own step does with a sparse gradient. (Not
    compressed: the rows cross to the host as they are.)"""
    _keras_compat.apply_weight_decay_to_copy(optimizer, [variable])
    target = variable.value if isinstance(variable, keras.Variable) else variable
    strategy.extended.update(target, lambda v, g: optimizer.update_step(g, v, optimizer.learning_rate),
                             args=(grad,), group=False)


def _check_not_xla() -> None:
    if _keras_compat.in_xla_context():
        raise ValueError(
            "tf_glp.Strategy does not support jit_compile=True: its host aggregation runs as native "
            "host ops outside XLA. Compile the model with jit_compile=False.")


class _HostUpdate:
    """The optimizer step on the host (update="host", one machine or across
    workers). Across workers each chunk's local sum first crosses the workers
    (one collective per chunk); the same update then runs on every worker's
    host."""

    def _fuses_update(self, optimizer, variables) -> bool:
        if not supports_fused_update(optimizer, update_step_only=True)[0]:
            return False
        return all(v.dtype == "float32" and getattr(v, "constraint", None) is None for v in variables)

    def _apply_update(self, optimizer, grads, variables) -> bool:
        """Sums the replicas' gradients and applies the optimizer in one fused
        pass per variable on the host (called from the optimizer hook). In
        cross-replica context (the loss-scaled step below) the gradients are
        already summed host tensors. Sparse gradients (IndexedSlices, e.g.
        Embedding's) are concatenated on the host and go through Keras' own
        update_step there, as Keras would run it (see concat_on_host)."""
        if not self._fuses_update(optimizer, variables):
            return False
        _check_not_xla()
        variables = list(variables)
        fused = FusedKerasUpdate(optimizer, update_step_only=True)
        compression = self.compression

        host = self._host_ops.host_device
        across = self._host_ops.across_workers

        def merge_fn(strategy, *grads, summed=False):
            sparse = [i for i, g in enumerate(grads) if is_sparse(g)]
            dense = [i for i in range(len(grads)) if i not in sparse]
            per_variable = [local_components(grads[i]) for i in dense]
            chunks = self.chunking_state.plan(byte_sizes(per_variable))  # planned on uncompressed sizes
            if not summed:
                per_variable = [compress(parts, compression) for parts in per_variable]
            with tf.device(host):
                for chunk in chunks:
                    barrier = [t for i in chunk for t in per_variable[i]] if len(chunk) > 1 else []
                    with tf.control_dependencies(barrier):
                        parts = [per_variable[i] for i in chunk]
                        if across and not summed:
                            # This worker's sum, then every worker's: one
                            # collective for the chunk.
                            parts = [[total] for total in across(
                                [host_reduce(p, output_dtype=tf.float32) for p in parts])]
                        fused.apply(parts, [variables[dense[i]] for i in chunk], increment_iterations=False)
                for i in sparse:
                    replicas = grads[i].values if isinstance(grads[i], tf.distribute.DistributedValues) else [grads[i]]
                    rows = concat_on_host(replicas, tf.distribute.ReduceOp.SUM, host)
                    if across and not summed:
                        rows = across([rows])[0]
                    _apply_sparse_update(strategy, optimizer, rows, variables[i])

        replica_context = tf.distribute.get_replica_context()
        if replica_context is None:
            # Host tensors already summed (across workers too, and if
            # compressed, already crossed in 16 bits): update in float32,
            # no second rounding.
            merge_fn(self, *grads, summed=True)
        else:
            replica_context.merge_call(merge_fn, args=tuple(grads))
        return True

    def _apply_loss_scaled_update(self, loss_scale_optimizer, grads, variables) -> bool:
        """Keras' dynamic loss scaling, inside the host update.

        The host sums each variable's replica gradients and divides the sum
        by the loss scale in one native pass that also checks the result is
        finite (Note [Finite check in the reduce pass]); then, as Keras'
        LossScaleOptimizer does, either the inner optimizer's fused update
        runs and the scale grows after `dynamic_growth_steps` good steps, or
        the step is skipped and the scale halves. Unlike Keras under
        MirroredStrategy, which looks at the first replica's gradients only,
        an overflow on any replica (or in the sum, or in fp16 compression)
        skips the step. Nothing is chunked here: no update may start before
        every gradient is known to be finite (explain() still shows the
        chunk count the other paths use).
        """
        inner = loss_scale_optimizer.inner_optimizer
        if (not self._fuses_update(inner, variables)
                or any(getattr(inner, name, None) is not None for name in ("clipnorm", "clipvalue", "global_clipnorm"))
                or any(getattr(v, "overwrite_with_gradient", False) for v in variables)
                or any(is_sparse(g) for g in grads if g is not None)):
            # Keras clips each replica's gradients before the sum, and does
            # not unscale overwrite-with-gradient (float8) variables: keep
            # its own path (with the fused update inside, when it applies).
            return False
        _check_not_xla()
        variables = list(variables)
        compression = self.compression

        across = self._host_ops.across_workers

        def merge_fn(strategy, *grads):
            scale = tf.convert_to_tensor(loss_scale_optimizer.dynamic_scale.value)
            summed, finite = [None] * len(grads), []
            present = [i for i, grad in enumerate(grads) if grad is not None]  # Keras skips the others
            with tf.device(self._host_ops.host_device):
                # An fp16 overflow becomes inf and skips the step, as loss
                # scaling intends, instead of raising.
                parts = [compress(local_components(grads[i]), compression, overflow="propagate") for i in present]
                if across:  # this worker's sums, then every worker's (one collective)
                    parts = [[total] for total in across([host_reduce(p, output_dtype=tf.float32) for p in parts])]
                for i, grad_parts in zip(present, parts):
                    total, all_finite = host_reduce(grad_parts, output_dtype=tf.float32, divisor=scale,
                                                    return_all_finite=True)
                    summed[i] = total
                    finite.append(all_finite)
                step_is_finite = tf.reduce_all(tf.stack(finite)) if finite else tf.constant(True)
            loss_scaling.finish_step(loss_scale_optimizer, step_is_finite, summed, variables)

        tf.distribute.get_replica_context().merge_call(merge_fn, args=tuple(grads))
        return True



class HostStrategy(_HostUpdate, Strategy, tf.distribute.experimental.CentralStorageStrategy):
    """tf_glp.Strategy with update="host" (see Strategy)."""

    def __init__(self, devices=None, *, update: str = "host", chunking="auto", compression=None, cpu_replicas=None,
                 cluster_resolver=None):
        devices = self._glp_setup(devices, update, chunking, compression, cpu_replicas)
        # CentralStorageStrategy with per-variable homes (host_extended.py).
        tf.distribute.Strategy.__init__(self, HostExtended(self, devices, HOST_DEVICE))
        # The host reductions (metrics, losses, optimizers without a fused update).
        _keras_compat.set_cross_device_ops(self.extended, self._host_ops)

class ReplicaStrategy(Strategy, tf.distribute.MirroredStrategy):
    """tf_glp.Strategy with update="replicas" (see Strategy)."""

    def __init__(self, devices=None, *, update: str = "replicas", chunking="auto", compression=None, cpu_replicas=None,
                 cluster_resolver=None):
        devices = self._glp_setup(devices, update, chunking, compression, cpu_replicas)
        tf.distribute.MirroredStrategy.__init__(self, devices=devices, cross_device_ops=self._host_ops)


class _MultiWorkerKerasFixes:
    def reduce(self, reduce_op, value, axis):
        """tf.distribute's reduce, with the two Keras workarounds that any
        multi-worker strategy needs under Keras 3.15 (keras-team/keras#20585,
        still in 3.15; harmless once fixed; a test says when they can go):

        - `Trainer._maybe_symbolic_build` passes the whole `(x, y,
          sample_weight)` batch as one value ("Attempt to convert a value
          (PerReplica...)"): a nested value is reduced leaf by leaf.
        - `reduce_per_replica` reduces scalar logs with `axis=0` ("Invalid
          reduction dimension 0 for input with 0 dimensions", tensorflow
          issue 72388): a scalar has no axis to reduce along, so its mean
          over the replicas is taken.
        """
        if isinstance(value, (tuple, list, dict)):
            return tf.nest.map_structure(lambda leaf: self.reduce(reduce_op, leaf, axis), value)
        if value is None:
            return None
        if axis is not None and all(getattr(part, "shape", None) is not None and part.shape.rank == 0
                                    for part in self.experimental_local_results(value)):
            axis = None
        return super().reduce(reduce_op, value, axis)


class MultiWorkerReplicaStrategy(_MultiWorkerKerasFixes, Strategy, tf.distribute.MultiWorkerMirroredStrategy):
    """tf_glp.Strategy with update="replicas" across workers (multi_worker.py).

    `devices` / `cpu_replicas` name this worker's replicas; every worker
    must have the same number."""

    _extended_class = multi_worker.CollectiveHostExtended

    def __init__(self, devices=None, *, update: str = "replicas", chunking="auto", compression=None, cpu_replicas=None,
                 cluster_resolver=None):
        devices = self._glp_setup(devices, update, chunking, compression, cpu_replicas)
        resolver = multi_worker.resolve_cluster(cluster_resolver)
        tf.distribute.Strategy.__init__(self, self._extended_class(self, resolver, devices, self._host_ops))


class MultiWorkerHostStrategy(_HostUpdate, MultiWorkerReplicaStrategy):
    """tf_glp.Strategy with update="host" across workers (multi_worker.py):
    every worker's host holds the weights and optimizer state and applies
    the same update from the cross-worker sums."""

    _extended_class = multi_worker.MultiWorkerHostExtended

    def __init__(self, devices=None, *, update: str = "host", chunking="auto", compression=None, cpu_replicas=None,
                 cluster_resolver=None):
        super().__init__(devices, update=update, chunking=chunking, compression=compression,
                         cpu_replicas=cpu_replicas, cluster_resolver=cluster_resolver)


def _measure_host_rates(uses_gpus: bool) -> cost_model.HostRates:
    """Times the host engine on this machine (about 0.2 s)."""
    elements = 4 << 20
    with tf.device(HOST_DEVICE):
        inputs = [tf.random.stateless_uniform([elements], seed=[i, 0]) for i in range(2)]
        small = [tf.zeros([16]) for _ in range(2)]

        def best(fn, repeats=5):
            fn()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return min(times)

        reduce_s = best(lambda: host_reduce(inputs).numpy())
        overhead_s = best(lambda: host_reduce(small).numpy(), repeats=20)
    reduce_bw = 3 * elements * 4 / reduce_s
    # A fused Adam update moves 28 bytes per parameter, a 2-way reduce 12 per
    # element: scale the measured reduce rate accordingly.
    update_rate = reduce_bw / 28
    transfer = 12e9 if uses_gpus else math.inf  # PCIe 3 x16 effective; shared memory on CPUs
    return cost_model.HostRates(transfer, reduce_bw, update_rate, overhead_s)
