"""tf_glp.Strategy: CPU-assisted data parallelism as a tf.distribute.Strategy.

    with tf_glp.Strategy().scope():
        model = ...; model.compile(...)
    model.fit(...)

Both modes are MirroredStrategies: the model's variables are mirrored on the
replicas, and everything Keras and TensorFlow see of them (reads, writes and
variable types from inside a replica, XLA-compiled layers, metrics, batch
statistics, seed generators) is what they see under MirroredStrategy. The
optimizer step is taken out of the replicas' step once per step: one merge,
where the host sums the replicas' gradients chunk by chunk (native
host_reduce; across workers, then TensorFlow's collective), and Keras' own
`optimizer.apply` runs once, in cross-replica context, on those sums. So
every optimizer, weight decay, clipping, constraints, EMA, gradient
accumulation and loss scaling run as Keras wrote them.

update="host" (Note [One rule for update="host"], host_copies.py): the
optimizer's variables live only on the host and its step runs there, on the
host copy of each weight, which is then copied to the replicas. For
keras.optimizers.SGD / Adam / AdamW (float32 weights) the sum and the
update are one fused native pass per variable (tf_glp.ops.FusedKerasUpdate)
where Keras would pass the gradients through unchanged.

update="replicas": the host's sums go back to the replicas and every
replica applies the update to its own copy, with its own optimizer state.

update="auto" (update_choice.py): "host", "replicas" or TensorFlow's own
all-reduce, chosen at the start of the first fit by timing each on the
model and its first batch.

Chunks (chunking.py) let the host work on the last layers while the devices
still compute the gradients of earlier ones; chunking="auto" decides the
chunk count at the start of the first fit, with the cost model
(cost_model.py) and at most one confirming retrace (chunking_decision.py).
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import keras
import tensorflow as tf

from tf_glp._keras import compat, patches
from tf_glp.ops import FusedKerasUpdate, host_reduce, supports_fused_update
from tf_glp.ops.keras_fused import changes_gradients
from tf_glp.strategy import chunking as chunking_lib
from tf_glp.strategy import cluster as cluster_lib, cost_model, devices as devices_lib, fit_setup, multi_worker
from tf_glp.strategy import micro_batches as micro_batches_lib, no_xla
from tf_glp.strategy import one_device, update_choice
from tf_glp.strategy.settings import Settings
from tf_glp.strategy.cross_device_ops import (
    HostCrossDeviceOps,
    byte_sizes,
    compress,
    concat_on_host,
    is_sparse,
    local_components,
)
from tf_glp.strategy.host_copies import HostMirroredExtended

_MirroredStrategy = tf.distribute.MirroredStrategy  # as imported (a test replaces the public name)
HOST_DEVICE = "/cpu:0"


class Strategy(tf.distribute.Strategy):
    """Data-parallel training with the host CPUs aggregating gradients.

    `Strategy(...)` returns a `HostStrategy` (update="host"), a
    `ReplicaStrategy` (update="replicas") or an `AutoStrategy`
    (update="auto"), all MirroredStrategies, or on a
    machine without GPUs, unless replicas are asked for, a
    `SingleDeviceStrategy` (one device, plain Keras' path with the fused
    optimizer update where it measures faster: logical CPU replicas share
    the same cores and could only add work); all are instances of
    `tf_glp.Strategy`.

    Args:
        devices: Compute devices. Default: all GPUs; without GPUs, one
            device (or `cpu_replicas` logical CPU devices when given, or
            with micro_batches 2).
        update: "auto" (at the start of the first fit, "host",
            "replicas" and TensorFlow's own all-reduce each run a few steps
            on the model and its first batch; the fastest beyond the spread
            is kept and written to `plan_path`: update_choice.py; on GPUs
            explain() also says whether the first GPU alone would train
            the model faster; with micro_batches or across workers "auto"
            runs "host", not measured), "host" (optimizer runs once, on
            the host) or "replicas" (every replica applies the host-summed
            gradients).
            An explicit "host" or "replicas" skips the measurement.
            Default: "auto".
        chunking: "auto" (decided at the start of the first fit: one chunk
            on CPU replicas, where chunking cannot help; on GPUs the cost
            model calibrated on the first steps, with at most one confirming
            retrace), "none" (one chunk), an int number of chunks, or a byte
            size such as "4MB" (10^6 bytes), "4MiB" (2^20) or "4194304".
            Default: "auto".
        compression: None, "bf16" or "fp16": gradients (and nothing else:
            metrics and losses stay exact) cross to the host in 16 bits and
            are accumulated in float32 (results then differ from float32
            training by the rounding of the gradients). A finite gradient
            beyond float16's range raises InvalidArgumentError, except in a
            loss-scaled step ('mixed_float16'): there it becomes inf, the
            step is skipped and the scale lowered, as loss scaling intends.
            Default: None (no compression).
        cpu_replicas: Number of logical CPU replicas when there are no GPUs
            (default None: one device; TF_GLP_CPU_REPLICAS when set, as
            `python -m tf_glp.launch` sets it), or to force CPU replicas on a
            GPU machine. Per worker when training across workers.
        micro_batches: None (default), or M: every global batch is cut into
            M equal micro-batches whose gradients are computed one by one
            and added on the host in a fixed order, so that any replica
            count dividing M applies the same update, bit for bit, as one
            device running the M micro-batches in turn (see
            micro_batches.py for what is not invariant yet). Across
            workers, the replicas of every worker count.
        cluster_resolver: A tf.distribute.cluster_resolver.ClusterResolver
            (e.g. SlurmClusterResolver) to train across workers; without
            it, TF_CONFIG's cluster when that variable is set (as
            `python -m tf_glp.launch` sets it). Across workers, each
            worker's host sums its replicas and the workers' sums meet in
            TensorFlow's collective all-reduce (multi_worker.py).
        plan_path: Where update="auto" reads and writes its choice (reused
            by a run with the same model, optimizer, devices and batch);
            None: neither. Default: "glp_strategy_plan.json".

    Raises:
        ValueError: for an unknown update, chunking or compression, or a
            replica count that does not divide micro_batches.
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

    def __new__(cls, devices=None, *, update: str = "auto", chunking="auto", compression=None, cpu_replicas=None,
                cluster_resolver=None, micro_batches=None, plan_path: str | None = "glp_strategy_plan.json"):
        # A concrete class constructed directly (HostStrategy(...)) implies its update.
        update = cls._update_mode or update
        settings = Settings(devices, update, chunking, compression, cpu_replicas, cluster_resolver, micro_batches,
                            plan_path)
        if cls is Strategy:
            if cluster_lib.resolve_cluster(cluster_resolver) is not None:
                # (update="auto" across workers: "host", not measured yet; explain() says so.)
                cls = MultiWorkerReplicaStrategy if update == "replicas" else MultiWorkerHostStrategy
            elif micro_batches is None and devices_lib.trains_on_one_device(devices, cpu_replicas):
                cls = SingleDeviceStrategy
            else:
                cls = {"host": HostStrategy, "replicas": ReplicaStrategy, "auto": AutoStrategy}[update]
        strategy = object.__new__(cls)
        strategy.settings = settings
        return strategy

    # Mark tf_glp strategies, and the one-device one, for the patches
    # (tf_glp/_keras/patches.py, which must not import this module).
    _is_tf_glp_strategy = True
    _is_one_device = False
    _update_mode: str | None = None

    def _glp_setup(self, devices: list[str] | None = None, workers: int = 1) -> list[str]:
        """Sets up what every tf_glp strategy holds, from self.settings;
        returns the devices (`devices` when given, else the settings' or
        the default ones)."""
        settings = self.settings
        # Each owned setting is validated and kept by its owner: the chunk
        # plan and the host reductions (which compress).
        chunking_state = chunking_lib.Chunking(settings.chunking)
        host_ops = HostCrossDeviceOps(HOST_DEVICE, settings.compression, chunking_state.plan)
        if devices is None:
            devices = (list(settings.devices) if settings.devices is not None
                       else devices_lib.default_devices(settings.cpu_replicas))
        self.micro_batches = micro_batches_lib.check_setting(settings.micro_batches, len(devices), workers)
        if self.micro_batches and settings.compression:
            raise ValueError(f"tf_glp.Strategy: micro_batches={settings.micro_batches} sums the micro-batches' "
                             f"gradients in float32 as they are; compression={settings.compression!r} cannot apply "
                             f"to them: pass one")
        self.chunking_state = chunking_state
        self._host_ops = host_ops
        self._rates: cost_model.HostRates | None = None
        patches.install_micro_batch_wrappers(
            micro_batches_lib.seed_next, micro_batches_lib.batch_norm_moments, micro_batches_lib.scale_for_distribution)
        return devices

    def _prepare_compile(self, arguments: dict) -> None:
        """Called by the compile patch with compile's bound arguments (no_xla.py)."""
        no_xla.prepare_compile(arguments)

    def _prepare_fit(self, model, arguments: dict) -> None:
        """Called by the fit patch with fit's bound arguments (fit_setup.py)."""
        fit_setup.prepare(model, self, arguments)

    def _prepare_update(self, model, arguments: dict, batch: int | None) -> keras.callbacks.Callback | None:
        """Called by fit_setup before fit builds anything: update="auto"
        decides its concept (AutoStrategy); returns a callback for fit or None."""
        return None

    def _micro_batch_train_step(self, model, data):
        """Keras' train_step under micro_batches=M (micro_batches.py)."""
        return micro_batches_lib.train_step(model, data, self)

    @property
    def update(self) -> str:
        """"host", "replicas" or "auto" (see the class docstring)."""
        return self.settings.update

    @property
    def chunking(self):
        """The chunking setting ("auto", "none", a count or a byte size)."""
        return self.chunking_state.setting

    @property
    def host_device(self) -> str:
        """The device whose CPUs sum the gradients (and, with update="host",
        run the optimizer step)."""
        return self._host_ops.host_device

    @property
    def compression(self) -> str | None:
        """None, "bf16" or "fp16" (see the class docstring)."""
        return self._host_ops.compression

    # -- cost model -------------------------------------------------------
    def host_rates(self) -> cost_model.HostRates:
        """Measures (once) the host speeds the cost model uses."""
        if self._rates is None:
            self._rates = cost_model.measure_host_rates(self.host_device, self.uses_gpus())
        return self._rates

    def uses_gpus(self) -> bool:
        """Whether every replica is a GPU (only then can the host's work
        overlap the replicas' compute)."""
        return devices_lib.all_gpus(self.extended.worker_devices)

    def explain(self) -> str:
        """How the chunk count in use was chosen: the reason, and for
        chunking="auto" on GPUs the predicted and measured step time of each
        candidate with the cost model's components, in milliseconds.

        Example:
            >>> print(strategy.explain())
        """
        where = f"{len(self.extended.worker_devices)} replicas"
        if compat.in_multi_worker_mode(self):
            where += f" x {self.extended.num_workers} workers"
        lines = [f"tf_glp.Strategy({self.settings.describe()}) on {where}"]
        if not self.chunking_state.decided and not self.chunking_state.trials:
            lines.append(f"  chunks in use: {self.chunking_state.in_use()} (chunking='auto' decides at the start "
                         f"of the first fit)")
        else:
            lines.extend(self.chunking_state.explain_lines())
        if self.settings.update == "auto" and self._update_mode != "auto":
            lines.append("  update='auto' -> 'host': across workers the concept is not measured yet")
        if not self.uses_gpus():
            lines.append(f"  cost: {len(self.extended.worker_devices)} logical CPU replicas share the host's cores, so "
                         f"they add no compute, only tf.distribute's fixed cost per step (1-2 ms on a tiny model "
                         f"on a 2-core machine, benchmarks/RESULTS.md); tf_glp.Strategy() without devices or "
                         f"cpu_replicas trains on one device")
        return "\n".join(lines)

    def _reducing_gradients(self):
        """Context for gradient reductions: the only ones `compression` applies to."""
        return self._host_ops.reducing_gradients()

    # -- the optimizer step --------------------------------------------------
    def _apply_once(self, optimizer, run, grads, variables, *, loss_scaled: bool = False) -> None:
        """The optimizer step, called from the replicas' step (tf_glp/_keras/patches.py):
        one merge; there the replicas' gradients are summed on the host and
        `run(summed_grads, variables)` (Keras' own apply) runs once, in
        cross-replica context. Under update="host" it runs on the host
        copies (`_optimizer_step`); the fused update may take the
        per-replica gradients unsummed (`_takes_unsummed`)."""
        no_xla.check_not_in_xla()

        def merge_fn(strategy, grads):
            grads = list(grads)
            keras_variables = list(variables) if variables is not None else compat.built_variables(optimizer)
            if not self._takes_unsummed(optimizer, keras_variables, loss_scaled):
                grads = self._sum_gradients(grads, loss_scaled)
            with self._optimizer_step(optimizer, keras_variables):
                run(grads, variables)

        # (A gradient that is one tensor object shared by every replica, made
        # outside the replicas' function, reaches the merge as one value and
        # is counted once, as in stock MirroredStrategy's all-reduce.)
        tf.distribute.get_replica_context().merge_call(merge_fn, args=(list(grads),))

    def _sum_gradients(self, grads: list, loss_scaled: bool) -> list:
        """The replicas' gradients summed on the host."""
        # An fp16 overflow in a loss-scaled step becomes inf and skips the
        # step, as loss scaling intends, instead of raising.
        return self._host_ops.reduce_to_host(grads, gradients=True, overflow="propagate" if loss_scaled else "raise")

    def _build_outside_the_trace(self, optimizer, variables) -> None:
        """Builds an optimizer met unbuilt in the replicas' step (a custom
        loop's first `apply_gradients`) in cross-replica context, outside
        any trace, in this strategy's scope: as `fit` builds it. Built
        inside a traced step, what a `build` writes (ScheduleFreeAdamW
        copies the weights into its momentum) would be lost: tf.function
        runs only the initializers of the variables a first trace creates,
        then retraces without them, so without the build (plain Keras on
        one device loses those writes too; stock MirroredStrategy applies
        them differently from a built optimizer)."""

        def build(strategy):
            if optimizer.built:
                return
            with tf.init_scope(), self.scope(), keras.name_scope(optimizer.name, caller=optimizer):
                optimizer.build(list(variables))
            optimizer.built = True

        tf.distribute.get_replica_context().merge_call(build)

    def _optimizer_step(self, optimizer, variables):
        return contextlib.nullcontext()

    def _takes_unsummed(self, optimizer, variables, loss_scaled: bool) -> bool:
        return False

    def _fuses_update(self, optimizer, variables) -> bool:
        return False

    def _fusing_now(self, optimizer, variables) -> bool:
        """Whether the fused update runs here: inside the host step (not
        from a replica, nor from a cross-replica call outside the step)."""
        return False

    def _apply_update(self, optimizer, grads, variables) -> bool:
        return False


