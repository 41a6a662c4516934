"""update="auto": the update concept chosen at the start of the first fit, by
measuring each candidate on the user's model and batch.

The candidates are the registered concepts (concepts.py: "host",
"replicas", TensorFlow's "all-reduce"); they compute the same update up to
the order of a sum. A concept that does not sum on the host is left out
under `compression` (which applies to the host's sums only).

How (before Keras' fit traces anything): every model variable's value is
kept (each replica's copy: batch statistics differ per replica); for each
candidate a scratch copy of the user's optimizer is built under that
concept and fit's train function is traced with it; the candidates then run
interleaved rounds of a few steps on the user's first batch (this machine's
speed drifts by phases of seconds: interleaving keeps a drift from deciding),
each round about ROUND_S long, a candidate clearly slower than "host" after
DROP_AFTER rounds not timed further. The default ("host") stays unless
another candidate is faster beyond the spread (its upper quartile below
host's lower quartile, and at least 1.05x faster by the medians: the
optimizer-step choice's rule). Then every variable gets its value back, the
metrics are reset, the user's optimizer (never stepped) is built under the
chosen concept by fit as usual, and fit traces its train function once
more: one retrace in all, on top of the candidates' traces.

Where the replicas are GPUs, a copy of the model (its architecture and
compile settings, new weights and optimizer) is also timed on the first
GPU alone, the global batch in one step, interleaved with the candidates:
the reason says whether one GPU would train this model faster than the
replicas. The devices are not switched (that is the user's call).

Not measured (the reason is in explain()): micro_batches (only a concept
proven to keep the micro-batched result bitwise is used: "host"), an
optimizer built before the first fit (its state already lives where "host"
puts it), inputs that cannot be read twice (Python generators, PyDatasets),
and an optimizer that cannot be copied from its config.

The choice and its times go to the plan store (tf_glp/tuning/store.py; by
default the user's cache), reused by the next run with the same key (the
machine and versions, devices, global batch, compression, the model's
trainable shapes, the optimizer). A model with no entry for this key is
measured and added.
"""

from __future__ import annotations

import random
import re
import statistics
import time
import warnings

import keras
import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.profiling import optimizer_step
from tf_glp.strategy import concepts
from tf_glp.tuning import store

CANDIDATES = tuple(concepts.CONCEPTS)  # their names: the form plan files and explain() use
DEFAULT = concepts.DEFAULT.name
SCHEMA = 2  # 2: one entry per model
# A round runs about this long (fewer steps per round for slow steps, at
# least one): the measurement must stay a small part of a first epoch.
ROUND_S = 0.03
# After this many rounds a candidate whose fastest round is slower than
# DROP_RATIO times the default's slowest is not timed further.
DROP_AFTER = 3
DROP_RATIO = 1.5


class UpdateChoice:
    """Which update concept a tf_glp.Strategy(update="auto") runs, and why.

    Args:
        rounds: Interleaved rounds per candidate. Defaults to `7`.
        steps: The most timed steps per round (fewer where a step takes
            long: ROUND_S). Defaults to `4`.
        clock: Seconds as a float (tests inject one). Defaults to
            `time.perf_counter`.
        alone: Also time a copy of the model on the first replica's device
            alone (see the module docstring). Defaults to `None`: where the
            replicas are GPUs.
    """

    def __init__(self, rounds: int = 7, steps: int = 4, clock=time.perf_counter, alone: bool | None = None):
        self.concept = DEFAULT
        self.decided = False
        self.reason = "decided at the start of the first fit"
        self.times_ms: dict[str, list[float]] = {}
        self.source = ""  # "measured", "reused PATH" or "" (not measured)
        self.rounds, self.steps, self.clock, self.alone = rounds, steps, clock, alone

    def decide(self, concept: str, reason: str, times_ms: dict | None = None, source: str = "") -> None:
        self.concept, self.reason, self.decided, self.source = concept, reason, True, source
        self.times_ms = dict(times_ms or {})

    def line(self) -> str:
        """The one line fit prints and explain() shows."""
        times = ", ".join(f"{name} {statistics.median(ms):.2f}" for name, ms in self.times_ms.items())
        where = f" ({self.source})" if self.source else ""
        return (f"update='auto' -> {self.concept!r}: {self.reason}{where}"
                + (f"; ms per step, medians: {times}" if times else ""))


