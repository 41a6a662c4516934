"""tf_glp.Strategy across workers: 2 local worker processes on 127.0.0.1,
started by tf_glp.launch, running tests/strategy/multi_worker_job.py.

- every configuration (update auto / host / replicas, one replica per
  worker as by default or 2, micro_batches or not, compression) keeps the
  workers bitwise equal and trains like one process with as many replicas
  (sync_matrix_job.py, all configurations in the same processes); workers
  that diverge stop with an error naming the variable;
- 2 workers x 2 logical CPU replicas hold bitwise identical variables and
  evaluate() / predict() results, with update="host" and update="replicas";
- a worker killed mid-epoch, then the job restarted with BackupAndRestore,
  ends bitwise where the uninterrupted job ends;
- a worker killed mid-fit, with no launcher to stop the other, stops the
  survivor within the heartbeat timeout, naming the dead worker;
- with ConcurrencyProfiler (update="host"'s job) every worker runs the
  chief's concurrency plan;
- micro-batched workers train bitwise like one replica, and restarted as one
  process end where the uninterrupted job ends;
- workers started differently fail with a message naming the difference;
- the same job started as engines start it (a simulated `srun`, read by
  tf_glp.slurm_cluster; TFJob's chief + worker TF_CONFIG) trains bitwise
  like the job tf_glp.launch starts.

Joining the cluster (TF_CONFIG, ports, a worker that never comes):
test_cluster.py.
"""

import contextlib
import io
import json
import socket
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tf_glp import launch

JOB = str(Path(__file__).with_name("multi_worker_job.py"))


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", **extra)
    return env


def _launch(out_dir, *args, workers=2, replicas=2, env=None):
    """Runs the job on `workers` local workers; returns (status, output)."""
    out = io.StringIO()
    status = launch.launch(workers, [sys.executable, JOB, str(out_dir), *args], cpu_replicas=replicas,
                           out=out, err=out, env=env or _env())
    return status, out.getvalue()


def _load(path):
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _keys(result, prefix):
    return sorted((k for k in result if k.startswith(prefix)), key=lambda k: int(k[len(prefix):]))


@pytest.fixture(scope="module", params=["host", "replicas"])
def update(request):
    return request.param


class _Job(list):
    """The workers' results (w0.npz, w1.npz), with the job's folder and output."""

    def __init__(self, out, output):
        super().__init__(_load(out / f"w{i}.npz") for i in (0, 1))
        self.out, self.output = out, output


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory, update):
    out = tmp_path_factory.mktemp(f"two_workers_{update}")
    # update="host"'s job also profiles (test_workers_run_the_chiefs_concurrency_plan).
    status, output = _launch(out, "--update", update, *(["--profile"] if update == "host" else []))
    assert status == 0, output
    expected = {"host": "MultiWorkerHostStrategy MirroredVariable",
                "replicas": "MultiWorkerReplicaStrategy MirroredVariable"}[update]
    assert output.count(f"done {expected}") == 2, output
    assert output.count("on 2 replicas x 2 workers (TF_GLP_CPU_REPLICAS=2)") == 2, output
    return _Job(out, output)


def test_workers_hold_bitwise_identical_variables(two_workers):
    chief, other = two_workers
    for prefix in ("trainable", "optimizer"):
        for key in _keys(chief, prefix):
            np.testing.assert_array_equal(chief[key], other[key], err_msg=key)
    # evaluate() and predict() gather every worker's share: both see the same.
    np.testing.assert_array_equal(chief["evaluation"], other["evaluation"])
    np.testing.assert_array_equal(chief["predictions"], other["predictions"])


def test_workers_run_the_chiefs_concurrency_plan(two_workers, update):
    # Each worker profiles for itself (here forced to choose differently);
    # all run the chief's choices, and only the chief writes the plan. (The
    # profiled job still trains like one process: the test above.)
    if update == "replicas":
        pytest.skip("update='host''s job profiles")
    chief, other = two_workers
    assert chief["concurrency"].tolist() == other["concurrency"].tolist() == [1, 1]
    assert [layer["choice"] for layer in json.load(open(two_workers.out / "plan0.json"))["layers"]] == [1, 1]
    assert not os.path.exists(two_workers.out / "plan1.json")  # worker 1 wrote nothing
    assert "the chief's choice (this worker measured k=2: forced for worker 1)" in two_workers.output


