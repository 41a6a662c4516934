"""A loop of short fits on one model, as tuning loops, active learning and
epoch-by-epoch scripts call `fit`: plain Keras against `tf_glp.Strategy()`.

    python benchmarks/short_fits.py                    # print the table
    python benchmarks/short_fits.py --write-results    # and write its section of RESULTS.md

One process (CPU, one device). Each way builds its model once (the tiny MLP
64 -> 32 -> 10, Adam, batch 64) and then runs FITS fits of one epoch of
STEPS steps each. The ways: plain Keras as compiled by default, plain Keras
with `steps_per_execution=16` (Keras' own knob, set by hand: the same
weights) and `tf_glp.Strategy()`; their fits are interleaved so that this
machine's slow phases fall on all. Reported per way: the first fit (its
traces and, for tf_glp, its start-up choices) and the later fits, in ms per
step: median and spread (min-max); and tf_glp against each plain way: the
ratio of the later fits' medians, and the median (min-max) of the ratio
taken fit by fit (paired: the fits run back to back).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time

from child_process import child_setup
from results_file import write_section

FITS = 12
GLP = "tf_glp.Strategy()"
STEPS = 40
BATCH = 64


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--fits", type=int, default=FITS)
    args = parser.parse_args()
    child_setup()
    import keras
    import numpy as np

    import tf_glp

    rng = np.random.default_rng(0)
    x = rng.random((STEPS * BATCH, 64), dtype=np.float32)
    y = rng.integers(0, 10, STEPS * BATCH)

    def build(**compile_args):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), **compile_args)
        return model

    strategy = tf_glp.Strategy()
    with strategy.scope():
        ours = build()
    models = {"plain Keras": build(), "plain Keras, steps_per_execution=16": build(steps_per_execution=16),
              GLP: ours}
    ms = {name: [] for name in models}
    started = time.time()
    for _ in range(args.fits):
        for name, model in models.items():
            start = time.perf_counter()
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
            ms[name].append(1e3 * (time.perf_counter() - start) / STEPS)
    elapsed = time.time() - started
    glp = ms[GLP][1:]
    rows = ["| way | first fit (ms/step) | later fits: median (min-max) ms/step |", "|---|---|---|",
            *(f"| {name} | {times[0]:.2f} | {_spread(times[1:])} |" for name, times in ms.items())]
    summary = " ".join(
        f"Later fits, {name} / tf_glp: {statistics.median(ms[name][1:]) / statistics.median(glp):.2f}x by the "
        f"medians; paired, fit by fit: {_spread([p / g for p, g in zip(ms[name][1:], glp)])}x."
        for name in ms if name != GLP)
    print("\n".join(rows))
    print(summary)
    print(f"tf_glp: {strategy.explain().splitlines()[-1].strip()}")
    if args.write_results:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
        text = [f"Date: {datetime.date.today().isoformat()}. Commit: {commit}. Machine: {platform.machine()}, "
                f"{os.cpu_count()} cores. Command: `python benchmarks/short_fits.py --write-results` "
                f"({elapsed:.0f} s). Tiny MLP 64-32-10, Adam, batch {BATCH}, {args.fits} fits of one {STEPS}-step "
                f"epoch per way, interleaved, one process.", "", *rows, "", summary, "",
                f"tf_glp's execution line after the loop: `{strategy.explain().splitlines()[-1].strip()}`", ""]
        write_section("A loop of short fits", "\n".join(text))


if __name__ == "__main__":
    sys.exit(main())
