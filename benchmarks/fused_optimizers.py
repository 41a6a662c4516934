"""Every fused optimizer update against Keras' own, alone and in a whole fit.

    python benchmarks/fused_optimizers.py                  # both parts
    python benchmarks/fused_optimizers.py --part update    # the update alone
    python benchmarks/fused_optimizers.py --part fit --optimizers RMSprop Lion
    python benchmarks/fused_optimizers.py --write-results  # and RESULTS.md

Part "update": one optimizer step on PARAMETERS float32 weights (two
variables, far larger than the last-level cache), Keras' `apply` against the
same `apply` with tf_glp's fused update in place of Keras' update step,
ROUNDS interleaved rounds of CALLS steps each (the order alternating). The
ceiling is the time the bytes the fused update must move per parameter (in
one pass the gradient once, the weight and every slot read and written;
Lamb's and Adafactor's norms and means need two and three passes:
HostUpdate.bytes_per_parameter) take at the machine's memory bandwidth:
numpy's probes in the same run, or the highest rate seen (update_rows).

Part "fit": the wide MLP 1024 -> 4096 -> 4096 -> 10 (batch 32), a whole fit
of FIT_STEPS steps as a user runs it the first time (build, compile, fit:
tracing and tf_glp's start-up measurement included), plain Keras against
`tf_glp.Strategy()`, per optimizer, REPEATS times interleaved; each fit in
its own fresh model. Reported: the fastest and the median.

Every optimizer of tf_glp.ops.keras_fused.FUSED_OPTIMIZER_TABLE, with its
default settings (Adam also with amsgrad, RMSprop also centered with
momentum: the largest update of each).
"""

from __future__ import annotations

import argparse
import contextlib
import concurrent.futures
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time

from child_process import child_setup, print_result, run_child
from results_file import write_section

PARAMETERS = 16 * 1024 * 1024  # 64 MB of float32 weights: twice the 32 MB L3 here
ROUNDS = 7
CALLS = 3
FIT_STEPS = 256
REPEATS = 2
# (label, class name, settings).
CASES = [
    ("SGD", "SGD", {}), ("SGD momentum", "SGD", {"momentum": 0.9}), ("Adam", "Adam", {}),
    ("Adam amsgrad", "Adam", {"amsgrad": True}), ("AdamW", "AdamW", {}), ("RMSprop", "RMSprop", {}),
    ("RMSprop centered momentum", "RMSprop", {"centered": True, "momentum": 0.9}), ("Adagrad", "Adagrad", {}),
    ("Adamax", "Adamax", {}), ("Adadelta", "Adadelta", {}), ("Lion", "Lion", {}), ("Nadam", "Nadam", {}),
    ("Ftrl", "Ftrl", {}), ("ScheduleFreeAdamW", "ScheduleFreeAdamW", {}), ("Lamb", "Lamb", {}),
    ("Adafactor", "Adafactor", {}),
]