def test_workers_take_the_chiefs_chunking_and_the_next_run_reuses_it(tmp_path):
    # chunking="auto" measures on every worker; here the step times are
    # scripted so that, alone, the chief would keep 2 chunks and worker 1
    # would stay at 1 (twice: after the one-chunk steps and after the
    # candidate's). Every chunk's sum crosses the workers, so all must chunk
    # alike: both take the chief's decisions, in step, and stay bitwise equal.
    # Only the chief keeps the decision; the next run's workers all take it
    # from the chief's plan store, measuring nothing. The model has no Input:
    # unbuilt at fit, it is built from the first batch before the store's
    # key is taken (else the key would be any unbuilt model's).
    for run in ("measures", "reuses"):
        status, output = _launch(tmp_path, "--update", "host", "--chunking", "--no-input")
        assert status == 0, output
        chief, other = (_load(tmp_path / f"w{i}.npz") for i in (0, 1))
        assert int(chief["chunks"]) == int(other["chunks"]) == 2, output
        for prefix in ("trainable", "optimizer"):
            for key in _keys(chief, prefix):
                np.testing.assert_array_equal(chief[key], other[key], err_msg=key)
        if run == "measures":
            assert ("chunking 1 chunks in use: 2 — the chief's choice (this worker: 2 chunks measured 31.00 ms"
                    in output)
            (entry,) = json.load(open(tmp_path / "cache0" / "strategy_plans.json"))["chunkings"]
            assert entry["key"]["trainable"][0] == [[8, 16], "float32"], entry["key"]
    assert (f"chunking 0 chunks in use: 2 — measured 50.00 ms against 100.00 ms for 1 chunk (reused {tmp_path}"
            in output)
    assert "chunking 1 chunks in use: 2 — the chief's decision, reused from its plan store" in output
    assert not (tmp_path / "cache1").exists()  # worker 1 wrote nothing


def test_the_saved_model_predicts_what_the_trained_one_predicts(two_workers):
    # Saved with the first replica's batch statistics and loaded without a
    # strategy: it predicts what the first replica predicted (its share of
    # predict's first batch of 32: 8 rows); the other replicas' statistics
    # differ, as under MirroredStrategy.
    chief = two_workers[0]
    assert np.all(np.isfinite(chief["reloaded"]))
    np.testing.assert_allclose(chief["reloaded"][:8], chief["predictions"][:8], rtol=1e-5, atol=1e-6)


def test_killed_worker_resumes_from_the_backup_and_ends_where_the_uninterrupted_run_ends(tmp_path, update,
                                                                                        two_workers):
    """update="replicas" here (whose optimizer state is per replica);
    update="host"'s backups, killed on 2 workers, resume in the micro-batched
    restart test below."""
    if update == "host":
        pytest.skip("update='host' is killed and resumed in the micro-batched restart test")
    backup, scratch = tmp_path / "backup", tmp_path / "tmp"
    scratch.mkdir()
    env = _env(TMPDIR=str(scratch))
    status, output = _launch(tmp_path, "--update", update, "--backup", str(backup), "--kill-at", "14", env=env)
    assert status == -9, output
    assert "killing worker 1 after step 14" in output and "[launch] worker 1 exited with status -9" in output
    metadata = json.loads((backup / "training_metadata.json").read_text())
    assert (metadata["epoch"], metadata["batches_done"]) == (1, 2)  # saved every 3 batches: after step 12
    assert sorted(p.name for p in backup.iterdir()) == sorted(["training_metadata.json", metadata["weights"]])
    assert not list(scratch.iterdir())  # worker 1's save went to a temporary folder, now removed

    status, output = _launch(tmp_path, "--update", update, "--backup", str(backup), env=env)
    assert status == 0, output
    assert not backup.exists()  # removed by the chief when training ended
    resumed = [_load(tmp_path / f"w{i}.npz") for i in (0, 1)]
    for worker, result in enumerate(resumed):
        assert int(result["steps"]) == 20
        for prefix in ("trainable", "optimizer"):
            for key in _keys(result, prefix):
                np.testing.assert_array_equal(result[key], two_workers[worker][key], err_msg=f"worker {worker} {key}")
    # Batch statistics are per replica; a backup holds the first replica's
    # (as under MirroredStrategy), so only the chief's first replica resumes
    # exactly.
    for key in _keys(resumed[0], "statistics"):
        np.testing.assert_array_equal(resumed[0][key], two_workers[0][key], err_msg=key)


# A dead worker's survivor: the coordination service's heartbeat timeout
# (TF_GLP_HEARTBEAT_TIMEOUT), short here, and what the survivor may take on top
# of it: the service checks heartbeats now and then, and the process exits
# 1.3-1.5 s after the error. Seen on 2 busy cores, 2026-12-07: 5.3-6.6 s from
# the kill to the survivor's exit (5 runs, the heartbeat), 1.7 s (1 run, a
# broken connection).
HEARTBEAT_S = 5
HEARTBEAT_MARGIN_S = 15


