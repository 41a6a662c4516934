"""The start-up profiler on a wide MLP on one CPU device, no strategy:
plain Keras against the same script with ConcurrencyProfiler, profiling
(no plan file) and reusing its plan; part of benchmarks/profiler.py.

    python benchmarks/profiler.py --parts wide determinism

Model: 1024 -> 4096 -> 4096 -> 10 (21 M parameters), batch 32, Adam and SGD;
the profiler chooses the layers' kernels and the optimizer step (Keras' or
the fused native update). Inside one process:
- first epoch, as the user waits for it: build, compile and a fit of one
  epoch of FIRST_STEPS steps, the callback's profiling included (a fresh
  model each time), FIRST_ROUNDS interleaved rounds;
- steady step: STEADY_ROUNDS interleaved rounds of ROUND_STEPS steps per
  variant on the models trained above (timed between batch ends).
Each reported as the fastest round with the median and the spread (max -
min, % of the median): this machine alternates between a fast and a ~1.7x
slower phase lasting seconds, so only rounds close in time are compared.

The determinism run is the same for Adam, in a child process (this file,
`--child FIRST_ROUNDS STEADY_ROUNDS`) that calls
tf.config.experimental.enable_op_determinism() first (it cannot be turned
off again), and checks that two runs reusing the plan end bitwise equal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from child_process import child_setup, print_result, run_child
from strategies import step_clock_class

FIRST_STEPS = 160  # one epoch of 5120 samples
FIRST_ROUNDS = 3
STEADY_ROUNDS = 12
ROUND_STEPS = 10
VARIANTS = ("plain Keras", "profiling", "reusing the plan")


def _summary(values, scale=1.0) -> dict:
    values = [v * scale for v in values]
    median = statistics.median(values)
    return {"fastest": min(values), "median": median, "spread": (max(values) - min(values)) / median}


def measure(optimizers=("Adam", "SGD"), first_rounds=FIRST_ROUNDS, steady_rounds=STEADY_ROUNDS,
            check_repeats=False) -> dict:
    """{optimizer: {"first": {variant: summary}, "steady": {...}, "choice": str,
    "repeats": bool | None}} for this process (determinism as it is set)."""
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from tf_glp.callbacks import ConcurrencyProfiler  # noqa: PLC0415

    rng = np.random.default_rng(0)
    x = rng.random((32 * FIRST_STEPS, 1024), dtype=np.float32)
    y = rng.integers(0, 10, 32 * FIRST_STEPS)
    folder = tempfile.mkdtemp()

    StepClock = step_clock_class(keras)  # noqa: N806

    makers = {"Adam": lambda: keras.optimizers.Adam(1e-4), "SGD": lambda: keras.optimizers.SGD(1e-3)}

    def build(name):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(4096, activation="relu"),
                                  keras.layers.Dense(4096, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer=makers[name](), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    out = {}
    for name in optimizers:
        plan_path = os.path.join(folder, f"{name}.json")
        callbacks = {"plain Keras": lambda: [],
                     "profiling": lambda: [ConcurrencyProfiler(plan_path=None, verbose=0, batch_size=32)],
                     "reusing the plan": lambda p=plan_path: [ConcurrencyProfiler(plan_path=p, verbose=0,
                                                                                  batch_size=32)]}
        # Writes the plan the "reusing" variant reads, and pays the process's
        # own first-use costs (tracing machinery, the op library) for all.
        build(name).fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0, callbacks=callbacks["reusing the plan"]())
        first = {variant: [] for variant in VARIANTS}
        models, choice = {}, ""
        for index in range(first_rounds):
            for variant in VARIANTS[index % 3:] + VARIANTS[:index % 3]:
                start = time.perf_counter()
                model = build(name)
                callback_list = callbacks[variant]()
                model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=callback_list)
                first[variant].append(time.perf_counter() - start)
                models[variant] = model
                if variant == "profiling" and callback_list[0].plan is not None:
                    step = callback_list[0].plan.optimizer or {}
                    choice = (f"Keras {step.get('native_ms', 0):.1f} ms, fused {step.get('fused_ms', 0):.1f} ms "
                              f"-> {step.get('choice', 'native')} ({step.get('reason', 'not timed')})")
        steady = {variant: [] for variant in VARIANTS}
        for index in range(steady_rounds):
            for variant in VARIANTS[index % 3:] + VARIANTS[:index % 3]:
                clock = StepClock()
                models[variant].fit(x[:32 * (ROUND_STEPS + 1)], y[:32 * (ROUND_STEPS + 1)], batch_size=32,
                                    epochs=1, verbose=0, callbacks=[clock])
                steady[variant].append((clock.ends[-1] - clock.ends[0]) / ROUND_STEPS)
        repeats = None
        if check_repeats:  # two fresh runs reusing the plan: bitwise the same weights
            ends = []
            for _ in range(2):
                model = build(name)
                model.fit(x[:32 * 20], y[:32 * 20], batch_size=32, epochs=1, verbose=0, shuffle=False,
                          callbacks=callbacks["reusing the plan"]())
                ends.append([w.numpy() for w in model.weights + model.optimizer.variables])
            repeats = all(np.array_equal(a, b) for a, b in zip(*ends, strict=True))
        out[name] = {"first": {v: _summary(first[v]) for v in VARIANTS},
                     "steady": {v: _summary(steady[v], 1e3) for v in VARIANTS}, "choice": choice,
                     "repeats": repeats}
    return out


def measure_under_determinism(first_rounds=2, steady_rounds=6) -> dict:
    """measure() for Adam in a child process with op determinism enabled."""
    return run_child(__file__, first_rounds, steady_rounds)


def rows(results: dict, label: str) -> list[str]:
    """Table rows: one per optimizer and variant."""
    out = []
    for name, result in results.items():
        plain_first, plain_steady = result["first"]["plain Keras"], result["steady"]["plain Keras"]
        for variant in VARIANTS:
            first, steady = result["first"][variant], result["steady"][variant]
            out.append(f"| {label} | {name} | {variant} | {first['fastest']:.2f} | {first['median']:.2f} "
                       f"({100 * first['spread']:.0f}%) | {plain_first['fastest'] / first['fastest']:.2f}x | "
                       f"{steady['fastest']:.1f} | {steady['median']:.1f} ({100 * steady['spread']:.0f}%) | "
                       f"{plain_steady['fastest'] / steady['fastest']:.2f}x |")
    return out


HEADER = ["| run | optimizer | variant | first epoch (s), fastest | median (spread) | first epoch speed-up | "
          "steady ms/step, fastest | median (spread) | steady speed-up |",
          "|---|---|---|---|---|---|---|---|---|"]


def verdicts(results: dict, label: str) -> list[str]:
    out = []
    for name, result in results.items():
        first, steady = result["first"], result["steady"]
        plain = steady["plain Keras"]["fastest"]
        line = (f"- {label}, {name}: steady step {plain / steady['reusing the plan']['fastest']:.2f}x "
                f"(reusing the plan) and {plain / steady['profiling']['fastest']:.2f}x "
                f"(profiling) of plain Keras; first epoch with profiling "
                f"{first['plain Keras']['fastest'] / first['profiling']['fastest']:.2f}x (fastest rounds), "
                f"{first['plain Keras']['median'] / first['profiling']['median']:.2f}x (medians); "
                f"the profiler's optimizer step: {result['choice']}")
        if result["repeats"] is not None:
            line += f"; two runs reusing the plan {'bitwise equal' if result['repeats'] else 'DIFFER'}"
        out.append(line)
    return out


def _determinism_child() -> None:
    """The child of measure_under_determinism."""
    parser = argparse.ArgumentParser(description="measure() for Adam with op determinism (a child process)")
    parser.add_argument("--child", nargs=2, type=int, required=True, metavar=("FIRST_ROUNDS", "STEADY_ROUNDS"))
    first_rounds, steady_rounds = parser.parse_args().child
    child_setup()
    import tensorflow as tf  # noqa: PLC0415

    tf.config.experimental.enable_op_determinism()
    print_result(measure(("Adam",), first_rounds, steady_rounds, check_repeats=True))


if __name__ == "__main__":
    _determinism_child()