def _apply_sparse_update(strategy, optimizer, grad: tf.IndexedSlices, variable) -> None:
    """Keras' weight decay and update_step for one variable, on its host
    copy: what Keras' own step does with a sparse gradient. (Not
    compressed: the rows cross to the host as they are.)"""
    compat.apply_weight_decay_to_copy(optimizer, [variable])
    target = variable.value if isinstance(variable, keras.Variable) else variable
    strategy.extended.update(target, lambda v, g: optimizer.update_step(g, v, optimizer.learning_rate),
                             args=(grad,), group=False)


class _HostUpdate:
    """The optimizer step on the host (update="host", one machine or across
    workers; host_copies.py). Across workers each chunk's local sum first
    crosses the workers (one collective per chunk); the same update then
    runs on every worker's host."""

    def _optimizer_step(self, optimizer, variables):
        # The optimizer's own list too: Keras' EMA reads it.
        return self.extended.host_update(list(variables) + compat.built_variables(optimizer))

    def _fuses_update(self, optimizer, variables) -> bool:
        return supports_fused_update(optimizer, variables, update_step_only=True)[0]

    def _fusing_now(self, optimizer, variables) -> bool:
        return self.extended.in_host_update() and self._fuses_update(optimizer, variables)

    def _takes_unsummed(self, optimizer, variables, loss_scaled: bool) -> bool:
        """Whether Keras passes the gradients untouched to the fused update
        (no unscaling, clipping or accumulation first): then the fused pass
        reads each replica's gradient itself and sums it on the fly."""
        if loss_scaled or not self._fuses_update(optimizer, variables):
            return False
        if changes_gradients(optimizer) is not None:
            return False
        return not any(getattr(v, "overwrite_with_gradient", False) for v in variables)

    def _apply_update(self, optimizer, grads, variables) -> bool:
        """Keras' `_backend_update_step` inside the host step (tf_glp/_keras/patches.py): the
        fused native pass per variable, chunk by chunk. Gradients arrive
        per replica (summed here, in the same pass; across workers first
        summed per worker, then across the workers), as a micro-batched
        step's M gradients (MicroBatchGradients: every worker's, summed here
        in order) or already summed on the host. Sparse gradients
        (IndexedSlices, e.g. Embedding's) are concatenated on the host and
        go through Keras' own update_step there, as Keras would run it (see
        concat_on_host)."""
        if not self._fusing_now(optimizer, variables):
            return False
        variables = [self.extended.host_target(v) for v in variables]
        fused = FusedKerasUpdate(optimizer, update_step_only=True)
        host_ops = self._host_ops
        across = host_ops.across_workers
        summed = not any(isinstance(g, tf.distribute.DistributedValues) for g in grads)
        # Every worker's micro-batch gradients, already gathered.
        complete = any(isinstance(g, micro_batches_lib.MicroBatchGradients) for g in grads)
        sparse = [i for i, g in enumerate(grads) if is_sparse(g)]
        dense = [i for i in range(len(grads)) if i not in sparse]
        per_variable = [local_components(grads[i]) for i in dense]
        sizes = byte_sizes(per_variable)  # planned on uncompressed sizes
        if not summed:
            per_variable = [compress(parts, self.compression) for parts in per_variable]
        with tf.device(host_ops.host_device):
            for chunk in host_ops.in_chunks(per_variable, sizes):
                parts = [per_variable[i] for i in chunk]
                if across and not summed and not complete:
                    # This worker's sum, then every worker's: one collective
                    # for the chunk.
                    parts = [[total] for total in across([host_reduce(p, output_dtype=tf.float32) for p in parts])]
                fused.apply(parts, [variables[dense[i]] for i in chunk], increment_iterations=False)
            for i in sparse:
                replicas = grads[i].values if isinstance(grads[i], tf.distribute.DistributedValues) else [grads[i]]
                rows = concat_on_host(replicas, tf.distribute.ReduceOp.SUM, host_ops.host_device)
                if across and not summed:
                    rows = across([rows])[0]
                _apply_sparse_update(self, optimizer, rows, variables[i])
        return True