def choose(times_ms: dict[str, list[float]], default: str = DEFAULT) -> tuple[str, str]:
    """(concept, why): of the candidates that beat the default beyond the
    spread (optimizer_step.beats: the optimizer-step choice's rule), the one
    with the largest gain; else the default."""
    best, best_gain = default, 1.0
    for name, ms in times_ms.items():
        if name != default:
            wins, gain = optimizer_step.beats(times_ms[default], ms)
            if wins and gain > best_gain:
                best, best_gain = name, gain
    if best == default:
        return default, f"no candidate beat {default!r} beyond the spread"
    return best, f"{best_gain:.2f}x faster than {default!r}, beyond the spread"


# -- the plan -----------------------------------------------------------------
WHO = "tf_glp.Strategy(update='auto')"


def plan_key(model, strategy, batch: int) -> dict:
    return {"schema": SCHEMA, **store.machine(),
            "devices": list(strategy.extended.worker_devices), "global_batch": batch,
            "compression": strategy.compression, "optimizer": type(model.optimizer).__name__,
            # Shapes and dtypes, not names (Keras numbers the names of every
            # new model in a process: the same model gets other names).
            "trainable": [[list(v.shape), str(v.dtype)] for v in model.trainable_variables]}


def _known_concept(entry: dict) -> bool:
    return entry.get("choice") in CANDIDATES


def write_plan(path: str, key: dict, choice: UpdateChoice) -> None:
    """Adds this model's concept to `path` (store.write_entry)."""
    store.write_entry(path, key, {"choice": choice.concept, "reason": choice.reason, "times_ms": choice.times_ms},
                      store.PLANS, _known_concept, WHO)


# -- the decision ------------------------------------------------------------
def decide(strategy, model, arguments: dict, batch: int | None) -> None:
    """Decides strategy.update_choice for `model`'s first fit (see the
    module docstring): from the plan file when it holds this key, else by
    measuring."""
    choice = strategy.update_choice
    if model.optimizer.built:
        choice.decide(DEFAULT, "the optimizer was built before the first fit, with its state on the host "
                               "(not measured)")
        return
    batch_values, why = first_batch(arguments, batch)
    if batch_values is None:
        choice.decide(DEFAULT, f"{why} (not measured)")
        return
    data = _packed(batch_values)
    _build_without_optimizer(model, data)  # (what is built already stays as it is)
    key = plan_key(model, strategy, batch)
    path = store.resolve(strategy.settings.plan_path)
    stored = store.read_plan(path, key, store.PLANS, _known_concept, WHO) if path else None
    if stored is not None:
        choice.decide(stored["choice"], stored["reason"], stored.get("times_ms"), source=f"reused {path}")
        return
    try:  # the candidates train scratch copies of the user's optimizer
        with strategy.scope():
            model.optimizer.__class__.from_config(model.optimizer.get_config())
    except Exception as error:  # noqa: BLE001 (any optimizer's own error: not measured, say why)
        choice.decide(DEFAULT, f"the optimizer cannot be copied from its config ({type(error).__name__}: "
                               f"{error}) (not measured)")
        return
    candidates = [c for c in CANDIDATES if concepts.get(c).sums_on_host or not strategy.compression]
    alone = {}
    if strategy.uses_gpus() if choice.alone is None else choice.alone:
        device = strategy.extended.worker_devices[0]
        spec = tf.DeviceSpec.from_string(device)
        alone[f"{spec.device_type}:{spec.device_index} alone"] = lambda: _alone(model, device, data)
    failed: dict[str, str] = {}
    times = measure(model, strategy, data, candidates, choice, lambda name: setattr(choice, "concept", name), failed,
                    alone)
    concept, why = choose({name: ms for name, ms in times.items() if name in candidates})
    for name, error in failed.items():
        why += f"; {name!r} failed and was left out ({error})"
    for name in alone:
        if name in times:
            wins, gain = optimizer_step.beats(times[concept], times[name])
            why += (f"; {name} measured {gain:.2f}x faster than the {len(strategy.extended.worker_devices)} "
                    f"replicas for this model and batch (tf_glp does not switch devices: pass them to "
                    f"tf_glp.Strategy)" if wins else f"; {name} is not faster than the replicas")
    if strategy.compression:
        left_out = [c for c in CANDIDATES if c not in candidates]
        why += (f" (compression={strategy.compression!r} applies to the host's sums only: "
                f"no {', '.join(left_out)})" if left_out else "")
    choice.decide(concept, why, times, source="measured")
    if path:
        write_plan(path, key, choice)


