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
they live in `_MultiWorkerKerasFixes.reduce` (strategy.py) and nowhere else.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import zlib

import tensorflow as tf
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.distribute import collective_all_reduce_strategy as collective_lib
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.eager import context as eager_context
from tensorflow.python.ops import collective_ops

from tf_glp import _keras_compat
from tf_glp.strategy.cross_device_ops import HostCrossDeviceOps
from tf_glp.strategy.host_copies import HostUpdateExtended

# How long a worker waits for the others at start-up before it stops with a
# message naming the silent ones (_bounded_start), and the coordination
# service's timeouts. TF_GLP_CLUSTER_TIMEOUT (seconds) overrides it.
DEFAULT_CLUSTER_TIMEOUT_S = 60


def cluster_timeout_s() -> float:
    text = os.environ.get("TF_GLP_CLUSTER_TIMEOUT", str(DEFAULT_CLUSTER_TIMEOUT_S))
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"TF_GLP_CLUSTER_TIMEOUT must be a number of seconds > 0, got {text!r}")
    return value


def check_tf_config(text: str) -> dict:
    """Parses TF_CONFIG and checks what a worker needs from it, with an
    error that names the problem (TensorFlow's own errors come later, and
    some as hangs)."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON ({error.msg} at character {error.pos}): {text!r}") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise ValueError(f"TF_CONFIG must be a JSON object with a 'cluster' object, got {text!r}")
    cluster, task = config["cluster"], config.get("task")
    workers = [job for job in ("chief", "worker") if job in cluster]
    if not workers:
        raise ValueError(f"TF_CONFIG's cluster has no 'worker' or 'chief' job: {cluster!r}")
    for job, addresses in cluster.items():
        if not isinstance(addresses, list) or not addresses:
            raise ValueError(f"TF_CONFIG's cluster job {job!r} must be a non-empty list of 'host:port', "
                             f"got {addresses!r}")
        for address in addresses:
            host, _, port = str(address).rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"TF_CONFIG's cluster job {job!r} has an address {address!r} that is not "
                                 f"'host:port' with a port in 1..65535")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ValueError(f"TF_CONFIG must have a 'task' with 'type' and 'index', got {task!r}")
    if task["type"] not in cluster:
        raise ValueError(f"TF_CONFIG's task type {task['type']!r} is not a job of the cluster "
                         f"({', '.join(cluster)})")
    index = task["index"]
    if not isinstance(index, int) or not 0 <= index < len(cluster[task["type"]]):
        raise ValueError(f"TF_CONFIG's task index {index!r} is out of range for job {task['type']!r} "
                         f"with {len(cluster[task['type']])} tasks")
    return config


def resolve_cluster(cluster_resolver=None):
    """The cluster this process belongs to: `cluster_resolver` if given,
    else TF_CONFIG's when it names a cluster, else None (one machine)."""
    if cluster_resolver is not None:
        if not isinstance(cluster_resolver, tf.distribute.cluster_resolver.ClusterResolver):
            raise ValueError(f"cluster_resolver must be a tf.distribute.cluster_resolver.ClusterResolver, "
                             f"got {type(cluster_resolver).__name__}")
        return cluster_resolver
    text = os.environ.get("TF_CONFIG", "").strip()
    if not text:
        return None
    check_tf_config(text)
    return tf.distribute.cluster_resolver.TFConfigClusterResolver()


def worker_count(cluster_resolver) -> int:
    """How many workers (tasks of the "chief" and "worker" jobs) the cluster has."""
    cluster_spec = multi_worker_util.normalize_cluster_spec(cluster_resolver.cluster_spec())
    return sum(cluster_spec.num_tasks(job) for job in ("chief", "worker") if job in cluster_spec.jobs)


