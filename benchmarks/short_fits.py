"""A loop of short fits on one model, as tuning loops, active learning and
epoch-by-epoch scripts call `fit`: plain Keras against `tf_glp.Strategy()`.

    python benchmarks/short_fits.py                    # print the table
    python benchmarks/short_fits.py --write-results    # and write its section of RESULTS.md

One process (CPU, one device). Each way builds its model once (the tiny MLP
64 -> 32 -> 10, Adam, batch 64) and then runs FITS fits of one epoch of
STEPS steps each; the ways' fits are interleaved (plain, tf_glp, plain, ...)
so that this machine's slow phases fall on both. Reported per way: the first
fit (its traces and, for tf_glp, its start-up choices) and the later fits,
in ms per step: median and spread (min-max); and the ratio plain / tf_glp
of the later fits' medians, with the median (min-max) of the ratio taken fit
by fit (paired: the two fits run back to back).
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

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    strategy = tf_glp.Strategy()
    with strategy.scope():
        models = {"tf_glp.Strategy()": build()}
    models = {"plain Keras": build(), **models}
    ms = {name: [] for name in models}
    started = time.time()
    for _ in range(args.fits):
        for name, model in models.items():
            start = time.perf_counter()
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
            ms[name].append(1e3 * (time.perf_counter() - start) / STEPS)
    elapsed = time.time() - started
    plain, glp = ms["plain Keras"], ms["tf_glp.Strategy()"]
    paired = [p / g for p, g in zip(plain[1:], glp[1:])]
    rows = ["| way | first fit (ms/step) | later fits: median (min-max) ms/step |", "|---|---|---|",
            *(f"| {name} | {times[0]:.2f} | {_spread(times[1:])} |" for name, times in ms.items())]
    summary = (f"Later fits: plain / tf_glp = {statistics.median(plain[1:]) / statistics.median(glp[1:]):.2f}x by "
               f"the medians; paired, fit by fit: {_spread(paired)}x.")
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
