"""The chunking cost model (ICPE 2018, section "runtime algorithm").

A step costs the devices' compute time plus the part of the host's work that
does not overlap it. With c chunks, the host can start chunk k while the
devices compute earlier layers, so only about one chunk's host work stays
exposed, while every chunk adds a fixed synchronisation overhead:

    step(c) = compute + host / c + overhead * c
    host    = transfer + host_reduce + host_update

which is smallest near c* = sqrt(host / overhead). The measured search starts
there (see tuner.py). Pure Python, testable without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class HostRates:
    """Measured (or assumed) speeds of the host side.

    Attributes:
        transfer_bytes_per_s: device-to-host copy bandwidth (math.inf when the
            replicas are logical CPUs sharing host memory).
        reduce_bytes_per_s: host_reduce bandwidth, bytes read + written.
        update_params_per_s: fused optimizer update rate.
        chunk_overhead_s: fixed cost each chunk adds (op dispatch, barriers).
    """

    transfer_bytes_per_s: float
    reduce_bytes_per_s: float
    update_params_per_s: float
    chunk_overhead_s: float


@dataclasses.dataclass(frozen=True)
class Components:
    """Predicted step-time components for one chunking, in seconds."""

    chunks: int
    compute: float
    transfer: float
    host_reduce: float
    host_update: float
    exposed: float

    @property
    def step(self) -> float:
        return self.compute + self.exposed


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one training step moves through the host."""

    gradient_bytes: int
    parameters: int
    replicas: int


def host_components(workload: Workload, rates: HostRates) -> tuple[float, float, float]:
    """(transfer, host_reduce, host_update) seconds per step."""
    transfer = workload.gradient_bytes * workload.replicas / rates.transfer_bytes_per_s
    reduce = workload.gradient_bytes * (workload.replicas + 1) / rates.reduce_bytes_per_s
    update = workload.parameters / rates.update_params_per_s
    return transfer, reduce, update


def predict(workload: Workload, rates: HostRates, chunks: int, compute: float = 0.0) -> Components:
    """Predicted components of a step with `chunks` chunks."""
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    transfer, reduce, update = host_components(workload, rates)
    host = transfer + reduce + update
    exposed = host / chunks + rates.chunk_overhead_s * chunks
    return Components(chunks, compute, transfer, reduce, update, exposed)


def best_chunk_count(workload: Workload, rates: HostRates, max_chunks: int) -> int:
    """The integer chunk count in [1, max_chunks] the model predicts fastest."""
    transfer, reduce, update = host_components(workload, rates)
    host = transfer + reduce + update
    if rates.chunk_overhead_s <= 0:
        return max_chunks
    ideal = math.sqrt(host / rates.chunk_overhead_s)
    candidates = {max(1, min(max_chunks, c)) for c in (math.floor(ideal), math.ceil(ideal))}
    return min(candidates, key=lambda c: predict(workload, rates, c).exposed)
