"""A local launcher for multi-worker TensorFlow training.

    python -m tf_glp.launch --workers 2 [--cpu-replicas 2] script.py [args...]

Starts `--workers` copies of the script on 127.0.0.1, each with a free port
and its own TF_CONFIG (the cluster of all workers, and its task index), as
tf.distribute's multi-worker strategies expect. Every output line is
prefixed with its worker ("[worker 1] ..."). When a worker fails, the others
are stopped with a message that names it, and the launcher exits with the
failing worker's status; when all succeed it exits 0. `--cpu-replicas N`
sets TF_GLP_CPU_REPLICAS=N, the number of logical CPU replicas
tf_glp.Strategy() gives each worker without GPUs.

Pure Python (no TensorFlow): it only starts processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

STOP_GRACE_S = 10.0


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config(ports: list[int], index: int) -> str:
    return json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def _pump(stream, prefix: str, out, lock: threading.Lock) -> None:
    for line in iter(stream.readline, ""):
        with lock:
            out.write(f"{prefix} {line}" if line.endswith("\n") else f"{prefix} {line}\n")
            out.flush()
    stream.close()


def launch(workers: int, command: list[str], cpu_replicas: int | None = None,
           out=None, err=None, poll_s: float = 0.05, env: dict | None = None) -> int:
    """Runs `command` as `workers` workers; returns the exit status (see module
    docstring).

    Args:
        workers: Number of workers.
        command: The command each worker runs, as a list of arguments.
        cpu_replicas: If set, TF_GLP_CPU_REPLICAS in every worker's
            environment (default: None, not set).
        out: Where the workers' standard output goes, line by line with
            its prefix (default: None, sys.stdout).
        err: Where their standard error and the launcher's messages go
            (default: None, sys.stderr).
        poll_s: Seconds between checks on the workers (default: 0.05).
        env: The workers' environment (default: this process's).
    """
    out, err = out or sys.stdout, err or sys.stderr
    ports = free_ports(workers)
    lock = threading.Lock()
    processes, pumps = [], []
    for index in range(workers):
        worker_env = dict(os.environ if env is None else env, TF_CONFIG=tf_config(ports, index),
                          PYTHONUNBUFFERED="1")
        # Local workers start together: a missing one is named within a minute.
        worker_env.setdefault("TF_GLP_CLUSTER_TIMEOUT", "60")
        if cpu_replicas is not None:
            worker_env["TF_GLP_CPU_REPLICAS"] = str(cpu_replicas)
        process = subprocess.Popen(command, env=worker_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        processes.append(process)
        for stream, sink in ((process.stdout, out), (process.stderr, err)):
            pump = threading.Thread(target=_pump, args=(stream, f"[worker {index}]", sink, lock), daemon=True)
            pump.start()
            pumps.append(pump)
    status = 0
    try:
        while True:
            codes = [p.poll() for p in processes]
            failed = next(((i, c) for i, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None:
                index, status = failed
                with lock:
                    err.write(f"[launch] worker {index} exited with status {status}; stopping the others\n")
                    err.flush()
                _stop(processes)
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        with lock:
            err.write("[launch] interrupted; stopping the workers\n")
        _stop(processes)
        status = 130
    for pump in pumps:
        pump.join(timeout=STOP_GRACE_S)
    return status


def _stop(processes) -> None:
    """SIGTERM to every live worker's process group, SIGKILL after a grace period."""
    live = [p for p in processes if p.poll() is None]
    for p in live:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for p in live:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def main(argv: list[str] | None = None) -> int:
    """`python -m tf_glp.launch` (see the module docstring); returns the exit
    status.

    Args:
        argv: The command-line arguments, without the program name
            (default: None, sys.argv[1:]).
    """
    parser = argparse.ArgumentParser(prog="python -m tf_glp.launch",
                                     description="Run a training script as local TensorFlow workers.")
    parser.add_argument("--workers", type=int, required=True, help="number of workers (>= 1)")
    parser.add_argument("--cpu-replicas", type=int, default=None,
                        help="logical CPU replicas per worker for tf_glp.Strategy() (sets TF_GLP_CPU_REPLICAS)")
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    if args.cpu_replicas is not None and args.cpu_replicas < 1:
        parser.error(f"--cpu-replicas must be >= 1, got {args.cpu_replicas}")
    if not os.path.isfile(args.script):
        parser.error(f"no such script: {args.script}")
    return launch(args.workers, [sys.executable, args.script, *args.args], args.cpu_replicas)


if __name__ == "__main__":
    sys.exit(main())
