"""chunking="auto" at start-up: no search on CPU replicas; on GPUs, the cost
model calibrated on the one-chunk steps and at most one confirming retrace
(scripted step times: no GPU needed)."""

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


def test_bad_settings():
    strategy = tf_glp.Strategy(cpu_replicas=2)
    with pytest.raises(ValueError, match="timed_steps must be >= 1, got 0"):
        chunking_decision.ChunkingDecision(strategy, timed_steps=0)
    with pytest.raises(ValueError, match="min_gain must be in"):
        chunking_decision.ChunkingDecision(strategy, min_gain=1.5)
