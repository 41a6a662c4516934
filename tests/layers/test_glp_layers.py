"""tf_glp.layers: same results as Keras' layers, config and .keras round
trips, weights moving both ways, convert() and training equivalence."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_glp
from tf_glp.layers import Conv2D, Dense, convert

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def small_cnn(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((12, 12, 3)),
            keras.layers.Conv2D(8, 3, activation="relu", name="conv_a"),
            keras.layers.Conv2D(6, 3, strides=2, padding="same", name="conv_b"),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu", name="dense_a"),
            keras.layers.Dense(4, name="dense_b"),
        ]
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(filters=5, kernel_size=3),
        dict(filters=4, kernel_size=(2, 3), strides=(2, 1), padding="same", use_bias=False),
        dict(filters=3, kernel_size=3, dilation_rate=2, padding="same", activation="tanh"),
    ],
)
@pytest.mark.parametrize("concurrency", [None, 1, 3])
def test_conv2d_matches_keras(rng, kwargs, concurrency):
    x = tf.constant(rng.standard_normal((4, 9, 10, 2), np.float32))
    reference = keras.layers.Conv2D(**kwargs)
    layer = Conv2D(**kwargs, concurrency=concurrency)
    reference.build(x.shape)
    layer.build(x.shape)
    layer.set_weights(reference.get_weights())
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y_ref, y = reference(x), layer(x)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    for g, g_ref in zip(tape.gradient(y, [x, *layer.trainable_weights]), tape.gradient(y_ref, [x, *reference.trainable_weights])):
        np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(7, 5), (2, 3, 5)])
def test_dense_matches_keras(rng, shape):
    x = tf.constant(rng.standard_normal(shape, np.float32))
    reference = keras.layers.Dense(6, activation="relu")
    layer = Dense(6, activation="relu", concurrency=2)
    reference.build(x.shape)
    layer.build(x.shape)
    layer.set_weights(reference.get_weights())
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y_ref, y = reference(x), layer(x)
    assert y.shape == y_ref.shape
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    for g, g_ref in zip(tape.gradient(y, [x, *layer.trainable_weights]), tape.gradient(y_ref, [x, *reference.trainable_weights])):
        np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-4)


def test_layers_are_bitwise_identical_for_every_concurrency(rng):
    x = rng.standard_normal((16, 12, 12, 3)).astype(np.float32)
    base = small_cnn()
    results = set()
    for k in (1, 2, 4, 8):
        model = convert(base, concurrency=k)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        grads = tape.gradient(loss, model.trainable_weights)
        results.add(b"".join(np.asarray(g).tobytes() for g in grads) + np.asarray(loss).tobytes())
    assert len(results) == 1


def test_bad_concurrency_is_a_value_error():
    with pytest.raises(ValueError, match="got 0"):
        Conv2D(4, 3, concurrency=0)
    with pytest.raises(ValueError, match="got 100"):
        Dense(4, concurrency=100)
    with pytest.raises(ValueError, match="got -3"):
        convert(small_cnn(), concurrency=-3)
    with pytest.raises(ValueError, match="'x'"):
        convert(small_cnn(), concurrency={"conv_a": "x"})


def test_config_round_trip_and_keras_file(tmp_path, rng):
    model = keras.Sequential([keras.Input((8, 8, 2)), Conv2D(4, 3, concurrency=2), keras.layers.Flatten(), Dense(3, concurrency=3)])
    config = model.layers[0].get_config()
    assert config["concurrency"] == 2
    assert Conv2D.from_config(config).concurrency == 2
    path = os.path.join(tmp_path, "glp.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.layers[0], Conv2D) and loaded.layers[0].concurrency == 2
    assert isinstance(loaded.layers[2], Dense) and loaded.layers[2].concurrency == 3
    x = rng.standard_normal((5, 8, 8, 2)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), model(x))


def test_weights_move_between_keras_and_glp_models(tmp_path, rng):
    keras_model = small_cnn(seed=1)
    glp_model = keras.Sequential(
        [keras.Input((12, 12, 3)), Conv2D(8, 3, activation="relu", concurrency=2), Conv2D(6, 3, strides=2, padding="same", concurrency=2),
         keras.layers.Flatten(), Dense(16, activation="relu", concurrency=2), Dense(4, concurrency=2)]
    )
    path = os.path.join(tmp_path, "keras.weights.h5")
    keras_model.save_weights(path)
    glp_model.load_weights(path)
    x = rng.standard_normal((3, 12, 12, 3)).astype(np.float32)
    np.testing.assert_allclose(glp_model(x), keras_model(x), rtol=1e-5, atol=1e-5)
    back = small_cnn(seed=2)
    glp_path = os.path.join(tmp_path, "glp.weights.h5")
    glp_model.save_weights(glp_path)
    back.load_weights(glp_path)
    for a, b in zip(back.get_weights(), keras_model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_convert_sequential_shares_variables(rng):
    model = small_cnn()
    converted = convert(model, concurrency=2)
    kinds = [type(layer) for layer in converted.layers]
    assert kinds[0] is Conv2D and kinds[1] is Conv2D and kinds[3] is Dense and kinds[4] is Dense
    assert all(layer.concurrency == 2 for layer in converted.layers if isinstance(layer, (Conv2D, Dense)))
    for a, b in zip(converted.trainable_weights, model.trainable_weights):
        assert a is b
    x = rng.standard_normal((4, 12, 12, 3)).astype(np.float32)
    np.testing.assert_allclose(converted(x), model(x), rtol=1e-5, atol=1e-5)
    model.layers[-1].bias.assign(np.full((4,), 7.0, np.float32))  # shared: seen by both
    np.testing.assert_allclose(converted(x), model(x), rtol=1e-5, atol=1e-5)


def test_convert_functional_with_a_plan(rng):
    inputs = keras.Input((10, 10, 2))
    a = keras.layers.Conv2D(4, 3, padding="same", name="left")(inputs)
    b = keras.layers.Conv2D(4, 1, name="right")(inputs)
    merged = keras.layers.Add()([a, b])
    outputs = keras.layers.Dense(3, name="head")(keras.layers.GlobalAveragePooling2D()(merged))
    model = keras.Model(inputs, outputs)
    converted = convert(model, concurrency={"left": 2, "head": 4})
    by_name = {layer.name: layer for layer in converted.layers}
    assert type(by_name["left"]) is Conv2D and by_name["left"].concurrency == 2
    assert type(by_name["head"]) is Dense and by_name["head"].concurrency == 4
    assert type(by_name["right"]) is keras.layers.Conv2D
    x = rng.standard_normal((3, 10, 10, 2)).astype(np.float32)
    np.testing.assert_allclose(converted(x), model(x), rtol=1e-5, atol=1e-5)


def test_convert_refuses_non_models():
    with pytest.raises(ValueError, match="Dense"):
        convert(keras.layers.Dense(3))


def train(model, x, y):
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return history.history["loss"], [w.numpy() for w in model.trainable_weights]


def test_converted_model_trains_like_the_original(rng):
    x = rng.standard_normal((64, 12, 12, 3)).astype(np.float32)
    y = rng.standard_normal((64, 4)).astype(np.float32)
    loss_ref, weights_ref = train(small_cnn(seed=3), x, y)
    loss_glp, weights_glp = train(convert(small_cnn(seed=3), concurrency=2), x, y)
    np.testing.assert_allclose(loss_glp, loss_ref, rtol=1e-4)
    for a, b in zip(weights_glp, weights_ref):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


def test_layers_use_the_fallback_without_the_native_library(rng, native_mode):
    x = rng.standard_normal((4, 12, 12, 3)).astype(np.float32)
    model = convert(small_cnn(), concurrency=3)
    native = model(x).numpy()
    native_mode("0")
    assert not tf_glp.native_available()
    np.testing.assert_allclose(model(x), native, rtol=1e-5, atol=1e-5)


def test_ineligible_layers_run_the_keras_kernel(rng):
    x = rng.standard_normal((2, 6, 6, 2))
    reference = keras.layers.Conv2D(3, 3, dtype="float64")
    layer = Conv2D(3, 3, dtype="float64", concurrency=2)
    reference.build(x.shape)
    layer.build(x.shape)
    layer.set_weights(reference.get_weights())
    assert not layer._runs_concurrently(tf.constant(x))
    np.testing.assert_array_equal(layer(x), reference(x))
    first = Conv2D(3, 3, data_format="channels_first", concurrency=2)
    assert not first._runs_concurrently(tf.zeros([1, 2, 6, 6]))


@pytest.fixture
def mixed_policy(request):
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(request.param)
    yield request.param
    keras.config.set_dtype_policy(previous)


# Tolerances against Keras' own layers under the same policy. Both compute in
# float32 and round once to 16 bits; the forward outputs were seen bitwise
# equal, but the float32 sums run in different orders, so a result can land
# one 16-bit ulp apart (float16: 2^-11 relative, bfloat16: 2^-8), and after
# two epochs such differences compound (seen: weights 1.5e-4 apart in
# float16, 2.5e-3 in bfloat16; losses 2e-5 and 2e-4 relative).
_MIXED_RTOL = {"mixed_float16": 2e-3, "mixed_bfloat16": 1e-2}


@pytest.mark.parametrize("mixed_policy", ["mixed_float16", "mixed_bfloat16"], indirect=True)
def test_mixed_precision_layers_run_concurrently(rng, mixed_policy):
    x = rng.standard_normal((64, 12, 12, 3)).astype(np.float32)
    y = rng.standard_normal((64, 4)).astype(np.float32)
    compute = mixed_policy.split("_")[1]
    models = {k: convert(small_cnn(seed=3), concurrency=k) for k in (1, 3)}
    for model in models.values():
        assert all(layer._runs_concurrently(tf.zeros([1, *layer.input.shape[1:]], compute))
                   for layer in model.layers if isinstance(layer, (Conv2D, Dense)))
    outputs = {k: model(x[:8]) for k, model in models.items()}
    assert outputs[1].dtype == compute
    reference = small_cnn(seed=3)
    np.testing.assert_array_equal(outputs[1].numpy(), outputs[3].numpy())  # bitwise for every k
    np.testing.assert_allclose(np.float32(outputs[1]), np.float32(reference(x[:8])),
                               rtol=_MIXED_RTOL[mixed_policy], atol=_MIXED_RTOL[mixed_policy])
    loss_ref, weights_ref = train(reference, x, y)
    trained = {k: train(model, x, y) for k, model in models.items()}
    for a, b in zip(trained[1][1], trained[3][1]):
        np.testing.assert_array_equal(a, b)  # training too: bitwise for every k
    np.testing.assert_allclose(trained[1][0], loss_ref, rtol=_MIXED_RTOL[mixed_policy])
    for a, b in zip(trained[1][1], weights_ref):
        np.testing.assert_allclose(a, b, rtol=_MIXED_RTOL[mixed_policy], atol=_MIXED_RTOL[mixed_policy])
