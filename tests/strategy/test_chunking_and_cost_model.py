"""Chunk plans and the cost model: pure Python, no TensorFlow needed."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tf_glp.strategy import chunking, cost_model


def test_one_chunk_in_backward_order():
    assert chunking.plan_chunks([4, 8, 16], "none") == [[2, 1, 0]]


def test_chunk_count_balances_bytes():
    # 4 variables of equal size in 2 chunks: the last two first.
    assert chunking.plan_chunks([10, 10, 10, 10], 2) == [[3, 2], [1, 0]]
    # Never more chunks than variables.
    assert chunking.plan_chunks([10, 10], 5) == [[1], [0]]


def test_byte_size_chunks():
    assert chunking.plan_chunks([1000, 1000, 3000], "2KB") == [[2], [1, 0]]
    assert chunking.parse_bytes("4MB") == 4 << 20 and chunking.parse_bytes("1.5kb") == 1536
    assert chunking.parse_bytes("lots") is None


@given(sizes=st.lists(st.integers(0, 10_000), min_size=1, max_size=40),
       setting=st.one_of(st.integers(1, 50), st.sampled_from(["none", "1KB", "64KB", "1B"])))
def test_every_variable_in_exactly_one_chunk(sizes, setting):
    chunks = chunking.plan_chunks(sizes, setting)
    flat = [i for c in chunks for i in c]
    assert flat == list(range(len(sizes) - 1, -1, -1))  # backward order, each once
    assert all(chunks)
    if isinstance(setting, int):
        assert len(chunks) == min(setting, len(sizes))


@pytest.mark.parametrize("bad", [0, -1, "some", "0MB", 2.5, True, None])
def test_bad_chunking_is_rejected(bad):
    with pytest.raises(ValueError, match="chunking"):
        chunking.validate_chunking(bad)


def test_cost_model_prefers_more_chunks_for_more_host_work():
    rates = cost_model.HostRates(float("inf"), 10e9, 1e9, 1e-4)
    small = cost_model.Workload(gradient_bytes=4 << 10, parameters=1 << 10, replicas=2)
    large = cost_model.Workload(gradient_bytes=400 << 20, parameters=100 << 20, replicas=2)
    assert cost_model.best_chunk_count(small, rates, 64) == 1
    best = cost_model.best_chunk_count(large, rates, 64)
    assert best > 4
    # The prediction is smallest at the chosen count among its neighbours.
    steps = {c: cost_model.predict(large, rates, c).step for c in (best - 1, best, best + 1)}
    assert steps[best] == min(steps.values())
    c = cost_model.predict(large, rates, 4, compute=0.5)
    assert c.step == pytest.approx(0.5 + (c.host_reduce + c.host_update) / 4 + 4e-4)
    with pytest.raises(ValueError, match="chunks must be >= 1"):
        cost_model.predict(large, rates, 0)
