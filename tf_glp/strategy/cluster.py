"""Joining a cluster of workers: TF_CONFIG or a cluster resolver read and
checked, the coordination service configured, the start-up bounded, and a
worker lost during training named.

TensorFlow's own start-up waits for every worker without a limit and cannot
be interrupted; a worker started with a wrong TF_CONFIG or a busy port would
hang or fail with an error naming nothing. Here each of those is named, and
the wait ends after TF_GLP_CLUSTER_TIMEOUT seconds (multi_worker_strategy.py starts
the cluster through `starting`).

Once started, a worker that dies is seen by the others when the coordination
service misses its heartbeat for TF_GLP_HEARTBEAT_TIMEOUT seconds, or sooner
where a collective's connection to it breaks; TensorFlow then aborts every
collective with an error that names the task among lines of gRPC detail, and
`lost_worker_error` says which worker (task and address) and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import subprocess
import sys

import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.strategy import resolvers

# How long a worker waits for the others at start-up before it stops with a
# message naming the silent ones (_bounded_start), and the coordination
# service's register timeout. TF_GLP_CLUSTER_TIMEOUT (seconds) overrides it.
# Ten minutes: pods of one job start minutes apart (image pulls, no gang
# scheduling); tf_glp.launch, whose workers start together, sets 60.
DEFAULT_CLUSTER_TIMEOUT_S = 600
# How long the coordination service waits for a started worker's heartbeat
# (and at shutdown) before it fails the others: a dead worker is seen in
# about a minute, whatever the start-up allowance. TF_GLP_HEARTBEAT_TIMEOUT
# (seconds) overrides it: shorter for tests, longer for workers that may stall
# (a long garbage collection, a saturated network) without being dead.
DEFAULT_HEARTBEAT_TIMEOUT_S = 60


def positive_env(name: str, default, convert=float, what: str = "a number > 0"):
    """The environment variable `name` (`default` when unset) converted by
    `convert`; ValueError "`name` must be `what`" unless it is > 0."""
    text = os.environ.get(name, str(default))
    try:
        value = convert(text)
    except ValueError:
        value = 0
    if not value > 0:
        raise ValueError(f"{name} must be {what}, got {text!r}")
    return value


def cluster_timeout_s() -> float:
    return positive_env("TF_GLP_CLUSTER_TIMEOUT", DEFAULT_CLUSTER_TIMEOUT_S, what="a number of seconds > 0")


def heartbeat_timeout_s() -> float:
    return positive_env("TF_GLP_HEARTBEAT_TIMEOUT", DEFAULT_HEARTBEAT_TIMEOUT_S, what="a number of seconds > 0")


def check_tf_config(text: str) -> None:
    """Parses TF_CONFIG and checks what a worker needs from it, with an
    error that names the problem (TensorFlow's own errors come later, and
    some as hangs)."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON ({error.msg} at character {error.pos}): {text!r}") from None
    if isinstance(config, dict) and "sparseCluster" in config and "cluster" not in config:
        raise ValueError("TF_CONFIG has the 'sparseCluster' form (a TFJob with enableDynamicWorker), which lists "
                         "only this worker's own address; tf_glp.Strategy's all-reduce needs every worker's. "
                         "Set enableDynamicWorker: false in the TFJob, or give a full 'cluster'.")
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise ValueError(f"TF_CONFIG must be a JSON object with a 'cluster' object, got {text!r}")
    cluster, task = config["cluster"], config.get("task")
    if "chief" not in cluster and "worker" not in cluster:
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


def resolve_cluster(cluster_resolver=None):
    """The cluster this process belongs to: `cluster_resolver` if given,
    else TF_CONFIG's when it names a cluster, else TF_GLP_WORKER_HOSTS's
    (tf_glp.environment_cluster(): the host list a Kubernetes Indexed Job's
    manifest sets, with the pod's index), else None (one machine)."""
    if cluster_resolver is not None:
        if not isinstance(cluster_resolver, tf.distribute.cluster_resolver.ClusterResolver):
            raise ValueError(f"cluster_resolver must be a tf.distribute.cluster_resolver.ClusterResolver, "
                             f"got {type(cluster_resolver).__name__}")
        return cluster_resolver
    text = os.environ.get("TF_CONFIG", "").strip()
    if text:
        check_tf_config(text)
        return tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if os.environ.get(resolvers.HOSTS_VARIABLE, "").strip():
        return resolvers.environment_cluster()
    return None


def worker_count(cluster_resolver) -> int:
    """How many workers (tasks of the "chief" and "worker" jobs) the cluster has."""
    cluster_spec = compat.normalized_cluster_spec(cluster_resolver)
    return sum(cluster_spec.num_tasks(job) for job in ("chief", "worker") if job in cluster_spec.jobs)


def _addresses(cluster_resolver) -> dict[tuple[str, int], str]:
    """(job, index) -> "host:port" of every task in the cluster."""
    return {(job, index): address
            for job, tasks in cluster_resolver.cluster_spec().as_dict().items()
            for index, address in (tasks.items() if isinstance(tasks, dict) else enumerate(tasks))}


