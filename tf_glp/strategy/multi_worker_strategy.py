"""Beyond one machine: tf_glp.Strategy across workers, on TensorFlow's collectives.

    # on every worker, with TF_CONFIG set (or: python -m tf_glp.launch --workers 2 train.py)
    with tf_glp.Strategy().scope():
        model = ...; model.compile(...)
    model.fit(...)

Hierarchical: inside each worker the host sums that worker's replicas chunk
by chunk, exactly as on one machine (HostCrossDeviceOps); each chunk's sums
then cross the workers in one collective all-reduce, TensorFlow's own
CollectiveReduceV2 (ring over gRPC, the engine of MultiWorkerMirroredStrategy),
so a chunk's cross-worker sum starts as soon as its local sum exists. Every
worker receives the same bytes from the ring, so all workers apply the same
update and hold bitwise identical variables: with update="host" each worker's
host applies it to its own copy (MultiWorkerHostExtended), with
update="replicas" every replica does.

The cluster itself (gRPC server, collective group keys, coordination
service, input sharding per worker, initial values broadcast from the
chief) is MultiWorkerMirroredStrategy's: `CollectiveHostExtended` is its
extended object with two changes, the local replicas (tf_glp's logical CPU
replicas or the GPUs) and the reductions (the hierarchical ones above).
Keras 3.15 needs two workarounds to train under any multi-worker strategy;
they live in `MultiWorkerKerasFixes.reduce` (below) and nowhere else.
"""

from __future__ import annotations

import itertools
import zlib

import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.strategy import cluster, concepts
from tf_glp.strategy.cross_device_ops import HostCrossDeviceOps
from tf_glp.strategy.host_copies import HostUpdateExtended
from tf_glp.strategy.strategy import WORKERS, Strategy


class WorkerSum:
    """Sums host values across the workers: one collective all-reduce per
    call for the dense values (packed into one), over the group of the
    workers' hosts; sparse values (IndexedSlices) are gathered. `gather`
    concatenates a value's copies in worker order (micro_batches.py)."""

    def __init__(self, collective_ops, num_workers: int, host_device: str):
        self._collective_ops = collective_ops  # CollectiveAllReduce over [this worker's host]
        self.num_workers = num_workers
        self.host_device = host_device

    def __call__(self, values: list) -> list:
        if not values:
            return []
        # TensorFlow packs a batch into one collective only when every value
        # sits on the first value's device and is its own destination.
        with tf.device(self.host_device):
            values = [v if isinstance(v, tf.IndexedSlices) else tf.identity(v) for v in values]
        results = self._collective_ops.batch_reduce(tf.distribute.ReduceOp.SUM, [(v, v) for v in values])
        return [r.values[0] if isinstance(r, tf.distribute.DistributedValues) else r for r in results]

    def gather(self, value):
        """Every worker's `value` (a host tensor of the same shape on every
        worker), concatenated along axis 0 in worker order: one collective."""
        with tf.device(self.host_device):
            value = tf.identity(value)
        result = compat.gather(self._collective_ops, value, value, 0, tf.distribute.experimental.CommunicationOptions())
        return result.values[0] if isinstance(result, tf.distribute.DistributedValues) else result


