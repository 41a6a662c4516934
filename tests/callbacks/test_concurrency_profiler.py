"""ConcurrencyProfiler in existing scripts: it changes nothing training
computes, reuses matching plans, re-profiles others (never crashing on a
broken file), works for Sequential and functional models with and without
tf_glp.Strategy, writes TensorBoard summaries, and strips for deployment."""

import json
import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_glp
from tf_glp.callbacks import ConcurrencyProfiler
from tf_glp.profiling import choice as choice_rule
from tf_glp.profiling import plan as plan_lib
from tf_glp.profiling import profiler

L = keras.layers


def _data(n=128):
    rng = np.random.default_rng(0)
    return rng.random((n, 8, 8, 1), dtype=np.float32), rng.integers(0, 10, n)


def _sequential():
    return keras.Sequential([keras.Input((8, 8, 1)), L.Conv2D(4, 3, activation="relu", name="conv"),
                             L.Dropout(0.3), L.Flatten(), L.Dense(16, activation="relu", name="hidden"),
                             L.Dense(10, name="logits")])


def _functional():
    inputs = keras.Input((8, 8, 1))
    a = L.Conv2D(4, 3, padding="same", name="conv_a")(inputs)
    b = L.Conv2D(4, 1, name="conv_b")(inputs)
    h = L.Flatten()(L.Add()([a, b]))
    return keras.Model(inputs, L.Dense(10, name="logits")(L.Dropout(0.2)(h)))


def _train(build, callbacks, strategy=None, epochs=2):
    x, y = _data()
    keras.utils.set_random_seed(3)
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        model = build()
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=32, epochs=epochs, verbose=0, callbacks=callbacks)
    return model, history.history["loss"]


def _forced(monkeypatch, lanes):
    """Makes every layer's choice `lanes`, whatever the timings say (the
    invariance tests must exercise the concurrent kernels)."""
    monkeypatch.setattr(choice_rule, "choose", lambda candidates: (lanes, "forced by the test"))


