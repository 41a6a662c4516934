"""tf_glp.Strategy(micro_batches=M): the same update, bit for bit, on every
replica count dividing M (tf_glp/strategy/micro_batches.py)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_glp
from tf_glp.strategy import micro_batches
from tf_glp.strategy import HostStrategy

L = keras.layers
M = 4
BATCH = 16
STEPS = 8


def _data():
    rng = np.random.default_rng(5)
    x = rng.random((BATCH * STEPS, 6, 6, 2), dtype=np.float32)
    y = rng.integers(0, 3, BATCH * STEPS)
    return x, y


def _model():
    keras.utils.set_random_seed(11)
    return keras.Sequential([keras.Input((6, 6, 2)), L.Conv2D(4, 3, activation="relu"), L.Flatten(),
                             L.Dense(8, activation="tanh"), L.Dense(3)])


def _train(replicas, update, optimizer=lambda: keras.optimizers.Adam(1e-2), micro=M):
    strategy = tf_glp.Strategy([f"/cpu:{i}" for i in range(replicas)], update=update, micro_batches=micro)
    with strategy.scope():
        model = _model()
        model.compile(optimizer=optimizer(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(*_data(), batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model, history.history["loss"]


def _state(model):
    return [(v.path, v.numpy()) for v in model.weights + model.optimizer.variables]


@pytest.mark.parametrize("update", ["host", "replicas"])
def test_every_replica_count_dividing_m_trains_bitwise_alike(update, exact_arithmetic):
    reference, reference_loss = _train(1, update)
    for replicas in (2, 4):
        model, loss = _train(replicas, update)
        for (path, a), (_, b) in zip(_state(model), _state(reference), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{replicas} replicas, {path}")
        np.testing.assert_allclose(loss, reference_loss, rtol=1e-6)


@pytest.mark.parametrize("optimizer", [lambda: keras.optimizers.SGD(0.1, momentum=0.9),
                                       lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.1),
                                       lambda: keras.optimizers.RMSprop(1e-2, clipnorm=1.0)],
                         ids=["momentum", "adamw", "rmsprop_clipnorm"])
def test_other_optimizers_are_invariant_too(optimizer, exact_arithmetic):
    reference, _ = _train(1, "host", optimizer)
    model, _ = _train(2, "host", optimizer)
    for (path, a), (_, b) in zip(_state(model), _state(reference), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=path)


def test_the_fused_update_adds_the_micro_batches_in_its_own_pass_bitwise_as_in_order_sum(
        monkeypatch, exact_arithmetic):
    """update="host" with Adam: the M gradients go unsummed into the fused
    update (one pass); forcing the separate in_order_sum first gives the
    same bits."""
    seen = []
    original = tf_glp.ops.FusedKerasUpdate.apply
    monkeypatch.setattr(tf_glp.ops.FusedKerasUpdate, "apply",
                        lambda self, parts, *a, **k: seen.append(len(parts[0])) or original(self, parts, *a, **k))
    one_pass, _ = _train(2, "host")
    assert seen and set(seen) == {M}
    seen.clear()
    monkeypatch.setattr(HostStrategy, "_takes_gradients_unsummed", lambda *a: False)
    separate, _ = _train(2, "host")
    assert seen and set(seen) == {1}
    for (path, a), (_, b) in zip(_state(one_pass), _state(separate), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=path)


def _assert_the_same_on_2_and_4_replicas_as_on_1(train, update):
    """train(replicas, update) -> ([(path, value)], history): bitwise the
    same on 2 and 4 replicas as on 1. Returns the 1-replica state."""
    reference, reference_history = train(1, update)
    for replicas in (2, 4):
        state, history = train(replicas, update)
        for (path, a), (_, b) in zip(state, reference, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{replicas} replicas, {path}")
        assert history == reference_history, f"{replicas} replicas"
    return reference


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def _train_mixed_precision(replicas, update):
    strategy = tf_glp.Strategy([f"/cpu:{i}" for i in range(replicas)], update=update, micro_batches=M)
    x, y = _data()
    with strategy.scope():
        keras.utils.set_random_seed(11)
        model = keras.Sequential([keras.Input((6, 6, 2)), L.Conv2D(4, 3, activation="relu"),
                                  L.BatchNormalization(), L.Flatten(), L.Dropout(0.3, seed=5),
                                  L.Dense(3, dtype="float32")])
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    return [(v.path, v.numpy()) for v in model.variables + model.optimizer.variables], history


@pytest.mark.parametrize("update", ["host", "replicas"])
def test_loss_scaling_is_invariant_too(update, mixed_float16, exact_arithmetic):
    """mixed_float16: Keras wraps the optimizer in a LossScaleOptimizer; the
    micro-batches' losses are scaled, the sums checked for overflow and the
    dynamic scale updated once per step, the same on every replica count."""
    reference = _assert_the_same_on_2_and_4_replicas_as_on_1(_train_mixed_precision, update)
    assert any("dynamic_scale" in path for path, _ in reference)


def test_the_update_is_the_micro_batches_mean_gradient_added_in_order():
    # One device, by hand: each micro-batch's gradient of its mean loss / M,
    # added in micro-batch order, then Keras' Adam.
    x, y = _data()
    model = _model()
    optimizer = keras.optimizers.Adam(1e-2)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    size = BATCH // M
    for step in range(STEPS):
        grads = []
        for m in range(M):
            start = step * BATCH + m * size
            with tf.GradientTape() as tape:
                loss = loss_fn(y[start:start + size], model(x[start:start + size], training=True)) / M
            grads.append(tape.gradient(loss, model.trainable_weights))
        optimizer.apply([((g0 + g1) + g2) + g3 for g0, g1, g2, g3 in zip(*grads)],
                        model.trainable_weights)
    trained, _ = _train(2, "host")
    for a, b in zip(trained.weights, model.weights, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-5, atol=1e-6, err_msg=b.path)


def test_in_order_sum():
    values = [tf.constant(v) for v in (1e8, 1.0, -1e8, 1.0, 3.0)]
    # (((1e8 + 1) - 1e8) + 1) + 3 in float32: 1e8 + 1 rounds to 1e8.
    assert float(micro_batches.in_order_sum(values)) == 4.0
    assert float(micro_batches.in_order_sum(values[:1])) == 1e8


@pytest.mark.parametrize("value, message", [
    (3, "the 2 replicas do not divide 3 micro-batches"), (0, "positive int"), (2.0, "positive int"),
    (True, "positive int")])
def test_bad_settings_name_the_numbers(value, message):
    with pytest.raises(ValueError, match=message):
        tf_glp.Strategy(["/cpu:0", "/cpu:1"], micro_batches=value)


def test_micro_batches_with_compression_is_refused():
    with pytest.raises(ValueError, match="compression='bf16' cannot apply"):
        tf_glp.Strategy(["/cpu:0", "/cpu:1"], micro_batches=2, compression="bf16")


def test_a_global_batch_the_micro_batches_do_not_divide_is_refused_at_fit():
    strategy = tf_glp.Strategy(["/cpu:0", "/cpu:1"], micro_batches=4)
    with strategy.scope():
        model = _model()
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="global batch size 18 does not divide into 4 equal micro-batches"):
        model.fit(*_data(), batch_size=18, epochs=1, verbose=0)
    x, y = _data()
    with pytest.raises(ValueError, match="the 126 training samples end in a last batch of 14, which does not divide "
                                         r"into 4 equal micro-batches. Train on a multiple of 4 samples \(e.g. 124\)"):
        model.fit(x[:126], y[:126], batch_size=BATCH, epochs=1, verbose=0)
    # The same in a dataset, known only when the last batch comes: every
    # replica count refuses it (tf.distribute would share it out unevenly).
    data = tf.data.Dataset.from_tensor_slices((x[:126], y[:126])).batch(BATCH)
    for replicas in (2, 4):  # (2: a replica's share does not split; 4: the shares differ)
        with tf_glp.Strategy([f"/cpu:{i}" for i in range(replicas)], micro_batches=4).scope():
            model = _model()
            model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        with pytest.raises(tf.errors.InvalidArgumentError, match="did not divide into 4 equal micro-batches"):
            model.fit(data, epochs=1, verbose=0)


def test_a_custom_train_step_is_refused_and_renorm_is_named():
    class Custom(keras.Sequential):
        def train_step(self, data):
            return super().train_step(data)

    strategy = tf_glp.Strategy(["/cpu:0", "/cpu:1"], micro_batches=2)
    with strategy.scope():
        model = Custom([keras.Input((6, 6, 2)), L.Flatten(), L.Dense(3)])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="Custom overrides train_step"):
        model.fit(*_data(), batch_size=BATCH, epochs=1, verbose=0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6, 6, 2)), L.Flatten(), L.BatchNormalization(renorm=True, name="norm"),
                                  L.Dense(3)])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.warns(UserWarning, match=r"norm \(BatchNormalization with renorm\) still depend"):
        model.fit(*_data(), batch_size=BATCH, epochs=1, verbose=0)


def _model_people_train():
    keras.utils.set_random_seed(11)
    inputs = keras.Input((6, 6, 2))
    h = L.RandomFlip("horizontal", seed=3)(inputs)
    h = L.GaussianNoise(0.1, seed=4)(h)
    h = L.Conv2D(4, 3, activation="relu")(h)
    h = L.BatchNormalization()(h)
    h = L.Flatten()(h)
    h = L.Dense(8, activation="relu")(h)
    h = L.Dropout(0.3, seed=5)(h)
    return keras.Model(inputs, L.Dense(3)(h))


def _train_everything(replicas, update, steps=20):
    strategy = tf_glp.Strategy([f"/cpu:{i}" for i in range(replicas)], update=update, micro_batches=M)
    rng = np.random.default_rng(8)
    x = rng.random((BATCH * steps, 6, 6, 2), dtype=np.float32)
    y = rng.integers(0, 3, BATCH * steps)
    with strategy.scope():
        model = _model_people_train()
        model.compile(optimizer=keras.optimizers.Adam(1e-2), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # (shuffled: seeded, so the same order)
    state = [(v.path, v.numpy()) for v in model.variables + model.optimizer.variables]
    # (Each replica holds the whole batch's metric state: the variables read
    # as their sum over the replicas, the results as the one value.)
    results = {metric.name: metric.result() for metric in model.metrics}
    state += [(name, np.asarray(tf.nest.flatten(value))) for name, value in sorted(results.items())]
    return state, history.history


@pytest.mark.parametrize("update", ["host", "replicas"])
def test_batch_norm_dropout_augmentation_metrics_are_invariant_too(update, exact_arithmetic):
    reference = _assert_the_same_on_2_and_4_replicas_as_on_1(_train_everything, update)
    assert any("seed_generator_state" in path for path, _ in reference)
    assert any("moving_mean" in path for path, _ in reference)


class _Interrupt(keras.callbacks.Callback):
    """Stops training with an error after `at` batches (a failed machine)."""

    def __init__(self, at):
        super().__init__()
        self.at, self.seen = at, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.at:
            raise RuntimeError("interrupted by the test")


def _fit_people_train(replicas, callbacks=(), steps=10, epochs=2):
    strategy = tf_glp.Strategy([f"/cpu:{i}" for i in range(replicas)], micro_batches=M)
    rng = np.random.default_rng(8)
    x = rng.random((BATCH * steps, 6, 6, 2), dtype=np.float32)
    y = rng.integers(0, 3, BATCH * steps)
    with strategy.scope():
        model = _model_people_train()
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=list(callbacks))
    return [(v.path, v.numpy()) for v in model.variables + model.optimizer.variables]


def test_an_elastic_restart_on_fewer_replicas_ends_where_the_uninterrupted_job_ends(tmp_path, exact_arithmetic):
    uninterrupted = _fit_people_train(4)
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted by the test"):
        _fit_people_train(4, [keras.callbacks.BackupAndRestore(backup, save_freq=3), _Interrupt(14)])
    resumed = _fit_people_train(2, [keras.callbacks.BackupAndRestore(backup, save_freq=3)])
    for (path, a), (_, b) in zip(resumed, uninterrupted, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=path)
    with pytest.raises(ValueError, match=r"micro_batches=4\): the 3 replicas do not divide 4 micro-batches"):
        tf_glp.Strategy(["/cpu:0", "/cpu:1", "/cpu:2"], micro_batches=4)


def test_what_may_break_invariance_is_named():
    assert micro_batches.invariance_doubts(["/cpu:0", "/cpu:1"], [], False) == []
    assert micro_batches.invariance_doubts(["/gpu:0", "/gpu:1"], ["H200", "H200"], True) == []
    mixed = micro_batches.invariance_doubts(["/gpu:0", "/cpu:0"], ["H200"], True)
    assert len(mixed) == 1 and "mix CPUs and GPUs" in mixed[0]
    (different, nondeterministic) = micro_batches.invariance_doubts(["/gpu:0", "/gpu:1"], ["A100", "H200"], False)
    assert "the GPUs differ (A100, H200)" in different
    assert "enable_op_determinism()" in nondeterministic


def test_a_plain_model_gets_no_warning_and_an_own_compute_metrics_is_named():
    import warnings  # noqa: PLC0415

    class OwnMetrics(keras.Sequential):
        def compute_metrics(self, x, y, y_pred, sample_weight=None):
            return super().compute_metrics(x, y, y_pred, sample_weight)

    strategy = tf_glp.Strategy(["/cpu:0", "/cpu:1"], micro_batches=2)
    for kind in (keras.Sequential, OwnMetrics):
        with strategy.scope():
            model = kind([keras.Input((6, 6, 2)), L.Flatten(), L.Dense(3)])
            model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(*_data(), batch_size=BATCH, epochs=1, verbose=0)
        named = [str(w.message) for w in caught if "micro_batches" in str(w.message)]
        assert named == ([] if kind is keras.Sequential else [
            "tf_glp.Strategy(micro_batches=2) calls OwnMetrics.compute_metrics with the whole global batch's y and "
            "y_pred and x=None (the inputs are not gathered)"])
