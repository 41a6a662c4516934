"""Distributed-training strategies side by side on logical CPU devices.

    python benchmarks/strategies.py                  # 2 and 4 replicas
    python benchmarks/strategies.py --write-results  # and write its section of RESULTS.md

Trains the same models (a small CNN on 32x32x3 images, and a 784-2048-2048-10
MLP), global batch 64 per replica, Adam, under: plain Keras (no strategy) and
OneDeviceStrategy with the same global batch; MirroredStrategy (default
all-reduce); MirroredStrategy with ReductionToOneDevice('/cpu:0');
CentralStorageStrategy; tf_glp.Strategy (update="host" and "replicas").

What a user waits for, both measured inside one process per (replica count,
model) pair: the first epoch (the first fit() call of FIRST_STEPS steps, wall
clock: tracing, tf_glp's chunking decision and the steps), then the steady
state in ROUNDS short interleaved rounds (every strategy ROUND_STEPS steps per
round, the order rotating each round, timed between batch ends), reported as
the fastest round with the median and the spread (max - min, as % of the
median): this machine alternates between a fast and a ~1.7x slower phase
lasting seconds, so one sequential pass per strategy could put one of them in
the slow phase. TensorFlow fixes the number of logical devices at start-up,
and two MirroredStrategy instances with collective all-reduce and different
replica counts cannot share a process: hence one process per pair.

On one CPU the logical devices share the same cores, so more replicas add no
compute: one device with the same global batch is the ceiling.
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

FIRST_STEPS = 20
ROUNDS = 7
ROUND_STEPS = 8
NAMES = ["plain Keras", "one device", "Mirrored", "Mirrored+ReductionToOneDevice", "CentralStorage",
         "tf_glp host", "tf_glp host (chunking=none)", "tf_glp replicas"]
PEERS = ("Mirrored", "Mirrored+ReductionToOneDevice", "CentralStorage")


def step_clock_class(keras):
    class StepClock(keras.callbacks.Callback):
        """Records when each training step ends."""

        def __init__(self):
            super().__init__()
            self.ends = []

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

    return StepClock


def _models(keras):
    def cnn():
        return keras.Sequential([
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ])

    def mlp():
        return keras.Sequential([
            keras.Input((784,)),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(10),
        ])

    return {"CNN": (cnn, (32, 32, 3)), "MLP": (mlp, (784,))}


def run_replicas(replicas: int, model_name: str) -> dict:
    """Measures every strategy on one model with `replicas` logical CPU devices (child process)."""
    child_setup(logical_cpus=replicas)
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_glp

    StepClock = step_clock_class(keras)  # noqa: N806
    devices = [f"/cpu:{i}" for i in range(replicas)]
    makers = {
        "plain Keras": tf.distribute.get_strategy,
        "one device": lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
        "Mirrored": lambda: tf.distribute.MirroredStrategy(devices),
        "Mirrored+ReductionToOneDevice": lambda: tf.distribute.MirroredStrategy(
            devices, cross_device_ops=tf.distribute.ReductionToOneDevice("/cpu:0")),
        "CentralStorage": lambda: tf.distribute.experimental.CentralStorageStrategy(devices, "/cpu:0"),
        "tf_glp host": lambda: tf_glp.Strategy(devices, update="host"),
        "tf_glp host (chunking=none)": lambda: tf_glp.Strategy(devices, update="host", chunking="none"),
        "tf_glp replicas": lambda: tf_glp.Strategy(devices, update="replicas"),
    }
    global_batch = 64 * replicas
    results = {}
    build, shape = _models(keras)[model_name]
    rng = np.random.default_rng(0)
    x = rng.random((global_batch * 4, *shape), dtype=np.float32)
    y = rng.integers(0, 10, size=(global_batch * 4,))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch).repeat().prefetch(2)
    models = {}
    for name in NAMES:
        strategy = makers[name]()
        start = time.perf_counter()
        with strategy.scope():
            model = build()
            model.compile(optimizer=keras.optimizers.Adam(1e-3),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        # The first epoch as the user waits for it: build, compile and one fit.
        model.fit(dataset, steps_per_epoch=FIRST_STEPS, epochs=1, verbose=0)
        results[f"{model_name}|{name}|first_epoch_s"] = time.perf_counter() - start
        models[name] = (model, strategy)
    rounds = {name: [] for name in NAMES}
    for index in range(ROUNDS):
        order = NAMES[index % len(NAMES):] + NAMES[:index % len(NAMES)]
        for name in order:
            clock = StepClock()
            models[name][0].fit(dataset, steps_per_epoch=ROUND_STEPS + 1, epochs=1, verbose=0, callbacks=[clock])
            rounds[name].append(ROUND_STEPS / (clock.ends[-1] - clock.ends[0]))  # fit's start-up not counted
    for name in NAMES:
        rates = rounds[name]
        results[f"{model_name}|{name}|fastest"] = max(rates)
        results[f"{model_name}|{name}|median"] = statistics.median(rates)
        results[f"{model_name}|{name}|spread_pct"] = 100 * (max(rates) - min(rates)) / statistics.median(rates)
        print(f"  {replicas} replicas, {model_name}, {name}: first epoch "
              f"{results[f'{model_name}|{name}|first_epoch_s']:.2f} s; steady {max(rates):.2f} steps/s fastest, "
              f"{statistics.median(rates):.2f} median", file=sys.stderr, flush=True)
    results[f"{model_name}|explain"] = models["tf_glp host"][1].explain()
    return results


def table(replicas: int, results: dict) -> tuple[list[str], list[str]]:
    rows = [f"| {replicas} replicas | " + " | ".join(NAMES) + " | tf_glp best / best peer | tf_glp best / plain Keras |",
            "|---" * (len(NAMES) + 3) + "|"]
    verdicts = []
    for model in ("CNN", "MLP"):
        def get(name, what):
            return results[f"{model}|{name}|{what}"]

        rows.append(f"| {model} first epoch (s) | " + " | ".join(f"{get(n, 'first_epoch_s'):.2f}" for n in NAMES)
                    + " | | |")
        fastest = {n: get(n, "fastest") for n in NAMES}
        peers = max(fastest[n] for n in PEERS)
        ours = max(fastest["tf_glp host"], fastest["tf_glp replicas"])
        rows.append(f"| {model} steady, fastest round (steps/s) | " + " | ".join(f"{fastest[n]:.2f}" for n in NAMES)
                    + f" | {ours / peers:.2f}x | {ours / fastest['plain Keras']:.2f}x |")
        rows.append(f"| {model} steady, median (spread) | " + " | ".join(
            f"{get(n, 'median'):.2f} ({get(n, 'spread_pct'):.0f}%)" for n in NAMES) + " | | |")
        verdicts.append(f"- {replicas} replicas, {model}: tf_glp {ours / peers:.2f}x the best peer strategy, "
                        f"{ours / fastest['plain Keras']:.2f}x plain Keras (fastest rounds); auto chunking "
                        f"{fastest['tf_glp host'] / fastest['tf_glp host (chunking=none)']:.2f}x chunking='none'")
    return rows, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print_result(run_replicas(int(args.child[0]), args.child[1]))
        return
    start = time.time()
    sections, verdicts, explains = [], [], []
    for replicas in args.replicas:
        results = {}
        for model in ("CNN", "MLP"):
            results.update(run_child(__file__, replicas, model))
        rows, v = table(replicas, results)
        sections += rows + [""]
        verdicts += v
        explains.append(f"{replicas} replicas, MLP:\n" + results["MLP|explain"])
    print("\n".join(sections))
    print("\n".join(verdicts))
    print("\n\n".join(explains))
    elapsed = time.time() - start
    print(f"benchmark took {elapsed:.0f} s")
    if args.write_results:
        text = [f"Date: {datetime.date.today().isoformat()}. "
                f"Machine: {platform.machine()}, {os.cpu_count()} cores; logical CPU devices share them. "
                f"Command: `python benchmarks/strategies.py --write-results` ({elapsed:.0f} s). Global batch 64 "
                f"per replica, Adam. First epoch: build, compile and a fit of {FIRST_STEPS} steps (wall clock). "
                f"Steady: {ROUNDS} interleaved rounds of {ROUND_STEPS} steps per strategy, steps/s.", "",
                *sections, *verdicts, "",
                "tf_glp's chunking search (MLP):", "", "```", *"\n\n".join(explains).splitlines(), "```", ""]
        write_section("Strategies", "\n".join(text))


if __name__ == "__main__":
    main()
