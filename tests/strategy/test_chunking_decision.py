"""chunking="auto" at start-up: no search on CPU replicas; on GPUs, the cost
model calibrated on the one-chunk steps and at most one confirming retrace
(scripted step times: no GPU needed)."""

import json
import os

import keras
import numpy as np
import pytest

import tf_glp
from tf_glp.strategy import chunking_decision, cost_model


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def _decide(monkeypatch, step_ms, rates, first_step_ms=500.0, timed_steps=3, steps=50):
    """Runs the decision over scripted step times (ms per chunk count)."""
    strategy = tf_glp.Strategy(cpu_replicas=2, update="host")
    monkeypatch.setattr(strategy, "uses_gpus", lambda: True)
    monkeypatch.setattr(strategy, "_host_rates", lambda optimizer=None: rates)
    with strategy.scope():
        model = keras.Sequential([keras.Input((256,))] + [keras.layers.Dense(256) for _ in range(8)])  # 16 variables
    clock = FakeClock()
    retraces = []
    monkeypatch.setattr(chunking_decision, "time", clock)
    original_function = object()
    model.train_function = original_function
    def retrace(force=False):
        retraces.append(strategy.chunking_state.in_use())
        model.train_function = object()

    monkeypatch.setattr(model, "make_train_function", retrace)
    callback = chunking_decision.ChunkingDecision(strategy, timed_steps=timed_steps)
    callback.set_model(model)
    callback.on_train_begin()
    traced = None
    for batch in range(steps):
        if strategy.chunking_state.decided:
            break
        chunks = strategy.chunking_state.in_use()
        callback.on_train_batch_begin(batch)
        clock.now += (first_step_ms if chunks != traced else step_ms[chunks]) / 1e3
        traced = chunks
        callback.on_train_batch_end(batch)
    callback.on_train_end()
    return strategy, retraces, model.train_function is original_function


# A host that needs about 20 ms per step for this model (2.1 MB of gradients), 0.1 ms per chunk.
SLOW_HOST = cost_model.HostRates(float("inf"), 3.2e8, 1e9, 1e-4)


def test_cpu_replicas_decide_one_chunk_without_measuring():
    strategy = tf_glp.Strategy(cpu_replicas=2, update="host")  # chunking="auto"
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        model.compile(optimizer="sgd", loss="mse")
    x = np.zeros((64, 8), np.float32)
    calls = []
    model.fit(x, x[:, :4], batch_size=32, epochs=1, verbose=0,
              callbacks=[keras.callbacks.LambdaCallback(on_train_begin=lambda logs: calls.append(
                  strategy.chunking_state.decided))])
    assert calls == [True]  # decided before the first step
    assert strategy.chunking_state.in_use() == 1 and not strategy.chunking_state.trials
    report = strategy.explain()
    assert "chunks in use: 1" in report and "cannot help" in report


def test_keeps_one_chunk_when_the_model_promises_little(monkeypatch):
    fast_host = cost_model.HostRates(float("inf"), 1e12, 1e12, 1e-3)
    strategy, retraces, same_function = _decide(monkeypatch, {1: 10.0}, fast_host)
    assert retraces == [] and same_function
    assert strategy.chunking_state.in_use() == 1
    assert "not worth a retrace" in strategy.explain()
    (trial,) = strategy.chunking_state.trials
    assert trial.measured == pytest.approx(0.010)


def test_one_confirming_retrace_kept_when_faster(monkeypatch):
    strategy, retraces, same_function = _decide(monkeypatch, {1: 30.0, **{c: 15.0 for c in range(2, 17)}}, SLOW_HOST)
    chosen = strategy.chunking_state.in_use()
    assert chosen > 1 and retraces == [chosen] and not same_function
    assert [t.chunks for t in strategy.chunking_state.trials] == [1, chosen]
    assert all(t.measured is not None for t in strategy.chunking_state.trials)
    assert f"chunks in use: {chosen}" in strategy.explain()


