"""The chunking cost model (ICPE 2018, section "runtime algorithm").

A step costs the devices' compute time plus the part of the host's work that
does not overlap it. With c chunks, the host works on chunk k while the
devices still compute the backward pass of earlier layers, so the host work
of the first c - 1 chunks can hide behind the rest of the backward pass (but
not behind more than the backward pass itself); only the last chunk's work
stays exposed for sure, and every chunk adds a fixed synchronisation cost:

    host      = transfer + host_reduce + host_update
    hidden(c) = min(host * (c - 1) / c, backward)      backward ~ 2/3 of compute
    step(c)   = compute + host - hidden(c) + overhead * c

Before the compute time is known the backward pass is assumed long enough to
hide everything (hidden = host (c - 1) / c). chunking_decision.py measures
the one-chunk step, calibrates compute from it and takes the best c under
the calibrated model. Pure Python, testable without TensorFlow (only
measure_host_rates, which times the host engine, imports it).
"""

from __future__ import annotations

import dataclasses
import math
import time


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


# The backward pass computes two products per forward one.
BACKWARD_SHARE = 2.0 / 3.0


def predict(workload: Workload, rates: HostRates, chunks: int, compute: float | None = None) -> Components:
    """Predicted components of a step with `chunks` chunks (seconds).

    Args:
        compute: The devices' compute time per step, if known (None: see
            the module docstring).
    """
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    transfer = workload.gradient_bytes * workload.replicas / rates.transfer_bytes_per_s
    reduce = workload.gradient_bytes * (workload.replicas + 1) / rates.reduce_bytes_per_s
    update = workload.parameters / rates.update_params_per_s
    host = transfer + reduce + update
    hidden = host * (chunks - 1) / chunks
    if compute is not None:
        hidden = min(hidden, BACKWARD_SHARE * compute)
    exposed = host - hidden + rates.chunk_overhead_s * chunks
    return Components(chunks, compute or 0.0, transfer, reduce, update, exposed)


def best_chunk_count(workload: Workload, rates: HostRates, max_chunks: int, compute: float | None = None) -> int:
    """The chunk count in [1, max_chunks] the model predicts fastest (the
    smallest of equals)."""
    counts = range(1, max(1, max_chunks) + 1)
    return min(counts, key=lambda c: (predict(workload, rates, c, compute).step, c))


def calibrate_compute(workload: Workload, rates: HostRates, measured_one_chunk: float) -> float:
    """The compute time that makes the model's one-chunk step equal to the
    measured one (never negative)."""
    return max(0.0, measured_one_chunk - predict(workload, rates, 1).exposed)


def gradient_workload(sizes: list[int], replicas: int, bytes_per_element: int = 4) -> Workload:
    """The workload of variables with `sizes` elements each."""
    total = int(sum(sizes))
    return Workload(gradient_bytes=bytes_per_element * total, parameters=total, replicas=replicas)


def measure_host_rates(host_device: str, uses_gpus: bool, optimizer=None) -> HostRates:
    """Times the host engine on this machine (about 0.2 s).

    Args:
        host_device: The device the host engine runs on.
        uses_gpus: Whether the replicas are GPUs (gradients cross PCIe).
        optimizer: The Keras optimizer whose fused update the update rate is
            for (its bytes per parameter, tf_glp.ops.keras_fused's table).
            Default None: Adam's, as for an optimizer without a fused update.
    """
    import tensorflow as tf  # noqa: PLC0415 (the model itself stays pure Python)

    from tf_glp.ops import host_reduce  # noqa: PLC0415
    from tf_glp.ops.keras_fused import update_bytes_per_parameter  # noqa: PLC0415

    elements = 4 << 20
    with tf.device(host_device):
        inputs = [tf.random.stateless_uniform([elements], seed=[i, 0]) for i in range(2)]
        small = [tf.zeros([16]) for _ in range(2)]

        def best(fn, repeats=5):
            fn()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return min(times)

        reduce_s = best(lambda: host_reduce(inputs).numpy())
        overhead_s = best(lambda: host_reduce(small).numpy(), repeats=20)
    reduce_bw = 3 * elements * 4 / reduce_s
    # The fused update moves update_bytes_per_parameter bytes per parameter
    # (Adam: 28), a 2-way reduce 12 per element: scale the measured reduce
    # rate accordingly.
    update_rate = reduce_bw / update_bytes_per_parameter(optimizer)
    transfer = 12e9 if uses_gpus else math.inf  # PCIe 3 x16 effective; shared memory on CPUs
    return HostRates(transfer, reduce_bw, update_rate, overhead_s)