def configure_coordination(cluster_resolver) -> None:
    """Configures the coordination service as MultiWorkerMirroredStrategy
    would, with TF_GLP_CLUSTER_TIMEOUT as its register, heartbeat and
    shutdown timeouts. (In TensorFlow 2.21 the register timeout was seen not
    to bound the start-up wait: _bounded_start does.)"""
    if eager_context.context().coordination_service is not None:
        return
    cluster_spec = multi_worker_util.normalize_cluster_spec(cluster_resolver.cluster_spec())
    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
            for job in ("chief", "worker") if job in cluster_spec.jobs]
    timeout_ms = int(cluster_timeout_s() * 1000)
    eager_context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster_spec),
        coordinated_jobs=jobs,
        cluster_register_timeout_in_ms=timeout_ms,
        heartbeat_timeout_in_ms=timeout_ms,
        shutdown_barrier_timeout_in_ms=timeout_ms,
    )


def _addresses(cluster_resolver) -> dict[tuple[str, int], str]:
    """(job, index) -> "host:port" of every task in the cluster."""
    return {(job, index): address
            for job, tasks in cluster_resolver.cluster_spec().as_dict().items()
            for index, address in (tasks.items() if isinstance(tasks, dict) else enumerate(tasks))}


def _check_port_free(address: str) -> None:
    host, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As gRPC binds: a port left in TIME_WAIT by a previous run is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("" if host in ("localhost", "127.0.0.1", "0.0.0.0") else host, int(port)))
        except OSError as error:
            raise RuntimeError(f"tf_glp.Strategy: this worker's address {address} (from TF_CONFIG or the "
                               f"cluster resolver) cannot be used: port {port} cannot be bound ({error.strerror}). "
                               f"Free the port or give this worker another one.") from None


# Run in a child process: TensorFlow's cluster start-up holds the GIL while it
# waits, so no thread of this process could act.
_WATCHDOG = """
import json, os, select, signal, socket, sys
parent, timeout_s, peers = int(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3])
if select.select([sys.stdin], [], [], timeout_s)[0]:
    sys.exit(0)  # the parent started (or died): its end of the pipe closed
def reachable(address):
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1.0).close()
        return True
    except OSError:
        return False
silent = [a for a in peers if not reachable(a)]
detail = ("no worker answers at " + ", ".join(silent) if silent else
          "every worker's address answers, but not every worker joined (started with another TF_CONFIG cluster?)")
sys.stderr.write("tf_glp.Strategy: the cluster did not start within %g s (TF_GLP_CLUSTER_TIMEOUT): %s. "
                 "Start every worker with the same cluster and its own task index; stopping this worker.\\n"
                 % (timeout_s, detail))
sys.stderr.flush()
os.kill(parent, signal.SIGKILL)
"""


@contextlib.contextmanager
def _bounded_start(peers: list[str], timeout_s: float):
    """Bounds TensorFlow's cluster start-up, which waits for every worker
    without a limit and cannot be interrupted (it holds the GIL and ignores
    SIGTERM while it waits): past `timeout_s`, a watchdog process prints
    which workers did not answer and kills this one."""
    watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(timeout_s),
                                 json.dumps(peers)], stdin=subprocess.PIPE)
    try:
        yield
    finally:
        watchdog.stdin.close()
        watchdog.wait()


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
        return [r.values[0] if isinstance(r, values_lib.DistributedValues) else r for r in results]

    def gather(self, value):
        """Every worker's `value` (a host tensor of the same shape on every
        worker), concatenated along axis 0 in worker order: one collective."""
        with tf.device(self.host_device):
            value = tf.identity(value)
        result = _keras_compat.gather(self._collective_ops, value, value, 0,
                                      tf.distribute.experimental.CommunicationOptions())
        return result.values[0] if isinstance(result, values_lib.DistributedValues) else result


