"""tf_glp.Strategy with the models people train: Dropout, BatchNormalization,
augmentation layers, EMA, gradient accumulation, mixed precision, plain
tf.Variables, and true metrics from evaluate() — in both update modes,
against MirroredStrategy (ReductionToOneDevice) and against one device."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_glp

DEVICES = ["/cpu:0", "/cpu:1"]
MODES = ["host", "replicas"]
L = keras.layers


def mirrored():
    return tf.distribute.MirroredStrategy(DEVICES, cross_device_ops=tf.distribute.ReductionToOneDevice())


def glp(update):
    return tf_glp.Strategy(DEVICES, update=update, chunking="none")


def _data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 12)).astype(np.float32)
    y = (x[:, :3].argmax(1) + (x[:, 3] > 1)).astype(np.int64) % 3
    return x, y


ROWS = {
    # row: (hidden layers, optimizer, policy)
    "dropout": (lambda: [L.Dense(16, activation="relu"), L.Dropout(0.3)], lambda: keras.optimizers.Adam(1e-2), None),
    "batchnorm": (lambda: [L.Dense(16), L.BatchNormalization(), L.Activation("relu")],
                  lambda: keras.optimizers.SGD(0.05, momentum=0.9), None),
    "augmentation": (lambda: [L.GaussianNoise(0.2), L.Dense(16, activation="relu"), L.GaussianDropout(0.2)],
                     lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.01), None),
    "ema": (lambda: [L.Dense(16, activation="relu")], lambda: keras.optimizers.Adam(1e-2, use_ema=True), None),
    "mixed_float16": (lambda: [L.Dense(16), L.BatchNormalization(), L.Activation("relu"), L.Dropout(0.2)],
                      lambda: keras.optimizers.Adam(1e-2), "mixed_float16"),
    "mixed_bfloat16": (lambda: [L.Dense(16), L.BatchNormalization(), L.Activation("relu")],
                       lambda: keras.optimizers.Adam(1e-2), "mixed_bfloat16"),
    "layernorm_clipnorm": (lambda: [L.Dense(16), L.LayerNormalization(), L.Activation("relu")],
                           lambda: keras.optimizers.Adam(1e-2, clipnorm=0.5), None),
}


CLIPPED_ROWS = {"layernorm_clipnorm"}


def _small_mlp(logits_dtype=None):
    return keras.Sequential([keras.Input((12,)), L.Dense(16, activation="relu"), L.Dense(3, dtype=logits_dtype)])


def _build(strategy, row):
    layers, optimizer, _ = ROWS[row]
    keras.utils.set_random_seed(7)
    with strategy.scope():
        # float32 logits, as Keras advises under mixed precision
        model = keras.Sequential([keras.Input((12,)), *layers(), L.Dense(3, dtype="float32")])
        model.compile(optimizer=optimizer(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2)])
    return model


def _train(strategy, row, epochs=2):
    policy = ROWS[row][2]
    if policy:
        keras.mixed_precision.set_global_policy(policy)
    try:
        x, y = _data()
        model = _build(strategy, row)
        history = model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0).history
        evaluation = model.evaluate(x, y, batch_size=32, verbose=0)
        state = {
            "weights": [w.numpy() for w in model.trainable_weights],
            "non_trainable": [w.numpy() for w in model.non_trainable_weights],
            "optimizer": [v.numpy() for v in model.optimizer.variables],
        }
        return history, evaluation, state, model
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _assert_same(ours, reference):
    (h1, e1, s1, _), (h2, e2, s2, _) = ours, reference
    for key in s2:
        assert len(s1[key]) == len(s2[key]), key
        for a, b in zip(s1[key], s2[key]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=key)
    for key in h2:
        np.testing.assert_allclose(h1[key], h2[key], rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(e1, e2, rtol=1e-5)


def _reloaded_predictions(model, path):
    """What `model`, saved and loaded on one device, predicts."""
    model.save(path)
    return keras.models.load_model(path).predict(_data(64, seed=5)[0], verbose=0)


_REFERENCES: dict = {}


def _reference(row, tmp_path):
    """The row trained once under stock MirroredStrategy (one device for the
    clipped rows), and its reloaded model's predictions."""
    if row not in _REFERENCES:
        reference = _train(tf.distribute.get_strategy() if row in CLIPPED_ROWS else mirrored(), row)
        _REFERENCES[row] = reference, _reloaded_predictions(reference[3], tmp_path / "reference.keras")
    return _REFERENCES[row]


