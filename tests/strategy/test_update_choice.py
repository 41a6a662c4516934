"""tf_glp.Strategy(update="auto"): the update concept chosen at the start of
the first fit (tf_glp/strategy/update_choice.py).

The clock is injected, so the choice is deterministic; the measurement
leaves no trace (a run under the chosen concept is bitwise the run with
that concept named); the plan file is reused, and a corrupt or foreign one
measured again with a warning."""

import json
import random
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_glp
from tf_glp.strategy import update_choice
from tf_glp.tuning import store
from tf_glp.strategy import AutoStrategy, concepts

L = keras.layers
DEVICES = ["/cpu:0", "/cpu:1"]
BATCH = 32


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * BATCH, 6)).astype("float32")
    return x, (x[:, :3].sum(1) > x[:, 3:].sum(1)).astype("int32")


def _fake_clock(ms_per_step: dict[str, float], calls: list | None = None):
    """A clock under which a step of each candidate takes the given time:
    the measurement reads it at the start and the end of every round, with
    what is being timed (`clock.strategy.update_choice.current`)."""
    state = {"now": 0.0}

    def clock():
        # Each read moves the clock on by one step of the candidate timed: a
        # round (of one step: _strategy) reads it at its start and end.
        if calls is not None:
            calls.append(1)
        now = state["now"]
        state["now"] += ms_per_step[clock.strategy.update_choice.current] / 1e3
        return now

    return clock


def _strategy(update="auto", clock=None, **kwargs):
    strategy = tf_glp.Strategy(DEVICES, update=update, **kwargs)
    if clock is not None:
        strategy.update_choice.clock, strategy.update_choice.steps = clock, 1
        clock.strategy = strategy
    return strategy


