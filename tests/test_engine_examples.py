"""The shipped cluster examples, started as their engines start them:
examples/multi_worker.py on 2 workers under tf_glp.launch (the reference),
as the pods of examples/kubernetes/indexed-job.yaml, and as the tasks of
examples/slurm/train.sbatch under a simulated srun (tests/fake_slurm).

- the Kubernetes manifest is read as Kubernetes reads it (the Job's index
  in each pod, the pods' DNS names behind the headless service, the
  volume): SIGTERM to one pod (an eviction) makes both save at one step and
  exit with 143; started again (restartPolicy OnFailure), the pods end
  bitwise where tf_glp.launch's uninterrupted run ends;
- the sbatch script run by bash: SLURM's USR1 (`--signal=USR1@120`) passed
  by srun to every task makes them save at one step and exit with 143, the
  script requeues the job, and the requeued job ends bitwise where
  tf_glp.launch's run ends.
"""

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import keras
import numpy as np
import pytest
import yaml

from tf_glp import launch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "multi_worker.py"
MANIFEST = ROOT / "examples" / "kubernetes" / "indexed-job.yaml"
SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"
FAKE_SLURM = Path(__file__).with_name("fake_slurm")
# 8 steps of 64 digits an epoch, 6 epochs: the workers check for a signal
# every 10 steps, so one sent at the second epoch's start is read at least
# two checks before the end.
SIZE = ["--samples", "512", "--epochs", "6"]
SECOND_EPOCH = "Epoch 2/6"


def _base_env(**extra) -> dict:
    """This process's environment without what would pick a cluster or a
    cache for the job; output unbuffered (the test watches it)."""
    env = {k: v for k, v in os.environ.items()
           if k != "TF_CONFIG" and not k.startswith(("TF_GLP_", "SLURM_"))}
    return dict(env, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **extra)


def _weights(path: Path) -> list[np.ndarray]:
    model = keras.saving.load_model(path)
    return [v.numpy() for v in model.weights] + [v.numpy() for v in model.optimizer.variables]


def _assert_bitwise(path: Path, reference: list[np.ndarray]) -> None:
    found = _weights(path)
    assert len(found) == len(reference)
    for i, (a, b) in enumerate(zip(found, reference)):
        np.testing.assert_array_equal(a, b, err_msg=f"variable {i} of {path}")