@pytest.mark.parametrize("update", MODES)
@pytest.mark.parametrize("row", sorted(ROWS))
def test_trains_like_mirrored_strategy(row, update, fused_calls, tmp_path):
    # Clipping: tf_glp clips the summed gradient, as one device does; stock
    # MirroredStrategy clips each replica's share before the sum.
    reference, reference_predictions = _reference(row, tmp_path)
    ours = _train(glp(update), row)
    _assert_same(ours, reference)
    # The fused host update runs for the trainable variables under update="host".
    assert bool(fused_calls) == (update == "host")
    # Saved, loaded on one device and used there: the same model.
    np.testing.assert_allclose(_reloaded_predictions(ours[3], tmp_path / "ours.keras"), reference_predictions,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("update", MODES)
def test_evaluate_reports_the_metrics_of_the_weights(update):
    # Weights trained without a strategy, copied into the same model under
    # the strategy: evaluate() must give the single-device numbers.
    x, y = _data(512, seed=3)
    single = _build(tf.distribute.get_strategy(), "batchnorm")
    single.fit(x, y, batch_size=64, epochs=2, verbose=0)
    expected = single.evaluate(x, y, batch_size=64, verbose=0)
    for strategy in (glp(update), mirrored()):
        model = _build(strategy, "batchnorm")
        model.set_weights(single.get_weights())
        got = model.evaluate(x, y, batch_size=64, verbose=0)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
        # and the accuracy is that of the weights' own predictions
        logs = model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
        assert logs["accuracy"] == pytest.approx(float(np.mean(single.predict(x, verbose=0).argmax(1) == y)))


@pytest.mark.parametrize("update", MODES)
def test_gradient_accumulation_matches_one_device(update):
    def train(strategy):
        x, y = _data()
        keras.utils.set_random_seed(7)
        with strategy.scope():
            model = _small_mlp()
            model.compile(optimizer=keras.optimizers.Adam(1e-2, gradient_accumulation_steps=3, global_clipnorm=1.0),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
        return history, model.evaluate(x, y, batch_size=32, verbose=0), model

    reference = train(tf.distribute.get_strategy())
    ours = train(glp(update))
    for a, b in zip(ours[2].weights, reference[2].weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours[0]["loss"], reference[0]["loss"], rtol=1e-5)
    np.testing.assert_allclose(ours[1], reference[1], rtol=1e-5)
    # 16 steps over 2 epochs, an update every 3rd step: Keras counts 5 updates
    assert int(ours[2].optimizer.iterations.numpy()) == int(reference[2].optimizer.iterations.numpy()) == 5


@pytest.mark.parametrize("update", MODES)
def test_ema_overwrite_frequency_matches_one_device(update):
    # Keras' own implementation fails under every tf.distribute strategy.
    x, y = _data()

    def train(strategy):
        keras.utils.set_random_seed(7)
        with strategy.scope():
            model = _small_mlp()
            model.compile(optimizer=keras.optimizers.Adam(1e-2, use_ema=True, ema_overwrite_frequency=3),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
        return [w.numpy() for w in model.weights]

    for a, b in zip(train(glp(update)), train(tf.distribute.get_strategy())):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("update", MODES)
def test_regularizer_loss_and_weights_match_one_device(update):
    # Keras' test_correctness_with_fit_and_regularizer, with tf_glp.Strategy.
    x, y = np.ones((12, 1), np.float32), np.zeros((12, 1), np.float32)

    def train(strategy):
        with strategy.scope():
            inputs = keras.Input((1,))
            layer = L.Dense(1, use_bias=False, kernel_initializer=keras.initializers.Constant(1),
                            kernel_regularizer=keras.regularizers.L1L2(l1=0.01, l2=0.01))
            model = keras.Model(inputs, layer(inputs))
            model.compile(loss="mse", optimizer="sgd")
        history = model.fit(x, y, batch_size=12, epochs=1, verbose=0).history
        return history["loss"], layer.kernel.numpy()

    loss, kernel = train(glp(update))
    expected_loss, expected_kernel = train(tf.distribute.get_strategy())
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
    np.testing.assert_allclose(kernel, expected_kernel, rtol=1e-6)


@pytest.mark.parametrize("update", MODES)
def test_swap_ema_weights_callback(update):
    x, y = _data()

    def train(strategy):
        keras.utils.set_random_seed(7)
        with strategy.scope():
            model = _small_mlp()
            model.compile(optimizer=keras.optimizers.SGD(0.1, use_ema=True),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, validation_data=(x, y),
                            callbacks=[keras.callbacks.SwapEMAWeights(swap_on_epoch=True)]).history
        return history, [w.numpy() for w in model.weights]

    reference = train(mirrored())
    ours = train(glp(update))
    np.testing.assert_allclose(ours[0]["val_loss"], reference[0]["val_loss"], rtol=1e-5)
    for a, b in zip(ours[1], reference[1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_forced_overflow_skips_the_step_and_lowers_the_scale():
    # A batch of huge inputs makes every float16 gradient overflow: the step
    # is skipped (weights unchanged) and the loss scale halves, as Keras'
    # LossScaleOptimizer does without a strategy.
    x, y = _data(64)
    x[32:] *= 6e4

    def train(strategy):
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            keras.utils.set_random_seed(7)
            with strategy.scope():
                model = _small_mlp()
                model.compile(optimizer=keras.optimizers.SGD(0.05),
                              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.fit(x[:32], y[:32], batch_size=32, epochs=1, shuffle=False, verbose=0)
            before = [w.numpy() for w in model.trainable_weights]
            scale = float(model.optimizer.dynamic_scale.numpy())
            model.fit(x[32:], y[32:], batch_size=32, epochs=1, shuffle=False, verbose=0)
            after = [w.numpy() for w in model.trainable_weights]
            return before, after, scale, float(model.optimizer.dynamic_scale.numpy())
        finally:
            keras.mixed_precision.set_global_policy("float32")

    for strategy in (glp("host"), glp("replicas"), tf.distribute.get_strategy()):
        before, after, scale, new_scale = train(strategy)
        assert new_scale == scale / 2
        for a, b in zip(before, after):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("update", MODES)
def test_plain_tf_variables_with_a_keras_optimizer(update):
    def step(strategy, momentum):
        with strategy.scope():
            variable = tf.Variable([1.0, 2.0, 3.0, 4.0])
            optimizer = keras.optimizers.SGD(0.5, momentum=momentum)
            grads = tf.constant([0.1, 0.2, 0.3, 0.4])

            @tf.function
            def apply():
                strategy.run(lambda: optimizer.apply_gradients([(grads, variable)]))

            apply()
            apply()
        return variable.numpy()

    for momentum in (0.0, 0.9):
        ours = step(glp(update), momentum)
        # Two replicas sum two identical gradients (as MirroredStrategy does).
        np.testing.assert_allclose(ours, step(mirrored(), momentum), rtol=1e-6)
        assert not np.allclose(ours, [1.0, 2.0, 3.0, 4.0])


def test_seed_generators_start_equal_on_every_replica():
    strategy = glp("host")
    with strategy.scope():
        seed_generator = keras.random.SeedGenerator(42)
        states = strategy.run(lambda: seed_generator.state.value).values
    assert len(states) == 2
    for state in states:
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(state), (42, 0))


def test_variable_homes_under_update_host():
    """Each kind of Keras variable gets the home host_copies.py promises:
    the model's as under MirroredStrategy, every optimizer variable one
    plain host variable. If Keras or TensorFlow change how they create
    variables, this fails first."""
    strategy = glp("host")
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), L.Dense(3), L.BatchNormalization(), L.Dropout(0.5)])
            model.compile(optimizer=keras.optimizers.Nadam(use_ema=True, gradient_accumulation_steps=2),
                          loss="mse", metrics=["mae"])
            model.optimizer.build(model.trainable_variables)
            seed_generator = keras.random.SeedGenerator(1)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.evaluate(np.zeros((4, 4)), np.zeros((4, 3)), verbose=0)  # builds the metrics

    def kind(variable):
        return type(variable.value).__name__

    for variable in model.variables + [seed_generator.state]:
        assert kind(variable) == "MirroredVariable", variable.path
    optimizer = model.optimizer  # the LossScaleOptimizer
    assert len(optimizer.variables) > 10
    for variable in optimizer.variables:  # its own, the inner optimizer's (u_product too)
        assert isinstance(variable.value, tf.Variable), variable.path
        assert not isinstance(variable.value, tf.distribute.DistributedValues), variable.path
        assert variable.value.device.endswith("CPU:0"), (variable.path, variable.value.device)
    for metric in model.metrics:
        for variable in metric.variables:
            assert kind(variable) == "SyncOnReadVariable", variable.path


def test_small_resnet_on_digits_reaches_single_device_accuracy():
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images[..., None] / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    x_train, y_train, x_test, y_test = x[:1280], y[:1280], x[1280:], y[1280:]

    def build(strategy):
        keras.utils.set_random_seed(11)
        with strategy.scope():
            inputs = keras.Input((8, 8, 1))
            h = L.RandomTranslation(0.1, 0.1)(inputs)
            h = L.Conv2D(16, 3, padding="same", use_bias=False)(h)
            h = L.Activation("relu")(L.BatchNormalization(momentum=0.9)(h))
            skip = h
            h = L.Conv2D(16, 3, padding="same", use_bias=False)(h)
            h = L.Activation("relu")(L.BatchNormalization(momentum=0.9)(h))
            h = L.Conv2D(16, 3, padding="same", use_bias=False)(h)
            h = L.Activation("relu")(L.Add()([L.BatchNormalization(momentum=0.9)(h), skip]))
            h = L.Dropout(0.2)(L.GlobalAveragePooling2D()(h))
            model = keras.Model(inputs, L.Dense(10)(h))
            model.compile(optimizer=keras.optimizers.Adam(3e-3),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model

    accuracy = {}
    for name, strategy in (("single", tf.distribute.get_strategy()), ("glp", tf_glp.Strategy(DEVICES, update="host"))):
        model = build(strategy)
        model.fit(x_train, y_train, batch_size=64, epochs=12, verbose=0)
        accuracy[name] = model.evaluate(x_test, y_test, batch_size=64, verbose=0)[1]
        # evaluate() says what the weights really score
        true = float(np.mean(model.predict(x_test, batch_size=64, verbose=0).argmax(1) == y_test))
        assert accuracy[name] == pytest.approx(true, abs=1e-6)
    assert accuracy["single"] > 0.9
    assert accuracy["glp"] >= accuracy["single"] - 0.03, accuracy


@pytest.mark.parametrize("compression", ["bf16", "fp16"])
@pytest.mark.parametrize("update", MODES)
def test_compression_applies_to_gradients_only(update, compression):
    x, y = _data()
    plain = _build(glp(update), "batchnorm")
    compressed = _build(tf_glp.Strategy(DEVICES, update=update, chunking="none", compression=compression),
                        "batchnorm")
    history = compressed.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
    reference = plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
    for key in reference:
        assert np.all(np.isfinite(history[key])), key
        np.testing.assert_allclose(history[key], reference[key], rtol=3e-2, atol=2e-2, err_msg=key)
    # The gradients were compressed: the weights differ by their rounding.
    assert not all(np.array_equal(a, b) for a, b in zip(plain.get_weights(), compressed.get_weights()))
    # Same weights in both models: evaluate() must agree exactly. (set_weights
    # on both: batch statistics are per replica, as under MirroredStrategy,
    # and set_weights makes every replica's copy the same.)
    weights = plain.get_weights()
    plain.set_weights(weights)
    compressed.set_weights(weights)
    assert compressed.evaluate(x, y, batch_size=32, verbose=0) == plain.evaluate(x, y, batch_size=32, verbose=0)


@pytest.mark.parametrize("update", MODES)
def test_fp16_compression_overflow_is_a_clear_error(update):
    x, y = _data(64)
    y_far = np.full((64, 1), 1e6, np.float32)  # a regression target far away: huge gradients
    with glp_compressed(update).scope():
        model = keras.Sequential([keras.Input((12,)), L.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(1e-9), loss="mse")
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not fit in float16"):
        model.fit(x, y_far, batch_size=32, epochs=1, verbose=0)


def test_fp16_compression_overflow_under_loss_scaling_skips_the_step():
    # mixed_float16 under update="host": the overflow is one more non-finite
    # step for dynamic loss scaling, which skips it and halves the scale.
    x, _ = _data(32)
    y_far = np.full((32, 1), 3e3, np.float32)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with glp_compressed("host").scope():
            model = keras.Sequential([keras.Input((12,)), L.Dense(1, dtype="float32")])
            model.compile(optimizer=keras.optimizers.SGD(1e-9), loss="mse")
        before = [w.numpy() for w in model.weights]
        model.fit(x, y_far, batch_size=32, epochs=1, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert float(model.optimizer.dynamic_scale.numpy()) == 2.0**14
    for a, b in zip(before, model.weights):
        np.testing.assert_array_equal(a, b.numpy())


@pytest.mark.parametrize("compression", ["bf16", "fp16"])
def test_loss_scaled_host_update_with_compression_trains_like_without(compression, monkeypatch):
    # Finite steps: the gradients cross to the host in 16 bits once (scaled,
    # so small ones survive fp16), are summed and unscaled in float32.
    x, y = _data()

    def train(strategy):
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            keras.utils.set_random_seed(7)
            with strategy.scope():
                model = _small_mlp(logits_dtype="float32")
                model.compile(optimizer=keras.optimizers.SGD(0.05),
                              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
            return [w.numpy() for w in model.weights], float(model.optimizer.dynamic_scale.numpy())
        finally:
            keras.mixed_precision.set_global_policy("float32")

    reference, reference_scale = train(glp("host"))
    from tf_glp.strategy import compression as compression_lib

    compressed = []
    original = compression_lib.compress
    monkeypatch.setattr(compression_lib, "compress",
                        lambda parts, *a, **k: compressed.append(len(parts)) or original(parts, *a, **k))
    ours, scale = train(tf_glp.Strategy(DEVICES, update="host", chunking="none", compression=compression))
    # Each gradient was compressed once, as its two replica parts; never the host sum again.
    assert compressed and set(compressed) == {2}
    assert scale == reference_scale  # no step skipped
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-3)


def glp_compressed(update):
    return tf_glp.Strategy(DEVICES, update=update, chunking="none", compression="fp16")


def test_overflow_on_one_replica_skips_the_step_under_update_host():
    # Only the second replica's half of the batch overflows. The host checks
    # the summed gradients, so the step is skipped (Keras' LossScaleOptimizer
    # under MirroredStrategy looks at the first replica's gradients only).
    x, y = _data(32)
    x[16:] *= 6e4
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with glp("host").scope():
            model = _small_mlp(logits_dtype="float32")
            model.compile(optimizer=keras.optimizers.SGD(0.05),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        before = [w.numpy() for w in model.weights]
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert float(model.optimizer.dynamic_scale.numpy()) == 2.0**14
    for a, b in zip(before, model.weights):
        np.testing.assert_array_equal(a, b.numpy())
