"""update="auto": the update concept chosen at the start of the first fit, by
measuring each candidate on the user's model and batch.

The candidates are the registered concepts (concepts.py); a concept that
does not sum on the host is left out under `compression` (which applies
to the host's sums only).

How (before Keras' fit traces anything): every model variable's value is
kept (each replica's copy: batch statistics differ per replica); for each
candidate a scratch copy of the user's optimizer is built under that
concept and fit's train function is traced with it; the candidates then run
interleaved rounds of a few steps on the user's first batch (this machine's
speed drifts by phases of seconds: interleaving keeps a drift from deciding),
each round about ROUND_S long, a candidate clearly slower than "host" after
DROP_AFTER rounds not timed further. The default ("host") stays unless
another candidate beats it by the kit's rule (tuning/rule.py, CONCEPT_GAIN).
Then every variable gets its value back, the metrics are reset, the user's
optimizer (never stepped) is built under the chosen concept by fit as
usual, and fit traces its train function once more: one retrace in all, on
top of the candidates' traces.

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

The choice and its times go to the plan store's "plans" section
(tuning/store.py), keyed also by compression.
"""

from __future__ import annotations

import random
import statistics
import time
import warnings

import keras
import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.strategy import concepts
from tf_glp.tuning import rounds as rounds_lib, rule, store

# A round runs about this long (fewer steps per round for slow steps, at
# least one): the measurement must stay a small part of a first epoch.
ROUND_S = 0.03
ROUNDS, STEPS = 7, 4  # interleaved rounds per candidate; the most timed steps per round
# After this many rounds a candidate whose fastest round is slower than
# DROP_RATIO times the default's slowest is not timed further.
DROP_AFTER = 3
DROP_RATIO = 1.5
WHO = "tf_glp.Strategy(update='auto')"


class UpdateChoice:
    """Which update concept a tf_glp.Strategy(update="auto") runs, and why.

    Args:
        strategy: The AutoStrategy it chooses for.
    """

    def __init__(self, strategy):
        self._strategy = strategy
        self.concept: concepts.UpdateConcept = concepts.DEFAULT
        self.decided = False
        self.reason = "decided at the start of the first fit"
        self.times_ms: dict = {}  # an UpdateConcept (or "DEVICE alone") -> [ms per step per round]
        self.source = ""  # "measured", "reused PATH" or "" (not measured)
        self.rounds, self.steps, self.clock = ROUNDS, STEPS, time.perf_counter  # (tests set these, and:)
        self.alone = None  # time a copy on the first device alone (module docstring); None: where the replicas are GPUs
        self.current = ""  # what is being timed, read by a clock a test injects

    def decide(self, concept: concepts.UpdateConcept, reason: str, times_ms: dict | None = None,
               source: str = "") -> None:
        self.concept, self.reason, self.decided, self.source = concept, reason, True, source
        self.times_ms = dict(times_ms or {})

    def prepare(self, model, arguments: dict, batch: int | None, callbacks: list) -> list:
        """The start-up choice (tf_glp/tuning): decides before fit builds
        anything; the announcement for fit."""
        if self.decided or model.optimizer is None:
            return []
        decide(self._strategy, model, arguments, batch)
        return [rounds_lib.Announce(self)] if arguments.get("verbose", "auto") != 0 else []

    def line(self) -> str:
        """The one line fit prints and explain() shows."""
        times = ", ".join(f"{_label(who)} {statistics.median(ms):.2f}" for who, ms in self.times_ms.items())
        where = f" ({self.source})" if self.source else ""
        return (f"update='auto' -> {self.concept.name!r}: {self.reason}{where}"
                + (f"; ms per step, medians: {times}" if times else ""))


def _label(who) -> str:
    return who.name if isinstance(who, concepts.UpdateConcept) else who


def choose(times_ms: dict) -> tuple[concepts.UpdateConcept, str]:
    """(concept, why): of the candidates that beat the default beyond the
    spread (the kit's rule, CONCEPT_GAIN), the one with the largest gain;
    else the default."""
    best, gain = rule.best_of(times_ms, concepts.DEFAULT, rule.CONCEPT_GAIN)
    if best is concepts.DEFAULT:
        return best, f"no candidate beat {best.name!r} beyond the spread"
    return best, f"{gain:.2f}x faster than {concepts.DEFAULT.name!r}, beyond the spread"


def _known_concept(entry: dict) -> bool:
    """A plan entry's test: a registered concept (the file holds names only)."""
    return entry.get("choice") in concepts.CONCEPTS


