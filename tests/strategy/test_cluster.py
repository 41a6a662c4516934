"""Joining a cluster (tf_glp/strategy/cluster.py): a worker that never
comes, a port in use, a malformed TF_CONFIG and a bad timeout each stop the
worker within a bounded time with a message naming the problem; a worker
lost during training is named from TensorFlow's error (end to end, a killed
worker: test_multi_worker.py)."""

import io
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tf_glp import launch
from tf_glp.strategy import cluster, devices
from tf_glp.strategy.settings import Settings


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", **extra)
    return env


def _run_strategy(tf_config, timeout_s=3):
    code = ("import tf_glp\n"
            "tf_glp.Strategy(update='replicas', cpu_replicas=1)\n"
            "print('started')\n")
    return subprocess.run([sys.executable, "-c", code], env=_env(TF_CONFIG=json.dumps(tf_config),
                                                                  TF_GLP_CLUSTER_TIMEOUT=str(timeout_s)),
                          capture_output=True, text=True, timeout=120)


def test_a_worker_that_never_comes_is_named_within_the_timeout():
    ports = launch.free_ports(2)
    config = json.loads(launch.tf_config(ports, 0))
    start = time.monotonic()
    done = _run_strategy(config)
    assert done.returncode == -9  # stopped by the start-up watchdog
    assert (f"the cluster did not start within 3 s (TF_GLP_CLUSTER_TIMEOUT): no worker answers at "
            f"127.0.0.1:{ports[1]}") in done.stderr
    assert time.monotonic() - start < 60


def test_a_port_in_use_is_named():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _run_strategy({"cluster": {"worker": [f"127.0.0.1:{port}"]}, "task": {"type": "worker", "index": 0}})
    assert done.returncode == 1
    assert f"this worker's address 127.0.0.1:{port}" in done.stderr and "cannot be bound" in done.stderr


@pytest.mark.parametrize("text, message", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ('{"task": {"type": "worker", "index": 0}}', "must be a JSON object with a 'cluster' object"),
    ('{"cluster": {"ps": ["h:1"]}, "task": {"type": "ps", "index": 0}}', "has no 'worker' or 'chief' job"),
    ('{"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}', "must be a non-empty list"),
    ('{"cluster": {"worker": ["localhost"]}, "task": {"type": "worker", "index": 0}}', "is not 'host:port'"),
    ('{"cluster": {"worker": ["h:70000"]}, "task": {"type": "worker", "index": 0}}', "is not 'host:port'"),
    ('{"cluster": {"worker": ["h:1"]}}', "must have a 'task' with 'type' and 'index'"),
    ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "chief", "index": 0}}', "is not a job of the cluster"),
    ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 1}}', "index 1 is out of range"),
    # A TFJob with enableDynamicWorker: only this worker's own address.
    ('{"sparseCluster": {"worker": {"1": "w1:2222"}}, "task": {"type": "worker", "index": 1}}',
     "has the 'sparseCluster' form (a TFJob with enableDynamicWorker)"),
])
def test_malformed_tf_config_is_named(monkeypatch, text, message):
    monkeypatch.setenv("TF_CONFIG", text)
    import tf_glp

    with pytest.raises(ValueError) as error:
        tf_glp.Strategy(update="replicas")
    assert message in str(error.value)


def test_an_unresolvable_pod_name_passes_the_port_check_as_tensorflow_would_start():
    # A pod's DNS name does not resolve until the pod runs; TensorFlow's
    # server binds every interface, so only a port in use stops the worker.
    port = launch.free_ports(1)[0]
    cluster._check_port_free(f"myjob-worker-0.default.svc.invalid:{port}")
    with socket.socket() as busy:
        busy.bind(("", port))
        busy.listen()
        with pytest.raises(RuntimeError, match=f"port {port} cannot be bound"):
            cluster._check_port_free(f"myjob-worker-0.default.svc.invalid:{port}")


def test_the_start_up_timeout_suits_pods_starting_minutes_apart(monkeypatch):
    monkeypatch.delenv("TF_GLP_CLUSTER_TIMEOUT", raising=False)
    assert cluster.cluster_timeout_s() == 600
    # tf_glp.launch's workers start together: it asks for a minute, unless told.
    out = io.StringIO()
    code = "import os; print(os.environ['TF_GLP_CLUSTER_TIMEOUT'])"
    assert launch.launch(1, [sys.executable, "-c", code], out=out, err=out, env=_env()) == 0
    assert "[worker 0] 60" in out.getvalue()
    out = io.StringIO()
    assert launch.launch(1, [sys.executable, "-c", code], out=out, err=out, env=_env(TF_GLP_CLUSTER_TIMEOUT="5")) == 0
    assert "[worker 0] 5" in out.getvalue()


