"""host_reduce: the sum or mean of N same-shaped tensors, on the host CPU."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_glp import _native
from tf_glp.ops._common import as_float_tensors, invalid, sum_in_order


@tf.autograph.experimental.do_not_convert  # Note [No AutoGraph in tf_glp]
def host_reduce(
    tensors: Sequence[tf.Tensor],
    op: str = "sum",
    output_dtype: tf.DType | None = None,
    divisor=None,
    return_all_finite: bool = False,
):
    """Sums (or averages) N same-shaped float tensors on the host CPU.

    The sum is accumulated in float32 in list order, whatever the input dtype,
    so the result is bitwise reproducible (independent of thread count and
    CPU instruction set) and equals `((t0 + t1) + t2) + ...` computed in
    float32, divided by N for "mean" (or by `divisor`), then cast to
    output_dtype. For float32 and up to 8 inputs that is exactly
    `tf.add_n(tensors)`.

    Args:
        tensors: A non-empty list of float32, bfloat16 or float16 tensors of
            one dtype and shape.
        op: "sum" (default) or "mean".
        output_dtype: The input dtype (default) or tf.float32.
        divisor: Optional float32 scalar (op="sum" only): the float32 sum is
            divided by it, in the same pass (how Keras unscales loss-scaled
            gradients). Default None (no division).
        return_all_finite: Also return a boolean scalar that says whether
            every float32 result (after the division, before the cast to
            output_dtype) is finite, checked in the same pass. Default False.

    Returns:
        A tensor of the inputs' shape, placed on the host CPU; with
        return_all_finite, the pair (that tensor, all_finite).

    Raises:
        tf.errors.InvalidArgumentError: for an empty list, mixed dtypes or
            shapes, a non-float dtype, a bad output_dtype or a non-scalar
            divisor.
        ValueError: for an unknown `op`, or a divisor with op="mean".

    Example:
        >>> grads = [tf.fill([4], 1.0), tf.fill([4], 3.0)]
        >>> tf_glp.ops.host_reduce(grads, op="mean").numpy()
        array([2., 2., 2., 2.], dtype=float32)
        >>> total, finite = tf_glp.ops.host_reduce(grads, divisor=4.0, return_all_finite=True)
        >>> total.numpy(), bool(finite)
        (array([1., 1., 1., 1.], dtype=float32), True)
    """
    if op not in ("sum", "mean"):
        raise ValueError(f"host_reduce: op must be 'sum' or 'mean', got {op!r}")
    if divisor is not None and op != "sum":
        raise ValueError(f"host_reduce: a divisor needs op='sum', got op={op!r}")
    with tf.device("/cpu:0"):
        inputs = as_float_tensors(tensors, "host_reduce", "tensors")
        dtype = inputs[0].dtype
        out_dtype = dtype if output_dtype is None else tf.as_dtype(output_dtype)
        if out_dtype not in (dtype, tf.float32):
            raise invalid(f"host_reduce: output_dtype must be the input dtype ({dtype.name}) or float32, got {out_dtype.name}")
        divide = divisor is not None
        divisor_tensor = tf.cast(tf.convert_to_tensor(1.0 if divisor is None else divisor), tf.float32)
        if divisor_tensor.shape.rank not in (None, 0):
            raise invalid(f"host_reduce: divisor must be a scalar, got shape {divisor_tensor.shape}")
        native = _native.library()
        if native is not None:
            output, all_finite = native.glp_host_reduce(
                inputs, divisor_tensor, out_type=out_dtype, reduction=op, divide=divide,
                check_finite=return_all_finite)
        else:
            output, all_finite = _fallback(inputs, op, out_dtype, divisor_tensor if divide else None,
                                           return_all_finite)
        return (output, all_finite) if return_all_finite else output


def _fallback(inputs: list[tf.Tensor], op: str, out_dtype: tf.DType, divisor, check_finite: bool):
    total = sum_in_order(inputs)
    if op == "mean":
        total = total / tf.constant(len(inputs), tf.float32)
    elif divisor is not None:
        total = total / divisor
    all_finite = tf.reduce_all(tf.math.is_finite(total)) if check_finite else tf.constant(True)
    return tf.cast(total, out_dtype), all_finite


@tf.RegisterGradient("Glp>HostReduce")
def _host_reduce_grad(op: tf.Operation, grad: tf.Tensor, _all_finite_grad=None) -> list:
    # Mirrors the fallback's graph (float32 divide, then cast) so both paths
    # give the same gradient bits. The divisor gets no gradient.
    count = len(op.inputs) - 1
    if op.get_attr("reduction") in (b"mean", "mean"):
        grad = tf.cast(grad, tf.float32) / tf.constant(count, tf.float32)
    elif op.get_attr("divide"):
        grad = tf.cast(grad, tf.float32) / op.inputs[count]
    grad = tf.cast(grad, op.get_attr("T"))
    return [grad] * count + [None]
