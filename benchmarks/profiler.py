"""What the start-up profiler costs and what its plan gives (issue 11).

    python benchmarks/profiler.py                  # prints the tables
    python benchmarks/profiler.py --write-results  # and appends them to RESULTS.md

1. Cost: examples/quickstart.py's model, data and strategy (tf_glp.Strategy
   on 2 logical CPU replicas, batch 64), one epoch from a fresh model: the
   first epoch without the callback, and the time the callback spends in
   on_train_begin when it profiles (no plan file) and when it reuses a plan.
2. Gain: steady-state step time (median of 90 steps after 10 warm-up steps)
   of a model run with the profiler's plan against the same model in plain
   Keras, interleaved over 5 rounds, for the quickstart CNN (batch 64, one
   device) and a 784-2048-2048-10 MLP (batch 256, one device).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time

from results_file import append_section

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    import tf_glp  # noqa: PLC0415

    strategy = tf_glp.Strategy(cpu_replicas=2)  # before any TensorFlow op (logical CPU devices)
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from sklearn.datasets import load_digits  # noqa: PLC0415

    from tf_glp.callbacks import ConcurrencyProfiler  # noqa: PLC0415

    digits = load_digits()
    x = (digits.images[..., None] / 16.0).astype(np.float32)[:1500]
    y = digits.target.astype(np.int64)[:1500]

    def cnn():
        return keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ])

    def mlp():
        return keras.Sequential([keras.Input((784,)), keras.layers.Dense(2048, activation="relu"),
                                 keras.layers.Dense(2048, activation="relu"), keras.layers.Dense(10)])

    def compiled(build, scope=None):
        keras.utils.set_random_seed(0)
        with (scope or strategy).scope():
            model = build()
            model.compile(optimizer=keras.optimizers.Adam(1e-3),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.begin = self.first_epoch = 0.0
            self.steps = []

        def on_train_begin(self, logs=None):  # runs after the profiler (added before it)
            self.begin = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                self.first_epoch = time.perf_counter() - self.begin

        def on_train_batch_end(self, batch, logs=None):
            self.steps.append(time.perf_counter())

    class Measured(ConcurrencyProfiler):
        def on_train_begin(self, logs=None):
            start = time.perf_counter()
            super().on_train_begin(logs)
            self.seconds = time.perf_counter() - start

    # 1. Cost on the quickstart.
    workdir = tempfile.mkdtemp()
    plan_path = os.path.join(workdir, "glp_plan.json")
    rounds = {"first epoch": [], "profiling": [], "reuse": []}
    for round_index in range(3):
        if os.path.exists(plan_path):
            os.unlink(plan_path)
        timer = Timer()
        compiled(cnn).fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=[timer])
        rounds["first epoch"].append(timer.first_epoch)
        for key in ("profiling", "reuse"):
            profiler = Measured(plan_path=plan_path, verbose=0, batch_size=64)
            compiled(cnn).fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=[profiler, Timer()])
            rounds[key].append(profiler.seconds)
            assert profiler.reused == (key == "reuse")
    first_epoch = statistics.median(rounds["first epoch"])
    profiling = statistics.median(rounds["profiling"])
    reuse = statistics.median(rounds["reuse"])
    plan_text = tf_glp.plan.table(tf_glp.plan.read(plan_path))
    cost_rows = ["| quickstart first epoch (s) | profiling (s) | share | reusing the plan (s) | share |",
                 "|---|---|---|---|---|",
                 f"| {first_epoch:.2f} | {profiling:.3f} | {profiling / first_epoch:.1%} | {reuse:.4f} | "
                 f"{reuse / first_epoch:.2%} |"]

    # 2. Steady-state gain, one device.
    import tensorflow as tf  # noqa: PLC0415

    default = tf.distribute.get_strategy()
    gain_rows = ["| model | batch | plan | plain Keras step (ms) | with the plan (ms) | ratio |", "|---|---|---|---|---|---|"]
    plans = {}
    for name, build, shape, batch in (("CNN", cnn, (8, 8, 1), 64), ("MLP", mlp, (784,), 256)):
        rng = np.random.default_rng(0)
        data_x = rng.random((batch * 100, *shape), dtype=np.float32)
        data_y = rng.integers(0, 10, batch * 100)
        times = {"plain": [], "plan": []}
        for round_index in range(5):
            for variant in (("plain", "plan") if round_index % 2 == 0 else ("plan", "plain")):
                model = compiled(build, default)
                callbacks = [Timer()]
                if variant == "plan":
                    profiler = ConcurrencyProfiler(plan_path=os.path.join(workdir, f"{name}.json"), verbose=0,
                                                   batch_size=batch)
                    callbacks.insert(0, profiler)
                model.fit(data_x, data_y, batch_size=batch, epochs=1, verbose=0, callbacks=callbacks)
                ends = callbacks[-1].steps[10:]
                times[variant].append(statistics.median(b - a for a, b in zip(ends, ends[1:])))
                if variant == "plan":
                    plans[name] = profiler.plan
        plain, planned = statistics.median(times["plain"]), statistics.median(times["plan"])
        choices = ", ".join(f"{layer.name}: {'native' if layer.choice is None else f'k={layer.choice}'}"
                            for layer in plans[name].layers)
        gain_rows.append(f"| {name} | {batch} | {choices} | {plain * 1e3:.2f} | {planned * 1e3:.2f} | "
                         f"{planned / plain:.2f} |")
    print("\n".join(cost_rows))
    print(plan_text)
    print("\n".join(gain_rows))
    for name, plan in plans.items():
        print(f"{name} plan:\n{tf_glp.plan.table(plan)}")
    if args.write_results:
        text = [f"## Start-up profiler (issue 11) — {datetime.date.today().isoformat()}", "",
                f"Machine: {platform.machine()}, {os.cpu_count()} cores. Command: "
                "`python benchmarks/profiler.py --write-results`. Medians of interleaved rounds (3 for the cost, 5 "
                "for the gain).", "",
                "Cost (quickstart: tf_glp.Strategy on 2 logical CPU replicas, batch 64; the first epoch includes "
                "tracing):", "", *cost_rows, "", "The quickstart's plan:", "", "```", *plan_text.splitlines(), "```",
                "", "Steady-state step with the plan against plain Keras (one device):", "", *gain_rows, ""]
        append_section("\n".join(text))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
