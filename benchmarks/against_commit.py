"""This checkout's tf_glp.Strategy against an older commit's, on one model.

    git worktree add /tmp/before 75222ef
    python benchmarks/against_commit.py --before /tmp/before [--replicas 4] [--model MLP] [--write-results]

Old and new code cannot share a process (they are the same package), so
this alternates processes: before, after, before, after, ... (PAIRS pairs).
Each process trains plain Keras and the chosen tf_glp.Strategy mode on the
same model (benchmarks/strategies.py's CNN or MLP, global batch 64 per
replica, Adam) and measures both in ROUNDS short interleaved rounds of
ROUND_STEPS steps. Plain Keras, the same code in both trees, is the yardstick:
the ratio "tf_glp / plain Keras" inside one process cancels most of this
machine's slow phases, and the comparison is between those ratios. The older
tree is imported with this checkout's op library (copied in if it has none).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import time

from child_process import child_setup, print_result, run_child
from results_file import write_section
from strategies import _models, step_clock_class

PAIRS = 3
ROUNDS = 8
ROUND_STEPS = 8
FIRST_STEPS = 10
HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(HERE)


def interleaved_rounds(replicas: int, model_name: str, update: str) -> dict:
    """Plain Keras and tf_glp.Strategy(update=...) in interleaved rounds (child process)."""
    child_setup(logical_cpus=replicas)
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_glp

    StepClock = step_clock_class(keras)  # noqa: N806
    build, shape = _models(keras)[model_name]
    global_batch = 64 * replicas
    rng = np.random.default_rng(0)
    x = rng.random((global_batch * 4, *shape), dtype=np.float32)
    y = rng.integers(0, 10, size=(global_batch * 4,))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch).repeat().prefetch(2)
    makers = {"plain": tf.distribute.get_strategy,
              "tf_glp": lambda: tf_glp.Strategy([f"/cpu:{i}" for i in range(replicas)], update=update)}
    models = {}
    for name, make in makers.items():
        with make().scope():
            model = build()
            model.compile(optimizer=keras.optimizers.Adam(1e-3),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(dataset, steps_per_epoch=FIRST_STEPS, epochs=1, verbose=0)
        models[name] = model
    rates = {name: [] for name in models}
    for index in range(ROUNDS):
        for name in (list(models) if index % 2 else list(models)[::-1]):
            clock = StepClock()
            models[name].fit(dataset, steps_per_epoch=ROUND_STEPS + 1, epochs=1, verbose=0, callbacks=[clock])
            rates[name].append(ROUND_STEPS / (clock.ends[-1] - clock.ends[0]))
    return {"tf_glp_file": tf_glp.__file__, "rates": rates}


def summary(rates: dict) -> dict:
    ratios = [ours / plain for ours, plain in zip(rates["tf_glp"], rates["plain"])]
    return {"ours_fastest": max(rates["tf_glp"]), "ours_median": statistics.median(rates["tf_glp"]),
            "plain_fastest": max(rates["plain"]), "plain_median": statistics.median(rates["plain"]),
            "ratio_fastest": max(rates["tf_glp"]) / max(rates["plain"]),
            "ratio_median": statistics.median(ratios)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", help="a checkout (git worktree) of the older commit")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--model", choices=["CNN", "MLP"], default="MLP")
    parser.add_argument("--update", choices=["host", "replicas"], default="host")
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print_result(interleaved_rounds(args.replicas, args.model, args.update))
        return
    if not args.before:
        parser.error("--before DIR is required")
    before = os.path.abspath(args.before)
    library = os.path.join(CHECKOUT, "tf_glp", "_tf_glp_ops.so")
    if not os.path.exists(os.path.join(before, "tf_glp", "_tf_glp_ops.so")):
        shutil.copy(library, os.path.join(before, "tf_glp"))
    start = time.time()
    rows = []
    for pair in range(PAIRS):
        for label, tree in (("before", before), ("after", CHECKOUT)):
            env = dict(os.environ, PYTHONPATH=tree)
            result = run_child(__file__, "--replicas", args.replicas, "--model", args.model, "--update", args.update,
                               env=env)
            if not result["tf_glp_file"].startswith(tree):
                raise RuntimeError(f"the {label} process imported tf_glp from {result['tf_glp_file']}, not {tree}")
            rows.append((f"{label} {pair + 1}", summary(result["rates"])))
            s = rows[-1][1]
            print(f"{rows[-1][0]}: tf_glp/plain fastest {s['ratio_fastest']:.3f}, median {s['ratio_median']:.3f}",
                  flush=True)
    lines = ["| process | tf_glp fastest | tf_glp median | plain Keras fastest | plain median "
             "| tf_glp / plain (fastest) | tf_glp / plain (median of rounds) |", "|---" * 7 + "|"]
    for label, s in rows:
        lines.append(f"| {label} | {s['ours_fastest']:.2f} | {s['ours_median']:.2f} | {s['plain_fastest']:.2f} | "
                     f"{s['plain_median']:.2f} | {s['ratio_fastest']:.3f} | {s['ratio_median']:.3f} |")
    verdict = []
    for label in ("before", "after"):
        mine = [s for name, s in rows if name.startswith(label)]
        verdict.append(f"{label}: tf_glp / plain Keras best {max(s['ratio_fastest'] for s in mine):.3f}, "
                       f"median of processes {statistics.median(s['ratio_median'] for s in mine):.3f}")
    elapsed = time.time() - start
    print("\n".join(lines + [""] + verdict))
    print(f"benchmark took {elapsed:.0f} s")
    if args.write_results:
        commit = subprocess.run(["git", "-C", before, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                                text=True).stdout.strip() or before
        subject = (f"tf_glp.Strategy(update={args.update!r}) against commit {commit}, "
                   f"{args.replicas} replicas, {args.model}")
        text = [f"Date: {datetime.date.today().isoformat()}. "
                f"Machine: {platform.machine()}, {os.cpu_count()} cores. Command: `python benchmarks/against_commit.py "
                f"--before <worktree of {commit}> --replicas {args.replicas} --model {args.model} --update "
                f"{args.update}` ({elapsed:.0f} s): alternating processes, each with plain Keras and tf_glp in "
                f"{ROUNDS} interleaved rounds of {ROUND_STEPS} steps (steps/s).", "", *lines, "",
                *[f"- {v}" for v in verdict], ""]
        write_section(subject, "\n".join(text))


if __name__ == "__main__":
    main()
