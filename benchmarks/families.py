"""The model families people train, as they call `fit`: plain Keras against
`tf_glp.Strategy()` as written, per family, in one process (CPU, one device).

    python benchmarks/families.py                 # every family: a record, and its RESULTS.md section
    python benchmarks/families.py text_gru mlp    # some: a record only
    python benchmarks/families.py --render        # the section again, from the latest record

Per family, three ways, each its own model built once (same seed): plain
Keras as compiled by default, plain Keras with `steps_per_execution=16`
(Keras' own knob, set by hand: the same weights) and `tf_glp.Strategy()`.
Two measurements, each way's runs interleaved so this machine's slow phases
fall on all:
- a loop of FITS short fits of one SHORT_STEPS-step epoch on one model (a
  tuning loop, an epoch-by-epoch script): the first fit is the cold one
  (traces, tf_glp's start-up choices), the later ones warm;
- one long fit of LONG_STEPS steps on a new model, start-up included,
  LONG_REPEATS times.
Figures in ms per step. The record (records.py: benchmarks/records/
families.jsonl) holds every fit's figure, and per family tf_glp's ratio to
each plain way: (plain ms / tf_glp ms) of the later short fits' medians and
of the long fits' medians, and the cold first fit's, with tf_glp's
explain() after the loop.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import records
from child_process import child_setup
from results_file import write_section

FITS, SHORT_STEPS = 8, 32
LONG_STEPS, LONG_REPEATS = 192, 3
BATCH = 64
PLAIN, KNOB, GLP = "plain Keras", "plain Keras, steps_per_execution=16", "tf_glp.Strategy()"


def families(keras, np) -> dict:
    """name -> (build(**compile_args) -> compiled model, inputs, targets)."""
    L, rng = keras.layers, np.random.default_rng(0)
    n = max(SHORT_STEPS, LONG_STEPS) * BATCH
    tokens = lambda vocabulary, length: rng.integers(0, vocabulary, (n, length)).astype("int32")  # noqa: E731
    labels = rng.integers(0, 2, n)

    def compiled(layers_or_model, optimizer, loss="sparse_categorical_crossentropy_logits", **compile_args):
        model = layers_or_model if isinstance(layers_or_model, keras.Model) else keras.Sequential(layers_or_model)
        model.compile(optimizer=optimizer(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
                      if loss.endswith("logits") else loss, **compile_args)
        return model

    def transformer():
        inputs = keras.Input((40,), dtype="int32")
        x = L.Embedding(8000, 64)(inputs)
        x = L.LayerNormalization()(x + L.MultiHeadAttention(4, 16)(x, x))
        x = L.LayerNormalization()(x + L.Dense(64)(L.Dense(128, activation="relu")(x)))
        return keras.Model(inputs, L.Dense(2)(L.GlobalAveragePooling1D()(x)))

    adam, adamw = keras.optimizers.Adam, keras.optimizers.AdamW
    text = lambda *layers: [keras.Input((40,), dtype="int32"), L.Embedding(20000, 64), *layers, L.Dense(2)]  # noqa: E731
    return {
        "mlp": (lambda **c: compiled([keras.Input((64,)), L.Dense(32, activation="relu"), L.Dense(10)], adam, **c),
                rng.random((n, 64), dtype=np.float32), rng.integers(0, 10, n)),
        "wide_mlp": (lambda **c: compiled([keras.Input((784,)), L.Dense(1024, activation="relu"),
                                           L.Dense(1024, activation="relu"), L.Dense(10)], adam, **c),
                     rng.random((n, 784), dtype=np.float32), rng.integers(0, 10, n)),
        "cnn_batchnorm": (lambda **c: compiled([keras.Input((28, 28, 1)), L.Conv2D(16, 3, activation="relu"),
                                                L.BatchNormalization(), L.MaxPooling2D(), L.Conv2D(32, 3, activation="relu"),
                                                L.BatchNormalization(), L.GlobalAveragePooling2D(), L.Dense(10)], adam, **c),
                          rng.random((n, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, n)),
        "text_pooling": (lambda **c: compiled(text(L.GlobalAveragePooling1D(), L.Dense(64, activation="relu")),
                                              adam, **c), tokens(20000, 40), labels),
        "text_conv1d": (lambda **c: compiled(text(L.Conv1D(64, 5, activation="relu"), L.GlobalMaxPooling1D()),
                                             adam, **c), tokens(20000, 40), labels),
        "text_gru": (lambda **c: compiled(text(L.GRU(64)), adam, **c), tokens(20000, 40), labels),
        "text_lstm": (lambda **c: compiled(text(L.LSTM(64)), adam, **c), tokens(20000, 40), labels),
        "transformer": (lambda **c: compiled(transformer(), adamw, **c), tokens(8000, 40), labels),
        "recommender_sgd": (lambda **c: compiled([keras.Input((8,), dtype="int32"), L.Embedding(200_000, 32),
                                                  L.GlobalAveragePooling1D(), L.Dense(2)],
                                                 lambda: keras.optimizers.SGD(0.1), **c), tokens(200_000, 8), labels),
        "recommender_adagrad": (lambda **c: compiled([keras.Input((8,), dtype="int32"), L.Embedding(200_000, 32),
                                                      L.GlobalAveragePooling1D(), L.Dense(2)],
                                                     keras.optimizers.Adagrad, **c), tokens(200_000, 8), labels),
    }


def _fit_ms(model, x, y, steps: int) -> float:
    start = time.perf_counter()
    model.fit(x[:steps * BATCH], y[:steps * BATCH], batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    return 1e3 * (time.perf_counter() - start) / steps


def measure(name: str, build, x, y, keras, tf_glp) -> dict:
    """The family's figures (see the module docstring)."""
    def ways():
        keras.utils.set_random_seed(0)
        strategy = tf_glp.Strategy()
        with strategy.scope():
            ours = build()
        keras.utils.set_random_seed(0)
        plain = build()
        keras.utils.set_random_seed(0)
        return strategy, {PLAIN: plain, KNOB: build(steps_per_execution=16), GLP: ours}

    strategy, models = ways()
    short = {way: [] for way in models}
    for _ in range(FITS):
        for way, model in models.items():
            short[way].append(_fit_ms(model, x, y, SHORT_STEPS))
    explain = strategy.explain()
    long = {way: [] for way in models}
    for _ in range(LONG_REPEATS):
        _, fresh = ways()
        for way, model in fresh.items():
            long[way].append(_fit_ms(model, x, y, LONG_STEPS))
    figures = {"short_fits": {way: {"first": round(ms[0], 3), "later": records.summary(ms[1:])}
                              for way, ms in short.items()},
               "long_fit": {way: records.summary(ms) for way, ms in long.items()}, "explain": explain}
    figures["ratios"] = {
        way: {"later_short_fits": round(statistics.median(short[way][1:]) / statistics.median(short[GLP][1:]), 3),
              "first_fit": round(short[way][0] / short[GLP][0], 3),
              "long_fit": round(statistics.median(long[way]) / statistics.median(long[GLP]), 3),
              "long_fit_paired": records.summary([p / g for p, g in zip(long[way], long[GLP])])}
        for way in (PLAIN, KNOB)}
    return figures


