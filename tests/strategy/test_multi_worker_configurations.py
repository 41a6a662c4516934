"""tf_glp.Strategy across workers, every configuration: 2 local worker
processes started by tf_glp.launch (multi_worker_runs.py).

- every configuration (update auto / host / replicas, one replica per
  worker as by default or 2, micro_batches or not, compression) keeps the
  workers bitwise equal and trains like one process with as many replicas
  (sync_matrix_job.py, all configurations in the same processes); workers
  that diverge stop with an error naming the variable; a simulated `srun`
  starts workers that end as tf_glp.launch's;
- micro-batched workers train bitwise like one replica, and restarted as one
  process end where the uninterrupted job ends; micro_batches the cluster
  does not divide are refused;
- workers started differently fail with a message naming the difference.

The rest (two workers' results, restarts, preemption, engines):
test_multi_worker.py.
"""

import io
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from multi_worker_runs import JOB, engine_envs, job_env, launch_job, load

from tf_glp import launch


# micro_batches across workers (tf_glp/strategy/micro_batches.py): what
# evaluate() computes after fit is not covered (it runs as without
# micro_batches, reducing per replica).
_EVALUATE_ONLY = ("evaluation", "metric_loss", "predictions", "reloaded")


@pytest.fixture(scope="module")
def micro_batched_on_one_replica(tmp_path_factory):
    out = tmp_path_factory.mktemp("micro_batched_one_replica")
    done = subprocess.run([sys.executable, JOB, str(out), "--update", "host", "--replicas", "1",
                           "--micro-batches", "4"], env=job_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return load(out / "w0.npz")


def _assert_bitwise_equal(result, reference, keys, where):
    assert keys
    for key in keys:
        np.testing.assert_array_equal(result[key], reference[key], err_msg=f"{where}: {key}")


def test_micro_batched_workers_train_bitwise_like_one_replica(tmp_path, micro_batched_on_one_replica):
    """2 workers x 2 replicas = 1 x 1 with micro_batches=4: every variable
    (weights, batch statistics, seed generators, metrics), the optimizer's,
    the metric results and the history, bit for bit, on both workers.
    (update="replicas" here; update="host" on 2 workers runs in the restart
    test below, whose end is bitwise the same only if its first 12 steps
    were.)"""
    status, output = launch_job(tmp_path, "--update", "replicas", "--micro-batches", "4")
    assert status == 0, output
    reference = micro_batched_on_one_replica
    keys = [k for k in reference if k not in _EVALUATE_ONLY]
    assert any(k.startswith("history_") for k in keys) and any(k.startswith("metric_") for k in keys)
    for worker in (0, 1):
        _assert_bitwise_equal(load(tmp_path / f"w{worker}.npz"), reference, keys, f"worker {worker}")


def test_micro_batched_two_workers_restarted_as_one_end_where_the_uninterrupted_job_ends(
        tmp_path, micro_batched_on_one_replica):
    """An elastic restart: 2 workers x 2 replicas backed up every 3 steps and
    killed after step 14, restarted as one process with 2 replicas."""
    backup = tmp_path / "backup"
    status, output = launch_job(tmp_path, "--update", "host", "--micro-batches", "4", "--backup", str(backup),
                             "--kill-at", "14")
    assert status == -9 and "killing worker 1 after step 14" in output, output
    done = subprocess.run([sys.executable, JOB, str(tmp_path), "--update", "host", "--replicas", "2",
                           "--micro-batches", "4", "--backup", str(backup)], env=job_env(), capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = micro_batched_on_one_replica
    # (The history of a resumed fit holds only what it ran.)
    keys = [k for k in reference if k not in _EVALUATE_ONLY and not k.startswith("history_")]
    _assert_bitwise_equal(load(tmp_path / "w0.npz"), reference, keys, "restarted")


def test_micro_batches_the_cluster_does_not_divide_are_refused(tmp_path):
    status, output = launch_job(tmp_path, "--micro-batches", "2", replicas=2)
    assert status == 1, output
    assert "micro_batches=2): the 4 replicas (2 workers x 2) do not divide 2 micro-batches" in output


@pytest.mark.parametrize("args, message", [
    (["--worker1-width", "17"], "the workers create variable 'kernel' with different shapes or dtypes"),
    (["--worker1-batch", "64"], "the workers' global batch sizes differ (32 to 64"),
])
def test_workers_started_differently_fail_with_a_clear_error(tmp_path, args, message):
    start = time.monotonic()
    status, output = launch_job(tmp_path, *args)
    assert status == 1, output
    assert message in output
    assert time.monotonic() - start < 120


# -- workers in sync under every configuration (tests/strategy/sync_matrix_job.py) --
# update x replicas per worker ("default": none given, what a CPU worker gets:
# one) x micro_batches, all in the same two worker processes, against one
# process with the cluster's replica count. Explicit "1" runs once (it resolves
# to the default's path), and so does each compression; so does "host": across
# workers "auto" runs it (the same class and concept: the first test checks the
# class), so the matrix spends its time on "auto", what users get.
SYNC_CONFIGS = ([f"{update}/{replicas}/none" for replicas in ("default", "2") for update in ("auto", "replicas")]
                + ["host/default/none", "auto/1/none", "auto/default/none/bf16", "replicas/2/none/fp16"]
                + [f"{update}/{replicas}/4" for replicas in ("default", "2") for update in ("auto", "replicas")])
SYNC_JOB = str(Path(__file__).with_name("sync_matrix_job.py"))


def _by_config(result, config):
    """The keys of a configuration's weights and optimizer variables."""
    keys = sorted(k for k in result if k.startswith(f"{config}|") and ("|trainable" in k or "|optimizer" in k))
    assert keys, config
    return keys


@pytest.fixture(scope="module")
def sync_matrix(tmp_path_factory):
    out = tmp_path_factory.mktemp("sync_matrix")
    # No --cpu-replicas: "default" is what a worker gets without TF_GLP_CPU_REPLICAS.
    output = io.StringIO()
    status = launch.launch(2, [sys.executable, SYNC_JOB, str(out), *SYNC_CONFIGS, "--diverge"], out=output,
                           err=output, env=job_env(TF_GLP_CACHE_DIR=str(out / "cache")))
    assert status == 0, output.getvalue()[-5000:]
    return [load(out / f"w{i}.npz") for i in (0, 1)]


@pytest.fixture(scope="module")
def sync_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("sync_reference")
    done = subprocess.run([sys.executable, SYNC_JOB, str(out), "--as-workers", "2", *SYNC_CONFIGS],
                          env=job_env(TF_GLP_CACHE_DIR=str(out / "cache")),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return load(out / "w0.npz")


def test_every_worker_ends_with_the_same_variables_under_every_configuration(sync_matrix):
    chief, other = sync_matrix
    for config in SYNC_CONFIGS:
        update, replicas, *_ = config.split("/")
        assert str(chief[f"{config}|strategy"]) == ("MultiWorkerReplicaStrategy" if update == "replicas"
                                                     else "MultiWorkerHostStrategy"), config
        assert int(chief[f"{config}|replicas"]) == 2 * (2 if replicas == "2" else 1), config
        for key in _by_config(chief, config):
            np.testing.assert_array_equal(chief[key], other[key], err_msg=key)


def test_the_workers_train_like_one_process_with_as_many_replicas(sync_matrix, sync_reference):
    """Weights, optimizer state and the first replica's batch statistics:
    bitwise with one replica per worker (the cluster adds two workers' sums,
    one process its two replicas': the same two-term sum) and with
    micro_batches (added in micro-batch order everywhere); to rounding with
    2 x 2 replicas, whose sums group the terms (a + b) + (c + d), not
    ((a + b) + c) + d; there evaluate() and predict() too."""
    chief = sync_matrix[0]
    for config in SYNC_CONFIGS:
        _, replicas, micro_batches, *_ = config.split("/")
        assert int(sync_reference[f"{config}|replicas"]) == int(chief[f"{config}|replicas"]), config
        # The chief's first replica's batch statistics are one process's first replica's too.
        keys = _by_config(chief, config) + sorted(k for k in chief if k.startswith(f"{config}|statistics"))
        for key in keys:
            if replicas != "2" or micro_batches != "none":
                np.testing.assert_array_equal(chief[key], sync_reference[key], err_msg=key)
            else:
                np.testing.assert_allclose(chief[key], sync_reference[key], rtol=1e-5, atol=1e-6, err_msg=key)
        if replicas == "2" and micro_batches == "none":  # evaluate() and predict() gather every worker's share
            np.testing.assert_allclose(chief[f"{config}|evaluation"], sync_reference[f"{config}|evaluation"],
                                       rtol=1e-5)
            np.testing.assert_allclose(chief[f"{config}|predictions"], sync_reference[f"{config}|predictions"],
                                       rtol=1e-4, atol=1e-5)
            for key in (f"{config}|evaluation", f"{config}|predictions"):
                np.testing.assert_array_equal(chief[key], sync_matrix[1][key], err_msg=key)


def test_srun_starts_workers_that_stay_in_sync(tmp_path, sync_matrix):
    # The defaults as a SLURM user gets them (no replica count), through
    # tf_glp.slurm_cluster(): bitwise what tf_glp.launch's workers end with.
    configs = ["auto/default/none", "auto/default/4"]
    workers = [subprocess.Popen([sys.executable, SYNC_JOB, str(tmp_path), "--engine", "slurm", *configs],
                                env=dict(env, TF_GLP_CLUSTER_TIMEOUT="60"), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
               for env in engine_envs("slurm")]
    outputs = [worker.communicate(timeout=240)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    for index, launched in enumerate(sync_matrix):
        started = load(tmp_path / f"w{index}.npz")
        for config in configs:
            for key in _by_config(launched, config):
                np.testing.assert_array_equal(started[key], launched[key], err_msg=f"worker {index} {key}")


def test_workers_that_diverge_stop_with_an_error_naming_the_variable(sync_matrix):
    # After the matrix, worker 1 changes a bias of its own before the second
    # epoch of one more fit: the check at the first epoch's end passed, the
    # second's stops both workers with the same error.
    for worker, result in enumerate(sync_matrix):
        # (Its model is the process's last: Keras numbers the names, sequential_17/dense_34.)
        assert re.match(rf"tf_glp\.Strategy \(worker {worker}\): after epoch 2 the workers hold different values "
                        rf"of 1 of 20 variables, first 'sequential_\d+/dense_\d+/bias': they no longer train the "
                        rf"same model, so training stopped\.", str(result["diverged|error"])), result["diverged|error"]
