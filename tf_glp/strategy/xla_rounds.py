"""XLA against the steps without it, timed on a scratch copy before fit.

XLA rounds differently, so unlike the counts (timed on the fit's own steps,
execution_choice.py) it cannot be measured on the steps that train: it runs
on the first batch, repeated, and every variable is put back. Without the
user's consent it is timed only where its compile and rounds cost at most
`choice.xla_hint` of the fit (then it is only named in explain()).
"""

from __future__ import annotations

import time
import warnings

import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.tuning import rounds as rounds_lib, rule

XLA_TRACES = 3  # XLA's compile, in traces of the step (about 3x on this machine's models)


def measure(choice, state, model, arguments: dict, batch: int | None, base, xla, fit_steps: int) -> str:
    """Times the way `xla` against `base` (execution_choice.Way, the same
    count) for `choice` (an ExecutionChoice) on the first batch; records
    the times and whether XLA wins in `state` (its ModelExecution) and
    returns the note for explain()."""
    data, why = rounds_lib.first_batch(arguments, batch)
    if data is None:
        return f"XLA not measured: {why}"
    if not compat.nothing_to_build(model):
        with model.distribute_strategy.scope():
            compat.symbolic_build(model, data)
    times, compile_s, error = _rounds(model, data, base, xla, choice, state, fit_steps)
    if error:
        return error
    # (The base's times here are on the first batch, repeated, apart from the counts' on the fit's steps.)
    state.times_ms.update({xla.label: times[xla.label], f"{base.label} beside XLA": times[base.label]})
    wins, gain = rule.beats(times[base.label], times[xla.label], rule.COUNT_GAIN)
    state.xla_wins, state.xla_steps = wins, base.steps_per_execution
    return (f"XLA at {base.steps_per_execution}: {gain:.2f}x "
            f"{'faster, beyond the spread' if wins else '(not faster beyond the spread)'}, "
            f"its compile {compile_s:.1f} s")


def _rounds(model, data, base, xla, choice, state, fit_steps: int):
    """Times the ways `base` and `xla` (execution_choice.Way) on `data` in
    interleaved rounds of the same steps; returns ({label: [ms per step per
    round]}, XLA's first call in seconds, "") or ({}, 0, why not). Every
    model and optimizer variable ends as it started (each replica's copy),
    the metrics reset. The functions are the fit's own, traced on batches
    of the fit's element spec (the batch dimension unknown, as Keras'
    adapters make it), so the fit runs on their traces (kept in
    state.functions): Keras' at one step per call first (its trace and a
    step weigh XLA's cost), the base at its count only where XLA is
    measured."""
    optimizer, strategy = model.optimizer, model.distribute_strategy
    compiled = (model.steps_per_execution, model.jit_compile)
    restore = rounds_lib.variables_kept(strategy, [*model.variables, *optimizer.variables])
    rows = int(tf.nest.flatten(data)[0].shape[0])
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(data).repeat().unbatch().batch(rows))
    one = type(base)(1)
    functions = {}
    try:
        start = time.perf_counter()
        functions[one] = _traced(model, one, dataset)
        trace_s = time.perf_counter() - start
        state.functions[one] = (functions[one][0], None)
        start = time.perf_counter()  # a second call: the step's time, to weigh XLA's compile
        rounds_lib.sync(functions[one][0](functions[one][1]))
        step_s = time.perf_counter() - start
        cost_s = XLA_TRACES * trace_s + choice.rounds * 2 * base.steps_per_execution * step_s
        if not choice.allow_xla and cost_s > choice.xla_hint * fit_steps * step_s:
            return {}, 0.0, (f"XLA not measured (allow_xla is off, and measuring it, about {cost_s:.1f} s, "
                             f"would be more than {choice.xla_hint:.0%} of this fit)")
        for way in (base, xla):
            if way in functions:
                continue
            start = time.perf_counter()
            try:
                functions[way] = _traced(model, way, dataset)
            except Exception as error:  # noqa: BLE001 (an op XLA lacks, say; the base's error is the user's)
                if way == base:
                    raise
                return {}, 0.0, f"XLA failed and was left out ({rounds_lib.gist(error)})"
            compile_s = time.perf_counter() - start  # (XLA's: traced last)
            if way == base:
                state.functions[base] = (functions[base][0], None)
        times = {way.label: [] for way in (base, xla)}
        for index in range(choice.rounds):
            for way in ((base, xla) if index % 2 == 0 else (xla, base)):
                function, iterator = functions[way]
                choice.current = way.label
                start = choice.clock()
                rounds_lib.sync(function(iterator))
                times[way.label].append(1e3 * (choice.clock() - start) / way.steps_per_execution)
        return times, compile_s, ""
    finally:
        choice.current = ""
        model.steps_per_execution, model.jit_compile = compiled
        model.train_function = None
        restore()
        model.reset_metrics()


def _traced(model, way, dataset) -> tuple:
    """Keras' train function for `way` and an iterator over `dataset`,
    after its first call (the trace; XLA's compile)."""
    model.steps_per_execution = way.steps_per_execution  # (the fused ops never run inside XLA: patches.py)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (Keras warns where a layer does not support XLA: checked below)
        model.jit_compile = way.xla
    if model.jit_compile != way.xla:
        raise ValueError("a layer of this model does not support XLA (Keras' model_supports_jit)")
    model.make_train_function(force=True)
    iterator = iter(dataset)
    rounds_lib.sync(model.train_function(iterator))
    return model.train_function, iterator
