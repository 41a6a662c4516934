"""What the user feels: one whole fit, start-up included, per way.

    python benchmarks/whole_fit.py                        # every model, 3 repetitions
    python benchmarks/whole_fit.py --models tiny --repeats 5
    python benchmarks/whole_fit.py --write-results
    python benchmarks/whole_fit.py --models tiny --tensorboard   # each fit with keras.callbacks.TensorBoard()

Each fit runs in a fresh process, as a user's script does (import, build,
compile, fit: tracing and tf_glp's start-up measurements included; the clock
starts before `import keras`). The ways: plain Keras as compiled by default,
plain Keras with `steps_per_execution=16` (Keras' own knob: the same weights,
bit for bit), `tf_glp.Strategy()` on a cold plan (a plan file that does not
exist yet: the first run) and on a warm one (the same script run again: the
plan the cold run wrote). The ways are interleaved, REPEATS times; reported:
the median of each and its spread (max - min), tf_glp's medians against
the faster plain way, and the median (min-max) of the same ratio taken
within each repetition (paired: its ways run back to back). With
--tensorboard every fit has the callback a tutorial adds,
keras.callbacks.TensorBoard(log_dir) as Keras defaults it.

Models (Adam everywhere): the tiny
MLP 64 -> 32 -> 10 (60,000 samples, batch 64, 5 epochs), the quickstart's CNN
on 8x8x1 (20,000 samples, batch 64, 5 epochs; and "quickstart-script": the
fit examples/quickstart.py runs, 1,500 samples, 8 epochs), the wide MLP 1024 -> 4096
-> 4096 -> 10 (8,192 samples, batch 32, 2 epochs) and MobileNetV2 on 32x32x3
(4,096 samples, batch 32, 2 epochs; with BatchNormalization).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from child_process import child_setup, print_result, run_child
from results_file import write_section

REPEATS = 3
WAYS = ["plain", "plain spe=16", "tf_glp cold", "tf_glp warm"]
# (input shape, samples, batch, epochs)
MODELS = {"tiny": ((64,), 60_000, 64, 5), "quickstart": ((8, 8, 1), 20_000, 64, 5),
          "quickstart-script": ((8, 8, 1), 1_500, 64, 8),
          "wide": ((1024,), 8_192, 32, 2), "mobilenet": ((32, 32, 3), 4_096, 32, 2)}


def _model(keras, name: str):
    layers = keras.layers
    if name == "tiny":
        return keras.Sequential([keras.Input((64,)), layers.Dense(32, activation="relu"), layers.Dense(10)])
    if name.startswith("quickstart"):
        return keras.Sequential([
            keras.Input((8, 8, 1)), layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.Conv2D(64, 3, activation="relu"), layers.Flatten(), layers.Dense(128, activation="relu"),
            layers.Dense(10)])
    if name == "mobilenet":  # (untrained: weights=None; logits, as the others)
        return keras.applications.MobileNetV2(input_shape=(32, 32, 3), weights=None, classes=10,
                                              classifier_activation=None)
    return keras.Sequential([keras.Input((1024,)), layers.Dense(4096, activation="relu"),
                             layers.Dense(4096, activation="relu"), layers.Dense(10)])


def run_fit(name: str, way: str, plan_path: str, log_dir: str) -> dict:
    """One whole fit (this process is the user's script)."""
    start = time.perf_counter()
    child_setup()
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    import tf_glp  # noqa: PLC0415

    shape, samples, batch, epochs = MODELS[name]
    rng = np.random.default_rng(0)
    x = rng.random((samples, *shape), dtype=np.float32)
    y = rng.integers(0, 10, samples)
    keras.utils.set_random_seed(0)
    strategy = tf_glp.Strategy(plan_path=plan_path) if way.startswith("tf_glp") else None
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = _model(keras, name)
        knob = {"steps_per_execution": 16} if way == "plain spe=16" else {}  # (else as the user compiles)
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), **knob)
    callbacks = [keras.callbacks.TensorBoard(log_dir)] if log_dir != "-" else []
    history = model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, callbacks=callbacks)
    result = {"seconds": time.perf_counter() - start, "loss": float(history.history["loss"][-1])}
    if strategy is not None:
        result["explain"] = strategy.explain()
    return result


def _paired(seconds: dict, way: str) -> str:
    """The median (min-max) over the repetitions of the faster plain way's
    seconds over `way`'s in the same repetition (the ways of a repetition
    run back to back, so the machine's slow phases cancel more than in the
    medians' ratio)."""
    ratios = [min(plain, spe) / mine for plain, spe, mine in
              zip(seconds["plain"], seconds["plain spe=16"], seconds[way])]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def rows(results: dict) -> list[str]:
    lines = ["| model | fit | plain s | plain spe=16 s | tf_glp cold s | tf_glp warm s | cold / faster plain | "
             "warm / faster plain | cold, paired | warm, paired |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, seconds in results.items():
        shape, samples, batch, epochs = MODELS[name]
        median = {way: statistics.median(seconds[way]) for way in WAYS}
        cell = {way: f"{median[way]:.1f} ({max(seconds[way]) - min(seconds[way]):.1f})" for way in WAYS}
        fastest = min(median["plain"], median["plain spe=16"])
        lines.append(f"| {name} | {samples:,} samples, batch {batch}, {epochs} epochs | {cell['plain']} | "
                     f"{cell['plain spe=16']} | {cell['tf_glp cold']} | {cell['tf_glp warm']} | "
                     f"{fastest / median['tf_glp cold']:.2f}x | {fastest / median['tf_glp warm']:.2f}x | "
                     f"{_paired(seconds, 'tf_glp cold')} | {_paired(seconds, 'tf_glp warm')} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--tensorboard", action="store_true", help="each fit with keras.callbacks.TensorBoard")
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print_result(run_fit(*args.child))
        return
    start = time.time()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    results, explains = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            results[name] = {way: [] for way in WAYS}
            for index in range(args.repeats):
                plan = os.path.join(scratch, f"{name}-{index}.json")  # cold: not there yet
                order = WAYS if index % 2 == 0 else ["tf_glp cold", "tf_glp warm", "plain spe=16", "plain"]
                for way in order:
                    log_dir = os.path.join(scratch, f"logs-{name}-{index}-{way}") if args.tensorboard else "-"
                    result = run_child(__file__, name, way, plan, log_dir)
                    results[name][way].append(result["seconds"])
                    explains[(name, way)] = result.get("explain", "")
                print(f"  {name} {index}: " + ", ".join(f"{w} {results[name][w][-1]:.1f} s" for w in WAYS),
                      file=sys.stderr, flush=True)
    table = rows(results)
    print("\n".join(table))
    for (name, way), text in explains.items():
        if text:
            print(f"\n{name}, {way}:\n{text}")
    print(f"benchmark took {time.time() - start:.0f} s")
    if args.write_results:
        title = "A whole fit as the user runs it, cold and warm" + (", with TensorBoard" if args.tensorboard else "")
        write_section(title, "\n".join([
            f"Date {datetime.date.today().isoformat()}, commit {commit}; machine: {platform.machine()}, "
            f"{os.cpu_count()} cores, no GPU. Command: `python benchmarks/whole_fit.py --models "
            f"{' '.join(args.models)} --repeats {args.repeats}{' --tensorboard' * args.tensorboard}`. Seconds: median of {args.repeats} interleaved "
            "repetitions (spread, max - min), each fit a fresh process from `import keras` to the end of fit; "
            "paired: the median (min-max) of each repetition's own ratio.",
            "", *table]))


if __name__ == "__main__":
    main()
