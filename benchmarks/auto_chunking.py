"""What chunking="auto" costs a user, against chunking="none".

    python benchmarks/auto_chunking.py                  # 2 and 4 replicas
    python benchmarks/auto_chunking.py --write-results  # and write its section of RESULTS.md

From a fresh model and a fresh tf_glp.Strategy each time, times the whole of
`fit(epochs=3)` (tracing and the chunking decision included), its first
epoch, and the steady-state step (median step of the third epoch), for an MLP
(784-2048-2048-10) and a small CNN (32x32x3), Adam, global batch 64 per
replica, 16 steps per epoch. "auto" and "none" alternate, four rounds each, in
one process per replica count (TensorFlow fixes its logical devices at
start-up); the table gives medians and the ratio auto / none.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import statistics
import sys
import time

from child_process import child_setup, print_result, run_child
from results_file import write_section
from strategies import _models, step_clock_class

EPOCHS = 3
STEPS_PER_EPOCH = 16
ROUNDS = 4


def run_replicas(replicas: int) -> dict:
    child_setup(logical_cpus=replicas)
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_glp

    StepClock = step_clock_class(keras)  # noqa: N806
    devices = [f"/cpu:{i}" for i in range(replicas)]
    global_batch = 64 * replicas
    results = {}
    for model_name, (build, shape) in _models(keras).items():
        rng = np.random.default_rng(0)
        x = rng.random((global_batch * STEPS_PER_EPOCH, *shape), dtype=np.float32)
        y = rng.integers(0, 10, size=(global_batch * STEPS_PER_EPOCH,))
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch).repeat()
        runs = {"auto": [], "none": []}
        for round_index in range(ROUNDS):
            order = ("auto", "none") if round_index % 2 == 0 else ("none", "auto")
            for setting in order:
                strategy = tf_glp.Strategy(devices, update="host", chunking=setting)
                keras.utils.set_random_seed(round_index)
                with strategy.scope():
                    model = build()
                    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
                clock = StepClock()
                gc.collect()  # the previous run's garbage is not this run's cost
                start = time.perf_counter()
                model.fit(dataset, steps_per_epoch=STEPS_PER_EPOCH, epochs=EPOCHS, verbose=0, callbacks=[clock])
                ends = clock.ends
                total = ends[-1] - start
                last_epoch = ends[-STEPS_PER_EPOCH - 1:]
                runs[setting].append({
                    "total": total,
                    "first_epoch": ends[STEPS_PER_EPOCH - 1] - start,
                    "steady_step": statistics.median(b - a for a, b in zip(last_epoch, last_epoch[1:])),
                })
                if setting == "auto":
                    results[f"{model_name}|explain"] = strategy.explain()
                print(f"  {replicas} replicas, {model_name}, {setting}: {runs[setting][-1]}", file=sys.stderr, flush=True)
        for setting, measured in runs.items():
            for key in ("total", "first_epoch", "steady_step"):
                results[f"{model_name}|{setting}|{key}"] = statistics.median(m[key] for m in measured)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print_result(run_replicas(args.child))
        return
    start = time.time()
    rows = ["| replicas | model | fit(epochs=3) to its last step, auto / none (s) | ratio | first epoch auto / none (s) | ratio "
            "| steady step auto / none (ms) | ratio |", "|---|---|---|---|---|---|---|---|"]
    explains = []
    for replicas in args.replicas:
        r = run_child(__file__, replicas)
        for model in ("MLP", "CNN"):
            cells = [f"| {replicas} | {model}"]
            for key, scale, fmt in (("total", 1, ".2f"), ("first_epoch", 1, ".2f"), ("steady_step", 1e3, ".1f")):
                a, b = r[f"{model}|auto|{key}"] * scale, r[f"{model}|none|{key}"] * scale
                cells.append(f"{a:{fmt}} / {b:{fmt}} | {a / b:.2f}")
            rows.append(" | ".join(cells) + " |")
        explains.append(f"{replicas} replicas, MLP:\n" + r["MLP|explain"])
    elapsed = time.time() - start
    print("\n".join(rows))
    print("\n\n".join(explains))
    print(f"benchmark took {elapsed:.0f} s")
    if args.write_results:
        text = [f"Date: {datetime.date.today().isoformat()}. "
                f"Machine: {platform.machine()}, {os.cpu_count()} cores; logical CPU devices share them. Command: "
                f"`python benchmarks/auto_chunking.py --write-results` ({elapsed:.0f} s). Fresh model and strategy "
                f"per run, medians of {ROUNDS} interleaved runs; fit(epochs={EPOCHS}) with {STEPS_PER_EPOCH} steps "
                "per epoch of a repeated tf.data.Dataset, global batch 64 per replica, Adam, timed from the call to "
                "its last step; the first epoch includes tracing and the decision.", "",
                *rows, "", "What explain() said (MLP):", "", "```", *"\n\n".join(explains).splitlines(), "```", ""]
        write_section('chunking="auto" against "none"', "\n".join(text))


if __name__ == "__main__":
    main()
