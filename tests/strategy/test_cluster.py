"""Joining a cluster (tf_glp/strategy/cluster.py): a worker that never
comes, a port in use, a malformed TF_CONFIG and a bad timeout each stop the
worker within a bounded time with a message naming the problem."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tf_glp import launch
from tf_glp.strategy import cluster


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
])
def test_malformed_tf_config_is_named(monkeypatch, text, message):
    monkeypatch.setenv("TF_CONFIG", text)
    import tf_glp

    with pytest.raises(ValueError) as error:
        tf_glp.Strategy(update="replicas")
    assert message in str(error.value)


def test_cluster_timeout_must_be_positive(monkeypatch):
    monkeypatch.setenv("TF_GLP_CLUSTER_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="TF_GLP_CLUSTER_TIMEOUT must be a number of seconds > 0, got 'soon'"):
        cluster.cluster_timeout_s()
