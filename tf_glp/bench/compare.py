"""Distributed-training concepts side by side on this machine (DIDL 2018).

    python -m tf_glp.bench compare --workload cnn,lstm --replicas 1,2,4 [--workers 2]
        [--steps 100] [--seeds 3] [--target-accuracy 0.9] [--target-perplexity 300]
        [--out DIR] [--data DIR] [--synthetic] [--concepts a,b]

Trains the same model with the same data order, global batch (batch per
replica x replicas) and number of steps under each concept (run_concept.py
lists them), each run in its own process, and writes DIR/report.md (also
printed), DIR/results.json (every raw number) and PNG plots (throughput vs
replicas, scaling efficiency, loss curves; they need matplotlib). Scaling
efficiency is throughput(concept, N) / (N x throughput(one device, 1)).
A failed concept is reported with its error; the others still run. A run
killed by a signal (a crash) runs once more, and the report says so.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib.metadata import version

from tf_glp.bench.run_concept import CONCEPTS, MULTI_WORKER_CONCEPTS
from tf_glp.tuning import store

DEFAULT_CONCEPTS = [c for c in CONCEPTS if c not in MULTI_WORKER_CONCEPTS]


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{name} must be a comma-separated list of integers >= 1, got {text!r}")
    return sorted(set(values))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tf_glp.bench compare", description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="cnn", help="cnn, lstm, MODULE:FN, or a comma-separated list")
    parser.add_argument("--replicas", default="1,2", type=lambda t: _int_list(t, "--replicas"))
    parser.add_argument("--workers", default=None, type=lambda t: _int_list(t, "--workers"),
                        help="also run MultiWorkerMirroredStrategy with these local worker counts")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--batch-per-replica", type=int, default=32)
    parser.add_argument("--target-accuracy", type=float, default=None)
    parser.add_argument("--target-perplexity", type=float, default=None)
    parser.add_argument("--out", default="compare_results")
    parser.add_argument("--data", default=None, help="folder with Fashion-MNIST IDX and/or ptb.*.txt files")
    parser.add_argument("--synthetic", action="store_true", help="random data of the workloads' shapes")
    parser.add_argument("--concepts", default=",".join(DEFAULT_CONCEPTS))
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    args = parser.parse_args(argv)
    for name in ("steps", "seeds", "batch_per_replica"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.steps < 3:
        parser.error(f"--steps must be >= 3 (one warm-up step and two timed ones), got {args.steps}")
    args.concepts = [c.strip() for c in args.concepts.split(",") if c.strip()]
    unknown = [c for c in args.concepts if c not in CONCEPTS]
    if unknown:
        parser.error(f"unknown concept(s) {', '.join(unknown)}; known: {', '.join(CONCEPTS)}")
    args.workloads = [w.strip() for w in args.workload.split(",") if w.strip()]
    for workload in args.workloads:
        if workload not in ("cnn", "lstm") and ":" not in workload:
            parser.error(f"--workload must be cnn, lstm or MODULE:FN, got {workload!r}")
    if args.data and not os.path.isdir(args.data):
        parser.error(f"--data {args.data} is not a folder")
    return args


def _runs(args) -> list[dict]:
    runs = []
    for workload in args.workloads:
        common = {"steps": args.steps, "warmup_steps": max(1, min(10, args.steps // 5)),
                  "batch_per_replica": args.batch_per_replica, "data": args.data, "synthetic": args.synthetic,
                  "target": args.target_accuracy if workload != "lstm" else args.target_perplexity}
        for concept in args.concepts:
            if concept in MULTI_WORKER_CONCEPTS:
                continue
            for replicas in ([1] if CONCEPTS[concept][1] else args.replicas):
                for seed in range(args.seeds):
                    runs.append({"workload": workload, "concept": concept, "replicas": replicas, "seed": seed,
                                 **common})
        for workers in args.workers or []:
            for concept in MULTI_WORKER_CONCEPTS:
                for seed in range(args.seeds):
                    runs.append({"workload": workload, "concept": concept, "replicas": 1, "workers": workers,
                                 "seed": seed, **common})
    return runs


def _run_one(spec: dict, timeout: float) -> dict:
    command = [sys.executable, "-m", "tf_glp.bench.run_concept", json.dumps(spec)]
    if spec.get("workers", 1) > 1:
        from tf_glp import launch  # noqa: PLC0415

        out, err = io.StringIO(), io.StringIO()
        status = launch.launch(spec["workers"], command, out=out, err=err)
        lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines() if line.startswith("[worker 0] ")]
        text, stderr = "\n".join(lines), err.getvalue()
    else:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
        text, stderr, status = done.stdout, done.stderr, done.returncode
    for line in reversed(text.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"ok": False, "error": f"exited with status {status}: {stderr.strip().splitlines()[-1:] or ['no output']}",
            "crashed": status is not None and status < 0}


def _run_retrying_a_crash(spec: dict, timeout: float) -> dict:
    """One run; a run killed by a signal (not one that failed with an
    error) runs once more, and its result says so. TensorFlow 2.21 crashes
    now and then (seen: a SIGSEGV while fit() built its data adapter, in
    stock MirroredStrategy, once in some hundred runs), and one such crash
    should not cost a cell of a long comparison."""
    result = _run_one(spec, timeout)
    if result.get("ok") or not result.get("crashed"):
        return result
    retried = _run_one(spec, timeout)
    retried["retried_after"] = result["error"]
    return retried


def machine() -> dict:
    info = {"cpu": store.cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout
        info["gpus"] = [g.strip() for g in out.splitlines() if g.strip()]
    except (OSError, subprocess.TimeoutExpired):
        info["gpus"] = []
    for package in ("tensorflow", "keras", "tf_glp", "horovod"):
        try:
            info[package] = version(package)
        except Exception:  # noqa: BLE001 (absent: reported as such)
            info[package] = "not installed"
    return info


def summarise(results: list[dict]) -> dict:
    """Per (workload, concept, replicas, workers): medians and spreads over seeds."""
    groups: dict = {}
    for entry in results:
        spec, result = entry["spec"], entry["result"]
        key = (spec["workload"], spec["concept"], spec["replicas"], spec.get("workers", 1))
        groups.setdefault(key, []).append(result)
    summary = {}
    for (workload, concept, replicas, workers), group in groups.items():
        ok = [r for r in group if r.get("ok")]
        row = {"workload": workload, "concept": concept, "replicas": replicas, "workers": workers,
               "runs": len(group), "failed": len(group) - len(ok),
               "error": next((r["error"] for r in group if not r.get("ok")), None)}
        if ok:
            rates = [r["steps_per_s"] for r in ok]
            row.update(
                steps_per_s=statistics.median(rates),
                steps_per_s_spread=(max(rates) - min(rates)) if len(rates) > 1 else 0.0,
                samples_per_s=statistics.median(r["samples_per_s"] for r in ok),
                warmup_s=statistics.median(r["warmup_s"] for r in ok),
                final_loss=statistics.median(r["final_loss"] for r in ok),
                metric=ok[0]["metric"],
                final_metric=statistics.median(r["final_metric"] for r in ok),
                time_to_target_s=(statistics.median(r["time_to_target_s"] for r in ok)
                                  if all(r["time_to_target_s"] is not None for r in ok) else None),
                data_source=ok[0]["data_source"], global_batch=ok[0]["global_batch"])
        summary[f"{workload}|{concept}|{replicas}|{workers}"] = row
    for row in summary.values():
        base = summary.get(f"{row['workload']}|one-device|1|1")
        if "samples_per_s" in row and base and "samples_per_s" in base:
            devices = row["replicas"] * row["workers"]
            row["scaling_efficiency"] = row["samples_per_s"] / (devices * base["samples_per_s"])
    return summary


def report(args, info: dict, summary: dict, results: list[dict], elapsed: float, plots: list[str]) -> str:
    lines = [f"# Distributed-training concepts compared — {datetime.date.today().isoformat()}", "",
             f"Machine: {info['cpu']}, {info['cores']} cores, GPUs: {', '.join(info['gpus']) or 'none'}; "
             f"Python {info['python']}, TensorFlow {info['tensorflow']}, Keras {info['keras']}, "
             f"tf_glp {info['tf_glp']}, Horovod {info['horovod']}.",
             f"Command: `python -m tf_glp.bench compare {' '.join(sys.argv[1:] if args.argv is None else args.argv)}` "
             f"({elapsed:.0f} s). {args.steps} steps per run, batch {args.batch_per_replica} per replica, "
             f"{args.seeds} seed(s); the first {max(1, min(10, args.steps // 5))} steps (tracing, warm-up) are "
             "not in the throughput and are reported apart. Without GPUs the replicas are logical CPU devices "
             "sharing the same cores: more replicas add no compute, so efficiency near 1/N is what the "
             "concepts' overheads leave.", ""]
    if info["horovod"] == "not installed":
        lines += ["Horovod: not installed, not compared (its last release does not build against TensorFlow 2.21 "
                  "without patches).", ""]
    for workload in args.workloads:
        rows = [r for r in summary.values() if r["workload"] == workload]
        source = next((r["data_source"] for r in rows if "data_source" in r), "?")
        metric = next((r["metric"] for r in rows if "metric" in r), "metric")
        lines += [f"## {workload} ({source})", "",
                  f"| concept | replicas x workers | steps/s | samples/s | scaling efficiency | warm-up s | final loss "
                  f"| {metric} | time to target s |", "|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(rows, key=lambda r: (list(CONCEPTS).index(r["concept"]), r["workers"], r["replicas"])):
            where = f"{r['replicas']} x {r['workers']}"
            if "steps_per_s" not in r:
                lines.append(f"| {r['concept']} | {where} | failed: {r['error']} | | | | | | |")
                continue
            spread = f" ± {r['steps_per_s_spread'] / 2:.2f}" if r["runs"] > 1 else ""
            target = "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
            efficiency = f"{r['scaling_efficiency']:.2f}" if "scaling_efficiency" in r else "-"
            lines.append(f"| {r['concept']} | {where} | {r['steps_per_s']:.2f}{spread} | {r['samples_per_s']:.0f} | "
                         f"{efficiency} | {r['warmup_s']:.1f} | {r['final_loss']:.3f} | {r['final_metric']:.3f} | "
                         f"{target} |")
        lines.append("")
    retried = [r for r in results if "retried_after" in r["result"]]
    if retried:
        lines += ["Run again after a crash: " + "; ".join(
            f"{r['spec']['workload']} {r['spec']['concept']} {r['spec']['replicas']} x {r['spec'].get('workers', 1)} "
            f"seed {r['spec']['seed']} (first attempt {r['result']['retried_after']})" for r in retried), ""]
    lines += ["Concepts: " + "; ".join(f"{name}: {CONCEPTS[name][0]}" for name in args.concepts), ""]
    lines += [f"Plots: {', '.join(plots)}" if plots else "Plots: not drawn (needs matplotlib: pip install 'tf_glp[plot]')", ""]
    return "\n".join(lines)


def draw(args, summary: dict, results: list[dict], out: str) -> list[str]:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return []
    written = []
    for workload in args.workloads:
        for key, label, name in (("samples_per_s", "samples/s", "throughput"),
                                 ("scaling_efficiency", "scaling efficiency", "efficiency")):
            figure, axes = plt.subplots(figsize=(6, 4))
            counts = set()
            for concept in args.concepts:
                points = sorted((r["replicas"] * r["workers"], r[key]) for r in summary.values()
                                if r["workload"] == workload and r["concept"] == concept and key in r)
                if points:
                    axes.plot(*zip(*points), marker="o", label=concept)
                    counts.update(p[0] for p in points)
            axes.set_xticks(sorted(counts))
            axes.set(xlabel="replicas", ylabel=label, title=f"{workload}: {label}")
            axes.legend(fontsize="small")
            written.append(_save(plt, figure, out, f"{workload.replace(':', '_')}_{name}.png"))
        figure, axes = plt.subplots(figsize=(6, 4))
        for entry in results:
            spec, result = entry["spec"], entry["result"]
            if spec["workload"] == workload and spec["seed"] == 0 and result.get("ok"):
                axes.plot(result["losses"], label=f"{spec['concept']} x{spec['replicas'] * spec.get('workers', 1)}")
        axes.set(xlabel="step", ylabel="training loss (running mean)", title=f"{workload}: loss")
        axes.legend(fontsize="x-small")
        written.append(_save(plt, figure, out, f"{workload.replace(':', '_')}_loss.png"))
    return written


def _save(plt, figure, out: str, name: str) -> str:
    figure.tight_layout()
    figure.savefig(os.path.join(out, name))
    plt.close(figure)
    return name


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.argv = argv
    os.makedirs(args.out, exist_ok=True)
    runs = _runs(args)
    start = time.time()
    results = []
    import keras  # noqa: PLC0415 (only for its progress bar)

    bar = keras.utils.Progbar(len(runs), unit_name="run")
    for spec in runs:
        result = _run_retrying_a_crash(spec, args.timeout)
        results.append({"spec": spec, "result": result})
        bar.add(1)
    elapsed = time.time() - start
    info = machine()
    summary = summarise(results)
    plots = draw(args, summary, results, args.out)
    text = report(args, info, summary, results, elapsed, plots)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"machine": info, "arguments": {k: v for k, v in vars(args).items() if k != "argv"},
                   "summary": summary, "runs": results}, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