def test_a_cpu_worker_trains_one_replica_by_default_and_explain_says_why(monkeypatch):
    # (End to end, explain()'s line on 2 Ray workers: tests/ray's example test.)
    monkeypatch.delenv("TF_GLP_CPU_REPLICAS", raising=False)
    assert devices.default_devices(None, across_workers=True) == ["/cpu:0"]
    assert devices.replicas_reason(Settings(), across_workers=True) == (
        "no GPU and no replica count given: one per worker")
    monkeypatch.setenv("TF_GLP_CPU_REPLICAS", "2")
    assert devices.default_devices(None, across_workers=True) == ["/cpu:0", "/cpu:1"]
    assert devices.replicas_reason(Settings(), across_workers=True) == "TF_GLP_CPU_REPLICAS=2"
    assert devices.replicas_reason(Settings(cpu_replicas=3), across_workers=True) == "cpu_replicas=3"


def test_cluster_timeout_must_be_positive(monkeypatch):
    monkeypatch.setenv("TF_GLP_CLUSTER_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="TF_GLP_CLUSTER_TIMEOUT must be a number of seconds > 0, got 'soon'"):
        cluster.cluster_timeout_s()


def test_heartbeat_timeout_defaults_to_a_minute_and_must_be_positive(monkeypatch):
    monkeypatch.delenv("TF_GLP_HEARTBEAT_TIMEOUT", raising=False)
    assert cluster.heartbeat_timeout_s() == 60
    monkeypatch.setenv("TF_GLP_HEARTBEAT_TIMEOUT", "2.5")
    assert cluster.heartbeat_timeout_s() == 2.5
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv("TF_GLP_HEARTBEAT_TIMEOUT", bad)
        with pytest.raises(ValueError, match=f"TF_GLP_HEARTBEAT_TIMEOUT must be a number of seconds > 0, got '{bad}'"):
            cluster.heartbeat_timeout_s()


# TensorFlow 2.21's errors on a surviving worker (shortened), seen with one
# of two workers SIGKILLed or SIGSTOPped mid-fit: worker 1 dead or stopped,
# worker 0's heartbeat check; the chief dead, worker 1's pending collective;
# the chief stopped (it runs the coordination service), worker 1's heartbeat.
_HEARTBEAT_LOST = (
    "Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks are unhealthy "
    "(stopped sending heartbeats):\n/job:worker/replica:0/task:1\nThe tasks have crashed. Check the task logs for "
    "an earlier error, or scheduler events (e.g. preemption, eviction) to debug further.\nThe error could be from a "
    "previous operation. Restart your program to reset.\n\t [[{{node CollectiveReduceV2}}]]")
_CONNECTION_LOST = (
    "Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC error information from remote "
    "target /job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/RecvBuf:\n:UNKNOWN:Error received "
    "from peer  {grpc_message:\"recvmsg:Connection reset by peer\", grpc_status:14}")

_LEADER_SILENT = ("Collective ops is aborted by: Deadline Exceeded\n\nRPC: /tensorflow.CoordinationService/Heartbeat\n"
                  "The error could be from a previous operation. Restart your program to reset.")


@pytest.mark.parametrize("task, message, dead, how", [
    (0, _HEARTBEAT_LOST, 1, "no heartbeat from it reached the coordination service within TF_GLP_HEARTBEAT_TIMEOUT"),
    (1, _CONNECTION_LOST, 0, "a collective's connection to it broke"),
    (1, _LEADER_SILENT, 0, "it runs the coordination service, which did not answer this worker's heartbeat within"),
])
def test_a_lost_worker_is_named_with_its_address(monkeypatch, task, message, dead, how):
    import tensorflow as tf

    monkeypatch.setenv("TF_CONFIG", launch.tf_config([5000, 5001], task))
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    kind = tf.errors.DeadlineExceededError if message is _LEADER_SILENT else tf.errors.UnavailableError
    error = cluster.lost_worker_error(kind(None, None, message), resolver, task)
    assert str(error).startswith(f"tf_glp.Strategy (worker {task}): the worker /job:worker/task:{dead} "
                                 f"(127.0.0.1:{5000 + dead}) stopped answering during training ({how}")
    assert "restart every worker of the job (with keras.callbacks.BackupAndRestore" in str(error)
    # Other errors, and a task named elsewhere in them, are left as TensorFlow's.
    for other in (f"Socket closed on /job:worker/replica:0/task:{dead}",
                  f"from remote target /job:worker/replica:0/task:{task} while calling RecvBuf"):
        assert cluster.lost_worker_error(tf.errors.UnavailableError(None, None, other), resolver, task) is None