def test_back_to_one_chunk_without_a_second_retrace_when_slower(monkeypatch):
    strategy, retraces, same_function = _decide(monkeypatch, {1: 30.0, **{c: 31.0 for c in range(2, 17)}}, SLOW_HOST)
    assert len(retraces) == 1 and same_function  # the one-chunk function came back
    assert strategy.chunking_state.in_use() == 1
    assert "not faster" in strategy.explain()


def test_fit_ending_mid_decision_keeps_one_chunk_and_never_searches_again(monkeypatch):
    strategy, retraces, same_function = _decide(monkeypatch, {1: 30.0, **{c: 15.0 for c in range(2, 17)}},
                                                SLOW_HOST, steps=5)
    assert strategy.chunking_state.decided and strategy.chunking_state.in_use() == 1 and same_function
    assert chunking_decision.decide_without_measuring(strategy)  # later fits add no callback


def test_a_measured_decision_is_kept_in_the_plan_store_and_reused(monkeypatch, tmp_path):
    """On GPUs (scripted here) the decision made by measuring goes to the
    plan store; the next run of the same model decides from it, without a
    callback, a measurement or a retrace. A fit that ends before the
    measurement is not kept."""
    plan = str(tmp_path / "plan.json")
    x = np.zeros((64, 256), np.float32)

    def prepared(**settings):
        strategy = tf_glp.Strategy(cpu_replicas=2, update="host", plan_path=plan, **settings)
        monkeypatch.setattr(strategy, "uses_gpus", lambda: True)
        monkeypatch.setattr(strategy, "_host_rates", lambda optimizer=None: SLOW_HOST)
        with strategy.scope():
            model = keras.Sequential([keras.Input((256,))] + [keras.layers.Dense(256) for _ in range(8)])
            model.compile(optimizer="sgd", loss="mse")
        callbacks = chunking_decision.ChunkingChoice(strategy).prepare(model, {"x": x}, 32, [])
        return strategy, model, callbacks

    strategy, model, [decision] = prepared()
    decision.set_model(model)
    decision.on_train_begin()
    decision.on_train_end()  # (the fit ended before 1 chunk was timed)
    assert strategy.chunking_state.in_use() == 1 and not os.path.exists(plan)

    strategy, model, [decision] = prepared()
    clock = FakeClock()
    monkeypatch.setattr(chunking_decision, "time", clock)
    monkeypatch.setattr(model, "make_train_function", lambda force=False: None)
    decision.set_model(model)
    decision.on_train_begin()
    step_ms, traced = {1: 40.0, 4: 25.0}, None
    for batch in range(20):
        if strategy.chunking_state.decided:
            break
        chunks = strategy.chunking_state.in_use()
        decision.on_train_batch_begin(batch)
        clock.now += (500.0 if chunks != traced else step_ms.get(chunks, 25.0)) / 1e3
        traced = chunks
        decision.on_train_batch_end(batch)
    chosen = strategy.chunking_state.in_use()
    assert chosen > 1 and "measured" in strategy.chunking_state.reason
    [entry] = json.loads(open(plan).read())["chunkings"]
    assert entry["chunks"] == chosen and entry["key"]["update"] == "host"

    again, model, callbacks = prepared()
    assert callbacks == [] and again.chunking_state.decided and again.chunking_state.in_use() == chosen
    assert f"(reused {plan})" in again.explain(), again.explain()
    other, model, callbacks = prepared(compression="bf16")  # another key: measured
    assert len(callbacks) == 1 and not other.chunking_state.decided


def test_bad_settings():
    strategy = tf_glp.Strategy(cpu_replicas=2)
    with pytest.raises(ValueError, match="timed_steps must be >= 1, got 0"):
        chunking_decision.ChunkingDecision(strategy, timed_steps=0)
    with pytest.raises(ValueError, match="min_gain must be in"):
        chunking_decision.ChunkingDecision(strategy, min_gain=1.5)