@pytest.mark.parametrize("build", [_sequential, _functional])
def test_changes_nothing_training_computes(build, tmp_path, monkeypatch):
    _forced(monkeypatch, 2)
    path = str(tmp_path / "plan.json")
    profiled, profiled_loss = _train(build, [ConcurrencyProfiler(trials=1, plan_path=path, verbose=0, batch_size=32)])
    assert {getattr(layer, "concurrency", "plain") for layer in profiler.eligible_layers(profiled, True)} == {2}
    calls = []
    monkeypatch.setattr(profiler, "profile_layers", lambda *a, **k: calls.append(1))
    reused_callback = ConcurrencyProfiler(trials=1, plan_path=path, verbose=0, batch_size=32)
    reused, reused_loss = _train(build, [reused_callback])
    assert reused_callback.reused and not calls
    # Bitwise: profiling touched no weight, optimizer state, RNG (Dropout) or counter.
    assert profiled_loss == reused_loss
    for a, b in zip(profiled.weights + profiled.optimizer.variables, reused.weights + reused.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # And plain Keras, to the concurrent layers' tolerance.
    plain, plain_loss = _train(build, [])
    np.testing.assert_allclose(profiled_loss, plain_loss, rtol=1e-5)
    for a, b in zip(profiled.weights, plain.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_plan_file_records_every_candidate_within_the_cap(tmp_path):
    path = str(tmp_path / "plan.json")
    callback = ConcurrencyProfiler(trials=3, plan_path=path, verbose=0, batch_size=32)
    _train(_sequential, [callback], epochs=1)
    plan = plan_lib.read(path)
    assert plan.header["batch_size"] == 32 and plan.header["tensorflow"] == tf.__version__
    assert [layer.name for layer in plan.layers] == ["conv", "hidden", "logits"]
    for layer in plan.layers:
        assert layer.candidates[0].concurrency is None  # native always timed
        assert all(c.concurrency is None or c.concurrency <= layer.cap for c in layer.candidates)
        chosen, native = layer.candidate(layer.choice), layer.candidate(None)
        if layer.choice is not None:  # a lane count only when it measured faster than native
            assert chosen.median_ms < native.median_ms


def test_mismatched_and_broken_plans_are_reprofiled(tmp_path):
    path = str(tmp_path / "plan.json")
    _train(_sequential, [ConcurrencyProfiler(trials=1, plan_path=path, verbose=0, batch_size=32)], epochs=1)
    for breakage, message in ((lambda d: d["header"].update(batch_size=64), "batch_size"),
                              (lambda d: d["header"].update(device="NVIDIA H200"), "device"),
                              (lambda d: d["header"].update(tensorflow="2.20.0"), "tensorflow"),
                              (lambda d: d["header"].pop("min_speedup"), "min_speedup"),  # a plan of an older rule
                              (lambda d: d["layers"][0].update(input_shape=[32, 9, 9, 1]), "input shapes"),
                              (lambda d: d["layers"][1]["config"].update(units=99), "configurations"),
                              (lambda d: d["layers"][0].update(choice="fast"), "not a tf_glp plan"),
                              (lambda d: d["layers"][0].pop("candidates"), "not a tf_glp plan"),
                              (None, "not valid JSON")):
        data = json.load(open(path))
        if breakage is None:
            open(path, "w").write(json.dumps(data)[:40])
        else:
            breakage(data)
            json.dump(data, open(path, "w"))
        callback = ConcurrencyProfiler(trials=1, plan_path=path, verbose=0, batch_size=32)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _train(_sequential, [callback], epochs=1)
        assert not callback.reused
        assert any(message in str(w.message) for w in caught), (message, [str(w.message) for w in caught])
        assert plan_lib.read(path).header["batch_size"] == 32  # rewritten, whole


@pytest.mark.parametrize("update", ["host", "replicas"])
def test_with_tf_glp_strategy(update, tmp_path, monkeypatch):
    _forced(monkeypatch, 2)
    strategy = tf_glp.Strategy(["/cpu:0", "/cpu:1"], update=update, chunking="none")
    path = str(tmp_path / "plan.json")
    callback = ConcurrencyProfiler(trials=1, plan_path=path, verbose=0, batch_size=32)
    model, loss = _train(_functional, [callback], strategy=strategy)
    assert callback.plan.layers[0].input_shape[0] == 16  # each replica's share
    assert "chunks in use" in plan_lib.table(callback.plan)  # the Strategy's decision, in the same table
    assert plan_lib.read(path).notes == [strategy.explain()]  # and in the plan file
    reference, reference_loss = _train(_functional, [], strategy=tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()))
    np.testing.assert_allclose(loss, reference_loss, rtol=1e-5)


def test_hand_converted_model_and_convert_false(monkeypatch):
    _forced(monkeypatch, 2)
    x, y = _data()
    model = _sequential()
    hand = tf_glp.layers.convert(model, concurrency={"hidden": 1})
    hand.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = ConcurrencyProfiler(trials=1, plan_path=None, verbose=0, convert=False)
    hand.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[callback])
    assert [layer.name for layer in callback.plan.layers] == ["hidden"]  # only the tf_glp layer
    assert hand.get_layer("hidden").concurrency == 2
    assert type(hand.get_layer("conv")) is keras.layers.Conv2D


def test_tensorboard_summaries(tmp_path):
    log_dir = str(tmp_path / "logs")
    _train(_sequential, [ConcurrencyProfiler(trials=1, plan_path=None, verbose=0, log_dir=log_dir)], epochs=1)
    tags = {}
    for name in os.listdir(log_dir):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(log_dir, name)):
            for value in event.summary.value:
                tags[value.tag] = value
    assert {"tf_glp/concurrency_plan", "tf_glp/concurrency_chart", "tf_glp/concurrency/conv",
            "tf_glp/concurrency/hidden", "tf_glp/concurrency/logits"} <= set(tags)
    text = tf.make_ndarray(tags["tf_glp/concurrency_plan"].tensor).item().decode()
    assert "native ms" in text and "conv" in text


