"""Running a measurement in a fresh Python process, and being that process.

TensorFlow fixes its logical devices at start-up, and some set-ups cannot
share a process (MirroredStrategies with different replica counts, two trees
of tf_glp, op determinism once enabled), so a benchmark runs such a
measurement as `python <its script> --child ARGS...`. The child calls
`child_setup` before importing TensorFlow and ends with `print_result`; the
parent's `run_child` starts it and returns that result.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile

# Marks the child's result line: TensorFlow and Keras may print to stdout too.
RESULT_MARK = "RESULT "
STDERR_TAIL_LINES = 30


def child_setup(logical_cpus: int | None = None) -> None:
    """TensorFlow's C++ logs down to errors, tf_glp's plan cache empty and,
    with `logical_cpus`, the host CPU split into that many logical devices
    ("/cpu:0", "/cpu:1", ...). Call it first: TensorFlow reads the log
    level when it loads and fixes its devices when it first uses one."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # A cache of tf_glp's start-up choices of its own, empty: a measurement
    # never reuses (or writes) what the user's runs or another commit chose.
    cache = tempfile.mkdtemp(prefix="tf_glp_benchmark_cache_")
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    os.environ["TF_GLP_CACHE_DIR"] = cache
    if logical_cpus is not None:
        # Imported here, not at the top: the log level must be set before TensorFlow loads.
        import tensorflow as tf  # noqa: PLC0415

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * logical_cpus)


def print_result(result: dict) -> None:
    """The child's result, as one marked JSON line on stdout."""
    print(RESULT_MARK + json.dumps(result), flush=True)


def result_in(output: str, line_start: str = "") -> dict | None:
    """The result a child printed in `output` (its last line starting with
    `line_start` and the mark), or None if it printed none."""
    marker = line_start + RESULT_MARK
    lines = [line for line in output.splitlines() if line.startswith(marker)]
    return json.loads(lines[-1][len(marker):]) if lines else None


def run_child(script: str, *args: object, env: dict | None = None) -> dict:
    """Runs `python script --child ARGS...` (in `env`, default this process's
    environment) and returns the result it printed. The child's stderr (its
    progress) goes on to this process's as it comes; if the child fails or
    prints no result, the RuntimeError ends with the last of it."""
    command = [sys.executable, script, "--child", *map(str, args)]
    tail = collections.deque(maxlen=STDERR_TAIL_LINES)
    # stdout to a file, so that reading stderr as it comes cannot deadlock on a full stdout pipe.
    with tempfile.TemporaryFile("w+") as stdout:
        with subprocess.Popen(command, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True) as child:
            for line in child.stderr:
                sys.stderr.write(line)
                tail.append(line)
        stdout.seek(0)
        result = result_in(stdout.read())
    if child.returncode or result is None:
        problem = f"exited with status {child.returncode}" if child.returncode else "printed no result"
        raise RuntimeError(f"{' '.join(command)} {problem}; the end of its stderr:\n{''.join(tail)}")
    return result
