"""host_reduce: the sum or mean of N same-shaped tensors, on the host CPU."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_glp import _native
from tf_glp.ops._common import as_float_tensors, invalid, sum_in_order

_REDUCTIONS = ("sum", "mean")


@tf.autograph.experimental.do_not_convert  # Note [No AutoGraph in tf_glp]
def host_reduce(
    tensors: Sequence[tf.Tensor],
    op: str = "sum",
    output_dtype: tf.DType | None = None,
) -> tf.Tensor:
    """Sums (or averages) N same-shaped float tensors on the host CPU.

    The sum is accumulated in float32 in list order, whatever the input dtype,
    so the result is bitwise reproducible (independent of thread count and
    CPU instruction set) and equals `((t0 + t1) + t2) + ...` computed in
    float32, divided by N for "mean", then cast to output_dtype. For float32
    and up to 8 inputs that is exactly `tf.add_n(tensors)`.

    Args:
        tensors: A non-empty list of float32, bfloat16 or float16 tensors of
            one dtype and shape.
        op: "sum" or "mean".
        output_dtype: The input dtype (default) or tf.float32.

    Returns:
        A tensor of the inputs' shape, placed on the host CPU.

    Raises:
        tf.errors.InvalidArgumentError: for an empty list, mixed dtypes or
            shapes, a non-float dtype or a bad output_dtype.
        ValueError: for an unknown `op`.

    Example:
        >>> grads = [tf.fill([4], 1.0), tf.fill([4], 3.0)]
        >>> tf_glp.ops.host_reduce(grads, op="mean").numpy()
        array([2., 2., 2., 2.], dtype=float32)
    """
    if op not in _REDUCTIONS:
        raise ValueError(f"host_reduce: op must be 'sum' or 'mean', got {op!r}")
    with tf.device("/cpu:0"):
        inputs = as_float_tensors(tensors, "host_reduce", "tensors")
        dtype = inputs[0].dtype
        out_dtype = dtype if output_dtype is None else tf.as_dtype(output_dtype)
        if out_dtype not in (dtype, tf.float32):
            raise invalid(f"host_reduce: output_dtype must be the input dtype ({dtype.name}) or float32, got {out_dtype.name}")
        native = _native.library()
        if native is not None:
            return native.glp_host_reduce(inputs, out_type=out_dtype, reduction=op)
        return _fallback(inputs, op, out_dtype)


def _fallback(inputs: list[tf.Tensor], op: str, out_dtype: tf.DType) -> tf.Tensor:
    total = sum_in_order(inputs)
    if op == "mean":
        total = total / tf.constant(len(inputs), tf.float32)
    return tf.cast(total, out_dtype)


@tf.RegisterGradient("Glp>HostReduce")
def _host_reduce_grad(op: tf.Operation, grad: tf.Tensor) -> list[tf.Tensor]:
    # Mirrors the fallback's graph (float32 divide, then cast) so both paths
    # give the same gradient bits.
    count = len(op.inputs)
    if op.get_attr("reduction") in (b"mean", "mean"):
        grad = tf.cast(grad, tf.float32) / tf.constant(count, tf.float32)
    grad = tf.cast(grad, op.get_attr("T"))
    return [grad] * count
