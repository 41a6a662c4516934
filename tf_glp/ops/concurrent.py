"""Layer-concurrency ops (GLP4NN): a layer's independent work split over lanes.

`concurrent_conv2d` and `concurrent_matmul` compute what `tf.nn.convolution`
and `tf.matmul` compute, with the batch split over `concurrency` lanes
(tasks of TensorFlow's intra-op pool on a CPU, CUDA streams on a GPU; see
Note [Lane pool] in cc/core/lane_pool.h). For a given input every output and
gradient is bitwise identical for every `concurrency` and every run (Note
[Concurrent determinism] in cc/core/conv.h); against TensorFlow's own kernels
results agree to float32 rounding. float16 and bfloat16 inputs (mixed
precision) are computed in float32 and rounded once to their dtype (Note
[16-bit layers] in cc/tf/kernels/concurrent_kernels.h).

Without the native library (see tf_glp._native) the ops run pure TensorFlow
(Note [The fallback avoids TensorFlow's convolutions]), which ignores
`concurrency` and agrees with the native ops to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_glp import _native
from tf_glp._limits import MAX_CONCURRENCY
from tf_glp.ops._common import FLOAT_DTYPES, invalid


def check_concurrency(concurrency: int, op_name: str = "concurrency") -> int:
    """Returns `concurrency` as an int, or raises ValueError naming it."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise ValueError(f"{op_name}: concurrency must be an int between 1 and {MAX_CONCURRENCY}, got {concurrency!r}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"{op_name}: concurrency must be between 1 and {MAX_CONCURRENCY}, got {concurrency}")
    return int(concurrency)


def _pair(value: int | Sequence[int], name: str, op_name: str) -> list[int]:
    values = [value, value] if isinstance(value, int) and not isinstance(value, bool) else list(value)
    if len(values) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise ValueError(f"{op_name}: {name} must be a positive int or a pair of them, got {value!r}")
    return values


def _padding(padding: str, op_name: str) -> str:
    if not isinstance(padding, str) or padding.upper() not in ("SAME", "VALID"):
        raise ValueError(f"{op_name}: padding must be 'valid' or 'same', got {padding!r}")
    return padding.upper()


def _floats(op_name: str, **named) -> list[tf.Tensor]:
    """The named values as tensors of one float dtype (float32, or float16 /
    bfloat16 for mixed precision), or InvalidArgumentError naming the bad one."""
    tensors = {what: tf.convert_to_tensor(value) for what, value in named.items()}
    for what, tensor in tensors.items():
        if tensor.dtype not in FLOAT_DTYPES:
            raise invalid(f"{op_name}: {what} must be float32, float16 or bfloat16, got {tensor.dtype.name}")
    dtypes = {tensor.dtype for tensor in tensors.values()}
    if len(dtypes) > 1:
        raise invalid(f"{op_name}: " + " and ".join(tensors) + " must have the same dtype, got "
                      + " and ".join(t.dtype.name for t in tensors.values()))
    return list(tensors.values())


def _in_float32(fn, *tensors: tf.Tensor) -> tf.Tensor:
    """fn on the tensors widened to float32, rounded once to their dtype: the
    fallbacks' form of Note [16-bit layers] (cc/tf/kernels/concurrent_kernels.h)."""
    dtype = tensors[0].dtype
    if dtype == tf.float32:
        return fn(*tensors)
    return tf.cast(fn(*(tf.cast(t, tf.float32) for t in tensors)), dtype)


def _rank(tensor: tf.Tensor, rank: int, op_name: str, what: str, layout: str) -> None:
    if tensor.shape.rank is not None and tensor.shape.rank != rank:
        raise invalid(f"{op_name}: {what} must be {rank}-D {layout}, got shape {tensor.shape}")


