"""python -m tf_glp.bench compare: a tiny real run writes the report, the
JSON (whose numbers are the report's) and the plots; a failing concept is
reported while the others run; bad arguments are clear errors."""

import json
import os
import re
import textwrap

import pytest

from tf_glp.bench import compare


def test_tiny_run_writes_report_json_and_plots(tmp_path):
    # (Every run is a process of its own, ~8 s: the stock multi-replica
    # concepts, and plain Keras, are built in-process by the next test
    # instead, the lstm workload runs in the crash-retry test, and a list of
    # replica counts is parsed in test_replica_and_worker_lists. The
    # multi-worker concepts run here on 2 local workers.)
    out = str(tmp_path / "out")
    assert compare.main(["--workload", "cnn", "--replicas", "2", "--workers", "2", "--steps", "3",
                         "--concepts", "one-device,tf_glp-host", "--batch-per-replica", "16", "--out", out]) == 0
    report = open(os.path.join(out, "report.md")).read()
    results = json.load(open(os.path.join(out, "results.json")))
    assert sorted(p for p in os.listdir(out) if p.endswith(".png")) == sorted(
        f"cnn_{k}.png" for k in ("throughput", "efficiency", "loss"))
    assert results["machine"]["cores"] == os.cpu_count() and "tensorflow" in results["machine"]
    assert len(results["runs"]) == 1 + 1 + 2  # one-device; tf_glp-host on 2; the two multi-worker concepts
    assert "plain-keras" in compare.DEFAULT_CONCEPTS  # the most common peer, in every default comparison
    summary = results["summary"]
    # Stock MultiWorkerMirroredStrategy is reported either way (under Keras
    # 3.15 it fails at the first step; the report shows its error).
    stock = summary.pop("cnn|multi-worker-mirrored|1|2")
    assert "steps_per_s" in stock or stock["error"]
    for key, row in summary.items():
        assert "steps_per_s" in row, (key, row.get("error"))
        # The report shows the JSON's numbers.
        line = next(line for line in report.splitlines()
                    if line.startswith(f"| {row['concept']} | {row['replicas']} x {row['workers']} |") and
                    line in report.split(f"## {row['workload']} ")[1].split("## ")[0])
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2] == f"{row['steps_per_s']:.2f}" and cells[3] == f"{row['samples_per_s']:.0f}"
        assert cells[6] == f"{row['final_loss']:.3f}" and cells[7] == f"{row['final_metric']:.3f}"
    one = summary["cnn|one-device|1|1"]
    assert one["scaling_efficiency"] == pytest.approx(1.0)
    assert "scikit-learn's 8x8 digits" in report
    assert re.search(r"\| tf_glp-host \| 2 x 1 \| [\d.]+ \|", report)
    ours = summary["cnn|tf_glp-multi-worker|1|2"]
    assert ours["samples_per_s"] == pytest.approx(ours["steps_per_s"] * 2 * 16)  # global batch: 2 workers x 16


def test_every_one_machine_concept_builds_its_strategy():
    import tensorflow as tf

    from tf_glp.bench import run_concept

    devices = ["/cpu:0", "/cpu:1"]
    built = {name: run_concept._strategy(name, devices) for name in run_concept.CONCEPTS
             if name not in run_concept.MULTI_WORKER_CONCEPTS}
    assert built["plain-keras"] is tf.distribute.get_strategy()
    assert isinstance(built["mirrored-host-reduce"].extended._cross_device_ops, tf.distribute.ReductionToOneDevice)
    assert isinstance(built["central-storage"], tf.distribute.experimental.CentralStorageStrategy)
    assert [built[name].update for name in ("tf_glp-host", "tf_glp-replicas")] == ["host", "replicas"]
    for name, strategy in built.items():
        if name not in ("plain-keras", "one-device"):
            assert strategy.num_replicas_in_sync == 2, name