def _packed(batch_values):
    x, y, sample_weight = batch_values
    if sample_weight is not None:
        return (x, y, sample_weight)
    return (x,) if y is None else (x, y)


def _build_without_optimizer(model, data) -> None:
    """Builds the model and its compiled loss and metrics as fit would
    (their variables then exist before any candidate's trace), leaving the
    optimizer unbuilt (it is built under the chosen concept)."""
    optimizer, model.optimizer = model.optimizer, None
    try:
        compat.symbolic_build(model, data)
    finally:
        model.optimizer = optimizer


# -- the measurement ---------------------------------------------------------
def first_batch(arguments: dict, batch: int | None):
    """fit's first batch as (x, y, sample_weight) tensors, or (None, why)
    where it cannot be read without consuming the user's input."""
    x = arguments.get("x")
    if isinstance(x, tf.data.Dataset):
        for element in x.take(1):
            return (tuple(element) + (None,) * (3 - len(element)) if isinstance(element, tuple)
                    else (element, None, None)), ""
        return None, "the dataset is empty"
    if batch and x is not None and all(hasattr(leaf, "shape") for leaf in tf.nest.flatten(x)):
        def head(value):
            return None if value is None else tf.nest.map_structure(lambda leaf: leaf[:batch], value)

        return (head(x), head(arguments.get("y")), head(arguments.get("sample_weight"))), ""
    return None, "fit's input is not arrays or a tf.data.Dataset (it cannot be read twice)"


def variables_kept(strategy, variables):
    """Every variable's value, per replica copy; returns a function that
    puts them back."""
    kept = []
    for variable in variables:
        for component in strategy.experimental_local_results(variable.value):
            kept.append((component, tf.identity(component.read_value())))

    def restore():
        for component, value in kept:
            with tf.device(component.device):
                component.assign(value)

    return restore


def measure(model, strategy, data, candidates, choice: UpdateChoice, set_concept, failed: dict[str, str],
            alone: dict | None = None) -> dict[str, list[float]]:
    """Times every candidate on one batch `data` (a built model; see the
    module docstring), and each of `alone` ({name: a function returning a
    train function and its iterator}) in the same rounds; returns {name:
    [ms per step, one per round]}. One other than the default whose trace
    or any step raises (in a timed round too) is left out, its error put in
    `failed`. The model's variables and metrics end as they started; the
    user's optimizer is untouched."""
    user_optimizer = model.optimizer
    restore = variables_kept(strategy, model.variables)
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(data).repeat())
    functions = {}
    try:
        for name in candidates:
            set_concept(name)
            try:
                with strategy.scope():  # (an optimizer keeps the strategy it was created in)
                    scratch = user_optimizer.__class__.from_config(user_optimizer.get_config())
                    scratch.build(model.trainable_variables)
                model.optimizer = scratch
                model.make_train_function(force=True)
                functions[name] = _warmed_up(model.train_function, iter(dataset))
            except Exception as error:  # noqa: BLE001
                # The default is what trains without "auto": its error is the
                # user's. Another candidate that fails (on GPUs: out of memory
                # with every replica holding the optimizer state) is left out.
                _left_out(name, error, failed)
        for name, make in (alone or {}).items():
            try:
                functions[name] = _warmed_up(*make())
            except Exception as error:  # noqa: BLE001 (a model clone_model cannot copy, say)
                _left_out(name, error, failed)
        steps = max(1, min(choice.steps, round(ROUND_S / max(min(f[2] for f in functions.values()), 1e-6))))
        times = {name: [] for name in functions}
        for index in range(choice.rounds):
            if index == DROP_AFTER:
                slowest_default = max(times[DEFAULT])
                for name in [n for n in functions if n != DEFAULT]:
                    if min(times[name]) > DROP_RATIO * slowest_default:
                        del functions[name]
            for name, (function, iterator, _) in list(functions.items()):
                set_concept(name)  # (read by an injected clock; a traced function keeps its concept)
                start = choice.clock()
                try:
                    for _ in range(steps):
                        result = function(iterator)
                    _sync(result)
                except Exception as error:  # noqa: BLE001 (as in its first steps; the variables are restored below)
                    _left_out(name, error, failed)
                    del functions[name], times[name]
                    continue
                times[name].append(1e3 * (choice.clock() - start) / steps)
        return times
    finally:
        set_concept(DEFAULT)
        model.optimizer = user_optimizer
        model.train_function = None
        restore()
        model.reset_metrics()


