"""What tf_glp.Strategy(micro_batches=M) costs.

    python benchmarks/micro_batches.py                  # prints the table
    python benchmarks/micro_batches.py --write-results  # and writes its section of RESULTS.md

The models of benchmarks/strategies.py (a small CNN on 32x32x3 images and a
784-2048-2048-10 MLP), Adam, global batch 128 whatever the replica count,
on 1, 2 and 4 logical CPU replicas (one process per count: TensorFlow fixes
its logical devices at start-up). In each process, tf_glp.Strategy without
micro_batches, with one micro-batch per replica (micro_batches = the
replica count) and with micro_batches=4: the first epoch (build, compile and
a fit of FIRST_STEPS steps) and the steady state in ROUNDS short interleaved
rounds of ROUND_STEPS steps, as steps/s: the fastest round, and the median
with the spread (max - min, % of the median).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

from child_process import child_setup, print_result, run_child
from results_file import write_section
from strategies import _models, step_clock_class

FIRST_STEPS = 20
ROUNDS = 7
ROUND_STEPS = 8
GLOBAL_BATCH = 128


def variants(replicas: int) -> dict:
    out = {"without micro_batches": None, f"micro_batches={replicas} (one per replica)": replicas}
    if replicas != 4:
        out["micro_batches=4"] = 4
    return out


def run(replicas: int, model_name: str) -> dict:
    """One process: every variant on one model with `replicas` logical CPUs."""
    child_setup(logical_cpus=replicas)
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_glp

    StepClock = step_clock_class(keras)  # noqa: N806
    build, shape = _models(keras)[model_name]
    rng = np.random.default_rng(0)
    x = rng.random((GLOBAL_BATCH * 4, *shape), dtype=np.float32)
    y = rng.integers(0, 10, size=(GLOBAL_BATCH * 4,))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).repeat().prefetch(2)
    devices = [f"/cpu:{i}" for i in range(replicas)]
    names = list(variants(replicas))
    models, results = {}, {}
    for name, micro in variants(replicas).items():
        start = time.perf_counter()
        with tf_glp.Strategy(devices, micro_batches=micro).scope():
            model = build()
            model.compile(optimizer=keras.optimizers.Adam(1e-3),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(dataset, steps_per_epoch=FIRST_STEPS, epochs=1, verbose=0)
        results[f"{name}|first_epoch_s"] = time.perf_counter() - start
        models[name] = model
    rounds = {name: [] for name in names}
    for index in range(ROUNDS):
        for name in names[index % len(names):] + names[:index % len(names)]:
            clock = StepClock()
            models[name].fit(dataset, steps_per_epoch=ROUND_STEPS + 1, epochs=1, verbose=0, callbacks=[clock])
            rounds[name].append(ROUND_STEPS / (clock.ends[-1] - clock.ends[0]))
    for name in names:
        rates = rounds[name]
        results[f"{name}|fastest"] = max(rates)
        results[f"{name}|median"] = statistics.median(rates)
        results[f"{name}|spread_pct"] = 100 * (max(rates) - min(rates)) / statistics.median(rates)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print_result(run(int(args.child[0]), args.child[1]))
        return
    start = time.time()
    rows = ["| model | replicas | variant | first epoch (s) | steady steps/s, fastest | median (spread) | "
            "vs without micro_batches (fastest) |", "|---|---|---|---|---|---|---|"]
    for model in ("CNN", "MLP"):
        for replicas in (1, 2, 4):
            results = run_child(__file__, replicas, model)
            base = results["without micro_batches|fastest"]
            for name in variants(replicas):
                rows.append(f"| {model} | {replicas} | {name} | {results[f'{name}|first_epoch_s']:.2f} | "
                            f"{results[f'{name}|fastest']:.2f} | {results[f'{name}|median']:.2f} "
                            f"({results[f'{name}|spread_pct']:.0f}%) | {results[f'{name}|fastest'] / base:.2f}x |")
            print(rows[-1], file=sys.stderr, flush=True)
    print("\n".join(rows))
    elapsed = time.time() - start
    if args.write_results:
        write_section("micro_batches", "\n".join([
            f"Date: {datetime.date.today().isoformat()}. "
            f"Machine: {platform.machine()}, {os.cpu_count()} cores (logical CPU devices share them). Command: "
            f"`python benchmarks/micro_batches.py --write-results` ({elapsed:.0f} s). Global batch {GLOBAL_BATCH}, "
            f"Adam, update=\"host\". First epoch: build, compile, fit of {FIRST_STEPS} steps. Steady: {ROUNDS} "
            f"interleaved rounds of {ROUND_STEPS} steps per variant in one process per replica count.", "",
            *rows, ""]))


if __name__ == "__main__":
    main()
