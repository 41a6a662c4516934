"""Chunking: which variables' aggregation and update wait for which gradients.

Gradients arrive in backward order (last layer first). A chunk is a run of
variables, in that order, whose host work starts once all of the chunk's
gradients exist, so the host works on chunk k while the devices still compute
the gradients of earlier layers (ICPE 2018, "Involving CPUs into Multi-GPU
Deep Learning"). One chunk is ordinary data parallelism: nothing starts until
the whole backward pass is done.

Pure Python on sizes only, so it is testable without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from tf_glp.strategy import cost_model


def validate_chunking(chunking) -> None:
    """Raises ValueError unless chunking is "auto", "none", a chunk count
    (int >= 1) or a byte size (see parse_bytes)."""
    if isinstance(chunking, int) and not isinstance(chunking, bool):
        if chunking < 1:
            raise ValueError(f"chunking as a number of chunks must be >= 1, got {chunking}")
        return
    if isinstance(chunking, str) and (chunking in ("auto", "none") or parse_bytes(chunking) is not None):
        return
    raise ValueError("chunking must be 'auto', 'none', an int number of chunks, or a byte size such as '4MB', "
                     f"'4MiB', '4 MiB' or '4194304', got {chunking!r}")


# One convention everywhere: SI units are powers of 10, IEC units powers of 2.
_UNITS = {"b": 1, "": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def parse_bytes(text: str) -> int | None:
    """A byte size: "4MB" -> 4_000_000, "4MiB" / "4 MiB" -> 4_194_304,
    "1048576" -> 1_048_576 (case-insensitive). None when text is not one."""
    value = text.strip().lower().replace(" ", "")
    number = value.rstrip("kmgib")
    unit = value[len(number):]
    if unit not in _UNITS:
        return None
    try:
        size = float(number) * _UNITS[unit]
    except ValueError:
        return None
    return int(size) if math.isfinite(size) and size >= 1 else None


def plan_chunks(sizes_in_bytes: Sequence[int], chunking) -> list[list[int]]:
    """Groups variable indices into chunks in backward order.

    Args:
        sizes_in_bytes: Gradient size of each variable, in forward (model) order.
        chunking: "none", an int number of chunks, or a byte size string.

    Returns:
        Chunks of variable indices; the first chunk holds the last variables
        (whose gradients the backward pass produces first). Chunks are
        balanced by bytes; there are never more chunks than variables.
    """
    count = len(sizes_in_bytes)
    if count == 0:
        return []
    backward = list(range(count - 1, -1, -1))
    if chunking == "none":
        return [backward]
    if isinstance(chunking, str):
        limit = parse_bytes(chunking)
        if limit is None:
            raise ValueError(f"not a byte size: {chunking!r}")
        chunks, current, filled = [], [], 0
        for index in backward:
            if current and filled + sizes_in_bytes[index] > limit:
                chunks.append(current)
                current, filled = [], 0
            current.append(index)
            filled += sizes_in_bytes[index]
        chunks.append(current)
        return chunks
    wanted = max(1, min(int(chunking), count))
    total = sum(sizes_in_bytes) or 1
    chunks, current, filled = [], [], 0
    for position, index in enumerate(backward):
        current.append(index)
        filled += sizes_in_bytes[index]
        remaining_vars = count - position - 1
        remaining_chunks = wanted - len(chunks) - 1
        # Close the chunk at its share of the bytes, keeping at least one
        # variable for every chunk still to come.
        if remaining_chunks > 0 and (filled * wanted >= total * (len(chunks) + 1) or remaining_vars == remaining_chunks):
            chunks.append(current)
            current = []
    if current:
        chunks.append(current)
    return chunks


@dataclasses.dataclass
class Trial:
    """One chunk count the start-up decision predicted and (maybe) measured."""

    chunks: int
    predicted: cost_model.Components
    measured: float | None = None  # median step time, seconds


class Chunking:
    """The one owner of a Strategy's chunking: the setting, the chunk count
    in use, and the record of how chunking="auto" chose it.

    The cross-device ops ask `plan()`; the start-up decision
    (chunking_decision.py) writes through `start`, `record`, `use` and
    `decide`; `explain()` reads the record.

    Args:
        setting: "auto", "none", an int number of chunks, or a byte size
            (see parse_bytes).

    Example:
        >>> chunking = Chunking(2)
        >>> chunking.plan([400, 400, 400, 400])
        [[3, 2], [1, 0]]
    """

    def __init__(self, setting):
        validate_chunking(setting)
        self.setting = setting
        self._chunks = None if setting == "auto" else setting
        self.decided = setting != "auto"  # False until chunking="auto" has made its start-up choice
        self.reason = "" if setting == "auto" else "set by the user"
        self.trials: list[Trial] = []
        self.workload: cost_model.Workload | None = None
        self.rates: cost_model.HostRates | None = None

    def in_use(self):
        """The chunking the next traced step uses ("none", a count or a size)."""
        return 1 if self._chunks is None else self._chunks

    def plan(self, sizes_in_bytes: Sequence[int]) -> list[list[int]]:
        """Chunks of variable indices (see plan_chunks) for the chunking in use."""
        return plan_chunks(sizes_in_bytes, self.in_use())

    # -- written by the start-up decision -------------------------------
    def start(self, workload: cost_model.Workload, rates: cost_model.HostRates | None) -> None:
        self.workload, self.rates, self.trials = workload, rates, []

    def use(self, chunks: int) -> None:
        self._chunks = chunks

    def record(self, trial: Trial) -> None:
        self.trials.append(trial)

    def decide(self, chunks: int, reason: str) -> None:
        self._chunks, self.reason, self.decided = chunks, reason, True

    # -- read by explain() ---------------------------------------------
    def explain_lines(self) -> list[str]:
        """The decision: its reason, and each trial's predicted and measured
        step time with the cost model's components, in milliseconds."""
        lines = []
        if self.workload is not None:
            w = self.workload
            lines.append(f"  workload: {w.parameters:,} parameters, {w.gradient_bytes / 1e6:.2f} MB of gradients "
                         f"per replica, {w.replicas} replicas")
        if self.trials:
            lines.append("  step time per chunk count, in ms (predicted: cost model; compute calibrated on the "
                         "measured 1-chunk step, so its two columns agree by construction):")
            lines.append(f"  {'chunks':>6} {'predicted':>10} {'measured':>10} {'compute':>9} {'transfer':>9} "
                         f"{'reduce':>8} {'update':>8} {'exposed':>8}")
            for trial in self.trials:
                c = trial.predicted
                measured = f"{trial.measured * 1e3:10.2f}" if trial.measured is not None else f"{'-':>10}"
                lines.append(f"  {trial.chunks:>6} {c.step * 1e3:10.2f} {measured} {c.compute * 1e3:9.2f} "
                             f"{c.transfer * 1e3:9.2f} {c.host_reduce * 1e3:8.2f} {c.host_update * 1e3:8.2f} "
                             f"{c.exposed * 1e3:8.2f}")
        state = "" if self.decided else " (deciding during the first steps)"
        lines.append(f"  chunks in use: {self.in_use()}{state}" + (f" — {self.reason}" if self.reason else ""))
        return lines