def _train(strategy, optimizer=lambda: keras.optimizers.Adam(1e-2), epochs=2):
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), L.Dense(16, activation="relu"), L.BatchNormalization(),
                                  L.Dropout(0.3), L.Dense(2)])
        model.compile(optimizer=optimizer(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(*_data(), batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0).history
    return model, history


def _state(model):
    return [(v.path, v.numpy()) for v in model.variables + model.optimizer.variables]


def _names(times: dict) -> dict:
    """update_choice's times, keyed by the concepts' names."""
    return {getattr(who, "name", who): ms for who, ms in times.items()}


def test_choose_keeps_host_unless_another_is_faster_beyond_the_spread():
    host = [10.0, 10.5, 11.0, 10.2, 10.8]
    HOST, REPLICAS, ALL_REDUCE = concepts.HOST, concepts.REPLICAS, concepts.ALL_REDUCE  # noqa: N806
    assert update_choice.choose({HOST: host, REPLICAS: [9.8, 10.1, 10.4, 9.9, 10.3]})[0] is HOST
    concept, why = update_choice.choose({HOST: host, REPLICAS: [8.0, 8.2, 8.1, 7.9, 8.3],
                                         ALL_REDUCE: [6.0, 6.5, 6.1, 6.2, 6.4]})
    assert concept is ALL_REDUCE and "faster than 'host', beyond the spread" in why
    # Faster by the median but inside host's spread: host stays.
    assert update_choice.choose({HOST: [5.0, 10.0, 15.0, 20.0], REPLICAS: [6.0, 7.0, 8.0, 16.0]})[0] is HOST


@pytest.mark.parametrize("fastest", ["host", "replicas", "all-reduce"])
def test_the_measured_choice_trains_bitwise_like_that_concept(fastest, exact_arithmetic, tmp_path):
    times = {name: (1.0 if name == fastest else 3.0) for name in concepts.CONCEPTS}
    strategy = _strategy(clock=_fake_clock(times), plan_path=str(tmp_path / "plan.json"))
    assert isinstance(strategy, AutoStrategy) and strategy.concept == "host"
    model, history = _train(strategy, epochs=1)
    assert strategy.concept == fastest and strategy.update_choice.source == "measured"
    assert f"update='auto' -> {fastest!r}" in strategy.explain()
    rounds = {name: len(ms) for name, ms in _names(strategy.update_choice.times_ms).items()}
    # A candidate 3x slower than host is dropped after 3 rounds; 3x faster ones are not.
    assert rounds == ({"host": 7, "replicas": 3, "all-reduce": 3} if fastest == "host" else
                      dict.fromkeys(concepts.CONCEPTS, 7))
    # The optimizer's state lives where the concept puts it.
    kind = type(model.optimizer.variables[-1].value).__name__
    assert kind == ("ResourceVariable" if fastest == "host" else "MirroredVariable"), kind
    # The measurement left no trace: the same bits as the concept named
    # (the all-reduce concept is MirroredStrategy's).
    named = (tf.distribute.MirroredStrategy(DEVICES) if fastest == "all-reduce"
             else tf_glp.Strategy(DEVICES, update=fastest))
    reference, reference_history = _train(named, epochs=1)
    for (path, a), (_, b) in zip(_state(model), _state(reference), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=path)
    assert history == reference_history


@pytest.mark.parametrize("alone_ms", [1.0, 5.0], ids=["faster", "slower"])
def test_one_device_alone_is_timed_and_named_but_not_switched_to(alone_ms, exact_arithmetic):
    """Where the replicas are GPUs (here asked for on logical CPUs), a copy of
    the model is timed on the first device alone, in the candidates'
    rounds: explain() says whether it trains faster, the devices stay, and
    the measurement leaves no trace (the copy's initializers draw from
    Python's random: put back)."""
    strategy = _strategy(clock=_fake_clock({"host": 3.0, "replicas": 4.0, "all-reduce": 4.0,
                                            "CPU:0 alone": alone_ms}), plan_path=None)
    strategy.update_choice.alone = True
    model, history = _train(strategy, epochs=1)
    drawn = random.random()
    # (5 ms is more than 1.5x host's 3: not timed after 3 rounds.)
    assert len(strategy.update_choice.times_ms["CPU:0 alone"]) == (7 if alone_ms == 1.0 else 3)
    assert strategy.concept == "host" and strategy.num_replicas_in_sync == 2
    assert ("CPU:0 alone measured 3.00x faster than the 2 replicas for this model and batch" if alone_ms == 1.0
            else "CPU:0 alone is not faster than the replicas") in strategy.explain()
    reference, reference_history = _train(tf_glp.Strategy(DEVICES, update="host"), epochs=1)
    assert drawn == random.random()  # what a script draws next (a model it builds next)
    for (path, a), (_, b) in zip(_state(model), _state(reference), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=path)
    assert history == reference_history


def test_the_plan_is_reused_and_a_corrupt_or_foreign_one_measured_again(tmp_path):
    plan = tmp_path / "plan.json"
    _train(_strategy(clock=_fake_clock({"host": 3.0, "replicas": 1.0, "all-reduce": 3.0}), plan_path=str(plan)),
           epochs=1)
    [entry] = json.loads(plan.read_text())["plans"]
    assert entry["choice"] == "replicas"

    calls = []
    reused = _strategy(clock=_fake_clock({"host": 1.0, "replicas": 3.0, "all-reduce": 3.0}, calls),
                       plan_path=str(plan))
    _train(reused, epochs=1)
    assert reused.concept == "replicas" and not calls  # not measured again
    assert f"(reused {plan})" in reused.explain()

    # Another model in the same file: measured without a warning, added.
    other = _strategy(clock=_fake_clock({"host": 1.0, "replicas": 3.0, "all-reduce": 3.0}), plan_path=str(plan))
    with other.scope():
        model = keras.Sequential([keras.Input((6,)), L.Dense(5), L.Dense(2)])
        model.compile(optimizer="adam", loss="mse")
    x, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model.fit(x, np.eye(2, dtype="float32")[y], batch_size=BATCH, epochs=1, verbose=0)
    assert other.update_choice.source == "measured"
    assert [e["choice"] for e in json.loads(plan.read_text())["plans"]] == ["replicas", "host"]

    key = entry["key"]
    plan.write_text("{not json")
    with pytest.warns(UserWarning, match="is not a readable plan"):
        assert store.read_plan(str(plan), key, store.PLANS, update_choice._known_concept, update_choice.WHO) is None
    plan.write_text(json.dumps({"key": key, "choice": "replicas"}))  # the first format: one plan, no list
    with pytest.warns(UserWarning, match="not a list of plans"):
        assert store.read_plan(str(plan), key, store.PLANS, update_choice._known_concept, update_choice.WHO) is None
    # Foreign: this model's entry written for another batch size; measured
    # again, replaced.
    plan.write_text(json.dumps({"plans": [dict(entry, key=dict(key, global_batch=2 * BATCH))]}))
    again = _strategy(clock=_fake_clock({"host": 1.0, "replicas": 3.0, "all-reduce": 3.0}), plan_path=str(plan))
    with pytest.warns(UserWarning, match=r"holds this model's plan for another machine or setting \(global_batch "
                                         r"differ\)"):
        _train(again, epochs=1)
    assert again.concept == "host" and again.update_choice.source == "measured"
    assert [(e["key"], e["choice"]) for e in json.loads(plan.read_text())["plans"]] == [(key, "host")]


def test_what_is_not_measured_says_why(tmp_path):
    never = _fake_clock({"host": 1.0}, calls := [])
    # micro_batches: the concept that keeps the micro-batched result bitwise.
    micro = _strategy(clock=never, micro_batches=2, plan_path=None)
    _train(micro, epochs=1)
    assert micro.concept == "host" and "micro_batches" in micro.explain()
    # A Python generator cannot be read twice.
    generated = _strategy(clock=never, plan_path=None)
    with generated.scope():
        model = keras.Sequential([keras.Input((6,)), L.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
    x, y = _data()

    def batches():
        while True:
            yield x[:BATCH], np.eye(2, dtype="float32")[y[:BATCH]]

    model.fit(batches(), steps_per_epoch=2, verbose=0)
    assert generated.concept == "host" and "cannot be read twice" in generated.explain()

    class Uncopyable(keras.optimizers.SGD):
        def get_config(self):
            raise NotImplementedError("no config")

    uncopyable = _strategy(clock=never, plan_path=None)
    with uncopyable.scope():
        model = keras.Sequential([keras.Input((6,)), L.Dense(2)])
        model.compile(optimizer=Uncopyable(0.1), loss="mse")
    model.fit(x, np.eye(2, dtype="float32")[y], batch_size=BATCH, verbose=0)
    assert uncopyable.concept == "host" and "cannot be copied from its config (NotImplementedError: no config)" in (
        uncopyable.explain())
    assert not calls


@pytest.mark.parametrize("when", ["traced", "timed"])
def test_a_candidate_that_fails_is_left_out_and_named(when, monkeypatch, tmp_path):
    """On GPUs "replicas" and "all-reduce" hold the optimizer state on every
    GPU and may run out of memory where "host" fits: such a candidate is
    left out (its error in explain()) and training goes on, whether it
    fails while traced or in a timed round (at run time: here its third
    step, the first timed one)."""
    replicas = type(concepts.REPLICAS)
    original = replicas.sum_gradients
    steps = tf.Variable(0)

    def sum_gradients(self, strategy, grads, loss_scaled):
        if when == "traced":
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor\nmore detail")
        # (each of the 2 replicas counts)
        check = tf.debugging.assert_less(steps.assign_add(1), 5, message="OOM in a timed round")
        with tf.control_dependencies([check]):
            grads = [tf.identity(g) for g in grads]
        return original(self, strategy, grads, loss_scaled)

    monkeypatch.setattr(replicas, "sum_gradients", sum_gradients)
    strategy = _strategy(clock=_fake_clock({"host": 3.0, "replicas": 0.5, "all-reduce": 1.0}), plan_path=None)
    model, history = _train(strategy, epochs=1)
    assert strategy.concept == "all-reduce" and set(_names(strategy.update_choice.times_ms)) == {"host", "all-reduce"}, (
        strategy.explain())
    error = {"traced": "ResourceExhaustedError: OOM when allocating tensor",
             "timed": "InvalidArgumentError: assertion failed: [OOM in a timed round]"}[when]
    assert f"'replicas' failed and was left out ({error}" in strategy.explain()
    assert np.isfinite(history["loss"]).all()


def test_update_auto_without_replicas_is_one_device_and_a_bad_update_is_named(monkeypatch):
    monkeypatch.delenv("TF_GLP_CPU_REPLICAS", raising=False)
    assert type(tf_glp.Strategy(update="auto")).__name__ == "SingleDeviceStrategy"
    with pytest.raises(ValueError, match="update must be 'host', 'replicas' or 'auto', got 'fastest'"):
        tf_glp.Strategy(DEVICES, update="fastest")


def test_fit_prints_the_choice_in_one_line(tmp_path, capsys):
    strategy = _strategy(clock=_fake_clock({"host": 1.0, "replicas": 3.0, "all-reduce": 3.0}), plan_path=None)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), L.Dense(2)])
        model.compile(optimizer="adam", loss="mse")
    x, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(x, np.eye(2, dtype="float32")[y], batch_size=BATCH, epochs=1, verbose=2)
    lines = [line for line in capsys.readouterr().out.splitlines() if "update='auto'" in line]
    assert lines == ["tf_glp.Strategy: " + strategy.update_choice.line()]
    assert "ms per step, medians: host 1.00, replicas 3.00, all-reduce 3.00" in lines[0]
