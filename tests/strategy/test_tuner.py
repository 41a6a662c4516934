"""The chunking search on scripted step times: up while faster, else down
from the start, stop at the first slower candidate, keep the fastest."""

import keras
import pytest

import tf_glp
from tf_glp.strategy import cost_model, tuner


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def _search(monkeypatch, start, step_ms, first_step_ms=None, timed_steps=3):
    strategy = tf_glp.Strategy(cpu_replicas=2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,))] + [keras.layers.Dense(4) for _ in range(8)])  # 16 variables
    clock = FakeClock()
    retraces = []
    monkeypatch.setattr(tuner, "time", clock)
    monkeypatch.setattr(model, "make_train_function", lambda force=False: retraces.append(force))
    monkeypatch.setattr(cost_model, "best_chunk_count", lambda workload, rates, max_chunks: start)
    monkeypatch.setattr(strategy, "host_rates", lambda: cost_model.HostRates(float("inf"), 1e10, 1e9, 1e-4))
    callback = tuner.ChunkingTuner(strategy, timed_steps=timed_steps)
    callback.set_model(model)
    callback.on_train_begin()
    tried = []
    for batch in range(200):
        if strategy._tuned:
            break
        chunks = strategy._auto_chunks
        first = not tried or tried[-1] != chunks
        if first:
            tried.append(chunks)
        callback.on_train_batch_begin(batch)
        clock.now += ((first_step_ms or {}).get(chunks, step_ms[chunks]) if first else step_ms[chunks]) / 1e3
        callback.on_train_batch_end(batch)
    assert strategy._tuned
    assert retraces == [True] * (len(tried) + 1)  # one per candidate, one for the final choice
    return tried, strategy._auto_chunks, strategy.explain()


def test_goes_up_while_faster(monkeypatch):
    tried, chosen, report = _search(monkeypatch, 4, {4: 10.0, 8: 9.0, 16: 9.5})
    assert tried == [4, 8, 16] and chosen == 8
    assert "chunks in use: 8" in report


def test_goes_down_when_up_is_slower(monkeypatch):
    tried, chosen, _ = _search(monkeypatch, 4, {4: 10.0, 8: 11.0, 2: 9.0, 1: 9.5})
    assert tried == [4, 8, 2, 1] and chosen == 2


def test_keeps_the_start_when_both_directions_are_slower(monkeypatch):
    tried, chosen, _ = _search(monkeypatch, 4, {4: 10.0, 8: 11.0, 2: 12.0})
    assert tried == [4, 8, 2] and chosen == 4


def test_first_step_of_each_candidate_is_not_timed(monkeypatch):
    # The first step after a switch retraces the train function; timed, its
    # 500 ms would make 8 chunks lose.
    tried, chosen, _ = _search(monkeypatch, 4, {4: 10.0, 8: 9.0, 16: 9.5}, first_step_ms={8: 500.0},
                               timed_steps=1)
    assert tried == [4, 8, 16] and chosen == 8


def test_bad_setting():
    with pytest.raises(ValueError, match="timed_steps must be >= 1, got 0"):
        tuner.ChunkingTuner(tf_glp.Strategy(cpu_replicas=2), timed_steps=0)
