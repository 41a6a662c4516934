"""Keras layers whose work runs over lanes (GLP4NN layer concurrency).

`tf_glp.layers.Conv2D` and `tf_glp.layers.Dense` are keras.layers.Conv2D and
keras.layers.Dense with one more argument, `concurrency`: None runs
TensorFlow's own kernel (exactly the Keras layer), an int k runs tf_glp's
concurrent op over k lanes (tf_glp.ops.concurrent_conv2d / concurrent_matmul).
Weights, their names and order are those of the Keras layers, so weights move
freely between a Keras model and its GLP twin. `convert(model)` makes the twin
of a whole model.

Under the mixed_float16 / mixed_bfloat16 policies the concurrent ops run in
the compute dtype (float32 accumulation, one rounding; Note [16-bit layers]).
Layers that the concurrent ops cannot run (see is_eligible) run the Keras
kernel, whatever `concurrency` says.
"""

from __future__ import annotations

from collections.abc import Mapping

import keras
import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.ops.concurrent import check_concurrency, concurrent_conv2d, concurrent_matmul

__all__ = ["Conv2D", "Dense", "as_glp_layer", "convert", "is_eligible", "strip", "why_not_eligible"]


def _checked(concurrency: int | None, layer: str) -> int | None:
    return None if concurrency is None else check_concurrency(concurrency, layer)


