"""tf_glp.Strategy against the user's alternatives: plain Keras (no
strategy) and MirroredStrategy, on models a user trains, on this machine.

    python benchmarks/against_plain_keras.py                  # every model
    python benchmarks/against_plain_keras.py --models tiny    # one
    python benchmarks/against_plain_keras.py --write-results  # and RESULTS.md

Ways (the same global batch for all, per model): plain Keras; MirroredStrategy
on 1 and on 2 logical CPU devices (its default cross-device ops);
`tf_glp.Strategy()` as a user writes it (without GPUs: one device, plain
Keras' path with the fused optimizer step where it measures faster);
`tf_glp.Strategy(cpu_replicas=1)` (update="auto", the default); and forced
to 2 replicas with update="host", "replicas" and "auto" (what it chose is
printed; auto's plan file off, so it measures in every run). Models: a tiny
MLP (64 -> 32 -> 10, batch 64: nothing to compute, so
its step time is the fixed cost per step), the quickstart's CNN on 8x8
digits (batch 64), the wide Adam MLP (1024 -> 4096 -> 4096 -> 10, batch 32),
the CNN of strategies.py (32x32x3, batch 128) and keras.applications'
MobileNetV2 (32x32x3, weights=None, batch 32). Adam everywhere.

One process per model (two MirroredStrategies with collective all-reduce and
different shapes cannot share one). Inside it: the first epoch as the user
waits for it (build, compile and a fit of FIRST_STEPS steps: tracing and
tf_glp's start-up decisions included), then ROUNDS short interleaved rounds
of ROUND_STEPS steps per way (the order rotating), timed between batch ends:
this machine alternates between a fast and a ~1.7x slower phase lasting
seconds. Reported: ms per step of the fastest round, the median and the
spread (max - min, % of the median); "x plain" is plain Keras' fastest
round over the way's fastest round (above 1: faster than plain Keras).
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
from strategies import step_clock_class

FIRST_STEPS = 10
ROUNDS = 7
ROUND_STEPS = 8
WAYS = ["plain Keras", "Mirrored 1 device", "Mirrored 2 devices", "tf_glp.Strategy()",
        "tf_glp 1 replica", "tf_glp host 2 replicas", "tf_glp replicas 2 replicas", "tf_glp auto 2 replicas"]
MODELS = ["tiny", "quickstart", "wide", "cnn", "mobilenet"]


def _model_and_data(name: str):
    """(make_model, x, y, global batch)."""
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    rng = np.random.default_rng(0)
    layers = keras.layers
    if name == "quickstart":
        from sklearn.datasets import load_digits  # noqa: PLC0415

        digits = load_digits()
        x, y = (digits.images[..., None] / 16.0).astype(np.float32)[:1536], digits.target[:1536]
        return (lambda: keras.Sequential([
            keras.Input((8, 8, 1)), layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.Conv2D(64, 3, activation="relu"), layers.Flatten(), layers.Dense(128, activation="relu"),
            layers.Dense(10)]), x, y, 64)
    shapes = {"tiny": (64,), "wide": (1024,), "cnn": (32, 32, 3), "mobilenet": (32, 32, 3)}
    batches = {"tiny": 64, "wide": 32, "cnn": 128, "mobilenet": 32}
    batch = batches[name]
    x = rng.random((batch * 16, *shapes[name]), dtype=np.float32)
    y = rng.integers(0, 10, batch * 16)
    makers = {
        "tiny": lambda: keras.Sequential([keras.Input((64,)), layers.Dense(32, activation="relu"), layers.Dense(10)]),
        "wide": lambda: keras.Sequential([keras.Input((1024,)), layers.Dense(4096, activation="relu"),
                                          layers.Dense(4096, activation="relu"), layers.Dense(10)]),
        "cnn": lambda: keras.Sequential([
            keras.Input((32, 32, 3)), layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(), layers.Flatten(),
            layers.Dense(128, activation="relu"), layers.Dense(10)]),
        "mobilenet": lambda: keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=10,
                                                                     classifier_activation=None),
    }
    return makers[name], x, y, batch


def run_model(name: str) -> dict:
    """Measures every way on one model (child process)."""
    child_setup()
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import tf_glp  # noqa: PLC0415

    tf_glp.strategy.cpu_replica_devices(2)
    makers = {
        "plain Keras": tf.distribute.get_strategy,
        "Mirrored 1 device": lambda: tf.distribute.MirroredStrategy(["/cpu:0"]),
        "Mirrored 2 devices": lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
        "tf_glp.Strategy()": tf_glp.Strategy,
        "tf_glp 1 replica": lambda: tf_glp.Strategy(cpu_replicas=1, plan_path=None),
        "tf_glp host 2 replicas": lambda: tf_glp.Strategy(cpu_replicas=2, update="host"),
        "tf_glp replicas 2 replicas": lambda: tf_glp.Strategy(cpu_replicas=2, update="replicas"),
        "tf_glp auto 2 replicas": lambda: tf_glp.Strategy(cpu_replicas=2, plan_path=None),
    }
    make_model, x, y, batch = _model_and_data(name)
    StepClock = step_clock_class(keras)  # noqa: N806
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    trained, results = {}, {"first_epoch_s": {}, "ms": {}, "explain": ""}
    # TensorFlow's one-time start-up (kernels, thread pools, the first
    # trace) would otherwise land in the first way's first epoch.
    warm_up = make_model()
    warm_up.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    warm_up.fit(x, y, batch_size=batch, steps_per_epoch=2, epochs=1, verbose=0)
    for way in WAYS:
        keras.utils.set_random_seed(0)
        start = time.perf_counter()
        strategy = makers[way]()
        with strategy.scope():
            model = make_model()
            model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
        model.fit(x, y, batch_size=batch, steps_per_epoch=FIRST_STEPS, epochs=1, verbose=0)
        results["first_epoch_s"][way] = time.perf_counter() - start
        trained[way] = model
        if way == "tf_glp.Strategy()":
            results["explain"] = strategy.explain()
        if way == "tf_glp auto 2 replicas":
            results["auto"] = strategy.update_choice.line()
    times = {way: [] for way in WAYS}
    for index in range(ROUNDS):
        for way in WAYS[index % len(WAYS):] + WAYS[:index % len(WAYS)]:
            clock = StepClock()
            trained[way].fit(x, y, batch_size=batch, steps_per_epoch=ROUND_STEPS + 1, epochs=1, verbose=0,
                             callbacks=[clock])
            times[way].append(1e3 * (clock.ends[-1] - clock.ends[0]) / ROUND_STEPS)  # fit's start-up not counted
    for way, values in times.items():
        median = statistics.median(values)
        results["ms"][way] = {"fastest": min(values), "median": median,
                              "spread_pct": 100 * (max(values) - min(values)) / median}
        print(f"  {name}, {way}: first epoch {results['first_epoch_s'][way]:.2f} s; steady {min(values):.2f} ms "
              f"fastest, {median:.2f} median", file=sys.stderr, flush=True)
    return results


def table(all_results: dict) -> list[str]:
    rows = ["| model | " + " | ".join(WAYS) + " |", "|---" * (len(WAYS) + 1) + "|"]
    for name, results in all_results.items():
        ms = results["ms"]
        plain = ms["plain Keras"]["fastest"]
        rows.append(f"| {name}: first epoch (s) | " + " | ".join(
            f"{results['first_epoch_s'][w]:.2f}" for w in WAYS) + " |")
        rows.append(f"| {name}: ms/step fastest (x plain) | " + " | ".join(
            f"{ms[w]['fastest']:.2f} ({plain / ms[w]['fastest']:.2f}x)" for w in WAYS) + " |")
        rows.append(f"| {name}: median (spread) | " + " | ".join(
            f"{ms[w]['median']:.2f} ({ms[w]['spread_pct']:.0f}%)" for w in WAYS) + " |")
    return rows


def verdicts(all_results: dict) -> list[str]:
    lines = []
    for name, results in all_results.items():
        ms = {w: v["fastest"] for w, v in results["ms"].items()}
        plain = ms["plain Keras"]
        lines.append(f"- {name}: tf_glp.Strategy() {plain / ms['tf_glp.Strategy()']:.2f}x plain Keras "
                     f"({ms['tf_glp.Strategy()'] - plain:+.2f} ms/step); fixed cost over plain Keras per step: "
                     f"MirroredStrategy 1 device {ms['Mirrored 1 device'] - plain:+.2f} ms, 2 devices "
                     f"{ms['Mirrored 2 devices'] - plain:+.2f} ms; tf_glp 1 replica "
                     f"{ms['tf_glp 1 replica'] - plain:+.2f} ms, 2 replicas (host / replicas) "
                     f"{ms['tf_glp host 2 replicas'] - plain:+.2f} / "
                     f"{ms['tf_glp replicas 2 replicas'] - plain:+.2f} ms; auto "
                     f"{ms['tf_glp auto 2 replicas'] - plain:+.2f} ms ({results['auto']})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print_result(run_model(args.child))
        return
    start = time.time()
    all_results = {}
    for name in args.models:
        all_results[name] = run_child(__file__, name)
    rows, lines = table(all_results), verdicts(all_results)
    explain = next(iter(all_results.values()))["explain"]
    elapsed = time.time() - start
    print("\n".join(rows + [""] + lines + ["", explain, f"benchmark took {elapsed:.0f} s"]))
    if args.write_results:
        text = [f"Date {datetime.date.today().isoformat()}; machine: {platform.machine()}, {os.cpu_count()} cores, "
                f"no GPU (logical CPU devices share the cores). Command: `python benchmarks/against_plain_keras.py "
                f"--write-results --models {' '.join(args.models)}` ({elapsed:.0f} s). Adam; first epoch: build, "
                f"compile and a fit of {FIRST_STEPS} steps; steady: {ROUNDS} interleaved rounds of {ROUND_STEPS} "
                f"steps per way.", "", *rows, "", *lines, "", "`tf_glp.Strategy().explain()` on the first model:",
                "", "```", *explain.splitlines(), "```"]
        write_section("tf_glp.Strategy against plain Keras and MirroredStrategy", "\n".join(text))


if __name__ == "__main__":
    main()
