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
    assert chunking.plan_chunks([1000, 1000, 3000], "2KiB") == [[2], [1, 0]]


@pytest.mark.parametrize("text,size", [
    ("4MB", 4_000_000), ("4 MB", 4_000_000), ("4mb", 4_000_000), ("1.5kb", 1500), ("1GB", 10**9),
    ("4MiB", 4 << 20), ("4 MiB", 4 << 20), ("1.5KiB", 1536), ("1048576", 1 << 20), ("512B", 512),
])
def test_byte_sizes_si_and_iec(text, size):
    assert chunking.parse_bytes(text) == size
    chunking.validate_chunking(text)


@pytest.mark.parametrize("text", ["lots", "MB", "0MB", "-1", "4XB", "4 M B x"])
def test_not_byte_sizes(text):
    assert chunking.parse_bytes(text) is None


def test_chunking_owner_plans_and_records():
    fixed = chunking.Chunking(2)
    assert fixed.decided and fixed.in_use() == 2
    assert fixed.plan([400, 400, 400, 400]) == [[3, 2], [1, 0]]
    auto = chunking.Chunking("auto")
    assert not auto.decided and auto.in_use() == 1
    workload = cost_model.Workload(gradient_bytes=8_000_000, parameters=2_000_000, replicas=2)
    rates = cost_model.HostRates(float("inf"), 1e10, 1e9, 1e-4)
    auto.start(workload, rates)
    auto.record(chunking.Trial(1, cost_model.predict(workload, rates, 1), measured=0.01))
    auto.decide(1, "because")
    text = "\n".join(auto.explain_lines())
    assert "8.00 MB of gradients" in text and "in ms" in text and "chunks in use: 1 — because" in text


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
    # A backward pass shorter than the host's work hides only that much of it.
    short = cost_model.predict(large, rates, 4, compute=0.03)
    host = short.host_reduce + short.host_update
    assert short.exposed == pytest.approx(host - 0.02 + 4e-4)
    assert cost_model.best_chunk_count(large, rates, 64, compute=0.0) == 1
    assert cost_model.calibrate_compute(large, rates, 0.5) == pytest.approx(0.5 - cost_model.predict(large, rates, 1).exposed)
    with pytest.raises(ValueError, match="chunks must be >= 1"):
        cost_model.predict(large, rates, 0)