@tf.autograph.experimental.do_not_convert  # Note [No AutoGraph in tf_glp]
def concurrent_conv2d(
    inputs: tf.Tensor,
    filters: tf.Tensor,
    strides: int | Sequence[int] = 1,
    padding: str = "valid",
    dilations: int | Sequence[int] = 1,
    concurrency: int = 1,
) -> tf.Tensor:
    """NHWC 2-D convolution with the batch's samples split over lanes.

    Computes `tf.nn.convolution(inputs, filters, strides, padding,
    dilations)` (groups = 1). Each sample is an independent work item
    (im2col + GEMM) run on one of `concurrency` lanes; the filter gradient is
    summed over fixed groups of samples in index order, so results do not
    depend on `concurrency`.

    Args:
        inputs: float32, float16 or bfloat16 [batch, height, width, in_channels].
        filters: [filter_height, filter_width, in_channels, out_channels], the
            dtype of `inputs`.
        strides: An int or (height, width) pair, each >= 1. Defaults to `1`.
        padding: "valid" or "same" (any case), as tf.nn.convolution.
            Defaults to `"valid"`.
        dilations: An int or (height, width) pair, each >= 1. Defaults to
            `1`.
        concurrency: Number of lanes, 1..64. Defaults to `1`.

    Returns:
        [batch, out_height, out_width, out_channels], the dtype of `inputs`.

    Raises:
        ValueError: for a bad concurrency, padding, strides or dilations.
        tf.errors.InvalidArgumentError: for a wrong rank or dtype, or input
            channels that do not match the filter.

    Example:
        >>> x = tf.random.normal([8, 32, 32, 3])
        >>> w = tf.random.normal([3, 3, 3, 16])
        >>> y = tf_glp.ops.concurrent_conv2d(x, w, padding="same", concurrency=2)
        >>> y.shape
        TensorShape([8, 32, 32, 16])
    """
    name = "concurrent_conv2d"
    concurrency = check_concurrency(concurrency, name)
    strides = _pair(strides, "strides", name)
    dilations = _pair(dilations, "dilations", name)
    padding = _padding(padding, name)
    inputs, filters = _floats(name, inputs=inputs, filters=filters)
    _rank(inputs, 4, name, "inputs", "[batch, height, width, channels]")
    _rank(filters, 4, name, "filters", "[height, width, in_channels, out_channels]")
    in_channels, filter_channels = inputs.shape[-1], filters.shape[2]
    if in_channels is not None and filter_channels is not None and in_channels != filter_channels:
        raise invalid(f"{name}: inputs have {in_channels} channels but the filters expect {filter_channels} (shapes {inputs.shape} and {filters.shape})")
    native = _native.library()
    if native is not None:
        return native.glp_concurrent_conv2d(
            inputs, filters, strides=strides, padding=padding, dilations=dilations, concurrency=concurrency
        )
    return _in_float32(lambda x, w: _fallback_conv2d(x, w, strides, padding, dilations), inputs, filters)


def _fallback_conv2d(inputs, filters, strides, padding, dilations) -> tf.Tensor:
    """im2col + matmul in TensorFlow: the native kernels' algorithm.

    Note [The fallback avoids TensorFlow's convolutions]
    The fallback never calls tf.nn.convolution / Conv2D, nor
    tf.image.extract_patches. TensorFlow 2.21's CPU convolution (oneDNN)
    was seen returning wrong numbers and killing the process, on an earlier
    machine of this project whose CPU had AVX-512 (FACTS: a 2x1 input, 1x2
    filter, strides (1, 2), "same": second row 0; a [2, 4, 1, 1] input,
    [9, 9, 1, 1] filter, strides (1, 2), "same": values around 1e22;
    dilations (2147483647, 3), "same": SIGSEGV); the same calls were right
    on an AVX2 machine (2026-12-04), so which inputs go wrong depends on the
    CPU and cannot be listed. extract_patches needs the filter size at
    trace time. Here the patch matrix is built by tf.gather, the positions
    computed in int64 (no overflow for any int32 stride or dilation), with
    zeros for padding: every number is a plain product and sum, and the
    gradients are gather's and matmul's.
    """
    shape = tf.shape(inputs, out_type=tf.int64)
    filter_shape = tf.shape(filters, out_type=tf.int64)
    rows, row_inside, out_h = _patch_positions(shape[1], filter_shape[0], strides[0], dilations[0], padding, "height")
    cols, col_inside, out_w = _patch_positions(shape[2], filter_shape[1], strides[1], dilations[1], padding, "width")
    # [batch, out_h * kh, width, c] -> [batch, out_h * kh, out_w * kw, c]
    patches = tf.gather(tf.gather(inputs, tf.reshape(rows, [-1]), axis=1), tf.reshape(cols, [-1]), axis=2)
    patches = tf.reshape(patches, tf.stack([shape[0], out_h, filter_shape[0], out_w, filter_shape[1], shape[3]]))
    inside = row_inside[None, :, :, None, None, None] & col_inside[None, None, None, :, :, None]
    patches = tf.where(tf.broadcast_to(inside, tf.shape(patches)), patches, tf.zeros_like(patches))
    patches = tf.transpose(patches, [0, 1, 3, 2, 4, 5])  # [batch, out_h, out_w, kh, kw, c]
    patch_size = filter_shape[0] * filter_shape[1] * filter_shape[2]
    outputs = tf.matmul(tf.reshape(patches, tf.stack([-1, patch_size])),
                        tf.reshape(filters, tf.stack([patch_size, filter_shape[3]])))
    outputs = tf.reshape(outputs, tf.stack([shape[0], out_h, out_w, filter_shape[3]]))
    outputs.set_shape(_static_output_shape(inputs.shape, filters.shape, strides, padding, dilations))
    return outputs