def test_a_dead_worker_stops_the_survivor_within_the_heartbeat_timeout_naming_it(tmp_path):
    """Worker 1 SIGKILLs itself after step 5 of 20; worker 0, started by hand
    (tf_glp.launch would stop it itself), is left alone. Its collective fails
    when the coordination service misses worker 1's heartbeat, or sooner if a
    pending collective's connection breaks (seen when the chief dies: at
    once); tf_glp's error names the dead worker and its address."""
    ports = launch.free_ports(2)
    paths = [tmp_path / f"worker{index}.log" for index in (0, 1)]
    with contextlib.ExitStack() as logs:
        workers = [subprocess.Popen([sys.executable, JOB, str(tmp_path), "--kill-at", "5"],
                                    env=_env(TF_CONFIG=launch.tf_config(ports, index), TF_GLP_CLUSTER_TIMEOUT="60",
                                             TF_GLP_HEARTBEAT_TIMEOUT=str(HEARTBEAT_S)),
                                    stdout=logs.enter_context(open(path, "w")), stderr=subprocess.STDOUT)
                   for index, path in zip((0, 1), paths)]
    survivor, dead = workers
    try:
        dead.wait(timeout=240)
        killed = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            survivor.wait(timeout=HEARTBEAT_S + HEARTBEAT_MARGIN_S)
        waited = time.monotonic() - killed
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    output, dead_output = (path.read_text() for path in paths)
    assert dead.returncode == -9 and "killing worker 1 after step 5" in dead_output, dead_output[-3000:]
    assert waited < HEARTBEAT_S + HEARTBEAT_MARGIN_S and survivor.returncode == 1, (waited, output[-3000:])
    assert (f"RuntimeError: tf_glp.Strategy (worker 0): the worker /job:worker/task:1 (127.0.0.1:{ports[1]}) "
            f"stopped answering during training (") in output, output[-3000:]
    assert "restart every worker of the job (with keras.callbacks.BackupAndRestore" in output


def test_a_preemption_signal_to_one_worker_saves_every_worker_at_one_step_and_the_restart_ends_where_it_would_have(
        tmp_path, update, two_workers):
    """SIGTERM (Kubernetes' eviction, SLURM's preemption) to worker 1 after
    step 4: the workers agree at the next check (every 10 steps across
    workers), both save there and exit with 143; the restarted job ends
    bitwise where the uninterrupted one ends."""
    if update == "host":
        pytest.skip("update='replicas' here: the signal's path is the same under both")
    backup = tmp_path / "backup"
    status, output = _launch(tmp_path, "--update", update, "--backup", str(backup), "--term-at", "4")
    assert status == 143, output
    assert "SIGTERM to worker 1 after step 4" in output
    for worker, who in ((0, "another worker"), (1, "SIGTERM")):
        assert (f"[worker {worker}] tf_glp.callbacks.BackupAndRestore: preempted ({who}'s signal): saved at step 10 "
                f"in {backup}; exiting with status 143") in output, output
    assert json.loads((backup / "training_metadata.json").read_text())["step"] == 10
    status, output = _launch(tmp_path, "--update", update, "--backup", str(backup))
    assert status == 0, output
    for worker in (0, 1):
        result = _load(tmp_path / f"w{worker}.npz")
        for prefix in ("trainable", "optimizer"):
            for key in _keys(result, prefix):
                np.testing.assert_array_equal(result[key], two_workers[worker][key], err_msg=f"worker {worker} {key}")


# micro_batches across workers (tf_glp/strategy/micro_batches.py): what
# evaluate() computes after fit is not covered (it runs as without
# micro_batches, reducing per replica).
_EVALUATE_ONLY = ("evaluation", "metric_loss", "predictions", "reloaded")