# -- the decision ------------------------------------------------------------
def decide(strategy, model, arguments: dict, batch: int | None) -> None:
    """Decides strategy.update_choice for `model`'s first fit (see the
    module docstring): from the plan store when it holds this key, else by
    measuring."""
    choice = strategy.update_choice
    if model.optimizer.built:
        choice.decide(concepts.DEFAULT, "the optimizer was built before the first fit, with its state on the host "
                                        "(not measured)")
        return
    data, why = rounds_lib.first_batch(arguments, batch)
    if data is None:
        choice.decide(concepts.DEFAULT, f"{why} (not measured)")
        return
    rounds_lib.build_without_optimizer(model, data)  # (what is built already stays as it is)
    key = store.fit_key(model, strategy, batch, compression=strategy.compression)
    path = store.resolve(strategy.settings.plan_path)
    stored = store.read_plan(path, key, store.PLANS, _known_concept, WHO) if path else None
    if stored is not None:
        times = {concepts.CONCEPTS.get(name, name): ms for name, ms in (stored.get("times_ms") or {}).items()}
        choice.decide(concepts.get(stored["choice"]), stored["reason"], times, source=f"reused {path}")
        return
    try:  # the candidates train scratch copies of the user's optimizer
        with strategy.scope():
            model.optimizer.__class__.from_config(model.optimizer.get_config())
    except Exception as error:  # noqa: BLE001 (any optimizer's own error: not measured, say why)
        choice.decide(concepts.DEFAULT, f"the optimizer cannot be copied from its config ({type(error).__name__}: "
                                        f"{error}) (not measured)")
        return
    candidates = [c for c in concepts.CONCEPTS.values() if c.sums_on_host or not strategy.compression]
    alone = {}
    if strategy.uses_gpus() if choice.alone is None else choice.alone:
        device = strategy.extended.worker_devices[0]
        spec = tf.DeviceSpec.from_string(device)
        alone[f"{spec.device_type}:{spec.device_index} alone"] = lambda: _alone(model, device, data)
    failed: dict = {}
    times = measure(model, strategy, data, candidates, choice, failed, alone)
    concept, why = choose({who: ms for who, ms in times.items() if who in candidates})
    for who, error in failed.items():
        why += f"; {_label(who)!r} failed and was left out ({error})"
    for name in alone:
        if name in times:
            wins, gain = rule.beats(times[concept], times[name], rule.CONCEPT_GAIN)
            why += (f"; {name} measured {gain:.2f}x faster than the {len(strategy.extended.worker_devices)} "
                    f"replicas for this model and batch (tf_glp does not switch devices: pass them to "
                    f"tf_glp.Strategy)" if wins else f"; {name} is not faster than the replicas")
    left_out = [c.name for c in concepts.CONCEPTS.values() if c not in candidates]
    if left_out:
        why += (f" (compression={strategy.compression!r} applies to the host's sums only: "
                f"no {', '.join(left_out)})")
    choice.decide(concept, why, times, source="measured")
    if path:
        store.write_entry(path, key, {"choice": concept.name, "reason": why,
                                      "times_ms": {_label(w): ms for w, ms in times.items()}},
                          store.PLANS, _known_concept, WHO)


# -- the measurement ---------------------------------------------------------
def measure(model, strategy, data, candidates: list, choice: UpdateChoice, failed: dict, alone: dict) -> dict:
    """Times every candidate concept on one batch `data` (a built model),
    and each of `alone` ({name: a function returning a train function and
    its iterator}) in the same rounds, as the module docstring's "How"
    says; returns {concept or name: [ms per step, one per round]}. One
    other than the default whose trace or any step raises (in a timed round
    too) is left out, its error put in `failed`. While a candidate is traced
    it is choice.concept (the strategy's concept: the trace reads it)."""
    user_optimizer = model.optimizer
    restore = rounds_lib.variables_kept(strategy, model.variables)
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(data).repeat())
    functions = {}
    try:
        for concept in candidates:
            choice.concept = concept
            try:
                with strategy.scope():  # (an optimizer keeps the strategy it was created in)
                    scratch = user_optimizer.__class__.from_config(user_optimizer.get_config())
                    scratch.build(model.trainable_variables)
                model.optimizer = scratch
                model.make_train_function(force=True)
                functions[concept] = _warmed_up(model.train_function, iter(dataset))
            except Exception as error:  # noqa: BLE001
                # The default is what trains without "auto": its error is the
                # user's. Another candidate that fails (on GPUs: out of memory
                # with every replica holding the optimizer state) is left out.
                _left_out(concept, error, failed)
        for name, make in alone.items():
            try:
                functions[name] = _warmed_up(*make())
            except Exception as error:  # noqa: BLE001 (a model clone_model cannot copy, say)
                _left_out(name, error, failed)
        steps = max(1, min(choice.steps, round(ROUND_S / max(min(f[2] for f in functions.values()), 1e-6))))
        times = {who: [] for who in functions}
        for index in range(choice.rounds):
            if index == DROP_AFTER:
                slowest_default = max(times[concepts.DEFAULT])
                for who in [w for w in functions if w is not concepts.DEFAULT]:
                    if min(times[who]) > DROP_RATIO * slowest_default:
                        del functions[who]
            for who, (function, iterator, _) in list(functions.items()):
                choice.current = _label(who)  # (read by an injected clock; a traced function keeps its concept)
                start = choice.clock()
                try:
                    for _ in range(steps):
                        result = function(iterator)
                    rounds_lib.sync(result)
                except Exception as error:  # noqa: BLE001 (as in its first steps; the variables are restored below)
                    _left_out(who, error, failed)
                    del functions[who], times[who]
                    continue
                times[who].append(1e3 * (choice.clock() - start) / steps)
        return times
    finally:
        choice.concept, choice.current = concepts.DEFAULT, ""
        model.optimizer = user_optimizer
        model.train_function = None
        restore()
        model.reset_metrics()


def _warmed_up(function, iterator) -> tuple:
    """(function, iterator, seconds of one step) after a first step (the
    trace) and a second (how long a step takes: how many make a round)."""
    rounds_lib.sync(function(iterator))
    start = time.perf_counter()
    rounds_lib.sync(function(iterator))
    return function, iterator, time.perf_counter() - start


def _alone(model, device: str, data) -> tuple:
    """fit's train function for a copy of `model` on `device` alone (see the
    module docstring), and an iterator over `data` there."""
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


def _left_out(who, error: Exception, failed: dict) -> None:
    """Puts a failed candidate's error in `failed`; the default's is raised."""
    if who is concepts.DEFAULT:
        raise error
    failed[who] = rounds_lib.gist(error)