class _Watched:
    """Processes whose merged output is collected line by line; with
    `signal_at=(text, send)`, `send()` is called when a line first contains
    `text`."""

    def __init__(self, processes, signal_at=None):
        self.processes, self.lines, self.sent = processes, [], threading.Event()
        self._signal_at = signal_at
        self._threads = [threading.Thread(target=self._read, args=(p,), daemon=True) for p in processes]
        for thread in self._threads:
            thread.start()

    def _read(self, process):
        for line in process.stdout:
            self.lines.append(line)
            if self._signal_at and self._signal_at[0] in line and not self.sent.is_set():
                self.sent.set()
                self._signal_at[1]()

    def wait(self, timeout=240) -> list[int]:
        statuses = [p.wait(timeout=timeout) for p in self.processes]
        for thread in self._threads:
            thread.join(timeout=10)
        return statuses

    @property
    def output(self) -> str:
        return "".join(self.lines)


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> list[np.ndarray]:
    """The uninterrupted job, as the docs start it: `python -m tf_glp.launch --workers 2 ...`."""
    out = tmp_path_factory.mktemp("launched")
    command = [sys.executable, "-m", "tf_glp.launch", "--workers", "2", str(EXAMPLE), str(out), *SIZE]
    run = subprocess.run(command, env=_base_env(TF_GLP_CACHE_DIR=str(out / "cache")), capture_output=True,
                         text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "[worker 0] tf_glp.Strategy(" in run.stdout and "x 2 workers" in run.stdout, run.stdout[-3000:]
    assert re.search(r"^\[worker 0\] test accuracy: [\d.]+$", run.stdout, re.M), run.stdout[-3000:]
    return _weights(out / "model.keras")


# -- Kubernetes ---------------------------------------------------------------
def _pods(manifest: Path, shared: Path, ports: list[int]) -> list[tuple[list[str], dict, Path]]:
    """Each pod's (command, environment, working folder), as the Indexed Job
    of `manifest` would start it: its container's env, JOB_COMPLETION_INDEX
    and host name; the DNS names TF_GLP_WORKER_HOSTS names resolved as the
    headless service resolves them, each pod to its own port on 127.0.0.1;
    the volume at `shared`; the image's /app, this checkout; the command's
    run made small (SIZE)."""
    documents = list(yaml.safe_load_all(manifest.read_text()))
    service = next(d for d in documents if d["kind"] == "Service")
    job = next(d for d in documents if d["kind"] == "Job")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    name, count = job["metadata"]["name"], job["spec"]["completions"]
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] == count
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {"job-name": name}
    assert pod["subdomain"] == service["metadata"]["name"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert int(env["TF_GLP_WORKERS"]) == count == len(ports)
    service_port = service["spec"]["ports"][0]["port"]
    assert [p["containerPort"] for p in container["ports"]] == [service_port]
    # What each pod's name resolves to here, and its port (the manifest's).
    dns = {f"{name}-{index}.{pod['subdomain']}:{service_port}": f"127.0.0.1:{ports[index]}" for index in range(count)}
    named = [env["TF_GLP_WORKER_HOSTS"].replace("{index}", str(index)) for index in range(count)]
    assert set(named) == set(dns), (named, dns)
    (mount,) = container["volumeMounts"]
    assert mount["name"] == pod["volumes"][0]["name"]

    def local(text: str) -> str:
        return text.replace(mount["mountPath"], str(shared))

    envs = {k: local(v) for k, v in env.items()}
    envs["TF_GLP_WORKER_HOSTS"] = ",".join(dns[n] for n in named)
    command = [sys.executable if part == "python" else local(part) for part in container["command"]] + SIZE
    assert container["workingDir"] == "/app"
    return [(command, _base_env(**envs, JOB_COMPLETION_INDEX=str(index), HOSTNAME=f"{name}-{index}"), ROOT)
            for index in range(count)]


def _start_pods(pods, evict_at=None) -> _Watched:
    """The pods' processes; with `evict_at`, pod 1 gets SIGTERM (Kubernetes'
    eviction) when a line of output first contains it."""
    import signal  # noqa: PLC0415

    processes = [subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for command, env, cwd in pods]
    return _Watched(processes, (evict_at, lambda: processes[1].send_signal(signal.SIGTERM)) if evict_at else None)


def test_the_kubernetes_pods_save_on_an_eviction_and_end_bitwise_like_tf_glp_launch(tmp_path, launched):
    shared = tmp_path / "shared"
    pods = _pods(MANIFEST, shared, launch.free_ports(2))
    evicted = _start_pods(pods, evict_at=SECOND_EPOCH)
    assert evicted.wait() == [143, 143], evicted.output[-4000:]
    assert evicted.sent.is_set(), evicted.output[-4000:]
    saved = re.findall(r"BackupAndRestore: preempted \((SIGTERM|another worker)'s signal\): saved at step (\d+) "
                       r"in (\S+); exiting with status 143", evicted.output)
    assert sorted(who for who, _, _ in saved) == ["SIGTERM", "another worker"], evicted.output[-4000:]
    assert len({step for _, step, _ in saved}) == 1 and 0 < int(saved[0][1]) < 48, saved
    assert {folder for _, _, folder in saved} == {str(shared / "run" / "backup")}, saved

    restarted = _start_pods(pods)  # restartPolicy: OnFailure
    assert restarted.wait() == [0, 0], restarted.output[-4000:]
    assert "test accuracy:" in restarted.output, restarted.output[-4000:]
    _assert_bitwise(shared / "run" / "model.keras", launched)


# -- SLURM ----------------------------------------------------------------------
def _sbatch(out: Path, log: Path) -> subprocess.Popen:
    """examples/slurm/train.sbatch as sbatch runs it: bash, in the submit
    folder, with the allocation's variables (2 tasks on one node here) and
    the simulated srun and scontrol first on the PATH."""
    env = _base_env(PATH=os.pathsep.join([str(FAKE_SLURM), str(Path(sys.executable).parent), os.environ["PATH"]]),
                    SLURM_JOB_ID="4242", SLURM_NTASKS="2", SLURM_JOB_NODELIST="localhost",
                    SLURM_TASKS_PER_NODE="2", SLURM_JOB_NUM_NODES="1", FAKE_SLURM_LOG=str(log))
    return subprocess.Popen(["bash", str(SBATCH), str(out), *SIZE], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_the_sbatch_script_saves_on_slurms_signal_requeues_and_ends_bitwise_like_tf_glp_launch(tmp_path, launched):
    import signal  # noqa: PLC0415

    out, log = tmp_path / "run", tmp_path / "slurm.log"

    def usr1_to_srun():
        # SLURM's --signal=USR1@120 (no "B:") signals the step's tasks, through
        # srun, not the batch shell; the simulated srun logs its pid.
        (pid,) = re.findall(r"^srun (\d+)$", log.read_text(), re.M)
        os.kill(int(pid), signal.SIGUSR1)

    signalled = _Watched([_sbatch(out, log)], signal_at=(SECOND_EPOCH, usr1_to_srun))
    assert signalled.wait() == [143], signalled.output[-4000:]
    assert signalled.sent.is_set(), signalled.output[-4000:]
    saved = re.findall(r"BackupAndRestore: preempted \((SIGUSR1|another worker)'s signal\): saved at step (\d+)",
                       signalled.output)
    assert len(saved) == 2 and len({step for _, step in saved}) == 1, signalled.output[-4000:]
    assert "requeue 4242" in log.read_text()

    requeued = _sbatch(out, log)  # SLURM starts the requeued job's script again
    watched = _Watched([requeued])
    assert watched.wait() == [0], watched.output[-4000:]
    assert log.read_text().count("requeue") == 1, log.read_text()
    _assert_bitwise(out / "model.keras", launched)
