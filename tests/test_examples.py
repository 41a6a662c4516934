"""The examples run as a user runs them: each in its own Python process, in
its small mode (TF_GLP_EXAMPLE_SMALL=1, a few seconds of training), in a
scratch folder so that the plan files they write stay out of the checkout.
Each test checks the lines the example promises."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tf_glp.profiling import plan as plan_lib

pytest.importorskip("sklearn")  # the examples' data (pip install 'tf_glp[examples]')

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# A fresh TensorFlow process alone takes some seconds; a hang should fail, not stall CI.
TIMEOUT_S = 300


def _run(script: str, cwd: Path, **env_changes: str | None) -> str:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_GLP_EXAMPLE_SMALL="1")
    env.pop("TF_GLP_CPU_REPLICAS", None)  # the example's default devices unless a test asks
    for name, value in env_changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    out = subprocess.run([sys.executable, str(EXAMPLES / script)], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, f"{script} exited {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _check_quickstart(stdout: str) -> int:
    """Checks the quickstart's promised lines; returns its replica count."""
    strategy = re.search(r"^strategy: \w+ over (\d+) replicas", stdout, re.M)
    assert strategy, stdout
    epochs = re.findall(r"^epoch (\d+): loss [\d.]+, accuracy [\d.]+, [\d,]+ samples/s$", stdout, re.M)
    assert epochs == ["1", "2"], stdout  # the small mode's 2 epochs
    accuracy = re.search(r"^test accuracy: ([\d.]+) on 297 held-out digits$", stdout, re.M)
    assert accuracy, stdout
    assert 0.5 < float(accuracy.group(1)) <= 1.0, stdout  # 10 classes: chance is 0.1
    assert re.search(r"^tf_glp\.Strategy\(", stdout, re.M), stdout  # strategy.explain()
    assert re.search(r"^without tf_glp: [\d,]+ samples/s, with steps_per_execution=16: [\d,]+; with tf_glp: "
                     r"[\d,]+ samples/s \([\d.]+x plain Keras, [\d.]+x its fastest way here; "
                     r"fastest of 2 interleaved epochs\)$", stdout, re.M), stdout
    return int(strategy.group(1))


def test_quickstart_runs(tmp_path):
    _check_quickstart(_run("quickstart.py", tmp_path))


def test_quickstart_batch_divides_by_three_replicas(tmp_path):
    # 3 replicas: the fewest that the quickstart's former fixed global batch
    # of 64 failed on (Keras 3 requires the global batch to divide by the
    # replica count). Without GPUs TF_GLP_CPU_REPLICAS sets the count.
    stdout = _run("quickstart.py", tmp_path, TF_GLP_CPU_REPLICAS="3", CUDA_VISIBLE_DEVICES="")
    assert _check_quickstart(stdout) == 3
    assert "on 3 replicas" in stdout, stdout  # explain() on the strategy that trained


def test_existing_script_profiles_and_trains(tmp_path):
    stdout = _run("existing_script.py", tmp_path)
    written = re.search(r"^tf_glp concurrency plan \(profiled, written to (.+)\):$", stdout, re.M)
    assert written and written.group(1).startswith(os.environ["TF_GLP_CACHE_DIR"]), stdout  # the user's cache
    assert re.search(r"^optimizer step: .+ \(Adam, ", stdout, re.M), stdout
    accuracy = re.search(r"^test accuracy: ([\d.]+)$", stdout, re.M)
    assert accuracy, stdout
    assert 0.3 < float(accuracy.group(1)) <= 1.0, stdout  # 1 epoch on 512 digits; chance is 0.1

    assert os.listdir(tmp_path) == ["cache"]  # the working directory stays clean (the cache: conftest.py's)
    plan = plan_lib.read(written.group(1))
    assert [layer.name for layer in plan.layers] == ["conv2d", "conv2d_1", "dense", "dense_1"]
    for layer in plan.layers:
        row = re.search(rf"^{layer.name} .*$", stdout, re.M)  # the printed table shows the plan's choice
        assert row and ("native" if layer.choice is None else f"k={layer.choice}") in row.group().split(), stdout
        if layer.choice is not None:  # the docstring's rule: lanes only where 2x faster than TensorFlow's kernel
            assert 2 * layer.candidate(layer.choice).median_ms <= layer.candidate(None).median_ms, layer
    again = _run("existing_script.py", tmp_path)  # the next run of the script reuses its plan
    assert f"tf_glp concurrency plan (reused {written.group(1)}):" in again, again