def test_profile_leaves_the_model_alone_and_strip_deploys(tmp_path):
    x, _ = _data(32)
    model = _sequential()
    plan = tf_glp.profile(model, x, trials=1)
    assert [layer.name for layer in plan.layers] == ["conv", "hidden", "logits"]
    assert all(type(layer).__module__.startswith("keras") for layer in model.layers)
    # Converted in place, then stripped: plain Keras layers, same variables.
    for layer in profiler.eligible_layers(model, True):
        tf_glp.layers.as_glp_layer(layer, 2)
    assert type(model.get_layer("conv")) is tf_glp.layers.Conv2D
    plain = tf_glp.layers.strip(model)
    assert plain.get_layer("conv").kernel is model.get_layer("conv").kernel
    path = str(tmp_path / "plain.keras")
    plain.save(path)
    config = json.dumps(plain.get_config())
    assert "tf_glp" not in config and "concurrency" not in config
    np.testing.assert_allclose(keras.models.load_model(path).predict(x, verbose=0), model.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)


def test_strip_path_at_train_end(tmp_path):
    path = str(tmp_path / "deploy.keras")
    _train(_sequential, [ConcurrencyProfiler(trials=1, plan_path=None, verbose=0, strip_path=path)], epochs=1)
    assert "tf_glp" not in json.dumps(keras.models.load_model(path).get_config())


def test_bad_arguments():
    with pytest.raises(ValueError, match="candidates must be 'auto' or a list"):
        ConcurrencyProfiler(candidates=[0])
    with pytest.raises(ValueError, match="trials must be >= 1, got 0"):
        ConcurrencyProfiler(trials=0)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ConcurrencyProfiler(batch_size=0)


def test_native_choices_leave_plain_layers_plain_whether_profiled_or_reused(tmp_path, monkeypatch):
    _forced(monkeypatch, None)
    path = str(tmp_path / "plan.json")
    for _ in range(2):  # profiled, then reused
        model, _ = _train(_sequential, [ConcurrencyProfiler(trials=1, plan_path=path, verbose=0)], epochs=1)
        assert all(type(layer).__module__.startswith("keras") for layer in model.layers)
        assert "tf_glp" not in json.dumps(model.get_config())


def test_subclassed_model_layers_are_skipped_with_a_warning():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.flatten = L.Flatten()
            self.dense = L.Dense(10)

        def call(self, x):
            return self.dense(self.flatten(x))

    x, y = _data(64)
    model = Subclassed()
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model(x[:1])
    with pytest.warns(UserWarning, match="not profiling dense.*input shapes are unknown"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0,
                  callbacks=[ConcurrencyProfiler(trials=1, plan_path=None, verbose=0)])


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_layers_are_profiled_in_their_compute_dtype(policy, tmp_path, monkeypatch):
    _forced(monkeypatch, 2)
    path = str(tmp_path / "plan.json")
    keras.mixed_precision.set_global_policy(policy)
    try:
        profiled, profiled_loss = _train(_sequential, [ConcurrencyProfiler(trials=1, plan_path=path, verbose=0)])
        reused, reused_loss = _train(_sequential, [ConcurrencyProfiler(trials=1, plan_path=path, verbose=0)])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    plan = plan_lib.read(path)
    assert {layer.dtype for layer in plan.layers} == {policy.removeprefix("mixed_")}
    assert all(c.median_ms > 0 for layer in plan.layers for c in layer.candidates)
    assert profiled_loss == reused_loss and np.all(np.isfinite(profiled_loss))
    for a, b in zip(profiled.weights, reused.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("user_setting", [None, True, False])
def test_profiling_leaves_the_graph_optimizer_setting_as_it_was(user_setting):
    # Profiling turns Grappler off while it runs (timing.without_graph_optimizer).
    before = tf.config.optimizer.get_experimental_options()
    if user_setting is not None:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": user_setting})
    try:
        tf_glp.profile(_sequential(), _data(32)[0], trials=1)
        assert tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False) == bool(user_setting)
    finally:
        tf.config.optimizer.set_experimental_options(
            {"disable_meta_optimizer": before.get("disable_meta_optimizer", False)})


