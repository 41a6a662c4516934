"""Multi-worker tf_glp.Strategy next to one process, on local workers.

    python benchmarks/multi_worker.py                  # print the table, append a record
    python benchmarks/multi_worker.py --write-results  # and write its section of RESULTS.md

Every run appends its record (records.py) to
benchmarks/records/multi_worker.jsonl: each configuration's figures, the
tf_glp configurations' ratios to one process, and the workers-in-sync
check's first and later times, with their medians and spread.

Trains the same MLP (784-1024-1024-10, Adam, global batch 256, synthetic
data) in these configurations, each in its own processes:

- one process, tf_glp.Strategy with 2 logical CPU replicas (update="host"
  and "replicas");
- 1 worker and 2 workers started by tf_glp.launch on 127.0.0.1, each with
  2 / 1 logical CPU replicas (2 replicas in all), tf_glp.Strategy across
  workers (update="host" and "replicas");
- 2 workers of TensorFlow's MultiWorkerMirroredStrategy (one CPU each):
  stock, which fails under Keras 3.15 (the error is reported), and with
  the two Keras workarounds tf_glp applies (tf_glp.strategy.multi_worker_strategy's
  MultiWorkerKerasFixes), so that it trains.

Reported per configuration: start-up + first epoch (what the user waits
for: the cluster, variables broadcast from the chief, tracing, the first
epoch's steps; imports excluded) and steady-state steps/s after it, both
from the chief's clock, and what tf_glp's workers-in-sync check took at
each epoch's end. On this 2-core machine the workers share the same
cores: the numbers show what crossing processes costs (gRPC ring vs shared
memory), not what more machines gain.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import time

import records
from child_process import child_setup, print_result, result_in
from results_file import write_section

from tf_glp import launch

GLOBAL_BATCH = 256
STEPS_PER_EPOCH = 20
EPOCHS = 3  # the first is start-up, the other two steady state

CONFIGS = [
    # (label, workers started by tf_glp.launch (0: one plain process), replicas per process, concept)
    ("one process x 2 replicas, tf_glp host", 0, 2, "tf_glp-host"),
    ("one process x 2 replicas, tf_glp replicas", 0, 2, "tf_glp-replicas"),
    ("1 worker x 2 replicas, tf_glp host", 1, 2, "tf_glp-host"),
    ("2 workers x 1 replica, tf_glp host", 2, 1, "tf_glp-host"),
    ("2 workers x 1 replica, tf_glp replicas", 2, 1, "tf_glp-replicas"),
    ("2 workers x 1 CPU, MultiWorkerMirrored (stock)", 2, None, "mwms-stock"),
    ("2 workers x 1 CPU, MultiWorkerMirrored + tf_glp's Keras fixes", 2, None, "mwms-fixed"),
]


def worker(concept: str) -> None:
    """One process of a configuration: trains and prints the chief's times."""
    child_setup()
    import tensorflow as tf

    import tf_glp

    start = time.perf_counter()  # the user's start-up: cluster, variables (broadcast), tracing, first epoch
    if concept.startswith("tf_glp-"):
        strategy = tf_glp.Strategy(update=concept.split("-")[1])
    elif concept == "mwms-stock":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        from tf_glp.strategy.multi_worker_strategy import MultiWorkerKerasFixes

        class FixedMultiWorkerMirrored(MultiWorkerKerasFixes, tf.distribute.MultiWorkerMirroredStrategy):
            pass

        strategy = FixedMultiWorkerMirrored()
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.random((GLOBAL_BATCH * 4, 784), dtype=np.float32)
    y = rng.integers(0, 10, size=(GLOBAL_BATCH * 4,))
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).repeat()
    with strategy.scope():
        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(1024, activation="relu"),
                                  keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class EpochClock(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            ends.append(time.perf_counter())

    # The workers-in-sync check tf_glp runs at every epoch's end (inside the
    # epochs timed above), timed on its own.
    from tf_glp.strategy.workers_in_sync import WorkersInSync

    checks: list[float] = []
    check = WorkersInSync.on_epoch_end

    def timed_check(self, epoch, logs=None):
        started = time.perf_counter()
        check(self, epoch, logs)
        checks.append(time.perf_counter() - started)

    WorkersInSync.on_epoch_end = timed_check
    ends: list[float] = []
    model.fit(data, epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH, verbose=0, callbacks=[EpochClock()])
    steady = (EPOCHS - 1) * STEPS_PER_EPOCH / (ends[-1] - ends[0])
    print_result({"startup_s": ends[0] - start, "steps_per_s": steady,
                  "check_ms": [1e3 * seconds for seconds in checks]})


def run(workers, replicas, concept) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--worker", concept]
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if not workers:
        env["TF_GLP_CPU_REPLICAS"] = str(replicas)
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        status, output = done.returncode, done.stdout + done.stderr
    else:
        out = io.StringIO()
        status = launch.launch(workers, command, cpu_replicas=replicas, out=out, err=out, env=env)
        output = out.getvalue()
    result = result_in(output, "[worker 0] " if workers else "")  # the chief's, as tf_glp.launch prefixes it
    if result is not None:
        return result
    errors = [line for line in output.splitlines() if "Error" in line and ":" in line]
    return {"error": (errors[-1] if errors else f"exit status {status}").split("] ", 1)[-1][:160]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    started = time.time()
    rows = ["| configuration | start-up + first epoch (s) | steady steps/s | vs one process, same mode "
            "| workers-in-sync check, first (traced) / later (ms) |", "|---|---|---|---|---|"]
    results = {}
    for label, workers, replicas, concept in CONFIGS:
        results[label] = result = run(workers, replicas, concept)
        print(f"  {label}: {result}", file=sys.stderr, flush=True)
    for label, _, _, concept in CONFIGS:
        result = results[label]
        if "error" in result:
            rows.append(f"| {label} | failed: {result['error']} | | | |")
            continue
        base = results.get(f"one process x 2 replicas, {concept.replace('-', ' ')}", {})
        ratio = f"{result['steps_per_s'] / base['steps_per_s']:.2f}x" if "steps_per_s" in base else ""
        checks = result["check_ms"]
        check = f"{checks[0]:.1f} / {', '.join(f'{ms:.1f}' for ms in checks[1:])}" if checks else "none"
        rows.append(f"| {label} | {result['startup_s']:.2f} | {result['steps_per_s']:.2f} | {ratio} | {check} |")
    elapsed = time.time() - started
    print("\n".join(rows))
    print(f"benchmark took {elapsed:.0f} s")
    checked = [results[label]["check_ms"] for label, *_ in CONFIGS if results[label].get("check_ms")]
    ratios = {}
    for label, _, _, concept in CONFIGS:
        base = results.get(f"one process x 2 replicas, {concept.replace('-', ' ')}", {})
        if "steps_per_s" in results[label] and "steps_per_s" in base and not label.startswith("one process"):
            ratios[label] = round(results[label]["steps_per_s"] / base["steps_per_s"], 2)
    record = records.append("multi_worker", {
        "seconds": round(elapsed, 1), "configurations": results, "steps_per_s_vs_one_process": ratios,
        # Across the configurations with several workers: the first check of
        # a fit (it traces its function) and the later ones.
        "check_first_ms": records.summary([c[0] for c in checked]) if checked else None,
        "check_later_ms": records.summary([ms for c in checked for ms in c[1:]]) if checked else None})
    if args.write_results:
        write_section("Multi-worker", render(record, rows))


def render(record: dict, rows: list[str]) -> str:
    """RESULTS.md's section: the run's table and what it shows, from its record."""
    text = [f"Record `{record['id']}` (benchmarks/records/multi_worker.jsonl): {record['date'][:10]}, commit "
            f"{record['commit']}{' with changes' if record['tree_changed'] else ''}, {record['machine']['cpu']}, "
            f"{record['machine']['cores']} cores, shared by all workers. Command: `{record['command']}` "
            f"({record['seconds']:.0f} s). MLP 784-1024-1024-10, Adam, global batch {GLOBAL_BATCH}, "
            f"{STEPS_PER_EPOCH} steps per epoch; start-up = strategy creation (cluster), model build (broadcast), "
            f"tracing and the first {STEPS_PER_EPOCH} steps; steady = the next {(EPOCHS - 1) * STEPS_PER_EPOCH} "
            f"steps. Chief's clock. The check compares 1.86 M weights and Adam's 3.72 M state values across the "
            f"workers at each epoch's end (tf_glp/strategy/workers_in_sync.py); it is inside the epochs timed, "
            f"and runs only where there are several workers.", "", *rows, ""]
    results, ratios = record["configurations"], record["steps_per_s_vs_one_process"]
    two = {label: ratio for label, ratio in ratios.items() if label.startswith("2 workers")}
    later, first = record["check_later_ms"], record["check_first_ms"]
    if two and later:
        epoch_ms = 1e3 * STEPS_PER_EPOCH / min(results[label]["steps_per_s"] for label in two)
        text += [f"What it shows: two worker processes on this machine run at {min(two.values()):.2f}x-"
                 f"{max(two.values()):.2f}x of one process with the same 2 replicas: they share the cores and "
                 f"cross a gRPC ring, so this is the cost of crossing processes, not the gain of more machines. "
                 f"The workers-in-sync check took {later['min']:.1f}-{later['max']:.1f} ms per epoch after the "
                 f"first (median {later['median']:.1f}), {100 * later['median'] / epoch_ms:.1f}% of the slowest "
                 f"{STEPS_PER_EPOCH}-step epoch here; the first, which traces its function, "
                 f"{first['min']:.0f}-{first['max']:.0f} ms.", ""]
    return "\n".join(text)


if __name__ == "__main__":
    main()
