"""tf_glp.Strategy against the user's alternatives: plain Keras (no
strategy) with and without its own knobs, and MirroredStrategy, on models a
user trains, on this machine.

    python benchmarks/against_plain_keras.py                  # every model, every way
    python benchmarks/against_plain_keras.py --models tiny    # one
    python benchmarks/against_plain_keras.py --ways knobs     # Keras' knobs against tf_glp.Strategy()
    python benchmarks/against_plain_keras.py --write-results  # and RESULTS.md

Ways (the same global batch for all, per model): plain Keras as compiled by
default, with `steps_per_execution=16`, with `jit_compile=True` (XLA) and
with both (the knobs Keras already has); MirroredStrategy on 1 and on 2
logical CPU devices (its default cross-device ops); `tf_glp.Strategy()` as a
user writes it (without GPUs: one device, plain Keras' path with the fused
optimizer step and the steps per execution where they measure faster) and
`tf_glp.Strategy(allow_xla=True)`; `tf_glp.Strategy(cpu_replicas=1)`
(update="auto", the default); and forced to 2 replicas with update="host",
"replicas" and "auto" (what it chose is printed; auto's plan file off, so
it measures in every run). `--ways knobs` runs the first four and the two
one-device tf_glp ways. Models: a tiny MLP (64 -> 32 -> 10, batch 64:
nothing to compute, so its step time is the fixed cost per step), the
quickstart's CNN on 8x8 digits (batch 64), the wide Adam MLP (1024 -> 4096
-> 4096 -> 10, batch 32), the CNN of strategies.py (32x32x3, batch 128) and
keras.applications' MobileNetV2 (32x32x3, weights=None, batch 32). Adam
everywhere.

One process per model (two MirroredStrategies with collective all-reduce and
different shapes cannot share one). Inside it: the first fit as the user
waits for it (build, compile and a fit of FIRST_STEPS steps, in epochs of
ROUND_STEPS (the data's size): tracing, XLA's
compile and tf_glp's start-up measurements included; tf_glp's steps per
execution are measured on this fit's steps as at the start of a long fit,
all rounds run, and decided within it), then ROUNDS short interleaved rounds of
ROUND_STEPS steps per way (the order rotating), each timed from the epoch's
begin to its end (epoch-level hooks: a callback with batch-level hooks would
hold tf_glp's steps per execution at 1): this machine alternates between a
fast and a ~1.7x slower phase lasting seconds. Reported: ms per step of the
fastest round, the median and the spread (max - min, % of the median); "x
plain" is plain Keras' fastest round over the way's fastest round (above 1:
faster than plain Keras). The verdicts compare tf_glp.Strategy() with the
fastest plain-Keras way that computes the same numbers (any
steps_per_execution: the same weights, bit for bit), and with allow_xla=True
with the fastest way of all.
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

FIRST_STEPS = 192  # epochs of ROUND_STEPS; what the counts' rounds take at most (12 calls of 16 steps)
ROUNDS = 7
ROUND_STEPS = 32  # a multiple of 16: every way runs whole executions
KNOBS = ["plain Keras", "plain spe 16", "plain XLA", "plain XLA spe 16", "tf_glp.Strategy()",
         "tf_glp allow_xla"]
WAYS = KNOBS + ["Mirrored 1 device", "Mirrored 2 devices", "tf_glp 1 replica", "tf_glp host 2 replicas",
                "tf_glp replicas 2 replicas", "tf_glp auto 2 replicas"]
SAME_NUMBERS = ["plain Keras", "plain spe 16"]  # what tf_glp.Strategy() is held against
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
        # Twice over: ROUND_STEPS batches of 64, an epoch's worth exactly (with
        # more, Keras' iterator runs out inside every other epoch of the first
        # fit, which then trains fewer steps than the counts' rounds take).
        half = ROUND_STEPS * 64 // 2
        x = np.tile((digits.images[..., None] / 16.0).astype(np.float32)[:half], (2, 1, 1, 1))
        y = np.tile(digits.target[:half], 2)
        return (lambda: keras.Sequential([
            keras.Input((8, 8, 1)), layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.Conv2D(64, 3, activation="relu"), layers.Flatten(), layers.Dense(128, activation="relu"),
            layers.Dense(10)]), x, y, 64)
    shapes = {"tiny": (64,), "wide": (1024,), "cnn": (32, 32, 3), "mobilenet": (32, 32, 3)}
    batches = {"tiny": 64, "wide": 32, "cnn": 128, "mobilenet": 32}
    batch = batches[name]
    x = rng.random((batch * ROUND_STEPS, *shapes[name]), dtype=np.float32)
    y = rng.integers(0, 10, batch * ROUND_STEPS)
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


def _ways(tf, tf_glp) -> dict:
    """{way: (make the strategy, compile's extra arguments)}."""
    plain = tf.distribute.get_strategy
    return {
        "plain Keras": (plain, {}),
        "plain spe 16": (plain, {"steps_per_execution": 16}),
        "plain XLA": (plain, {"jit_compile": True}),
        "plain XLA spe 16": (plain, {"jit_compile": True, "steps_per_execution": 16}),
        "tf_glp.Strategy()": (tf_glp.Strategy, {}),
        "tf_glp allow_xla": (lambda: tf_glp.Strategy(allow_xla=True), {}),
        "Mirrored 1 device": (lambda: tf.distribute.MirroredStrategy(["/cpu:0"]), {}),
        "Mirrored 2 devices": (lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), {}),
        "tf_glp 1 replica": (lambda: tf_glp.Strategy(cpu_replicas=1, plan_path=None), {}),
        "tf_glp host 2 replicas": (lambda: tf_glp.Strategy(cpu_replicas=2, update="host"), {}),
        "tf_glp replicas 2 replicas": (lambda: tf_glp.Strategy(cpu_replicas=2, update="replicas"), {}),
        "tf_glp auto 2 replicas": (lambda: tf_glp.Strategy(cpu_replicas=2, plan_path=None), {}),
    }


def run_model(name: str, ways: list[str]) -> dict:
    """Measures `ways` on one model (child process)."""
    child_setup()
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import tf_glp  # noqa: PLC0415

    tf_glp.strategy.cpu_replica_devices(2)
    makers = _ways(tf, tf_glp)
    make_model, x, y, batch = _model_and_data(name)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    trained, results = {}, {"first_fit_s": {}, "ms": {}, "explain": "", "lines": {}}
    # TensorFlow's one-time start-up (kernels, thread pools, the first
    # trace) would otherwise land in the first way's first fit.
    warm_up = make_model()
    warm_up.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    warm_up.fit(x, y, batch_size=batch, steps_per_epoch=2, epochs=1, verbose=0)
    for way in ways:
        keras.utils.set_random_seed(0)
        start = time.perf_counter()
        make_strategy, compile_args = makers[way]
        strategy = make_strategy()
        execution = getattr(strategy, "_choices", {}).get("execution")
        if execution is not None:  # (as at the start of a long fit: see the module docstring)
            execution.budget, execution.plan_path = float("inf"), None
            execution.xla_hint = float("inf")  # (a long fit measures XLA: its compile is small against it)
        with strategy.scope():
            model = make_model()
            model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss, **compile_args)
        model.fit(x, y, batch_size=batch, steps_per_epoch=ROUND_STEPS, epochs=FIRST_STEPS // ROUND_STEPS, verbose=0)
        results["first_fit_s"][way] = time.perf_counter() - start
        trained[way] = model
        if execution is not None:
            results["lines"][way] = execution.line()
        if way == "tf_glp.Strategy()":
            results["explain"] = strategy.explain()
        if way == "tf_glp auto 2 replicas":
            results["auto"] = strategy.update_choice.line()
    times = {way: [] for way in ways}
    clock = _epoch_clock(keras)
    for index in range(ROUNDS):
        for way in ways[index % len(ways):] + ways[:index % len(ways)]:
            trained[way].fit(x, y, batch_size=batch, steps_per_epoch=ROUND_STEPS, epochs=1, verbose=0,
                             callbacks=[clock])
            times[way].append(1e3 * clock.seconds / ROUND_STEPS)
    for way, values in times.items():
        median = statistics.median(values)
        results["ms"][way] = {"fastest": min(values), "median": median,
                              "spread_pct": 100 * (max(values) - min(values)) / median}
        print(f"  {name}, {way}: first fit {results['first_fit_s'][way]:.2f} s; steady {min(values):.2f} ms "
              f"fastest, {median:.2f} median", file=sys.stderr, flush=True)
    return results


def _epoch_clock(keras):
    class EpochClock(keras.callbacks.Callback):
        """How long the last epoch ran, from its begin to its end."""

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds = time.perf_counter() - self.start

    return EpochClock()


def table(all_results: dict, ways: list[str]) -> list[str]:
    rows = ["| model | " + " | ".join(ways) + " |", "|---" * (len(ways) + 1) + "|"]
    for name, results in all_results.items():
        ms = results["ms"]
        plain = ms["plain Keras"]["fastest"]
        rows.append(f"| {name}: first fit (s) | " + " | ".join(
            f"{results['first_fit_s'][w]:.2f}" for w in ways) + " |")
        rows.append(f"| {name}: ms/step fastest (x plain) | " + " | ".join(
            f"{ms[w]['fastest']:.2f} ({plain / ms[w]['fastest']:.2f}x)" for w in ways) + " |")
        rows.append(f"| {name}: median (spread) | " + " | ".join(
            f"{ms[w]['median']:.2f} ({ms[w]['spread_pct']:.0f}%)" for w in ways) + " |")
    return rows


def _against(ms: dict, way: str, others: list[str]) -> str:
    """`way` against the fastest of `others` (by fastest rounds): the ratio,
    and whether its fastest round is below, inside or above that way's
    range of rounds (min to max: the spread)."""
    best = min(others, key=lambda w: ms[w]["fastest"])
    mine, theirs = ms[way]["fastest"], ms[best]
    where = ("faster" if mine < theirs["fastest"] else "within the spread" if mine <= theirs["fastest"] * (
        1 + theirs["spread_pct"] / 100) else "slower")
    return f"{theirs['fastest'] / mine:.2f}x {best} ({mine:.2f} against {theirs['fastest']:.2f} ms/step: {where})"


def verdicts(all_results: dict, ways: list[str]) -> list[str]:
    lines = []
    for name, results in all_results.items():
        ms = results["ms"]
        fastest = {w: v["fastest"] for w, v in ms.items()}
        plain = fastest["plain Keras"]
        if set(KNOBS) <= set(ways):
            first = results["first_fit_s"]
            lines.append(f"- {name}: tf_glp.Strategy() {_against(ms, 'tf_glp.Strategy()', SAME_NUMBERS)}, the "
                         f"fastest plain way with the same numbers; first fit {first['tf_glp.Strategy()']:.2f} s "
                         f"against {first['plain Keras']:.2f} s. allow_xla=True "
                         f"{_against(ms, 'tf_glp allow_xla', KNOBS[:4])}, the fastest plain way; first fit "
                         f"{first['tf_glp allow_xla']:.2f} s. Chosen: {results['lines']['tf_glp.Strategy()']} | "
                         f"allow_xla: {results['lines']['tf_glp allow_xla']}")
        if set(WAYS) - set(KNOBS) <= set(ways):
            lines.append(f"- {name}: fixed cost over plain Keras per step: MirroredStrategy 1 device "
                         f"{fastest['Mirrored 1 device'] - plain:+.2f} ms, 2 devices "
                         f"{fastest['Mirrored 2 devices'] - plain:+.2f} ms; tf_glp 1 replica "
                         f"{fastest['tf_glp 1 replica'] - plain:+.2f} ms, 2 replicas (host / replicas) "
                         f"{fastest['tf_glp host 2 replicas'] - plain:+.2f} / "
                         f"{fastest['tf_glp replicas 2 replicas'] - plain:+.2f} ms; auto "
                         f"{fastest['tf_glp auto 2 replicas'] - plain:+.2f} ms ({results['auto']})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--ways", nargs="+", default=["all"], choices=["all", "knobs", *WAYS],
                        help="ways to run: all (default), knobs (Keras' knobs and one-device tf_glp), or names")
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print_result(run_model(args.child[0], args.child[1:]))
        return
    ways = WAYS if args.ways == ["all"] else KNOBS if args.ways == ["knobs"] else args.ways
    if "plain Keras" not in ways:
        ways = ["plain Keras", *ways]  # (every ratio is to it)
    start = time.time()
    all_results = {}
    for name in args.models:
        all_results[name] = run_child(__file__, name, *ways)
    rows, lines = table(all_results, ways), verdicts(all_results, ways)
    explain = next(iter(all_results.values()))["explain"]
    elapsed = time.time() - start
    print("\n".join(rows + [""] + lines + ["", explain, f"benchmark took {elapsed:.0f} s"]))
    if args.write_results:
        text = [f"Date {datetime.date.today().isoformat()}; machine: {platform.machine()}, {os.cpu_count()} cores, "
                f"no GPU (logical CPU devices share the cores). Command: `python benchmarks/against_plain_keras.py "
                f"--write-results --models {' '.join(args.models)} --ways {' '.join(args.ways)}` ({elapsed:.0f} s). "
                f"Adam; first fit: build, compile and a fit of {FIRST_STEPS} steps; steady: {ROUNDS} interleaved "
                f"rounds of {ROUND_STEPS} steps per way.", "", *rows, "", *lines]
        if explain:
            text += ["", "`tf_glp.Strategy().explain()` on the first model:", "", "```", *explain.splitlines(), "```"]
        title = ("tf_glp.Strategy against the knobs of plain Keras" if set(ways) <= set(KNOBS)
                 else "tf_glp.Strategy against plain Keras and MirroredStrategy")
        write_section(title, "\n".join(text))


if __name__ == "__main__":
    main()
