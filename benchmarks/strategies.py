"""Distributed-training strategies side by side on logical CPU devices.

    python benchmarks/strategies.py                  # 2 and 4 replicas
    python benchmarks/strategies.py --write-results  # and append to RESULTS.md

Trains the same models (a small CNN on 32x32x3 images, and a 784-2048-2048-10
MLP), global batch 64 per replica, Adam, under: one device with the same
global batch; MirroredStrategy (default all-reduce); MirroredStrategy with
ReductionToOneDevice('/cpu:0'); CentralStorageStrategy; tf_glp.Strategy
(update="host" and "replicas"). Prints steps/s and the ratio of tf_glp to the
best peer. Each (replica count, model) pair runs in its own process:
TensorFlow fixes the number of logical devices at start-up, and two
MirroredStrategy instances with collective all-reduce cannot share a process.

On one CPU the logical devices share the same cores, so more replicas add no
compute: one device with the same global batch is the ceiling.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

from results_file import append_section

WARMUP = 25
STEPS = 30


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
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    import tf_glp

    StepClock = step_clock_class(keras)  # noqa: N806
    devices = [f"/cpu:{i}" for i in range(replicas)]
    peers = {
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
    for name, make in peers.items():
        strategy = make()
        with strategy.scope():
            model = build()
            model.compile(optimizer=keras.optimizers.Adam(1e-3),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        # One fit: WARMUP steps (tracing, and tf_glp's chunking search, which
        # are real training steps), then STEPS timed steps, timed between
        # batch ends so that fit's own start-up does not count.
        clock = StepClock()
        model.fit(dataset, steps_per_epoch=WARMUP + STEPS, epochs=1, verbose=0, callbacks=[clock])
        results[f"{model_name}|{name}"] = STEPS / (clock.ends[-1] - clock.ends[WARMUP - 1])
        if name == "tf_glp host":
            results[f"{model_name}|explain"] = strategy.explain()
        print(f"  {replicas} replicas, {model_name}, {name}: {results[f'{model_name}|{name}']:.2f} steps/s",
              file=sys.stderr, flush=True)
    return results


def table(replicas: int, results: dict) -> tuple[list[str], list[str]]:
    names = ["one device", "Mirrored", "Mirrored+ReductionToOneDevice", "CentralStorage",
             "tf_glp host", "tf_glp host (chunking=none)", "tf_glp replicas"]
    rows = [f"| {replicas} replicas | " + " | ".join(names) + " | tf_glp best / best peer | tf_glp best / one device |",
            "|---" * (len(names) + 3) + "|"]
    verdicts = []
    for model in ("CNN", "MLP"):
        rates = {n: results[f"{model}|{n}"] for n in names}
        peers = max(rates[n] for n in ("Mirrored", "Mirrored+ReductionToOneDevice", "CentralStorage"))
        ours = max(rates["tf_glp host"], rates["tf_glp replicas"])
        rows.append(f"| {model} | " + " | ".join(f"{rates[n]:.2f}" for n in names)
                    + f" | {ours / peers:.2f}x | {ours / rates['one device']:.2f}x |")
        verdicts.append(f"- {replicas} replicas, {model}: tf_glp {ours / peers:.2f}x the best peer strategy, "
                        f"{ours / rates['one device']:.2f}x one device; auto chunking {rates['tf_glp host'] / rates['tf_glp host (chunking=none)']:.2f}x "
                        f"chunking='none'")
    return rows, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_replicas(int(args.child[0]), args.child[1])))
        return
    start = time.time()
    sections, verdicts, explains = [], [], []
    for replicas in args.replicas:
        results = {}
        for model in ("CNN", "MLP"):
            out = subprocess.run([sys.executable, __file__, "--child", str(replicas), model], check=True,
                                 stdout=subprocess.PIPE, text=True).stdout
            results.update(json.loads(out.strip().splitlines()[-1]))
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
        text = [f"## Strategies (issue 4) — {datetime.date.today().isoformat()}", "",
                f"Machine: {platform.machine()}, {os.cpu_count()} cores; logical CPU devices share them. "
                f"Command: `python benchmarks/strategies.py --write-results` ({elapsed:.0f} s). Steps/s, "
                f"global batch 64 per replica, Adam, {STEPS} steps timed inside one fit after {WARMUP} warm-up steps "
                "(which include tf_glp's chunking search).", "", *sections, *verdicts, "",
                "tf_glp's chunking search (MLP):", "", "```", *"\n\n".join(explains).splitlines(), "```", ""]
        append_section("\n".join(text))


if __name__ == "__main__":
    main()