def _bandwidths_gbs(np) -> tuple[float, float]:
    """(read, write) bandwidth in GB/s on two threads over 256 MB (best of 5
    each): a sum reads; a copy reads and writes, and its time less the
    reading's gives the writing's."""
    source = np.ones(64 * 1024 * 1024, np.float32)
    target = np.empty_like(source)
    halves = [slice(0, source.size // 2), slice(source.size // 2, None)]

    def best(work) -> float:
        seconds = float("inf")
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for _ in range(5):
                start = time.perf_counter()
                list(pool.map(work, halves))
                seconds = min(seconds, time.perf_counter() - start)
        return seconds

    read = best(lambda s: source[s].sum())
    copy = best(lambda s: np.copyto(target[s], source[s]))
    return source.nbytes / read / 1e9, source.nbytes / max(copy - read, 1e-9) / 1e9


def _step_function(tf, optimizer, grads, variables):
    @tf.function(autograph=False)
    def step():
        optimizer.apply(grads, variables)
        return tf.reshape(variables[0].value, [-1])[0]
    return step


def run_updates(labels: list[str]) -> dict:
    child_setup()
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from tf_glp._keras import patches  # noqa: PLC0415
    from tf_glp.ops.keras_fused import fused_optimizer, fused_update_step  # noqa: PLC0415

    patches.install()
    read_gbs, write_gbs = _bandwidths_gbs(np)
    rng = np.random.default_rng(0)
    shapes = [(PARAMETERS // 4096 - 1, 4096), (4096,)]
    results = {"read_gbs": read_gbs, "write_gbs": write_gbs, "updates": {}}
    for label, class_name, settings in CASES:
        if label not in labels:
            continue
        steps = {}
        for way in ("keras", "fused"):
            variables = [keras.Variable(rng.random(s, dtype=np.float32) - 0.5) for s in shapes]
            grads = [tf.constant(rng.random(s, dtype=np.float32) - 0.5) for s in shapes]
            optimizer = getattr(keras.optimizers, class_name)(1e-3, **settings)
            optimizer.build(variables)
            patches.set_fused_update(optimizer, fused_update_step if way == "fused" else None)

            steps[way] = _step_function(tf, optimizer, grads, variables)
            steps[way]().numpy()  # trace and warm up
        times = {"keras": [], "fused": []}
        for index in range(ROUNDS):
            for way in (("keras", "fused") if index % 2 == 0 else ("fused", "keras")):
                start = time.perf_counter()
                for _ in range(CALLS):
                    steps[way]().numpy()
                times[way].append((time.perf_counter() - start) / CALLS)
        optimizer = getattr(keras.optimizers, class_name)(**settings)
        optimizer.build([keras.Variable(np.zeros(1, np.float32))])
        update = fused_optimizer(optimizer).host_update(optimizer)
        results["updates"][label] = {"keras_ms": [1e3 * t for t in times["keras"]],
                                     "fused_ms": [1e3 * t for t in times["fused"]],
                                     "bytes_per_parameter": update.bytes_per_parameter}
        print(f"  {label}: keras {1e3 * min(times['keras']):.1f} ms, fused {1e3 * min(times['fused']):.1f} ms",
              file=sys.stderr, flush=True)
    return results


def run_fit(way: str, label: str) -> dict:
    """One whole first fit of the wide MLP (a fresh process: a user's run)."""
    child_setup()
    start = time.perf_counter()
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    import tf_glp  # noqa: PLC0415

    _, class_name, settings = next(case for case in CASES if case[0] == label)
    rng = np.random.default_rng(0)
    x = rng.random((32 * FIT_STEPS, 1024), dtype=np.float32)
    y = rng.integers(0, 10, 32 * FIT_STEPS)
    keras.utils.set_random_seed(0)
    strategy = tf_glp.Strategy(plan_path=None) if way == "tf_glp" else None
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(4096, activation="relu"),
                                  keras.layers.Dense(4096, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer=getattr(keras.optimizers, class_name)(1e-3, **settings),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    result = {"seconds": time.perf_counter() - start}
    if strategy is not None:
        result["explain"] = next((line.strip() for line in strategy.explain().splitlines()
                                  if "optimizer step" in line), "")
    return result


def _ms(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f}"


def update_rows(results: dict) -> list[str]:
    """The table; the ceiling is the larger of numpy's two-thread probes and
    the highest rate any fused update reached in the run (the probes
    compute as they stream: they read below what the machine can)."""
    read, write = results["read_gbs"], results["write_gbs"]
    updates = results["updates"]
    achieved = {label: r["bytes_per_parameter"] * PARAMETERS / (min(r["fused_ms"]) * 1e-3) / 1e9
                for label, r in updates.items()}
    ceiling = max(read, *achieved.values())
    rows = [f"Memory bandwidth on two threads, numpy's probes: read {read:.1f} GB/s (a sum), write {write:.1f} GB/s "
            f"(a copy less the sum's time). Ceiling used: {ceiling:.1f} GB/s (read + written), the larger of the read "
            "probe and the highest rate a fused update reached.", "",
            "| optimizer | Keras ms (fastest / median) | fused ms (fastest / median) | Keras / fused (fastest) | "
            "bytes / parameter | fused GB/s | ceiling ms | fraction of ceiling |",
            "|---|---|---|---|---|---|---|---|"]
    for label, r in updates.items():
        fused = min(r["fused_ms"])
        ceiling_ms = 1e3 * r["bytes_per_parameter"] * PARAMETERS / (ceiling * 1e9)
        rows.append(f"| {label} | {_ms(r['keras_ms'])} | {_ms(r['fused_ms'])} | "
                    f"{min(r['keras_ms']) / fused:.2f}x | {r['bytes_per_parameter']} | {achieved[label]:.1f} | "
                    f"{ceiling_ms:.1f} | {ceiling_ms / fused:.2f} |")
    return rows


def fit_rows(fits: dict) -> list[str]:
    rows = ["| optimizer | plain Keras s (fastest / median) | tf_glp.Strategy() s (fastest / median) | "
            "plain / tf_glp (fastest; medians) | explain() |", "|---|---|---|---|---|"]
    for label, r in fits.items():
        plain, glp = r["plain"], r["tf_glp"]
        rows.append(f"| {label} | {min(plain):.1f} / {statistics.median(plain):.1f} | "
                    f"{min(glp):.1f} / {statistics.median(glp):.1f} | {min(plain) / min(glp):.2f}x; "
                    f"{statistics.median(plain) / statistics.median(glp):.2f}x | {r['explain']} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    labels = [case[0] for case in CASES]
    parser.add_argument("--part", choices=["update", "fit", "both"], default="both")
    parser.add_argument("--optimizers", nargs="+", default=labels, choices=labels)
    parser.add_argument("--repeats", type=int, default=REPEATS, help=f"fits per way and optimizer (default {REPEATS})")
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        print_result(run_updates(rest) if kind == "update" else run_fit(rest[0], " ".join(rest[1:])))
        return
    start = time.time()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    text = [f"Date {datetime.date.today().isoformat()}, commit {commit}; machine: {platform.machine()}, "
            f"{os.cpu_count()} cores, no GPU. Command: `python benchmarks/fused_optimizers.py --part {args.part}`."]
    if args.part in ("update", "both"):
        rows = update_rows(run_child(__file__, "update", *args.optimizers))
        print("\n".join(rows))
        text += ["", f"The update alone: one step on {PARAMETERS / 2**20:.0f} Mi float32 parameters, {ROUNDS} "
                 f"interleaved rounds of {CALLS} steps; ceiling: bytes per parameter over the bandwidth.", "", *rows]
    if args.part in ("fit", "both"):
        fits = {}
        for label in args.optimizers:
            fits[label] = {"plain": [], "tf_glp": [], "explain": ""}
            for index in range(args.repeats):
                for way in (("plain", "tf_glp") if index % 2 == 0 else ("tf_glp", "plain")):
                    result = run_child(__file__, "fit", way, label)
                    fits[label][way].append(result["seconds"])
                    fits[label]["explain"] = result.get("explain", fits[label]["explain"])
            print(f"  {label}: plain {fits[label]['plain']}, tf_glp {fits[label]['tf_glp']}", file=sys.stderr,
                  flush=True)
        rows = fit_rows(fits)
        print("\n".join(rows))
        text += ["", f"A whole first fit of the wide MLP (1024-4096-4096-10, batch 32, {FIT_STEPS} steps; a fresh "
                 f"process per fit: import, build, compile, tracing and start-up measurement included), "
                 f"{args.repeats} interleaved repetitions.", "", *rows]
    print(f"benchmark took {time.time() - start:.0f} s")
    if args.write_results:
        write_section("Fused optimizer updates against Keras' own", "\n".join(text))


if __name__ == "__main__":
    main()