def _patch_positions(size, kernel, stride: int, dilation: int, padding: str, what: str):
    """The input positions of every output pixel's patch along one axis
    ([out, kernel], clipped into the input), which of them lie inside the
    input (the rest is padding), and the output size; as TensorFlow defines
    "same" and "valid"."""
    span = (kernel - 1) * dilation + 1
    if padding == "SAME":
        out = (size + stride - 1) // stride
        pad = tf.maximum(tf.constant(0, tf.int64), (out - 1) * stride + span - size) // 2
    else:
        with tf.control_dependencies([tf.debugging.assert_less_equal(
                span, size, message=f"concurrent_conv2d: with padding \"valid\" the dilated filter {what} must fit in the input {what}")]):
            out = (size - span) // stride + 1
        pad = tf.constant(0, tf.int64)
    positions = tf.range(out)[:, None] * stride - pad + tf.range(kernel)[None, :] * dilation
    inside = (positions >= 0) & (positions < size)
    return tf.clip_by_value(positions, 0, tf.maximum(size - 1, 0)), inside, out


def _static_output_shape(input_shape, filter_shape, strides, padding, dilations) -> tf.TensorShape:
    """The output's shape as far as the static shapes tell it."""
    dims = [input_shape[0]]
    for i in range(2):
        size, kernel = input_shape[1 + i], filter_shape[i]
        if size is None or kernel is None:
            dims.append(None)
        elif padding == "SAME":
            dims.append(-(-size // strides[i]))
        else:
            span = (kernel - 1) * dilations[i] + 1
            dims.append((size - span) // strides[i] + 1 if span <= size else None)
    return tf.TensorShape(dims + [filter_shape[3]])


@tf.autograph.experimental.do_not_convert  # Note [No AutoGraph in tf_glp]
def concurrent_matmul(
    a: tf.Tensor, b: tf.Tensor, transpose_b: bool = False, concurrency: int = 1
) -> tf.Tensor:
    """a @ b (or a @ b^T) with the rows of `a` split over lanes.

    Args:
        a: float32, float16 or bfloat16 [rows, inner].
        b: [inner, cols], or [cols, inner] when transpose_b; the dtype of `a`.
        transpose_b: Multiply by b transposed. Defaults to `False`.
        concurrency: Number of lanes, 1..64. Defaults to `1`.

    Returns:
        [rows, cols], the dtype of `a`. Every element of the result and of both
        gradients is an in-order sum computed by one lane, so results do not
        depend on `concurrency`.

    Raises:
        ValueError: for a bad concurrency.
        tf.errors.InvalidArgumentError: for a wrong rank, dtype or inner size.

    Example:
        >>> x = tf.random.normal([32, 128])
        >>> w = tf.random.normal([128, 10])
        >>> tf_glp.ops.concurrent_matmul(x, w, concurrency=2).shape
        TensorShape([32, 10])
    """
    name = "concurrent_matmul"
    concurrency = check_concurrency(concurrency, name)
    a, b = _floats(name, a=a, b=b)
    _rank(a, 2, name, "a", "[rows, inner]")
    _rank(b, 2, name, "b", "[inner, cols]" if not transpose_b else "[cols, inner]")
    inner_a, inner_b = a.shape[1], b.shape[1 if transpose_b else 0]
    if inner_a is not None and inner_b is not None and inner_a != inner_b:
        raise invalid(f"{name}: a has {inner_a} columns but b{'^T' if transpose_b else ''} has {inner_b} rows (shapes {a.shape} and {b.shape})")
    native = _native.library()
    if native is not None:
        return native.glp_concurrent_mat_mul(a, b, transpose_b=bool(transpose_b), concurrency=concurrency)
    return _in_float32(lambda x, y: tf.matmul(x, y, transpose_b=bool(transpose_b)), a, b)


@tf.RegisterGradient("Glp>ConcurrentConv2D")
def _concurrent_conv2d_grad(op: tf.Operation, grad: tf.Tensor) -> list[tf.Tensor]:
    native = _native.library()
    inputs, filters = op.inputs
    attrs = {name: op.get_attr(name) for name in ("strides", "padding", "dilations", "concurrency")}
    input_grad = native.glp_concurrent_conv2d_backprop_input(tf.shape(inputs), filters, grad, **attrs)
    filter_grad = native.glp_concurrent_conv2d_backprop_filter(inputs, tf.shape(filters), grad, **attrs)
    return [input_grad, filter_grad]


@tf.RegisterGradient("Glp>ConcurrentMatMul")
def _concurrent_matmul_grad(op: tf.Operation, grad: tf.Tensor) -> list[tf.Tensor]:
    native = _native.library()
    a, b = op.inputs
    lanes = op.get_attr("concurrency")
    if op.get_attr("transpose_b"):  # y = a b^T: da = dy b, db = dy^T a
        a_grad = native.glp_concurrent_mat_mul(grad, b, transpose_b=False, concurrency=lanes)
        b_grad = native.glp_concurrent_mat_mul_grad_weights(grad, a, concurrency=lanes)
    else:  # y = a b: da = dy b^T, db = a^T dy
        a_grad = native.glp_concurrent_mat_mul(grad, b, transpose_b=True, concurrency=lanes)
        b_grad = native.glp_concurrent_mat_mul_grad_weights(a, grad, concurrency=lanes)
    return [a_grad, b_grad]