def _what_people_train():
    """Augmentation, a strided bias-free convolution, batch normalization, a
    dilated convolution, a Dense on a sequence (rank-3 input), dropout."""
    inputs = keras.Input((12, 12, 3))
    x = L.RandomFlip("horizontal", seed=1)(inputs)
    x = L.Conv2D(8, 3, strides=2, padding="same", use_bias=False, name="strided")(x)
    x = L.Activation("relu")(L.BatchNormalization()(x))
    x = L.Conv2D(8, 3, dilation_rate=2, padding="same", name="dilated")(x)
    x = L.Dense(16, activation="gelu", name="per_position")(L.Reshape((36, 8))(x))
    x = L.Dropout(0.2, seed=2)(L.GlobalAveragePooling1D()(x))
    return keras.Model(inputs, L.Dense(5, name="logits")(x))


def _train_on_dataset(callbacks):
    keras.utils.set_random_seed(5)  # before the dataset: its shuffle seed combines with the global one
    rng = np.random.default_rng(0)
    x, y = rng.random((96, 12, 12, 3), dtype=np.float32), rng.integers(0, 5, 96)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(96, seed=4).batch(16)
    model = _what_people_train()
    model.compile(optimizer=keras.optimizers.Adam(1e-2, use_ema=True, ema_overwrite_frequency=3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(dataset, epochs=2, verbose=0, callbacks=callbacks)
    return model, history.history["loss"]


def test_models_people_train(tmp_path, monkeypatch):
    _forced(monkeypatch, 2)
    path = str(tmp_path / "plan.json")
    profiled, profiled_loss = _train_on_dataset([ConcurrencyProfiler(trials=1, plan_path=path, verbose=0,
                                                                     batch_size=16)])
    plan = plan_lib.read(path)
    assert [(layer.name, layer.input_shape) for layer in plan.layers] == [
        ("strided", [16, 12, 12, 3]), ("dilated", [16, 6, 6, 8]), ("per_position", [16, 36, 8]), ("logits", [16, 16])]
    assert {type(layer) for layer in profiler.eligible_layers(profiled, True)} == {tf_glp.layers.Conv2D,
                                                                                  tf_glp.layers.Dense}
    reused, reused_loss = _train_on_dataset([ConcurrencyProfiler(trials=1, plan_path=path, verbose=0, batch_size=16)])
    assert profiled_loss == reused_loss  # profiling drew nothing from the augmentation's or dropout's generators
    for a, b in zip(profiled.weights + profiled.optimizer.variables, reused.weights + reused.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    plain, plain_loss = _train_on_dataset([])
    np.testing.assert_allclose(profiled_loss, plain_loss, rtol=1e-4)
    for a, b in zip(profiled.weights, plain.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-3, atol=1e-4)


def test_a_model_compiled_with_xla_keeps_its_kernels(tmp_path):
    # Keras compiles with XLA by default where there is a GPU; tf_glp's ops
    # have no XLA kernels, so the profiler must leave such a model alone.
    x, y = _data()
    model = _sequential()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    callback = ConcurrencyProfiler(trials=1, plan_path=str(tmp_path / "plan.json"), verbose=0)
    with pytest.warns(UserWarning, match=r"compiled with XLA \(jit_compile=True.*compile with jit_compile=False"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[callback])
    assert callback.plan is None and not os.path.exists(tmp_path / "plan.json")
    assert all(type(layer).__module__.startswith("keras") for layer in model.layers)


def test_layers_with_lanes_tell_keras_they_cannot_run_in_xla():
    from keras.src.trainers.trainer import model_supports_jit  # what jit_compile="auto" asks  # noqa: PLC0415

    model = _sequential()
    assert model_supports_jit(tf_glp.layers.convert(model, concurrency=None))
    assert not model_supports_jit(tf_glp.layers.convert(model, concurrency=2))
    tf_glp.layers.as_glp_layer(model.get_layer("hidden"), 1)
    assert not model_supports_jit(model)
    tf_glp.layers.as_glp_layer(model.get_layer("hidden"), None)
    assert model_supports_jit(model)


@pytest.fixture
def op_determinism():
    from tensorflow.python.framework import config

    tf.config.experimental.enable_op_determinism()
    try:
        yield
    finally:
        config.disable_op_determinism()


def test_works_under_op_determinism_and_the_reused_plan_repeats_bitwise(op_determinism, tmp_path, monkeypatch):
    # tf.timestamp() refuses to run under op determinism: the profiler times
    # on the host clock instead, chooses, and a run reusing its plan repeats.
    path = str(tmp_path / "plan.json")
    callback = ConcurrencyProfiler(trials=2, plan_path=path, verbose=0, batch_size=32)
    _train(_sequential, [callback], epochs=1)
    plan = plan_lib.read(path)
    assert [layer.name for layer in plan.layers] == ["conv", "hidden", "logits"]
    for layer in plan.layers:
        assert all(c.median_ms > 0 for c in layer.candidates), layer
    _forced(monkeypatch, 2)  # a plan with lanes, so that the concurrent kernels run too
    forced_path = str(tmp_path / "forced.json")
    _train(_sequential, [ConcurrencyProfiler(trials=1, plan_path=forced_path, verbose=0, batch_size=32)], epochs=1)
    runs = [_train(_sequential, [ConcurrencyProfiler(trials=1, plan_path=forced_path, verbose=0, batch_size=32)])
            for _ in range(2)]
    assert runs[0][1] == runs[1][1]
    for a, b in zip(runs[0][0].weights, runs[1][0].weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


_STRATEGIES = {
    "none": tf.distribute.get_strategy,
    "mirrored": lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                                       cross_device_ops=tf.distribute.ReductionToOneDevice()),
    "one_device": lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
    "central_storage": lambda: tf.distribute.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"]),
    "tf_glp_host": lambda: tf_glp.Strategy(["/cpu:0", "/cpu:1"], update="host"),
    "tf_glp_replicas": lambda: tf_glp.Strategy(["/cpu:0", "/cpu:1"], update="replicas"),
    "tf_glp_auto": lambda: tf_glp.Strategy(["/cpu:0", "/cpu:1"], update="auto", plan_path=None),
    "tf_glp_default_one_device": tf_glp.Strategy,
}


def _variant(kind):
    """A model with one layer variant the profiler may not convert, and the
    names of the layers it must profile."""
    if kind in ("quantized", "lora"):
        model = keras.Sequential([keras.Input((8, 8, 1)), L.Flatten(), L.Dense(16, name="variant"),
                                  L.Dense(10, name="logits")])
        if kind == "quantized":
            model.get_layer("variant").quantize("int8")
        else:
            model.get_layer("variant").enable_lora(2)
        return model
    layer = {"channels_first": lambda: L.Conv2D(4, 3, data_format="channels_first", name="variant"),
             "conv1d": lambda: L.Conv1D(4, 3, name="variant"),
             "conv3d": lambda: L.Conv3D(4, (1, 3, 3), name="variant"),
             "depthwise": lambda: L.DepthwiseConv2D(3, name="variant")}[kind]()
    shape = {"channels_first": (1, 8, 8), "conv1d": (8, 8), "conv3d": (2, 4, 8, 1), "depthwise": (8, 8, 1)}[kind]
    return keras.Sequential([keras.Input((8, 8, 1)), L.Reshape(shape), layer, L.Flatten(), L.Dense(10, name="logits")])


def _without_dropout():
    # (Stock CentralStorageStrategy cannot train Dropout at all.)
    return keras.Sequential([keras.Input((8, 8, 1)), L.Conv2D(4, 3, activation="relu", name="conv"), L.Flatten(),
                             L.Dense(16, activation="relu", name="hidden"), L.Dense(10, name="logits")])


@pytest.mark.parametrize("strategy", sorted(_STRATEGIES))
def test_works_under_every_strategy(strategy, tmp_path):
    path = str(tmp_path / "plan.json")
    model, losses = _train(_without_dropout, [ConcurrencyProfiler(trials=1, plan_path=path, verbose=0, batch_size=32)],
                           strategy=_STRATEGIES[strategy](), epochs=1)
    assert np.all(np.isfinite(losses))
    assert [layer.name for layer in plan_lib.read(path).layers] == ["conv", "hidden", "logits"]


def test_a_model_without_an_input_profiled_under_tf_glp_warned_without_a_strategy(tmp_path):
    # Its layers are built at the start of fit, before the callbacks begin
    # (Keras' symbolic build, which a one-device tf_glp.Strategy skips only
    # once the layers are built), also where no start-up choice reads a
    # batch (the count and XLA given in compile). Without a strategy Keras
    # builds them in the step's trace, after on_train_begin: nothing is
    # profiled there, and a warning says so.
    x, y = _data()
    with tf_glp.Strategy(plan_path=None).scope():
        model = keras.Sequential([L.Conv2D(4, 3, activation="relu", name="conv"), L.Flatten(),
                                  L.Dense(10, name="logits")])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=1, jit_compile=False)
    path = str(tmp_path / "plan.json")
    model.fit(x, y, batch_size=32, epochs=1, verbose=0,
              callbacks=[ConcurrencyProfiler(trials=1, plan_path=path, verbose=0, batch_size=32)])
    assert [layer.name for layer in plan_lib.read(path).layers] == ["conv", "logits"]
    # Without a strategy: a warning that says so and what to do.
    model = keras.Sequential([L.Conv2D(4, 3, activation="relu", name="conv"), L.Flatten(), L.Dense(10)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.warns(UserWarning, match=r"not built when training begins.*keras.Input.*tf_glp.Strategy\(\)"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0,
                  callbacks=[ConcurrencyProfiler(trials=1, plan_path=None, verbose=0, batch_size=32)])


def _plain_keras_trains(kind) -> bool:
    """Whether TensorFlow itself trains this variant on this machine: its CPU
    kernels run channels_first convolutions only through oneDNN's AVX-512
    path ("The Conv2D op currently only supports the NHWC tensor format on
    the CPU", "Conv2DCustomBackpropFilterOp only supports NHWC": seen on an
    AVX2 machine, TensorFlow 2.21)."""
    model = _variant(kind)
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _data()
    try:
        model.fit(x[:32], y[:32], batch_size=32, epochs=1, verbose=0)
    except (tf.errors.UnimplementedError, tf.errors.InvalidArgumentError) as error:
        if "NHWC" not in str(error):
            raise
        return False
    return True


@pytest.mark.parametrize("kind", ["quantized", "lora", "channels_first", "conv1d", "conv3d", "depthwise"])
def test_layer_variants_train_and_are_left_alone_when_not_eligible(kind, tmp_path):
    path = str(tmp_path / "plan.json")
    if kind == "channels_first" and not _plain_keras_trains(kind):
        # Nothing to train against here: the profiler's plan alone.
        model = _variant(kind)
        tf_glp.profile(model, _data()[0][:32], trials=1, plan_path=path)
    else:
        keras.utils.set_random_seed(3)
        plain = _variant(kind)
        plain.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        expected = plain.fit(*_data(), batch_size=32, epochs=1, verbose=0).history["loss"]
        keras.utils.set_random_seed(3)
        model = _variant(kind)
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        losses = model.fit(*_data(), batch_size=32, epochs=1, verbose=0,
                           callbacks=[ConcurrencyProfiler(trials=1, plan_path=path, verbose=0, batch_size=32)]
                           ).history["loss"]
        np.testing.assert_allclose(losses, expected, rtol=1e-4)
    plan = plan_lib.read(path)
    assert "logits" in [layer.name for layer in plan.layers]
    # The variant is named in the plan and its table, with why.
    reason = {"quantized": "quantized (int8)", "lora": "LoRA enabled",
              "channels_first": "data_format='channels_first' (the concurrent ops take channels_last)",
              "conv1d": "tf_glp's concurrent ops run Conv2D and Dense only",
              "conv3d": "tf_glp's concurrent ops run Conv2D and Dense only",
              "depthwise": "tf_glp's concurrent ops run Conv2D and Dense only"}[kind]
    layer_class = type(model.get_layer("variant")).__name__
    assert plan.left_alone == [{"name": "variant", "layer_class": layer_class, "reason": reason}]
    assert f"left as it is: variant ({layer_class}): {reason}" in plan_lib.table(plan)


class _Conv2DSubclass(L.Conv2D):
    pass


class _DenseSubclass(L.Dense):
    pass


_MORE_VARIANTS = {
    "grouped": (lambda: L.Conv2D(4, 3, groups=2, name="variant"), "groups=2"),
    "conv2d_subclass": (lambda: _Conv2DSubclass(4, 3, name="variant"),
                        "a subclass of Conv2D: its call may not be Conv2D's"),
    "dense_subclass": (lambda: _DenseSubclass(4, name="variant"), "a subclass of Dense: its call may not be Dense's"),
    "separable": (lambda: L.SeparableConv2D(4, 3, name="variant"), "tf_glp's concurrent ops run Conv2D and Dense only"),
    "transposed": (lambda: L.Conv2DTranspose(4, 3, name="variant"), "tf_glp's concurrent ops run Conv2D and Dense only"),
    "einsum_dense": (lambda: L.EinsumDense("abcd,de->abce", output_shape=(8, 8, 4), name="variant"),
                     "tf_glp's concurrent ops run Conv2D and Dense only"),
}


@pytest.mark.parametrize("kind", sorted(_MORE_VARIANTS))
def test_more_layer_kinds_are_left_alone_with_the_reason(kind):
    make, reason = _MORE_VARIANTS[kind]
    model = keras.Sequential([keras.Input((8, 8, 2)), make(), L.Flatten(), L.Dense(10, name="logits")])
    plan = tf_glp.profile(model, np.zeros((32, 8, 8, 2), np.float32), trials=1)
    assert [layer.name for layer in plan.layers] == ["logits"]
    layer_class = type(model.get_layer("variant")).__name__
    assert plan.left_alone == [{"name": "variant", "layer_class": layer_class, "reason": reason}]


def test_a_model_with_nothing_to_profile_names_what_it_left_alone(capsys):
    model = keras.Sequential([keras.Input((8, 8, 1)), L.Reshape((8, 8)), L.Conv1D(4, 3, name="conv1d"), L.Flatten(),
                              L.Dense(10, dtype="float64", name="wide")])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(*_data(64), batch_size=32, epochs=1, verbose=0,
              callbacks=[ConcurrencyProfiler(trials=1, plan_path=None, verbose=1)])
    printed = capsys.readouterr().out
    assert "no layer to profile" in printed
    assert "left as it is: conv1d (Conv1D): tf_glp's concurrent ops run Conv2D and Dense only" in printed
    assert "left as it is: wide (Dense): computes in float64" in printed


@pytest.mark.parametrize("fit_arguments", [{"steps_per_execution": 2}, {"initial_epoch": 1}], ids=str)
def test_steps_per_execution_and_initial_epoch(fit_arguments, tmp_path):
    x, y = _data()
    keras.utils.set_random_seed(3)
    model = _sequential()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=fit_arguments.get("steps_per_execution", 1))
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, initial_epoch=fit_arguments.get("initial_epoch", 0),
                        callbacks=[ConcurrencyProfiler(trials=1, plan_path=str(tmp_path / "p.json"), verbose=0,
                                                       batch_size=32)])
    assert np.all(np.isfinite(history.history["loss"]))
    assert len(history.history["loss"]) == 2 - fit_arguments.get("initial_epoch", 0)


def test_the_default_plan_is_the_models_file_in_the_cache_and_an_unwritable_cache_only_warns(tmp_path, monkeypatch):
    callback = ConcurrencyProfiler(trials=1, verbose=0, batch_size=32)
    _train(_sequential, [callback], epochs=1)
    cache = os.path.join(os.environ["TF_GLP_CACHE_DIR"], "layer_plans")
    assert os.listdir(cache) == [os.path.basename(callback.plan_file)] and not callback.reused
    again = ConcurrencyProfiler(trials=1, verbose=0, batch_size=32)
    _train(_sequential, [again], epochs=1)
    assert again.reused and again.plan_file == callback.plan_file
    other = ConcurrencyProfiler(trials=1, verbose=0, batch_size=16)  # another batch: another file
    _train(_sequential, [other], epochs=1)
    assert len(os.listdir(cache)) == 2 and not other.reused
    (tmp_path / "not_a_folder").write_text("")
    monkeypatch.setenv("TF_GLP_CACHE_DIR", str(tmp_path / "not_a_folder"))
    with pytest.warns(UserWarning, match="cannot write the plan .*not_a_folder.*the next run profiles again"):
        _, loss = _train(_sequential, [ConcurrencyProfiler(trials=1, verbose=0, batch_size=32)], epochs=1)
    assert np.isfinite(loss).all()