class CollectiveHostExtended(compat.collective_extended_class()):
    """MultiWorkerMirroredStrategy's extended object with tf_glp's local
    replicas and hierarchical reductions (see the module docstring)."""

    def __init__(self, container_strategy, cluster_resolver, local_devices: list[str],
                 host_ops: HostCrossDeviceOps):
        self._glp_local_devices = [tf.DeviceSpec.from_string(d) for d in local_devices]
        if cluster.serving(cluster_resolver):
            compat.reuse_collective_server(self)  # another strategy in this process started it
        with cluster.starting(cluster_resolver):
            super().__init__(container_strategy, cluster_resolver=cluster_resolver,
                             communication_options=tf.distribute.experimental.CommunicationOptions(
                                 implementation=tf.distribute.experimental.CommunicationImplementation.RING))
        self._glp_worker = compat.collective_worker(self)
        # In full (with replica:0): TensorFlow compares device strings when it
        # decides whether a batch of values can share one collective.
        host_device = tf.DeviceSpec.from_string(f"{self._glp_worker.worker_device}/device:CPU:0").replace(
            replica=0).to_string()
        # The reductions become tf_glp's hierarchical ones; gathers
        # (predict's results across workers) stay TensorFlow's.
        self._glp_collective_ops, host_collective_ops = compat.replace_cross_device_ops(self, host_ops)
        self._glp_host_collective_ops = host_collective_ops
        host_ops.span_workers(host_device, WorkerSum(host_collective_ops, self._glp_worker.num_workers, host_device))
        self._glp_host_ops = host_ops

    def _initialize_local_devices(self, cluster_resolver, worker_device):
        kinds = {spec.device_type for spec in self._glp_local_devices}
        names = tuple(f"{worker_device}/device:{spec.device_type}:{spec.device_index or 0}"
                      for spec in self._glp_local_devices)
        return names, kinds.pop() if len(kinds) == 1 else "CPU"

    def _get_variable_creator_initial_value(self, replica_id, device, primary_var, **kwargs):
        if replica_id != 0 or self._glp_worker.num_workers == 1:
            return compat.collective_initial_value(self, replica_id=replica_id, device=device,
                                                   primary_var=primary_var, **kwargs)

        def initial_value_fn():
            # Checked before the chief broadcasts it: a broadcast between
            # different shapes fails with an error that names no variable.
            with tf.device(device):
                value = kwargs["initial_value"]
                value = value() if callable(value) else value
                value = tf.convert_to_tensor(getattr(value, "wrapped_value", value), dtype=kwargs.get("dtype"))
            if tf.executing_eagerly():
                signature = f"{tuple(value.shape)} {value.dtype.name}"
                self.check_same_on_every_worker(
                    [zlib.crc32(signature.encode())],
                    f"the workers create variable {kwargs.get('name')!r} with different shapes or dtypes "
                    f"(here: {signature}): were they started with different models?", device)
            return compat.collective_initial_value(self, replica_id=replica_id, device=device,
                                                   primary_var=primary_var, **dict(kwargs, initial_value=value))()

        return initial_value_fn

    @property
    def worker_id(self) -> int:
        """This worker's index in the cluster (the chief's is 0)."""
        return self._glp_worker.id_in_cluster

    def _extremes_on_workers(self, values: list[int], device: str | None = None) -> tuple[list, list]:
        """The smallest and the largest of each integer over the workers (one
        collective of 2 x len(values) integers; eager only)."""
        device = device or self._glp_host_ops.host_device
        extremes = compat.all_reduce_among_workers(self, list(values) + [-v for v in values], device, "Max",
                                                   cluster.cluster_timeout_s())
        count = len(values)
        return [-v for v in extremes[count:]], extremes[:count]

    def differing_on_workers(self, values: list[int]) -> list[int]:
        """The indices of the integers that are not the same on every worker
        (one collective; eager only, called by every worker at the same point)."""
        low, high = self._extremes_on_workers(values)
        return [i for i, (a, b) in enumerate(zip(low, high)) if a != b]

    def check_same_on_every_worker(self, values: list[int], message: str, device: str | None = None) -> None:
        """Raises ValueError(message) when the workers' integers differ (one
        collective of 2 x len(values) integers; eager only). `message` may
        name {low} and {high}, the smallest and largest values seen."""
        low, high = self._extremes_on_workers(values, device)
        if high != low:
            low, high = (low[0], high[0]) if len(values) == 1 else (low, high)
            raise ValueError(f"tf_glp.Strategy (worker {self.worker_id}): " + message.format(low=low, high=high))

    def agree_with_the_chief(self, values: list[int]) -> list[int]:
        """The chief's integers, on every worker (one collective sum to which
        the other workers give zeros; eager only). No timeout: a worker may
        still be profiling while the chief reused a plan."""
        mine = list(values) if self._glp_worker.is_chief else [0] * len(values)
        return compat.all_reduce_among_workers(self, mine, self._glp_host_ops.host_device, "Add")

    def most_on_workers(self, value: int) -> int:
        """The largest of the workers' integers (one collective; eager only,
        called by every worker at the same point)."""
        return int(compat.all_reduce_among_workers(self, [value], self._glp_host_ops.host_device, "Max")[0])

    def _gather_to_implementation(self, value, destinations, axis, options):
        ops = self._glp_host_collective_ops if compat.reduces_on_host(self, value) else self._glp_collective_ops
        return compat.gather(ops, value, destinations, axis, options)


class MultiWorkerHostExtended(HostUpdateExtended, CollectiveHostExtended):
    """update="host" across workers: MultiWorkerMirroredStrategy's variables
    with the host homes and host updates of one machine (host_copies.py).
    Each worker keeps one host copy of the optimizer state, initialised from
    the chief's and updated from the same cross-worker sums, so every
    worker's copies stay bitwise equal."""

    def __init__(self, container_strategy, cluster_resolver, local_devices, host_ops):
        super().__init__(container_strategy, cluster_resolver, local_devices, host_ops)
        self._init_host_update(host_ops.host_device)

    def _host_initial_value(self, kwargs: dict):
        # The chief's initial value, as for replicated variables.
        return self._get_variable_creator_initial_value(replica_id=0, device=self.host_device, primary_var=None,
                                                        **kwargs)


class MultiWorkerKerasFixes:
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


# (TensorFlow's own tests space strategies' keys the same way: strategy_combinations.py.)
_COLLECTIVE_KEY_BASES = itertools.count(0, 100_000)


class MultiWorkerReplicaStrategy(MultiWorkerKerasFixes, Strategy, tf.distribute.MultiWorkerMirroredStrategy,
                                 placement=WORKERS, serves=(concepts.REPLICAS,)):
    """tf_glp.Strategy with update="replicas" across workers (see the module
    docstring).

    `devices` / `cpu_replicas` name this worker's replicas; every worker
    must have the same number."""

    _extended_class = CollectiveHostExtended

    def _init_distribution(self) -> None:
        resolver = cluster.resolve_cluster(self.settings.cluster_resolver)
        # Collective keys of their own: a later strategy in this process (a
        # loop over models) would otherwise reuse the earlier one's group keys,
        # and a group of another size is refused ("joining a group with size 4,
        # but that group has size 2", seen with 1 then 2 replicas per worker).
        # Every worker creates its strategies in the same order, so the
        # workers' keys agree.
        compat.set_collective_key_base(self, next(_COLLECTIVE_KEY_BASES))
        devices = self._set_up(workers=cluster.worker_count(resolver))
        tf.distribute.Strategy.__init__(self, self._extended_class(self, resolver, devices, self._host_ops))

    def _fit_failed(self, error: Exception) -> None:
        lost = cluster.lost_worker_error(error, self.cluster_resolver, self.extended.worker_id)
        if lost is not None:
            raise lost from error


class MultiWorkerHostStrategy(MultiWorkerReplicaStrategy, placement=WORKERS,
                              serves=(concepts.HOST, concepts.AUTO)):
    """tf_glp.Strategy with update="host" across workers (see the module
    docstring). update="auto" across workers runs this concept, not
    measured yet (explain() says so)."""

    _extended_class = MultiWorkerHostExtended
