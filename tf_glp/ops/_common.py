"""Shared by the ops: argument checks with clear errors, and the in-order sum."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

import tensorflow as tf

FLOAT_DTYPES = (tf.float32, tf.bfloat16, tf.float16)


def invalid(message: str) -> tf.errors.InvalidArgumentError:
    return tf.errors.InvalidArgumentError(None, None, message)


def as_float_tensors(values: Sequence, op_name: str, what: str) -> list[tf.Tensor]:
    """Converts values to tensors of one float dtype and one static shape."""
    if isinstance(values, (tf.Tensor, tf.Variable)) or not isinstance(values, Sequence):
        raise invalid(f"{op_name}: {what} must be a list of tensors, got {type(values).__name__}")
    if len(values) == 0:
        raise invalid(f"{op_name}: {what} must hold at least one tensor, got an empty list")
    tensors = [tf.convert_to_tensor(v) for v in values]
    dtype = tensors[0].dtype
    if dtype not in FLOAT_DTYPES:
        raise invalid(f"{op_name}: {what} must be float32, bfloat16 or float16, got {dtype.name}")
    for i, t in enumerate(tensors[1:], start=1):
        if t.dtype != dtype:
            raise invalid(f"{op_name}: all {what} must have one dtype, but {what}[{i}] is {t.dtype.name} and {what}[0] is {dtype.name}")
        if not t.shape.is_compatible_with(tensors[0].shape):
            raise invalid(f"{op_name}: all {what} must have one shape, but {what}[{i}] has shape {t.shape} and {what}[0] has shape {tensors[0].shape}")
    return tensors


def sum_in_order(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """((t0 + t1) + t2) + ... in float32: the native kernels' order.

    tf.add_n sums up to 8 inputs in this order but groups longer lists
    differently, so longer lists are chained here.
    """
    values = [tf.cast(t, tf.float32) for t in tensors]
    if len(values) <= 8:
        return tf.add_n(values)
    return functools.reduce(operator.add, values)
