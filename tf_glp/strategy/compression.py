"""Gradient compression: how gradients cross from the replicas to the host.

A scheme (Compression) says how a float32 gradient crosses to the host,
which accumulates in float32. Only gradient sums are compressed; metrics
and losses stay exact (HostCrossDeviceOps.reducing_gradients).

Adding a scheme (int8 with a scale, top-k with error feedback):
docs/building.md (Compression schemes).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

FLOAT16_MAX = 65504.0


class Compression:
    """One compression scheme.

    Attributes:
        name: The value of `tf_glp.Strategy(compression=...)`.
        wire_dtype: The dtype that crosses to the host.
        can_overflow: A finite float32 gradient can fail to encode.
        fused_readable: host_reduce and the fused update read `wire_dtype`
            as it is (no decode pass on the host).
    """

    name: str
    wire_dtype: tf.DType
    can_overflow = False
    fused_readable = True

    def encode(self, part: tf.Tensor, overflow: str) -> tf.Tensor:
        """A float32 gradient as it crosses (placed by the caller on its device)."""
        raise NotImplementedError

    def decode(self, wire: tf.Tensor) -> tf.Tensor:
        """The float32 gradient back, on the host (for schemes the host ops cannot read)."""
        return tf.cast(wire, tf.float32)


class Cast16(Compression):
    """A cast to a 16-bit float; the host accumulates in float32."""

    def __init__(self, name: str, wire_dtype: tf.DType, can_overflow: bool):
        self.name, self.wire_dtype, self.can_overflow = name, wire_dtype, can_overflow

    def encode(self, part, overflow):
        if self.can_overflow and overflow == "raise":
            part = _checked_float16(part)
        return tf.cast(part, self.wire_dtype)


# bfloat16 has float32's range and cannot overflow; float16 can (FLOAT16_MAX).
SCHEMES: dict[str, Compression] = {scheme.name: scheme for scheme in (
    Cast16("bf16", tf.bfloat16, can_overflow=False),
    Cast16("fp16", tf.float16, can_overflow=True),
)}


def get(name: str | None) -> Compression | None:
    """The scheme named `name` (None: no compression); ValueError naming the known ones."""
    if name is None:
        return None
    if isinstance(name, str) and name in SCHEMES:
        return SCHEMES[name]
    names = ["None", *map(repr, SCHEMES)]
    raise ValueError(f"compression must be {', '.join(names[:-1])} or {names[-1]}, got {name!r}")


def compress(parts: Sequence[tf.Tensor], scheme: Compression | None, *, overflow: str = "raise") -> list[tf.Tensor]:
    """Encodes float32 parts on their own devices before they cross to the
    host; other dtypes cross as they are.

    A finite value the scheme cannot hold (fp16: beyond 65504) is an
    InvalidArgumentError naming it with overflow="raise"; with
    overflow="propagate" it becomes inf and goes on, for a caller that
    checks the sum and skips the step (dynamic loss scaling under
    update="host").
    """
    if scheme is None:
        return list(parts)
    out = []
    for part in parts:
        if part.dtype == tf.float32:
            with tf.device(part.device):
                part = scheme.encode(part, overflow)
        out.append(part)
    return out


def for_host(parts: Sequence[tf.Tensor], scheme: Compression | None, host_device: str, *,
             overflow: str = "raise") -> list[tf.Tensor]:
    """What the host's ops read: the parts compressed, and decoded on the
    host where the scheme's wire dtype is not one they read."""
    wire = compress(parts, scheme, overflow=overflow)
    if scheme is None or scheme.fused_readable:
        return wire
    with tf.device(host_device):
        return [scheme.decode(w) if w.dtype == scheme.wire_dtype else w for w in wire]


def _checked_float16(part: tf.Tensor) -> tf.Tensor:
    # Only finite values that float16 cannot hold fail; a gradient that is
    # already inf or NaN passes through as it would without compression.
    largest = tf.reduce_max(tf.where(tf.math.is_finite(part), tf.abs(part), 0.0))
    check = tf.debugging.Assert(
        largest <= FLOAT16_MAX,
        ["tf_glp.Strategy(compression='fp16'): a gradient value of magnitude", largest,
         "does not fit in float16 (largest 65504) and would become inf. Use compression='bf16' "
         "(float32's range), or the 'mixed_float16' policy with update='host', whose loss scaling "
         "skips such steps."],
        summarize=1)
    with tf.control_dependencies([check]):
        return tf.identity(part)