def _warmed_up(function, iterator) -> tuple:
    """(function, iterator, seconds of one step) after a first step (the
    trace) and a second (how long a step takes: how many make a round)."""
    _sync(function(iterator))
    start = time.perf_counter()
    _sync(function(iterator))
    return function, iterator, time.perf_counter() - start


def _alone(model, device: str, data) -> tuple:
    """fit's train function for a copy of `model` on `device` alone (its
    architecture and compile settings, new weights and optimizer), and an
    iterator over `data` there."""
    one = tf.distribute.OneDeviceStrategy(device)
    kept = random.getstate()  # (the copy's initializers draw their seeds from Python's random)
    try:
        with warnings.catch_warnings(), one.scope():
            warnings.simplefilter("ignore")  # (a custom compile(): the copy is not compiled, and fails below)
            copy = keras.models.clone_model(model)
            copy.compile_from_config(model.get_compile_config())
            compat.symbolic_build(copy, data)
            copy.make_train_function()
    finally:
        random.setstate(kept)
    return copy.train_function, iter(one.experimental_distribute_dataset(tf.data.Dataset.from_tensors(data).repeat()))


def _left_out(name: str, error: Exception, failed: dict[str, str]) -> None:
    """Puts a failed candidate's error in `failed`; the default's is raised."""
    if name == DEFAULT:
        raise error
    failed[name] = f"{type(error).__name__}: {_gist(error)[:200]}"


def _gist(error: Exception) -> str:
    """The line of an error that says what went wrong: a step's error from
    TensorFlow begins "Graph execution error:", the node's Python stack
    (indented), then "N root error(s) found." and "  (0) CODE: what"."""
    text = str(error)
    root = re.search(r"^\s*\(0\) [A-Z_]+:\s*(.+)$", text, re.MULTILINE)
    if root:
        return root.group(1).strip()
    lines = [line for line in text.splitlines() if line.strip() and not line[0].isspace()
             and not line.startswith(("Graph execution error", "Detected at node"))]
    return lines[0].strip() if lines else ""


def _sync(result) -> None:
    """Waits for a train function's outputs (its Optional of logs)."""
    value = result.get_value() if isinstance(result, tf.experimental.Optional) else result
    for tensor in tf.nest.flatten(value):
        if isinstance(tensor, tf.Tensor):
            tensor.numpy()


class AnnounceChoice(keras.callbacks.Callback):
    """Prints a start-up choice's line once, when training begins (added
    for fit with verbose not 0): the update choice here, the steps per
    execution (execution_choice.py)."""

    def __init__(self, choice):
        super().__init__()
        self._choice = choice

    def on_train_begin(self, logs=None):
        print(f"tf_glp.Strategy: {self._choice.line()}", flush=True)