@pytest.fixture(scope="module")
def micro_batched_on_one_replica(tmp_path_factory):
    out = tmp_path_factory.mktemp("micro_batched_one_replica")
    done = subprocess.run([sys.executable, JOB, str(out), "--update", "host", "--replicas", "1",
                           "--micro-batches", "4"], env=_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return _load(out / "w0.npz")


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
    status, output = _launch(tmp_path, "--update", "replicas", "--micro-batches", "4")
    assert status == 0, output
    reference = micro_batched_on_one_replica
    keys = [k for k in reference if k not in _EVALUATE_ONLY]
    assert any(k.startswith("history_") for k in keys) and any(k.startswith("metric_") for k in keys)
    for worker in (0, 1):
        _assert_bitwise_equal(_load(tmp_path / f"w{worker}.npz"), reference, keys, f"worker {worker}")


def test_micro_batched_two_workers_restarted_as_one_end_where_the_uninterrupted_job_ends(
        tmp_path, micro_batched_on_one_replica):
    """An elastic restart: 2 workers x 2 replicas backed up every 3 steps and
    killed after step 14, restarted as one process with 2 replicas."""
    backup = tmp_path / "backup"
    status, output = _launch(tmp_path, "--update", "host", "--micro-batches", "4", "--backup", str(backup),
                             "--kill-at", "14")
    assert status == -9 and "killing worker 1 after step 14" in output, output
    done = subprocess.run([sys.executable, JOB, str(tmp_path), "--update", "host", "--replicas", "2",
                           "--micro-batches", "4", "--backup", str(backup)], env=_env(), capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = micro_batched_on_one_replica
    # (The history of a resumed fit holds only what it ran.)
    keys = [k for k in reference if k not in _EVALUATE_ONLY and not k.startswith("history_")]
    _assert_bitwise_equal(_load(tmp_path / "w0.npz"), reference, keys, "restarted")


def test_micro_batches_the_cluster_does_not_divide_are_refused(tmp_path):
    status, output = _launch(tmp_path, "--micro-batches", "2", replicas=2)
    assert status == 1, output
    assert "micro_batches=2): the 4 replicas (2 workers x 2) do not divide 2 micro-batches" in output


@pytest.mark.parametrize("args, message", [
    (["--worker1-width", "17"], "the workers create variable 'kernel' with different shapes or dtypes"),
    (["--worker1-batch", "64"], "the workers' global batch sizes differ (32 to 64"),
])
def test_workers_started_differently_fail_with_a_clear_error(tmp_path, args, message):
    start = time.monotonic()
    status, output = _launch(tmp_path, *args)
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
                           err=output, env=_env(TF_GLP_CACHE_DIR=str(out / "cache")))
    assert status == 0, output.getvalue()[-5000:]
    return [_load(out / f"w{i}.npz") for i in (0, 1)]


@pytest.fixture(scope="module")
def sync_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("sync_reference")
    done = subprocess.run([sys.executable, SYNC_JOB, str(out), "--as-workers", "2", *SYNC_CONFIGS],
                          env=_env(TF_GLP_CACHE_DIR=str(out / "cache")),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return _load(out / "w0.npz")


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
               for env in _engine_envs("slurm")]
    outputs = [worker.communicate(timeout=240)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    for index, launched in enumerate(sync_matrix):
        started = _load(tmp_path / f"w{index}.npz")
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


def test_stock_multi_worker_mirrored_strategy_still_needs_the_keras_workarounds(tmp_path):
    # Keras 3.15 (keras-team/keras#20585): if this starts passing, Keras fixed
    # both bugs and MultiWorkerReplicaStrategy.reduce's workarounds can go.
    status, output = _launch(tmp_path, "--stock", replicas=None)
    assert status != 0
    assert ("Attempt to convert a value (PerReplica" in output
            or "Invalid reduction dimension 0 for input with 0 dimensions" in output), output[-3000:]


def _slurm_job_id() -> int:
    """A job id whose ports (slurm_cluster's block for it: 2 tasks) are free here now."""
    from tf_glp.strategy import resolvers  # noqa: PLC0415

    for job_id in range(1000, 1000 + resolvers.PORT_BLOCKS):
        base = resolvers.FIRST_PORT + resolvers.PORTS_PER_JOB * (job_id % resolvers.PORT_BLOCKS)
        try:
            for port in (base, base + 1):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return job_id
    raise RuntimeError("no free SLURM port block")


def _engine_envs(engine: str) -> list[dict]:
    """The two workers' environments as the engine would set them."""
    if engine == "slurm":  # srun --ntasks=2 on one node
        job_id = _slurm_job_id()
        return [_env(SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_JOB_ID=str(job_id), SLURM_JOB_NODELIST="localhost",
                     SLURM_TASKS_PER_NODE="2", SLURMD_NODENAME="localhost") for rank in (0, 1)]
    ports = launch.free_ports(2)  # a TFJob with 1 chief and 1 worker
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    return [_env(TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": job, "index": 0},
                                      "environment": "cloud"})) for job in ("chief", "worker")]


def test_engines_start_the_job_tf_glp_launch_starts(tmp_path, update, two_workers):
    # One engine per concept (each run costs two processes): srun under
    # update="host", TFJob's chief + worker under update="replicas".
    engine = {"host": "slurm", "replicas": "tfjob"}[update]
    args = ["--update", update, *(["--profile"] if update == "host" else []),
            *(["--engine", "slurm"] if engine == "slurm" else [])]
    workers = [subprocess.Popen([sys.executable, JOB, str(tmp_path), *args],
                                env=dict(env, TF_GLP_CPU_REPLICAS="2", TF_GLP_CLUSTER_TIMEOUT="60"),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for env in _engine_envs(engine)]
    outputs = [worker.communicate(timeout=240)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    for index, launched in enumerate(two_workers):
        started = _load(tmp_path / f"w{index}.npz")
        for prefix in ("trainable", "optimizer"):
            for key in _keys(launched, prefix):
                np.testing.assert_array_equal(started[key], launched[key], err_msg=f"worker {index} {key}")