class SingleDeviceStrategy(Strategy, tf.distribute.OneDeviceStrategy):
    """tf_glp.Strategy on one device: `tf_glp.Strategy()` on a machine
    without GPUs (one_device.py). Plain Keras' path, with tf_glp's fused
    optimizer update where it measures faster at the start of the first fit.

    Example:
        >>> strategy = tf_glp.Strategy()  # no GPUs: one device
        >>> with strategy.scope():
        ...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        ...     model.compile(optimizer="adam", loss="mse")
        >>> model.fit(x, y, batch_size=32)
        >>> print(strategy.explain())
    """

    _is_one_device = True

    def __init__(self, *args, **kwargs):  # Strategy's arguments, kept in self.settings by Strategy.__new__
        self._glp_setup([HOST_DEVICE])
        if self.compression:
            warnings.warn(f"tf_glp.Strategy: compression={self.compression!r} has nothing to compress on one device "
                          f"(no gradient crosses to the host); pass cpu_replicas=N to train N replicas.", stacklevel=3)
        self._optimizer_step = one_device.OptimizerStepChoice(self)
        tf.distribute.Strategy.__init__(self, one_device.OneDeviceExtended(self, HOST_DEVICE))

    def optimizer_step_decided(self, optimizer) -> bool:
        """Whether this optimizer's step (Keras' or the fused one) is chosen."""
        return self._optimizer_step.decided(optimizer)

    def optimizer_step_decision(self) -> keras.callbacks.Callback:
        """The callback that chooses it at the start of fit (added by fit)."""
        return one_device.OptimizerStepDecision(self._optimizer_step)

    def explain(self) -> str:
        """Why one device, and which optimizer step runs (with its timings)."""
        return "\n".join([
            f"tf_glp.Strategy({self.settings.describe()}) on one device ({HOST_DEVICE}): no GPUs, so it trains as "
            f"plain Keras does; logical CPU replicas would share these cores and only add tf.distribute's fixed "
            f"cost per step (cpu_replicas=N trains N replicas, to try multi-replica code)",
            self._optimizer_step.explain_line()])