def render(record: dict) -> str:
    """The RESULTS.md section of a record: every figure from the record."""
    settings = record["settings"]
    lines = [f"Record `{record['id']}` (benchmarks/records/families.jsonl): {record['date'][:10]}, commit "
             f"{record['commit']}{' with uncommitted changes' if record['tree_changed'] else ''}, "
             f"{record['machine']['cpu']}, {record['machine']['cores']} cores. Command: `{record['command']}` "
             f"({record['seconds']} s). Batch {settings['batch']}; short fits: {settings['fits']} fits of one "
             f"{settings['short_steps']}-step epoch per way on one model, interleaved (the first is the cold one); "
             f"long fit: {settings['long_steps']} steps on a new model, start-up included, {settings['long_repeats']} "
             f"times, interleaved. ms per step; a ratio above 1 means tf_glp is faster.", "",
             "| family | plain Keras: later short fits, median (min-max) | tf_glp: later short fits | tf_glp / plain "
             "Keras: later short fits | first fit | long fit, median (paired min-max) | tf_glp / plain Keras with "
             "steps_per_execution=16: later short fits, first fit, long fit |", "|---|---|---|---|---|---|---|"]
    for name, figures in record["families"].items():
        short, ratios = figures["short_fits"], figures["ratios"]
        spread = lambda s: f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"  # noqa: E731
        paired = ratios[PLAIN]["long_fit_paired"]
        lines.append(f"| {name} | {spread(short[PLAIN]['later'])} | {spread(short[GLP]['later'])} | "
                     f"{ratios[PLAIN]['later_short_fits']:.2f}x | {ratios[PLAIN]['first_fit']:.2f}x | "
                     f"{ratios[PLAIN]['long_fit']:.2f}x ({paired['min']:.2f}-{paired['max']:.2f}) | "
                     f"{ratios[KNOB]['later_short_fits']:.2f}x, {ratios[KNOB]['first_fit']:.2f}x, "
                     f"{ratios[KNOB]['long_fit']:.2f}x |")
    lines += ["", "What tf_glp chose, per family (`explain()` after the short fits, shortened):", ""]
    for name, figures in record["families"].items():
        chosen = [line.strip().split(";")[0] for line in figures["explain"].splitlines()[1:]]
        lines.append(f"- {name}: {' / '.join(chosen)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("family", nargs="*", help="families to run (default: all)")
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument("--render", action="store_true", help="write the RESULTS.md section of the latest record")
    args = parser.parse_args()
    if args.render:
        return write_section("Model families, as fit is called", render(records.read("families")[-1]))
    child_setup()
    import keras
    import numpy as np

    import tf_glp

    every = families(keras, np)
    unknown = set(args.family) - set(every)
    if unknown:
        parser.error(f"unknown families {sorted(unknown)}; known: {sorted(every)}")
    results, started = {}, time.time()
    for name in args.family or every:
        build, x, y = every[name]
        results[name] = measure(name, build, x, y, keras, tf_glp)
        ratios = results[name]["ratios"]
        print(f"{name}: plain Keras / tf_glp: later short fits {ratios[PLAIN]['later_short_fits']:.2f}x, first fit "
              f"{ratios[PLAIN]['first_fit']:.2f}x, long fit {ratios[PLAIN]['long_fit']:.2f}x; with "
              f"steps_per_execution=16: {ratios[KNOB]['later_short_fits']:.2f}x, {ratios[KNOB]['first_fit']:.2f}x, "
              f"{ratios[KNOB]['long_fit']:.2f}x", flush=True)
    if not args.no_record:
        record = records.append("families", {
            "settings": {"fits": FITS, "short_steps": SHORT_STEPS, "long_steps": LONG_STEPS,
                         "long_repeats": LONG_REPEATS, "batch": BATCH},
            "seconds": round(time.time() - started), "families": results})
        if not args.family:  # (a partial run is a record, not the section)
            write_section("Model families, as fit is called", render(record))


if __name__ == "__main__":
    sys.exit(main())
