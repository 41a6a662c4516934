"""What the multi-worker tests share (test_multi_worker.py,
test_multi_worker_configurations.py): the job they run
(multi_worker_job.py), starting it on local workers, reading what the
workers wrote, and the environments engines give the workers."""

import io
import json
import os
import socket
import sys
from pathlib import Path

import numpy as np

from tf_glp import launch

JOB = str(Path(__file__).with_name("multi_worker_job.py"))


def job_env(**extra):
    """This process's environment without TF_CONFIG, TensorFlow quiet, and `extra`."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", **extra)
    return env


def launch_job(out_dir, *args, workers=2, replicas=2, env=None):
    """Runs the job on `workers` local workers; returns (status, output)."""
    out = io.StringIO()
    status = launch.launch(workers, [sys.executable, JOB, str(out_dir), *args], cpu_replicas=replicas,
                           out=out, err=out, env=env or job_env())
    return status, out.getvalue()


def load(path):
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def numbered_keys(result, prefix):
    """The keys `prefix`0, `prefix`1, ... of `result`, in number order."""
    return sorted((k for k in result if k.startswith(prefix)), key=lambda k: int(k[len(prefix):]))


def slurm_job_id() -> int:
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


def engine_envs(engine: str) -> list[dict]:
    """The two workers' environments as the engine would set them."""
    if engine == "slurm":  # srun --ntasks=2 on one node
        job_id = slurm_job_id()
        return [job_env(SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_JOB_ID=str(job_id), SLURM_JOB_NODELIST="localhost",
                     SLURM_TASKS_PER_NODE="2", SLURMD_NODENAME="localhost") for rank in (0, 1)]
    ports = launch.free_ports(2)  # a TFJob with 1 chief and 1 worker
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    return [job_env(TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": job, "index": 0},
                                      "environment": "cloud"})) for job in ("chief", "worker")]
