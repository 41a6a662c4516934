"""tf_glp.Strategy: CPU-assisted data parallelism as a tf.distribute.Strategy.

    with tf_glp.Strategy().scope():
        model = ...; model.compile(...)
    model.fit(...)

This file holds the base class and its factory; each strategy lives in its
own file with its extended object, as in tf.distribute:
one_device_strategy.py (no GPUs: plain Keras' path), host_strategy.py
(update="host"), replica_strategy.py (update="replicas"), auto_strategy.py
(update="auto", the concept measured: update_choice.py) and
multi_worker_strategy.py (across workers). What each update concept does
is in concepts.py; the settings, in settings.py.

Every multi-replica strategy is a MirroredStrategy: what Keras and
TensorFlow see of the model's variables is what they see under
MirroredStrategy. The optimizer step is taken out of the replicas' step:
one merge per step, where the concept sums the gradients (the host, chunk
by chunk: chunking.py) and Keras' own `optimizer.apply` runs once, in
cross-replica context, on the sums; so every optimizer, weight decay,
clipping, constraint, EMA, accumulation and loss scaling runs as Keras
wrote it. The hooks Keras' patched methods call are written down in
tf_glp/_keras/patches.py (StrategyHooks).
"""

from __future__ import annotations

import functools

import keras
import tensorflow as tf

from tf_glp._keras import compat, patches
from tf_glp.ops import supports_fused_update
from tf_glp.ops.keras_fused import changes_gradients
from tf_glp.strategy import chunking as chunking_lib
from tf_glp.strategy import concepts, cost_model, devices as devices_lib, fit_setup
from tf_glp.strategy import fused_host_step, micro_batches as micro_batches_lib, no_xla
from tf_glp.strategy.cross_device_ops import HostCrossDeviceOps
from tf_glp.strategy.settings import Settings

HOST_DEVICE = "/cpu:0"
ONE_DEVICE, ONE_MACHINE, WORKERS = devices_lib.ONE_DEVICE, devices_lib.ONE_MACHINE, devices_lib.WORKERS