class HostStrategy(_HostUpdate, Strategy, tf.distribute.MirroredStrategy):
    """tf_glp.Strategy with update="host" (see Strategy)."""

    _update_mode = "host"

    def __init__(self, *args, **kwargs):  # Strategy's arguments, kept in self.settings by Strategy.__new__
        devices = self._glp_setup()
        tf.distribute.Strategy.__init__(self, HostMirroredExtended(self, devices, self._host_ops, HOST_DEVICE))


class AutoStrategy(_HostUpdate, Strategy, tf.distribute.MirroredStrategy):
    """tf_glp.Strategy with update="auto" (update_choice.py): one strategy
    whose concept ("host", "replicas" or TensorFlow's "all-reduce") is chosen
    at the start of the first fit. Until then, and for an optimizer built
    before it, "host". The concept in use is `concept`."""

    _update_mode = "auto"

    def __init__(self, *args, **kwargs):  # Strategy's arguments, kept in self.settings by Strategy.__new__
        devices = self._glp_setup()
        self.update_choice = update_choice.UpdateChoice()
        if self.micro_batches:
            self.update_choice.decide("host", "micro_batches: the concept whose micro-batched result is kept bitwise "
                                              "(not measured)")
        tf.distribute.Strategy.__init__(self, HostMirroredExtended(self, devices, self._host_ops, HOST_DEVICE,
                                                                   on_host=lambda: self.concept == "host"))

    @property
    def concept(self) -> str:
        """The update concept in use: "host", "replicas" or "all-reduce"."""
        return self.update_choice.concept

    @functools.cached_property
    def _all_reduce(self) -> tf.distribute.CrossDeviceOps:
        """TensorFlow's own all-reduce, as MirroredStrategy picks it."""
        return tf.distribute.NcclAllReduce() if self.uses_gpus() else tf.distribute.ReductionToOneDevice()

    def _prepare_update(self, model, arguments: dict, batch: int | None):
        choice = self.update_choice
        if choice.decided or model.optimizer is None:
            return None
        update_choice.decide(self, model, arguments, batch)
        return update_choice.AnnounceChoice(choice) if arguments.get("verbose", "auto") != 0 else None

    def _optimizer_step(self, optimizer, variables):
        return super()._optimizer_step(optimizer, variables) if self.concept == "host" else contextlib.nullcontext()

    def _fuses_update(self, optimizer, variables) -> bool:
        return self.concept == "host" and super()._fuses_update(optimizer, variables)

    def _sum_gradients(self, grads: list, loss_scaled: bool) -> list:
        if self.concept != "all-reduce":
            return super()._sum_gradients(grads, loss_scaled)
        # MirroredStrategy's concept: TensorFlow sums the replicas' gradients
        # onto every replica (a gradient that is one tensor shared by every
        # replica passes as it is, counted once).
        grads = list(grads)
        distributed = [i for i, g in enumerate(grads) if isinstance(g, tf.distribute.DistributedValues)]
        if not distributed:
            return grads
        summed = self._all_reduce.batch_reduce(tf.distribute.ReduceOp.SUM, [(grads[i], grads[i]) for i in distributed])
        for i, total in zip(distributed, summed):
            grads[i] = total
        return grads

    def explain(self) -> str:
        """Strategy.explain(), with the update choice and its times."""
        lines = super().explain().split("\n")
        return "\n".join([lines[0], f"  {self.update_choice.line()}", *lines[1:]])