class _Lanes:
    """What tf_glp's Conv2D and Dense share: the `concurrency` argument,
    checked, kept in the config, and no XLA with a lane count."""

    def __init__(self, *args, concurrency: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.concurrency = _checked(concurrency, f"tf_glp.layers.{type(self).__name__}")
        self.supports_jit = self.concurrency is None  # Note [Not in XLA]

    def get_config(self) -> dict:
        config = super().get_config()
        config["concurrency"] = self.concurrency
        return config

    def _runs_concurrently(self, inputs) -> bool:
        return self.concurrency is not None and _unsupported(self) is None and _concurrent_dtype(inputs, self)


@keras.saving.register_keras_serializable(package="tf_glp")
class Conv2D(_Lanes, keras.layers.Conv2D):
    """keras.layers.Conv2D whose convolution runs over `concurrency` lanes.

    Args:
        *args: As keras.layers.Conv2D.
        concurrency: None (default) for TensorFlow's own convolution, or the
            number of lanes (1..64) over which the batch's samples are split.
            Results do not depend on it (bitwise).
        **kwargs: As keras.layers.Conv2D.

    Example:
        >>> layer = tf_glp.layers.Conv2D(32, 3, padding="same", concurrency=2)
        >>> layer(tf.zeros([8, 32, 32, 3])).shape
        TensorShape([8, 32, 32, 32])
    """

    def convolution_op(self, inputs, kernel):
        if not self._runs_concurrently(inputs):
            return super().convolution_op(inputs, kernel)
        return concurrent_conv2d(
            inputs,
            tf.cast(kernel, inputs.dtype),  # the compute dtype, as Keras' own op casts it
            strides=list(self.strides),
            padding=self.padding,
            dilations=list(self.dilation_rate),
            concurrency=self.concurrency,
        )


@keras.saving.register_keras_serializable(package="tf_glp")
class Dense(_Lanes, keras.layers.Dense):
    """keras.layers.Dense whose matrix product runs over `concurrency` lanes.

    Args:
        *args: As keras.layers.Dense.
        concurrency: None (default) for TensorFlow's own matmul, or the number
            of lanes (1..64) over which the batch's rows are split. Results do
            not depend on it (bitwise).
        **kwargs: As keras.layers.Dense.

    Example:
        >>> layer = tf_glp.layers.Dense(10, concurrency=2)
        >>> layer(tf.zeros([32, 128])).shape
        TensorShape([32, 10])
    """

    def call(self, inputs, training=None):
        if not (isinstance(inputs, tf.Tensor) and self._runs_concurrently(inputs)):
            return super().call(inputs, training=training)
        kernel = tf.cast(self.kernel, inputs.dtype)  # the compute dtype, as Keras' own op casts it
        rows = inputs if inputs.shape.rank == 2 else tf.reshape(inputs, [-1, kernel.shape[0]])
        x = concurrent_matmul(rows, kernel, concurrency=self.concurrency)
        if inputs.shape.rank != 2:
            x = tf.reshape(x, tf.concat([tf.shape(inputs)[:-1], [self.units]], axis=0))
            x.set_shape(inputs.shape[:-1].concatenate([self.units]))
        if self.bias is not None:
            x = tf.add(x, tf.cast(self.bias, x.dtype))
        if self.activation is not None:
            x = self.activation(x)
        return x


_DTYPES = ("float32", "float16", "bfloat16")

# Note [Not in XLA]: tf_glp's concurrent ops have no XLA kernels, so a layer
# with a lane count says supports_jit = False: Keras' jit_compile="auto" (XLA
# on a machine with a GPU) then compiles the model without XLA instead of
# failing. (ConcurrencyProfiler leaves a model compiled with XLA alone.)


def _concurrent_dtype(inputs, layer) -> bool:
    """Inputs in the layer's compute dtype, one the concurrent ops take."""
    dtype = getattr(inputs, "dtype", None)
    return dtype is not None and dtype.name == layer.compute_dtype and layer.compute_dtype in _DTYPES


_TWINS = {keras.layers.Conv2D: Conv2D, keras.layers.Dense: Dense}
_PLAIN = {glp: plain for plain, glp in _TWINS.items()}


def is_eligible(layer: keras.layers.Layer, include_keras_layers: bool = True) -> bool:
    """Whether the concurrent ops can run `layer`: a tf_glp Conv2D / Dense,
    or (include_keras_layers) a plain keras.layers.Conv2D / Dense, that is
    built, computing in float32, float16 or bfloat16 (mixed precision),
    channels_last, ungrouped, without LoRA or quantization.

    Args:
        layer: The layer to check.
        include_keras_layers: Also accept plain keras.layers.Conv2D / Dense
            (False: only tf_glp's own layers). Default True.
    """
    return why_not_eligible(layer, include_keras_layers) is None


def why_not_eligible(layer: keras.layers.Layer, include_keras_layers: bool = True) -> str | None:
    """Why the concurrent ops cannot run `layer` (see is_eligible), or None.

    Args:
        layer, include_keras_layers: As in is_eligible.
    """
    kind = type(layer)
    if kind not in _PLAIN and kind not in _TWINS:
        twin = next((plain for plain in _TWINS if isinstance(layer, plain)), None)
        if twin is not None:
            return f"a subclass of {twin.__name__}: its call may not be {twin.__name__}'s"
        return "tf_glp's concurrent ops run Conv2D and Dense only"
    if kind in _TWINS and not include_keras_layers:
        return "a plain Keras layer, and convert=False"
    if not layer.built:
        return "not built"
    return _unsupported(layer)


def _unsupported(layer: keras.layers.Layer) -> str | None:
    """What of a Conv2D / Dense layer's configuration the concurrent ops cannot run, or None."""
    if layer.compute_dtype not in _DTYPES:
        return f"computes in {layer.compute_dtype} (the concurrent ops take {', '.join(_DTYPES)})"
    if getattr(layer, "lora_enabled", False):
        return "LoRA enabled"
    if isinstance(layer, keras.layers.Conv2D):
        if layer.data_format != "channels_last":
            return f"data_format={layer.data_format!r} (the concurrent ops take channels_last)"
        if layer.groups != 1:
            return f"groups={layer.groups}"
        return None
    mode = getattr(layer, "quantization_mode", None)
    return f"quantized ({mode})" if mode else None


def as_glp_layer(layer: keras.layers.Layer, concurrency: int | None) -> keras.layers.Layer:
    """Sets a Conv2D / Dense layer's concurrency in place.

    A plain keras.layers.Conv2D / Dense becomes its tf_glp twin by changing
    its class: the twin adds only `concurrency` and the call path that reads
    it, so the object, its variables and every reference to it (a model that
    fit() is already training) stay the same. `concurrency=None` gives
    TensorFlow's own kernel; the class stays tf_glp's (see strip()).

    Returns:
        The layer.
    """
    kind = type(layer)
    if kind in _TWINS:
        layer.__class__ = _TWINS[kind]
    elif kind not in _PLAIN:
        raise ValueError(f"tf_glp.layers.as_glp_layer: needs a Conv2D or Dense layer, got {kind.__name__}")
    layer.concurrency = _checked(concurrency, f"tf_glp.layers.as_glp_layer (layer {layer.name!r})")
    layer.supports_jit = layer.concurrency is None  # Note [Not in XLA]
    return layer


def _rebuilt(layer: keras.layers.Layer, cls: type, **extra) -> keras.layers.Layer:
    """`cls` made from the layer's config (its concurrency replaced by
    `extra`), sharing the layer's variables."""
    config = {key: value for key, value in layer.get_config().items() if key != "concurrency"}
    twin = cls.from_config({**config, **extra})
    if layer.built:
        # Share, not copy: the twin trains the original's variables. Setting
        # them as attributes tracks them in the same order as build() would.
        compat.share_kernel(twin, layer)
        twin.bias = layer.bias
        twin.input_spec = layer.input_spec
        twin.built = True
    return twin


def strip(model: keras.Model) -> keras.Model:
    """The model with every tf_glp layer swapped back for its plain Keras
    layer, sharing the variables: save it for a machine without tf_glp.

    Example:
        >>> tf_glp.layers.strip(model).save("model.keras")  # loads with Keras alone
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"tf_glp.layers.strip: needs a functional or Sequential Keras model, got {type(model).__name__}")
    try:
        return keras.models.clone_model(model, clone_function=lambda layer: _rebuilt(layer, _PLAIN[type(layer)])
                                        if type(layer) in _PLAIN else layer)
    except ValueError as error:
        raise ValueError(f"tf_glp.layers.strip: cannot strip {type(model).__name__}: {error}") from error


def convert(
    model: keras.Model,
    concurrency: int | None | Mapping[str, int | None] = 1,
) -> keras.Model:
    """Swaps every Conv2D and Dense layer of a model for its GLP twin.

    The new model (same architecture, built by keras.models.clone_model)
    shares every variable with `model`: training either trains both. Other
    layers are shared as they are. Subclasses of Conv2D/Dense and layers
    already from tf_glp are left alone. The new model is not compiled. (A
    layer of a model that was never built has no variables yet; its twin
    then makes its own when first called.)

    Args:
        model: A functional or Sequential Keras model.
        concurrency: Lanes for every converted layer (int 1..64, or None for
            TensorFlow's kernels), or a mapping from layer name to that;
            layers missing from the mapping are not converted. Default 1.

    Returns:
        The converted model.

    Raises:
        ValueError: for a bad concurrency, or a model that is not functional
            or Sequential.

    Example:
        >>> model = keras.Sequential([keras.Input((32, 32, 3)),
        ...     keras.layers.Conv2D(32, 3), keras.layers.Flatten(),
        ...     keras.layers.Dense(10)])
        >>> fast = tf_glp.layers.convert(model, concurrency=2)
        >>> type(fast.layers[0]).__name__
        'Conv2D'
    """
    if isinstance(concurrency, Mapping):
        plan = {name: _checked(k, f"tf_glp.layers.convert (layer {name!r})") for name, k in concurrency.items()}
    else:
        default = _checked(concurrency, "tf_glp.layers.convert")
        plan = None
    if not isinstance(model, keras.Model):
        raise ValueError(f"tf_glp.layers.convert: needs a functional or Sequential Keras model, got {type(model).__name__}")

    def clone(layer: keras.layers.Layer) -> keras.layers.Layer:
        if type(layer) not in _TWINS or (plan is not None and layer.name not in plan):
            return layer
        return _rebuilt(layer, _TWINS[type(layer)], concurrency=default if plan is None else plan[layer.name])

    try:
        return keras.models.clone_model(model, clone_function=clone)
    except ValueError as error:  # e.g. a subclassed model
        raise ValueError(f"tf_glp.layers.convert: cannot convert {type(model).__name__} (needs a functional or Sequential model): {error}") from error