class Strategy(tf.distribute.Strategy):
    """Data-parallel training with the host CPUs aggregating gradients.

    `Strategy(...)` returns a `HostStrategy` (update="host"), a
    `ReplicaStrategy` (update="replicas") or an `AutoStrategy`
    (update="auto"), all MirroredStrategies; across workers a
    `MultiWorkerHostStrategy` or `MultiWorkerReplicaStrategy`; or on a
    machine without GPUs, unless replicas are asked for, a
    `SingleDeviceStrategy` (one device: one_device_strategy.py); all are
    instances of `tf_glp.Strategy`. A class constructed directly runs its
    own update concept (update="auto", the default, means that one; another
    raises).

    Args:
        devices: Compute devices. Default: all GPUs; without GPUs, one
            device (or `cpu_replicas` logical CPU devices when given, or
            with micro_batches 2).
        update: The update concept (concepts.py): "host" (the optimizer
            runs once, on the host), "replicas" (every replica applies the
            host-summed gradients) or "auto" (the fastest of them on the
            model's first batch, kept in `plan_path`: update_choice.py;
            "host" with micro_batches or across workers). Default: "auto".
        chunking: "auto" (at the start of the first fit: one chunk on CPU
            replicas; on GPUs the cost model calibrated on the first steps,
            with at most one confirming retrace), "none" (one chunk), a
            number of chunks, or a byte size such as "4MB" (10^6 bytes),
            "4MiB" (2^20) or "4194304". Default: "auto".
        compression: None, "bf16" or "fp16" (compression.py): gradients
            cross to the host in 16 bits, accumulated in float32. A finite
            gradient beyond float16's range raises InvalidArgumentError,
            except in a loss-scaled step (inf: the step is skipped).
            Default: None.
        cpu_replicas: Number of logical CPU replicas when there are no GPUs
            (default None: one device; TF_GLP_CPU_REPLICAS when set, as
            `python -m tf_glp.launch` sets it), or to force CPU replicas on a
            GPU machine. Per worker when training across workers.
        micro_batches: None (default), or M: every global batch is cut into
            M micro-batches whose gradients are added on the host in a fixed
            order, so that any replica count dividing M applies the same
            update, bit for bit, as one device running them in turn
            (micro_batches.py). Across workers, every worker's replicas count.
        cluster_resolver: A ClusterResolver (e.g. tf_glp.slurm_cluster())
            to train across workers; without it, TF_CONFIG's cluster when set
            (`python -m tf_glp.launch` sets it), else TF_GLP_WORKER_HOSTS's
            (tf_glp.environment_cluster(), e.g. a Kubernetes Indexed Job).
            Each worker's host sums its replicas; the workers' sums meet in
            TensorFlow's collective all-reduce (multi_worker_strategy.py).
        plan_path: Where the start-up choices are kept for the next run
            of the same model on this machine: "auto" (default), the
            user's cache (tf_glp/tuning/store.py); a file; None: nowhere.
        allow_xla: On one device, XLA (`jit_compile=True`) may be chosen
            where it measures faster at the start of the first fit
            (execution_choice.py); it rounds differently, so without this
            XLA is only measured and named. Default: False.

    Raises:
        ValueError: for an unknown update, chunking or compression, a
            replica count that does not divide micro_batches, or an update
            other than its own passed to a strategy class.
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

    _classes: dict[tuple, type] = {}  # (placement, concept or concepts.AUTO) -> class: their declarations
    # Mark tf_glp strategies, and the one-device one, for the patches
    # (tf_glp/_keras/patches.py, which must not import this module).
    _is_tf_glp_strategy = True
    _is_one_device = False
    _implied_update: str | None = None  # the setting a class constructed directly runs
    _measures_concept = False  # update="auto" measures the concept (AutoStrategy)

    def __init_subclass__(cls, placement: str | None = None, serves: tuple = (), **kwargs):
        """A strategy class declares where it trains and what `update=` can
        ask of it (concepts.SERVED: concepts, or concepts.AUTO); the factory
        picks it from there."""
        super().__init_subclass__(**kwargs)
        for served in serves:
            Strategy._classes[(placement, served)] = cls
        if serves:
            cls._implied_update = None if set(serves) == set(concepts.SERVED) else concepts.setting(serves[0])

    def __new__(cls, devices=None, *, update: str = Settings.update, chunking=Settings.chunking,
                compression=Settings.compression, cpu_replicas=Settings.cpu_replicas,
                cluster_resolver=Settings.cluster_resolver, micro_batches=Settings.micro_batches,
                plan_path: str | None = Settings.plan_path, allow_xla: bool = Settings.allow_xla):
        concepts.check_setting(update)  # (before the class' own: a bad name is named as such)
        if cls._implied_update is not None:
            if update not in (Settings.update, cls._implied_update):
                raise ValueError(f"{cls.__name__} runs update={cls._implied_update!r}, got update={update!r}: "
                                 f"pass update={update!r} to tf_glp.Strategy instead")
            update = cls._implied_update
        settings = Settings(devices=devices, update=update, chunking=chunking, compression=compression,
                            cpu_replicas=cpu_replicas, cluster_resolver=cluster_resolver,
                            micro_batches=micro_batches, plan_path=plan_path, allow_xla=allow_xla)
        if cls is Strategy:
            cls = Strategy._classes[(devices_lib.placement(settings), concepts.served(settings.update))]
        strategy = object.__new__(cls)
        strategy.settings = settings
        return strategy

    def __init__(self, devices=None, **settings):  # (the settings are in self.settings: __new__)
        self._init_distribution()

    def _init_distribution(self) -> None:
        """Sets up the class' tf.distribute side (its extended object)."""
        raise NotImplementedError

    def _set_up(self, devices: list[str] | None = None, workers: int | None = None) -> list[str]:
        """Sets up what every tf_glp strategy holds, from self.settings;
        returns the devices (`devices` when given, else the settings' or
        the default ones). `workers`: the cluster's, None on one machine."""
        settings = self.settings
        self._workers = workers
        self.chunking_state = chunking_lib.Chunking(settings.chunking)
        self._host_ops = HostCrossDeviceOps(HOST_DEVICE, settings.compression, self.chunking_state.plan)
        if devices is None:
            devices = (list(settings.devices) if settings.devices is not None
                       else devices_lib.default_devices(settings.cpu_replicas, across_workers=workers is not None))
        self.micro_batches = micro_batches_lib.check_replicas(settings.micro_batches, len(devices), workers or 1)
        self._rates: dict[type, cost_model.HostRates] = {}
        patches.install_micro_batch_wrappers(
            micro_batches_lib.seed_next, micro_batches_lib.batch_norm_moments, micro_batches_lib.scale_for_distribution)
        return devices

    # -- what the settings say, and what runs -------------------------------
    @property
    def update(self) -> str:
        """The `update=` setting: "host", "replicas" or "auto" (see the class docstring)."""
        return self.settings.update

    @property
    def update_concept(self) -> concepts.UpdateConcept:
        """The update concept in use (concepts.py)."""
        return concepts.for_setting(self.settings.update)

    @property
    def concept(self) -> str:
        """The name of the update concept in use: "host", "replicas" or "all-reduce"."""
        return self.update_concept.name

    @property
    def chunking(self):
        """The chunking setting ("auto", "none", a count or a byte size)."""
        return self.settings.chunking

    @property
    def compression(self) -> str | None:
        """The compression setting: None, "bf16" or "fp16" (see the class docstring)."""
        return self.settings.compression

    @property
    def host_device(self) -> str:
        """The device whose CPUs sum the gradients (update="host": and step)."""
        return self._host_ops.host_device

    # -- cost model -------------------------------------------------------
    def _host_rates(self, optimizer=None) -> cost_model.HostRates:
        """Measures (once per optimizer class) the host speeds the cost model
        uses; the update rate is for `optimizer`'s fused update."""
        if type(optimizer) not in self._rates:
            self._rates[type(optimizer)] = cost_model.measure_host_rates(self.host_device, self.uses_gpus(), optimizer)
        return self._rates[type(optimizer)]

    def uses_gpus(self) -> bool:
        """Whether every replica is a GPU (only then can the host's work overlap theirs)."""
        return devices_lib.all_gpus(self.extended.worker_devices)

    @functools.cached_property
    def _tf_all_reduce(self) -> tf.distribute.CrossDeviceOps:
        """TensorFlow's own all-reduce, as MirroredStrategy picks it (concepts.ALL_REDUCE's)."""
        return tf.distribute.NcclAllReduce() if self.uses_gpus() else tf.distribute.ReductionToOneDevice()

    def explain(self) -> str:
        """The settings, the update concept in use and why, how the chunk
        count was chosen (for chunking="auto" on GPUs each candidate's
        predicted and measured step time, in ms) and the steps per call.

        Example:
            >>> print(strategy.explain())
        """
        across_workers = self._workers is not None
        replicas, workers = len(self.extended.worker_devices), self._workers or 1
        where = f"{replicas} replica{'s' * (replicas != 1)}"
        if across_workers:
            where += f" x {workers} worker{'s' * (workers != 1)}"
        lines = [f"tf_glp.Strategy({self.settings.describe()}) on {where} "
                 f"({devices_lib.replicas_reason(self.settings, across_workers)})"]
        if not self.chunking_state.decided and not self.chunking_state.trials:
            lines.append(f"  chunks in use: {self.chunking_state.in_use()} (chunking='auto' decides at the start "
                         f"of the first fit)")
        else:
            lines.extend(self.chunking_state.explain_lines())
        if concepts.is_measured(self.settings.update) and not self._measures_concept:
            lines.append(f"  update={self.settings.update!r} -> {self.concept!r}: across workers the concept is "
                         f"not measured yet")
        if not self.uses_gpus() and replicas > 1:
            lines.append(f"  cost: {replicas} logical CPU replicas share the host's cores, so "
                         f"they add no compute, only tf.distribute's fixed cost per step (docs/performance.md); "
                         f"tf_glp.Strategy() without devices or cpu_replicas trains on one device "
                         f"{'per worker' if across_workers else ''}".rstrip())
        return "\n".join([*lines, f"  {self._choices['execution'].line()}"])

    # -- the hooks Keras' patched methods call (patches.StrategyHooks) ------
    def _prepare_compile(self, model, arguments: dict) -> None:
        self._choices["execution"].compiled(model, arguments)  # (before no_xla sets jit_compile)
        no_xla.prepare_compile(arguments, self.settings.allow_xla)

    def _prepare_fit(self, model, arguments: dict) -> None:
        fit_setup.prepare(model, self, arguments)

    def _fit_failed(self, error: Exception) -> None:
        pass  # on one machine TensorFlow's error says what it has to say

    @functools.cached_property
    def _choices(self) -> dict:
        """The start-up choices fit runs, in order (fit_setup.startup_choices)."""
        return fit_setup.startup_choices(self)

    def _own_choices(self) -> dict:
        """The choices this class adds (fit_setup.startup_choices)."""
        return {}

    def _micro_batch_train_step(self, model, data):
        return micro_batches_lib.train_step(model, data, self)

    def _reducing_gradients(self):
        return self._host_ops.reducing_gradients()

    def _apply_once(self, optimizer, run, grads, variables, *, loss_scaled: bool = False) -> None:
        """One merge: the concept sums the gradients (or the fused update takes
        them unsummed) and `run` runs inside the concept's optimizer step."""
        no_xla.check_not_in_xla()
        concept = self.update_concept

        def merge_fn(strategy, grads):
            grads = list(grads)
            keras_variables = list(variables) if variables is not None else compat.built_variables(optimizer)
            if not self._takes_gradients_unsummed(optimizer, keras_variables, loss_scaled):
                grads = concept.sum_gradients(self, grads, loss_scaled)
            else:
                # Unsummed gradients are per replica, even where a worker has
                # one replica (whose merge receives plain tensors): the fused
                # update tells them from sums by that, and sums them, across
                # the workers too (fused_host_step.apply).
                grads = [g if isinstance(g, tf.distribute.DistributedValues) or g is None
                         else compat.per_replica_class()((g,)) for g in grads]
            with concept.optimizer_step(self, optimizer, keras_variables):
                run(grads, variables)

        # (A gradient that is one tensor object shared by every replica, made
        # outside the replicas' function, reaches the merge as one value and
        # is counted once, as in stock MirroredStrategy's all-reduce.)
        tf.distribute.get_replica_context().merge_call(merge_fn, args=(list(grads),))

    def _build_outside_the_trace(self, optimizer, variables) -> None:
        """Builds an optimizer met unbuilt in the replicas' step (a custom loop's
        first `apply_gradients`) in this scope, outside any trace, as `fit` does: a
        traced `build`'s writes (ScheduleFreeAdamW copies the weights into its
        momentum) would be lost (plain Keras on one device loses them too)."""

        def build(strategy):
            if optimizer.built:
                return
            with tf.init_scope(), self.scope(), keras.name_scope(optimizer.name, caller=optimizer):
                optimizer.build(list(variables))
            optimizer.built = True

        tf.distribute.get_replica_context().merge_call(build)

    def _fuses_update_here(self, optimizer, variables) -> bool:
        return self._fuses_update(optimizer, variables) and self.extended.in_host_update()

    def _handled_update(self, optimizer, grads, variables) -> bool:
        if not self._fuses_update_here(optimizer, variables):
            return False
        fused_host_step.apply(self, optimizer, grads, variables)
        return True

    # -- the concept's optimizer step ----------------------------------------
    def _fuses_update(self, optimizer, variables) -> bool:
        """Whether the concept's step runs tf_glp's fused update for this optimizer."""
        return self.update_concept.steps_on_host and supports_fused_update(
            optimizer, variables, update_step_only=True)[0]

    def _takes_gradients_unsummed(self, optimizer, variables, loss_scaled: bool) -> bool:
        """Whether Keras passes the gradients untouched to the fused update
        (no unscaling, clipping or accumulation first): then the fused pass
        reads each replica's gradient itself and sums it on the fly."""
        return (not loss_scaled and self._fuses_update(optimizer, variables)
                and changes_gradients(optimizer) is None
                and not any(getattr(v, "overwrite_with_gradient", False) for v in variables))