def _check_port_free(address: str, port_origin: str | None = None) -> None:
    """Stops a worker whose port is taken. Binds as TensorFlow's gRPC server
    binds (every interface, the port only), so a host name that does not
    resolve yet (a pod's DNS name) passes as it would there; only "address
    in use" is fatal. `port_origin`: where the port came from and what to do
    (a resolver's `port_origin`, e.g. tf_glp.slurm_cluster()'s)."""
    port = address.rpartition(":")[2]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As gRPC binds: a port left in TIME_WAIT by a previous run is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", int(port)))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                return
            if port_origin:
                raise RuntimeError(f"tf_glp.Strategy: this worker's address {address} cannot be used: port {port} "
                                   f"cannot be bound ({error.strerror}). {port_origin}") from None
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
    """Past `timeout_s`, a watchdog process (`_WATCHDOG`) prints which
    workers did not answer and kills this one (SIGKILL: the start-up's wait
    ignores SIGTERM)."""
    watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(timeout_s),
                                 json.dumps(peers)], stdin=subprocess.PIPE)
    try:
        yield
    finally:
        watchdog.stdin.close()
        watchdog.wait()


# What TensorFlow 2.21's errors on a surviving worker say of the lost one:
# the coordination service's list of workers whose heartbeat stopped; the
# task a collective's RPC went to when its connection broke; this worker's
# own heartbeat to the service timing out (the service's task is lost).
_TASK_NAME = re.compile(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)")
_UNHEALTHY = re.compile(r"stopped sending heartbeats\):((?:\s*/job:\w+(?:/replica:\d+)?/task:\d+)+)")
_REMOTE = re.compile(r"from remote target (/job:\w+(?:/replica:\d+)?/task:\d+)")
_OWN_HEARTBEAT = "RPC: /tensorflow.CoordinationService/Heartbeat"


def lost_worker_error(error: Exception, cluster_resolver, worker_id: int) -> RuntimeError | None:
    """For `error` (a tf.errors.UnavailableError or DeadlineExceededError out
    of training across workers): a RuntimeError naming the workers it says
    were lost (TensorFlow's task names, with their addresses) and what to
    do; None where it says no other worker of the cluster was."""
    message = getattr(error, "message", str(error))
    timeout = f"within TF_GLP_HEARTBEAT_TIMEOUT seconds, default {DEFAULT_HEARTBEAT_TIMEOUT_S}"
    if unhealthy := _UNHEALTHY.search(message):
        named, how = unhealthy.group(1), f"no heartbeat from it reached the coordination service {timeout}"
    elif _OWN_HEARTBEAT in message:
        named = compat.coordination_leader(cluster_resolver)
        how = f"it runs the coordination service, which did not answer this worker's heartbeat {timeout}"
    elif remote := _REMOTE.search(message):
        named, how = remote.group(1), "a collective's connection to it broke"
    else:
        return None
    addresses = _addresses(cluster_resolver)
    own = (cluster_resolver.task_type, cluster_resolver.task_id)
    lost = sorted({(job, int(index)) for job, index in _TASK_NAME.findall(named)} & addresses.keys() - {own})
    if not lost:
        return None
    workers = ", ".join(f"/job:{job}/task:{index} ({addresses[job, index]})" for job, index in lost)
    return RuntimeError(f"tf_glp.Strategy (worker {worker_id}): the worker{'s' if len(lost) > 1 else ''} {workers} "
                        f"stopped answering during training ({how}). The other workers cannot go on without it, "
                        f"and TensorFlow's collectives cannot restart in this process: restart every worker of the "
                        f"job (with keras.callbacks.BackupAndRestore, fit resumes from its last backup).")


# The addresses whose server this process started: a later strategy in the
# same process (a loop over models) joins the same cluster through it.
_STARTED: set[str] = set()


def serving(cluster_resolver) -> bool:
    """Whether this process already runs the server of its address in
    `cluster_resolver`'s cluster (an earlier strategy started it)."""
    return _addresses(cluster_resolver).get((cluster_resolver.task_type, cluster_resolver.task_id)) in _STARTED


@contextlib.contextmanager
def starting(cluster_resolver):
    """Around TensorFlow's cluster start-up (the multi-worker extended object's constructor)."""
    addresses = _addresses(cluster_resolver)
    own = addresses.get((cluster_resolver.task_type, cluster_resolver.task_id))
    if own in _STARTED:
        yield  # this process's server runs already: nothing to start or wait for
        return
    if own is not None:
        _check_port_free(own, getattr(cluster_resolver, "port_origin", None))
    # The coordination service as MultiWorkerMirroredStrategy configures it; in TensorFlow 2.21
    # its register timeout was seen not to bound the start-up wait: _bounded_start does.
    timeout_s = cluster_timeout_s()
    compat.configure_coordination_service(cluster_resolver, int(timeout_s * 1000),
                                          max(1, round(heartbeat_timeout_s() * 1000)))
    with _bounded_start(sorted(set(addresses.values()) - {own}), timeout_s):
        try:
            yield
            if own is not None:
                _STARTED.add(own)
        except tf.errors.UnknownError as error:
            raise RuntimeError(f"tf_glp.Strategy: this worker could not start its server at {own} "
                               f"({error.message}); is the port in use?") from error
