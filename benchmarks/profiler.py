"""What the start-up profiler costs and what its plan gives.

    python benchmarks/profiler.py                  # prints the tables
    python benchmarks/profiler.py --write-results  # and writes their sections of RESULTS.md
    python benchmarks/profiler.py --parts wide determinism   # only some parts

Parts "layers" (1-3 below), "wide" and "determinism" (4):

1. Cost: examples/quickstart.py's model, data and strategy (tf_glp.Strategy
   on 2 logical CPU replicas, batch 64), a fresh model each time: the first
   epoch as the user waits for it (from calling fit() to the end of the
   first epoch) without the callback, with it profiling (no plan file), and
   with it reusing the plan; the callback's own time in on_train_begin; and
   the whole fit of the quickstart's 8 epochs. Interleaved rounds after one
   untimed round.
2. Gain: the first epoch (as above) and the steady-state step time (median
   of the steps after the first 10) of a model run with the profiler's plan
   (made once before, reused) against the same model in plain Keras,
   interleaved rounds, for the quickstart CNN (batch 64, one device) and a
   784-2048-2048-10 MLP (batch 256, one device).
3. Alone vs in the step: for the same two models, each profiled layer
   forced to each lane count the profiler timed, the others native: the
   speed-up the profiler measured for that layer alone next to the speed-up
   of the whole training step (the evidence for choice.MIN_SPEEDUP).
4. The wide MLP, one device, where the profiler's optimizer-step choice
   matters, with and without op determinism: benchmarks/profiler_wide_mlp.py.
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

import profiler_wide_mlp
from results_file import write_section

COST_ROUNDS = 7
QUICKSTART_EPOCHS = 8  # as examples/quickstart.py trains
GAIN_ROUNDS = 5
STEP_ROUNDS = 3

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--parts", nargs="+", choices=("layers", "wide", "determinism"),
                        default=["layers", "wide", "determinism"])
    args = parser.parse_args()
    started = time.time()
    if "layers" in args.parts:
        layer_parts(args)
    wide = {}
    if "wide" in args.parts:
        wide["no determinism"] = profiler_wide_mlp.measure()
    if "determinism" in args.parts:
        wide["op determinism"] = profiler_wide_mlp.measure_under_determinism()
    if wide:
        table = profiler_wide_mlp.HEADER + [row for label, result in wide.items()
                                            for row in profiler_wide_mlp.rows(result, label)]
        verdicts = [line for label, result in wide.items() for line in profiler_wide_mlp.verdicts(result, label)]
        print("\n".join(table + [""] + verdicts))
        elapsed = time.time() - started
        if args.write_results:
            write_section("Start-up profiler on a wide MLP", "\n".join([
                f"Date: {datetime.date.today().isoformat()}. "
                f"Machine: {platform.machine()}, {os.cpu_count()} cores, one CPU device, no strategy. Command: "
                f"`python benchmarks/profiler.py --write-results --parts {' '.join(args.parts)}` ({elapsed:.0f} s). "
                f"Wide MLP 1024-4096-4096-10, batch 32. First epoch: build, compile, fit of "
                f"{profiler_wide_mlp.FIRST_STEPS} steps, profiling included, {profiler_wide_mlp.FIRST_ROUNDS} "
                f"interleaved rounds (2 under determinism); steady: {profiler_wide_mlp.STEADY_ROUNDS} (6) "
                f"interleaved rounds of {profiler_wide_mlp.ROUND_STEPS} steps per variant; fastest round, median "
                f"and spread (max - min). Speed-ups: plain Keras' fastest round over the variant's.", "",
                *table, "", *verdicts, ""]))


def layer_parts(args) -> None:
    """Parts 1-3: cost, gain, alone vs in the step."""
    import tf_glp  # noqa: PLC0415

    strategy = tf_glp.Strategy(cpu_replicas=2, update="host")  # before any TensorFlow op (logical CPU devices)
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
        """Step ends, and the first epoch's end."""

        def __init__(self):
            super().__init__()
            self.first_epoch_end = self.last_epoch_end = self.whole = 0.0
            self.steps = []

        def steady_step(self) -> float:
            """Median seconds between steps after the first 10."""
            ends = self.steps[10:]
            return statistics.median(b - a for a, b in zip(ends, ends[1:]))

        def on_epoch_end(self, epoch, logs=None):
            self.last_epoch_end = time.perf_counter()
            if epoch == 0:
                self.first_epoch_end = self.last_epoch_end

        def on_train_batch_end(self, batch, logs=None):
            self.steps.append(time.perf_counter())

    class Measured(ConcurrencyProfiler):
        def on_train_begin(self, logs=None):
            start = time.perf_counter()
            super().on_train_begin(logs)
            self.seconds = time.perf_counter() - start

    def first_epoch(build, data_x, data_y, batch, scope=None, profiler=None, epochs=1, prepare=None):
        """Seconds from calling fit() to the end of the first epoch (what the
        user waits for: fit's set-up, tracing, the profiler if any, the
        steps), and the Timer, whose `whole` is the seconds to the last
        epoch's end (not to fit's return: with NumPy input on logical CPU
        devices, TensorFlow's input iterator teardown stalls 0-5 s at random).
        `prepare(model)` runs before fit."""
        model = compiled(build, scope)
        if prepare:
            prepare(model)
        timer = Timer()
        start = time.perf_counter()
        model.fit(data_x, data_y, batch_size=batch, epochs=epochs, verbose=0,
                  callbacks=[profiler, timer] if profiler else [timer])
        timer.whole = timer.last_epoch_end - start
        return timer.first_epoch_end - start, timer

    # 1. Cost on the quickstart: interleaved rounds after one untimed round
    # (the process's own first-use costs are paid whether or not one profiles).
    workdir = tempfile.mkdtemp()
    plan_path = os.path.join(workdir, "glp_plan.json")
    rounds = {"plain": [], "profiling": [], "reuse": [], "profiler alone": [], "reuse alone": [],
              "plain whole": [], "profiling whole": [], "reuse whole": []}
    variants = ("plain", "profiling", "reuse")
    for round_index in range(COST_ROUNDS + 1):
        order = variants if round_index == 0 else variants[round_index % 3:] + variants[:round_index % 3]
        for variant in order:
            profiler = None
            if variant != "plain":
                if variant == "profiling" and os.path.exists(plan_path):
                    os.unlink(plan_path)
                profiler = Measured(plan_path=plan_path, verbose=0, batch_size=64)
            seconds, timer = first_epoch(cnn, x, y, 64, profiler=profiler, epochs=QUICKSTART_EPOCHS)
            assert profiler is None or profiler.reused == (variant == "reuse")
            if round_index > 0:
                rounds[variant].append(seconds)
                rounds[f"{variant} whole"].append(timer.whole)
                if profiler:
                    rounds["reuse alone" if profiler.reused else "profiler alone"].append(profiler.seconds)
    med = {key: statistics.median(values) for key, values in rounds.items()}
    plan_text = tf_glp.plan.table(tf_glp.plan.read(plan_path))
    cost_rows = [f"| | first epoch (s) | vs plain | the callback's own time (s) | share of the plain first epoch | "
                 f"all {QUICKSTART_EPOCHS} epochs (s) | vs plain |",
                 "|---|---|---|---|---|---|---|"]
    for label, key in (("plain (no callback)", "plain"), ("profiling (no plan file)", "profiling"),
                       ("reusing the plan", "reuse")):
        own = {"plain": "| - | - |", "profiling": f"| {med['profiler alone']:.3f} | "
                                                  f"{med['profiler alone'] / med['plain']:.1%} |",
               "reuse": f"| {med['reuse alone']:.4f} | {med['reuse alone'] / med['plain']:.2%} |"}[key]
        cost_rows.append(f"| {label} | {med[key]:.3f} | {med[key] / med['plain']:.2f} {own} "
                         f"{med[key + ' whole']:.2f} | {med[key + ' whole'] / med['plain whole']:.2f} |")

    # 2. Steady-state gain, one device.
    import tensorflow as tf  # noqa: PLC0415

    default = tf.distribute.get_strategy()
    gain_rows = ["| model | batch | plan | first epoch, plain Keras (s) | first epoch, with the plan (s) | "
                 "steady step, plain Keras (ms) | steady step, with the plan (ms) | steady ratio |",
                 "|---|---|---|---|---|---|---|---|"]
    plans = {}
    for name, build, shape, batch in (("CNN", cnn, (8, 8, 1), 64), ("MLP", mlp, (784,), 256)):
        rng = np.random.default_rng(0)
        data_x = rng.random((batch * 100, *shape), dtype=np.float32)
        data_y = rng.integers(0, 10, batch * 100)
        path = os.path.join(workdir, f"{name}.json")
        with default.scope():
            plans[name] = tf_glp.profile(build(), data_x[:batch], plan_path=path)  # every round below reuses it
        first = {"plain": [], "plan": []}
        steady = {"plain": [], "plan": []}
        for round_index in range(GAIN_ROUNDS):
            for variant in (("plain", "plan") if round_index % 2 == 0 else ("plan", "plain")):
                profiler = ConcurrencyProfiler(plan_path=path, verbose=0, batch_size=batch) if variant == "plan" else None
                seconds, timer = first_epoch(build, data_x, data_y, batch, scope=default, profiler=profiler)
                assert profiler is None or profiler.reused
                first[variant].append(seconds)
                steady[variant].append(timer.steady_step())
        plain, planned = statistics.median(steady["plain"]), statistics.median(steady["plan"])
        choices = ", ".join(f"{layer.name}: {'native' if layer.choice is None else f'k={layer.choice}'}"
                            for layer in plans[name].layers)
        gain_rows.append(f"| {name} | {batch} | {choices} | {statistics.median(first['plain']):.2f} | "
                         f"{statistics.median(first['plan']):.2f} | {plain * 1e3:.2f} | {planned * 1e3:.2f} | "
                         f"{planned / plain:.2f} |")
    # 3. Alone vs in the step: each profiled layer forced to each timed lane
    # count (the others native): its speed-up measured alone (the plan's
    # medians) against what the whole step gains (why choice.MIN_SPEEDUP).
    from tf_glp.layers import as_glp_layer  # noqa: PLC0415
    from tf_glp.profiling import profiler as profiler_lib  # noqa: PLC0415

    step_rows = ["| model | layer | k | speed-up alone (profiler) | step, plain (ms) | step, this layer at k (ms) | "
                 "speed-up of the step |", "|---|---|---|---|---|---|---|"]
    for name, build, shape, batch in (("CNN", cnn, (8, 8, 1), 64), ("MLP", mlp, (784,), 256)):
        rng = np.random.default_rng(0)
        data_x = rng.random((batch * 60, *shape), dtype=np.float32)
        data_y = rng.integers(0, 10, batch * 60)

        def forcing(index, lanes):
            return lambda model: as_glp_layer(profiler_lib.eligible_layers(model, True)[index], lanes)

        forced = [None] + [(i, c.concurrency) for i, layer in enumerate(plans[name].layers)
                           for c in layer.candidates if c.concurrency is not None]
        steps = {force: [] for force in forced}
        for _ in range(STEP_ROUNDS):
            for force in forced:
                _, timer = first_epoch(build, data_x, data_y, batch, scope=default,
                                       prepare=forcing(*force) if force else None)
                steps[force].append(timer.steady_step())
        plain = statistics.median(steps[None])
        for index, lanes in forced[1:]:
            layer = plans[name].layers[index]
            alone = layer.candidate(None).median_ms / layer.candidate(lanes).median_ms
            step = statistics.median(steps[(index, lanes)])
            step_rows.append(f"| {name} | {layer.name} ({'x'.join(map(str, layer.input_shape))}) | {lanes} | "
                             f"{alone:.2f}x | {plain * 1e3:.2f} | {step * 1e3:.2f} | {plain / step:.2f}x |")
    print("\n".join(cost_rows))
    print(plan_text)
    print("\n".join(gain_rows))
    print("\n".join(step_rows))
    for name, plan in plans.items():
        print(f"{name} plan:\n{tf_glp.plan.table(plan)}")
    if args.write_results:
        text = [f"Date: {datetime.date.today().isoformat()}. "
                f"Machine: {platform.machine()}, {os.cpu_count()} cores. Command: "
                f"`python benchmarks/profiler.py --write-results`. Medians of interleaved rounds ({COST_ROUNDS} for the "
                f"cost, {GAIN_ROUNDS} for the gain).", "",
                "Cost (quickstart: tf_glp.Strategy on 2 logical CPU replicas, batch 64, 1500 samples; a first epoch "
                "runs from calling fit() to the epoch's end: set-up, tracing, the callback, 24 steps; the whole run "
                f"is the quickstart's {QUICKSTART_EPOCHS} epochs):", "", *cost_rows, "", "The quickstart's plan:", "", "```", *plan_text.splitlines(), "```",
                "", "First epoch and steady-state step with the plan (reused) against plain Keras (one device, 100 "
                "steps):", "", *gain_rows, "",
                f"Alone vs in the step: each profiled layer forced to each lane count the profiler timed (the "
                f"other layers native), steady step against plain Keras (one device, 60 steps, medians of "
                f"{STEP_ROUNDS} interleaved rounds):", "", *step_rows, ""]
        write_section("Start-up profiler", "\n".join(text))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