class ReplicaStrategy(Strategy, tf.distribute.MirroredStrategy):
    """tf_glp.Strategy with update="replicas" (see Strategy)."""

    _update_mode = "replicas"

    def __init__(self, *args, **kwargs):  # Strategy's arguments, kept in self.settings by Strategy.__new__
        devices = self._glp_setup()
        _MirroredStrategy.__init__(self, devices=devices, cross_device_ops=self._host_ops)


class _MultiWorkerKerasFixes:
    def reduce(self, reduce_op, value, axis):
        """tf.distribute's reduce, with the two Keras workarounds that any
        multi-worker strategy needs under Keras 3.15 (keras-team/keras#20585,
        still in 3.15; harmless once fixed; a test says when they can go):

        - `Trainer._maybe_symbolic_build` passes the whole `(x, y,
          sample_weight)` batch as one value ("Attempt to convert a value
          (PerReplica...)"): a nested value is reduced leaf by leaf.
        - `reduce_per_replica` reduces scalar logs with `axis=0` ("Invalid
          reduction dimension 0 for input with 0 dimensions",
          tensorflow/tensorflow#72388): a scalar has no axis to reduce
          along, so its mean over the replicas is taken.
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
    _update_mode = "replicas"

    def __init__(self, *args, **kwargs):  # Strategy's arguments, kept in self.settings by Strategy.__new__
        resolver = cluster_lib.resolve_cluster(self.settings.cluster_resolver)
        devices = self._glp_setup(workers=cluster_lib.worker_count(resolver))
        tf.distribute.Strategy.__init__(self, self._extended_class(self, resolver, devices, self._host_ops))


class MultiWorkerHostStrategy(_HostUpdate, MultiWorkerReplicaStrategy):
    """tf_glp.Strategy with update="host" across workers (multi_worker.py):
    every worker's host holds the optimizer state and applies the same
    update from the cross-worker sums to its host copies."""

    _extended_class = multi_worker.MultiWorkerHostExtended
    _update_mode = "host"
