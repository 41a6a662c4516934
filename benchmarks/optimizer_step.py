"""The optimizer step chosen at start-up (issue 20): a wide MLP on one CPU
device, no strategy, plain Keras against the same script with
ConcurrencyProfiler (profiling, and reusing its plan).

    python benchmarks/optimizer_step.py                  # prints the table
    python benchmarks/optimizer_step.py --write-results  # and appends it to RESULTS.md

Model: 1024 -> 4096 -> 4096 -> 10 (21 M parameters), batch 32, Adam and SGD.
Inside one process: for each variant the first epoch as the user waits for
it (build, compile and a fit of one epoch of FIRST_STEPS steps, the
callback's profiling included: about 2.4 s for this model, so epochs under
about 80 steps end later than plain Keras' while longer ones end sooner), then
ROUNDS interleaved rounds of ROUND_STEPS steps per variant (timed between
batch ends), reported as the fastest round with the median and the spread
(max - min, % of the median): this machine alternates between a fast and a
~1.7x slower phase lasting seconds. The ceiling: an Adam step reads and
writes 28 bytes per parameter (weight, gradient, two moments), SGD's 12.
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
from strategies import step_clock_class

FIRST_STEPS = 160  # one epoch of 5120 samples
ROUNDS = 8
ROUND_STEPS = 10

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from tf_glp.callbacks import ConcurrencyProfiler  # noqa: PLC0415

    rng = np.random.default_rng(0)
    x = rng.random((32 * FIRST_STEPS, 1024), dtype=np.float32)
    y = rng.integers(0, 10, 32 * FIRST_STEPS)
    folder = tempfile.mkdtemp()

    StepClock = step_clock_class(keras)  # noqa: N806

    def build(optimizer):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(4096, activation="relu"),
                                  keras.layers.Dense(4096, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer=optimizer(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    rows, verdicts, choices = [], [], []
    start_all = time.time()
    for name, optimizer in (("Adam", lambda: keras.optimizers.Adam(1e-4)), ("SGD", lambda: keras.optimizers.SGD(1e-3))):
        plan_path = os.path.join(folder, f"{name}.json")
        variants = {
            "plain Keras": lambda: [],
            "profiling": lambda: [ConcurrencyProfiler(plan_path=None, verbose=0, batch_size=32)],
            "reusing the plan": lambda: [ConcurrencyProfiler(plan_path=plan_path, verbose=0, batch_size=32)],
        }
        build(optimizer).fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0,  # writes the plan to reuse
                             callbacks=[ConcurrencyProfiler(plan_path=plan_path, verbose=0, batch_size=32)])
        models, first = {}, {}
        for variant, callbacks in variants.items():
            start = time.perf_counter()
            model = build(optimizer)
            callback_list = callbacks()
            model.fit(x[:32 * FIRST_STEPS], y[:32 * FIRST_STEPS], batch_size=32, epochs=1, verbose=0,
                      callbacks=callback_list)
            first[variant] = time.perf_counter() - start
            models[variant] = model
            if callback_list and callback_list[0].plan is not None and callback_list[0].plan.optimizer:
                step = callback_list[0].plan.optimizer
                choices.append(f"{name}, {variant}: Keras {step['native_ms']:.1f} ms, fused {step['fused_ms']:.1f} ms "
                               f"-> {step['choice']} ({step['reason']})")
        rates = {variant: [] for variant in variants}
        names = list(variants)
        for index in range(args.rounds):
            for variant in names[index % 3:] + names[:index % 3]:
                clock = StepClock()
                models[variant].fit(x[:32 * (ROUND_STEPS + 1)], y[:32 * (ROUND_STEPS + 1)], batch_size=32,
                                    epochs=1, verbose=0, callbacks=[clock])
                rates[variant].append(1e3 * (clock.ends[-1] - clock.ends[0]) / ROUND_STEPS)  # ms per step
        plain = min(rates["plain Keras"])
        for variant in names:
            ms = rates[variant]
            median = statistics.median(ms)
            rows.append(f"| {name} | {variant} | {first[variant]:.2f} | {first[variant] / first['plain Keras']:.2f}x | "
                        f"{min(ms):.1f} | {median:.1f} ({100 * (max(ms) - min(ms)) / median:.0f}%) | "
                        f"{plain / min(ms):.2f}x |")
        verdicts.append(f"- {name}: steady step {plain / min(rates['reusing the plan']):.2f}x (reusing the plan), "
                        f"{plain / min(rates['profiling']):.2f}x (profiling) of plain Keras, fastest rounds; "
                        f"first epoch {first['profiling'] / first['plain Keras']:.2f}x of plain Keras' time "
                        f"while profiling")
    header = ["| optimizer | variant | first epoch (s) | vs plain | steady ms/step, fastest | median (spread) | "
              "speed-up (fastest) |", "|---|---|---|---|---|---|---|"]
    print("\n".join(header + rows))
    print("\n".join(verdicts))
    print("\n".join(choices))
    elapsed = time.time() - start_all
    print(f"benchmark took {elapsed:.0f} s", file=sys.stderr)
    if args.write_results:
        append_section("\n".join([
            f"## Optimizer step chosen at start-up (issue 20) — {datetime.date.today().isoformat()}", "",
            f"Machine: {platform.machine()}, {os.cpu_count()} cores, one CPU device, no strategy. Command: "
            f"`python benchmarks/optimizer_step.py --write-results` ({elapsed:.0f} s). Wide MLP 1024-4096-4096-10, "
            f"batch 32. First epoch: build, compile, fit of {FIRST_STEPS} steps (profiling included). Steady: "
            f"{args.rounds} interleaved rounds of {ROUND_STEPS} steps per variant in one process.", "",
            *header, *rows, "", *verdicts, "", "The profiler's measurements:", "", *[f"- {c}" for c in choices], ""]))


if __name__ == "__main__":
    main()