def test_failing_concept_does_not_stop_the_others(tmp_path, monkeypatch):
    (tmp_path / "fragile_workload.py").write_text(textwrap.dedent("""
        import keras, numpy as np, tensorflow as tf

        def build():
            if isinstance(tf.distribute.get_strategy(), tf.distribute.experimental.CentralStorageStrategy):
                raise RuntimeError("this model refuses central storage")
            rng = np.random.default_rng(0)
            x, y = rng.random((256, 4), dtype=np.float32), rng.integers(0, 3, 256)
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
            return model, (x, y), (x[:64], y[:64])
    """))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = str(tmp_path / "out")
    assert compare.main(["--workload", "fragile_workload:build", "--replicas", "2", "--steps", "3",
                         "--concepts", "one-device,central-storage", "--out", out]) == 0
    summary = json.load(open(os.path.join(out, "results.json")))["summary"]
    failed = summary["fragile_workload:build|central-storage|2|1"]
    assert failed["failed"] == 1 and "this model refuses central storage" in failed["error"]
    assert "steps_per_s" in summary["fragile_workload:build|one-device|1|1"]
    assert "failed: RuntimeError: this model refuses central storage" in open(os.path.join(out, "report.md")).read()


def test_a_crashed_run_runs_once_more_and_the_report_says_so(tmp_path, monkeypatch):
    real, calls = compare._run_one, []

    def crash_first(spec, timeout):
        calls.append(spec["concept"])
        if len(calls) == 1:  # as a SIGSEGV inside TensorFlow looks
            return {"ok": False, "error": "exited with status -11: ['no output']", "crashed": True}
        return real(spec, timeout)

    monkeypatch.setattr(compare, "_run_one", crash_first)
    out = str(tmp_path / "out")
    # (The lstm workload: its run, perplexity and data source, checked here.)
    assert compare.main(["--workload", "lstm", "--steps", "3", "--concepts", "one-device", "--out", out]) == 0
    assert calls == ["one-device", "one-device"]
    data = json.load(open(os.path.join(out, "results.json")))
    row = data["summary"]["lstm|one-device|1|1"]
    assert "steps_per_s" in row and row["final_metric"] > 1.0  # a perplexity
    assert data["runs"][0]["result"]["retried_after"] == "exited with status -11: ['no output']"
    report = open(os.path.join(out, "report.md")).read()
    assert "Run again after a crash: lstm one-device 1 x 1 seed 0 (first attempt exited with status -11" in report
    assert "standard library" in report
    # A run that fails with an error (not a crash) is not run again.
    calls.clear()
    monkeypatch.setattr(compare, "_run_one", lambda spec, timeout: calls.append(1) or {"ok": False, "error": "E"})
    assert compare._run_retrying_a_crash({}, 1) == {"ok": False, "error": "E"} and calls == [1]


def test_replica_and_worker_lists():
    """Each replica count runs every multi-replica concept; a one-device
    concept runs once; each worker count runs both multi-worker concepts."""
    args = compare.parse_args(["--replicas", "4,1,2,2", "--workers", "2", "--seeds", "2",
                               "--concepts", "one-device,tf_glp-host"])
    assert args.replicas == [1, 2, 4] and args.workers == [2]
    runs = [(r["concept"], r["replicas"], r.get("workers", 1), r["seed"]) for r in compare._runs(args)]
    assert runs == [("one-device", 1, 1, 0), ("one-device", 1, 1, 1)] + [
        ("tf_glp-host", n, 1, seed) for n in (1, 2, 4) for seed in (0, 1)] + [
        (concept, 1, 2, seed) for concept in compare.MULTI_WORKER_CONCEPTS for seed in (0, 1)]


@pytest.mark.parametrize("argv,message", [
    (["--replicas", "0"], "--replicas must be a comma-separated list of integers >= 1"),
    (["--steps", "2"], "--steps must be >= 3"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--concepts", "one-device,magic"], "unknown concept(s) magic"),
    (["--workload", "resnet"], "--workload must be cnn, lstm or MODULE:FN, got 'resnet'"),
    (["--data", "/no/such/folder"], "--data /no/such/folder is not a folder"),
])
def test_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit):
        compare.parse_args(argv)
    assert message in capsys.readouterr().err