class CollectiveHostExtended(collective_lib.CollectiveAllReduceExtended):
    """MultiWorkerMirroredStrategy's extended object with tf_glp's local
    replicas and hierarchical reductions (see the module docstring)."""

    def __init__(self, container_strategy, cluster_resolver, local_devices: list[str],
                 host_ops: HostCrossDeviceOps):
        self._glp_local_devices = [tf.DeviceSpec.from_string(d) for d in local_devices]
        addresses = _addresses(cluster_resolver)
        own = addresses.get((cluster_resolver.task_type, cluster_resolver.task_id))
        if own is not None:
            _check_port_free(own)
        configure_coordination(cluster_resolver)
        with _bounded_start(sorted(set(addresses.values()) - {own}), cluster_timeout_s()):
            try:
                super().__init__(container_strategy, cluster_resolver=cluster_resolver,
                                 communication_options=tf.distribute.experimental.CommunicationOptions(
                                     implementation=tf.distribute.experimental.CommunicationImplementation.RING))
            except tf.errors.UnknownError as error:
                raise RuntimeError(f"tf_glp.Strategy: this worker could not start its server at {own} "
                                   f"({error.message}); is the port in use?") from error
        # Gathers (predict's results across workers) stay TensorFlow's.
        self._collective_ops = self._cross_device_ops
        # In full (with replica:0): TensorFlow compares device strings when it
        # decides whether a batch of values can share one collective.
        host_device = tf.DeviceSpec.from_string(f"{self._worker_device}/device:CPU:0").replace(replica=0).to_string()
        host_ops.span_workers(host_device, WorkerSum(self._host_cross_device_ops, self._num_workers, host_device))
        self._cross_device_ops = host_ops

    def _initialize_local_devices(self, cluster_resolver, worker_device):
        kinds = {spec.device_type for spec in self._glp_local_devices}
        names = tuple(f"{worker_device}/device:{spec.device_type}:{spec.device_index or 0}"
                      for spec in self._glp_local_devices)
        return names, kinds.pop() if len(kinds) == 1 else "CPU"

    def _get_variable_creator_initial_value(self, replica_id, device, primary_var, **kwargs):
        create = super()._get_variable_creator_initial_value
        if replica_id != 0 or self._num_workers == 1:
            return create(replica_id=replica_id, device=device, primary_var=primary_var, **kwargs)

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
            return create(replica_id=replica_id, device=device, primary_var=primary_var,
                          **dict(kwargs, initial_value=value))()

        return initial_value_fn

    def check_same_on_every_worker(self, values: list[int], message: str, device: str | None = None) -> None:
        """Raises ValueError(message) when the workers' integers differ (one
        collective of 2 x len(values) integers; eager only). `message` may
        name {low} and {high}, the smallest and largest values seen."""
        device = device or self._cross_device_ops.host_device
        group_key = self._collective_keys.get_group_key([device])
        instance_key = self._collective_keys.get_instance_key(group_key, device)
        with tf.device(device):
            mine = tf.constant(list(values) + [-v for v in values], tf.int64)
            extremes = collective_ops.all_reduce_v2(mine, self._num_workers, group_key, instance_key,
                                                    merge_op="Max", final_op="Id",
                                                    timeout=cluster_timeout_s()).numpy().tolist()
        count = len(values)
        high, low = extremes[:count], [-v for v in extremes[count:]]
        if high != low:
            low, high = (low[0], high[0]) if count == 1 else (low, high)
            raise ValueError(f"tf_glp.Strategy (worker {self._id_in_cluster}): "
                             + message.format(low=low, high=high))

    def agree_with_the_chief(self, values: list[int]) -> list[int]:
        """The chief's integers, on every worker (one collective sum to which
        the other workers give zeros; eager only). No timeout: a worker may
        still be profiling while the chief reused a plan."""
        device = self._cross_device_ops.host_device
        group_key = self._collective_keys.get_group_key([device])
        instance_key = self._collective_keys.get_instance_key(group_key, device)
        with tf.device(device):
            mine = tf.constant(list(values) if self._is_chief else [0] * len(values), tf.int64)
            return collective_ops.all_reduce_v2(mine, self._num_workers, group_key, instance_key,
                                                merge_op="Add", final_op="Id").numpy().tolist()

    def _gather_to_implementation(self, value, destinations, axis, options):
        ops = self._collective_ops if self._get_cross_device_ops(value) is self._cross_device_ops \
            else self._host_cross_device_ops
        return _keras_compat.gather(ops, value, destinations, axis, options)

    @property
    def num_workers(self) -> int:
        return self._num_workers


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
