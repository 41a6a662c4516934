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

from collections.abc import Sequence

def validate_chunking(chunking) -> None:
    """Raises ValueError unless chunking is "auto", "none", a chunk count
    (int >= 1) or a byte size (a string such as "4MB")."""
    if isinstance(chunking, bool):
        raise ValueError(f"chunking must be 'auto', 'none', an int number of chunks or a byte size like '4MB', got {chunking!r}")
    if isinstance(chunking, int):
        if chunking < 1:
            raise ValueError(f"chunking as a number of chunks must be >= 1, got {chunking}")
        return
    if isinstance(chunking, str) and (chunking in ("auto", "none") or parse_bytes(chunking) is not None):
        return
    raise ValueError(f"chunking must be 'auto', 'none', an int number of chunks or a byte size like '4MB', got {chunking!r}")


_UNITS = {"b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30}


def parse_bytes(text: str) -> int | None:
    """"4MB" -> 4194304; None when text is not a byte size."""
    value = text.strip().lower().replace(" ", "")
    for unit in sorted(_UNITS, key=len, reverse=True):
        if value.endswith(unit):
            number = value[: -len(unit)]
            try:
                amount = float(number)
            except ValueError:
                return None
            return int(amount * _UNITS[unit]) if amount > 0 else None
    return None


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
