"""tf_glp.Strategy with Keras' workflows: fit / evaluate / predict against
one device, save and load on one device, checkpoints, BackupAndRestore, and
clear errors for what it does not support."""

import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_glp


def _model(strategy, optimizer="adam", **compile_kwargs):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], **compile_kwargs)
    return model


def _digits(n=256):
    rng = np.random.default_rng(3)
    x = rng.random((n, 8, 8, 1)).astype(np.float32)
    y = (x.reshape(n, -1).sum(1) * 10 / 64).astype(np.int64) % 10
    return x, y


@pytest.mark.parametrize("way", ["one device", "host 2 replicas"])
def test_a_built_model_reads_its_input_as_often_as_plain_keras(way):
    """Keras' fit and evaluate under a strategy make a new iterator and read
    a batch from it to build what is unbuilt, even when nothing is; without
    a strategy they do not, and neither does tf_glp: an input is started
    once per epoch and evaluate, as plain Keras starts it."""
    x, y = _digits(64)
    starts = []

    def batches():
        starts.append(1)
        for i in range(0, 64, 16):
            yield x[i:i + 16], y[i:i + 16]

    dataset = tf.data.Dataset.from_generator(batches, output_signature=(
        tf.TensorSpec((None, 8, 8, 1), tf.float32), tf.TensorSpec((None,), tf.int64)))
    counts = {}
    for name, strategy in (("plain Keras", tf.distribute.get_strategy()),
                           (way, tf_glp.Strategy() if way == "one device"
                            else tf_glp.Strategy(["/cpu:0", "/cpu:1"], update="host"))):
        model = _model(strategy)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # builds everything
        starts.clear()
        model.fit(dataset, epochs=2, verbose=0)
        model.evaluate(dataset, verbose=0)
        counts[name] = len(starts)
    assert counts == {"plain Keras": 3, way: 3}


@pytest.mark.parametrize("update", ["host", "replicas"])
@pytest.mark.parametrize("replicas", [2, 4])
def test_fit_evaluate_predict_save_load(update, replicas, tmp_path):
    strategy = tf_glp.Strategy([f"/cpu:{i}" for i in range(replicas)], update=update, chunking=2)
    model = _model(strategy)
    x, y = _digits()
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    # The same weights on one device, without the strategy: same numbers.
    single = _model(tf.distribute.get_strategy())
    single.set_weights(model.get_weights())
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=32, verbose=0),
                               single.evaluate(x, y, batch_size=32, verbose=0), rtol=1e-6)
    predictions = model.predict(x, batch_size=32, verbose=0)
    np.testing.assert_allclose(predictions, single.predict(x, batch_size=32, verbose=0), rtol=1e-5, atol=1e-6)
    # Saved, it loads and predicts on a single device.
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded.predict(x, batch_size=32, verbose=0), predictions, rtol=1e-5, atol=1e-6)


def test_checkpoint_and_backup_and_restore(tmp_path):
    strategy = tf_glp.Strategy(cpu_replicas=2, chunking="none")  # update="auto": measured in the first fit
    x, y = _digits()
    model = _model(strategy)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    saved = checkpoint.save(str(tmp_path / "ckpt"))
    weights = [w.numpy() for w in model.weights]
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    checkpoint.restore(saved)
    for w, before in zip(model.weights, weights):
        np.testing.assert_array_equal(w.numpy(), before)

    class StopAfterEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("interrupted")

    backup = str(tmp_path / "backup")
    interrupted = _model(strategy)
    with pytest.raises(RuntimeError, match="interrupted"):
        interrupted.fit(x, y, batch_size=32, epochs=4, verbose=0,
                        callbacks=[keras.callbacks.BackupAndRestore(backup), StopAfterEpoch()])
    resumed = _model(strategy)
    history = resumed.fit(x, y, batch_size=32, epochs=4, verbose=0,
                          callbacks=[keras.callbacks.BackupAndRestore(backup)])
    assert len(history.history["loss"]) == 2  # epochs 3 and 4 only: restored after epoch 2
    assert os.path.isdir(backup) is False or not os.listdir(backup)  # cleaned up when training finished


@pytest.mark.parametrize("update", ["host", "replicas"])
def test_backup_and_restore_resumes_mid_epoch_at_the_batch(update, tmp_path):
    # One machine: a plain keras.callbacks.BackupAndRestore becomes tf_glp's,
    # which resumes at the batch of the backup (Keras' restarts the epoch).
    strategy = tf_glp.Strategy(cpu_replicas=2, update=update, chunking="none")
    x, y = _digits()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)  # 8 steps an epoch, same order every run

    class CrashAfterStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 11:
                raise RuntimeError("crashed")

    reference = _model(strategy)
    reference.fit(data, epochs=2, verbose=0)
    backup = str(tmp_path / "backup")
    crashed = _model(strategy)
    with pytest.raises(RuntimeError, match="crashed"):
        crashed.fit(data, epochs=2, verbose=0,
                    callbacks=[keras.callbacks.BackupAndRestore(backup, save_freq=3), CrashAfterStep()])
    resumed = _model(strategy)
    resumed.fit(data, epochs=2, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(backup, save_freq=3)])
    assert int(resumed.optimizer.iterations.numpy()) == 16
    for a, b in zip(resumed.weights, reference.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


def test_a_restore_on_another_replica_count_says_once_that_the_numbers_change(tmp_path):
    # Written by 2 replicas, restored by 4 without micro_batches: batch
    # statistics and dropout are per replica, so the numbers differ; with
    # micro_batches (a multiple of both counts) they do not, and nothing is said.
    # (update="replicas": no concept measured at the first fit.)
    x, y = _digits()
    data = tf.data.Dataset.from_tensor_slices((x[:64], y[:64])).batch(32)
    backup = str(tmp_path / "backup")
    written = _model(tf_glp.Strategy(cpu_replicas=2, update="replicas", chunking="none"))
    written.fit(data, epochs=1, verbose=0,
                callbacks=[keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)])
    with pytest.warns(UserWarning, match="the backup was written by 2 replicas, this run trains 4") as seen:
        _model(tf_glp.Strategy(cpu_replicas=4, update="replicas", chunking="none")).fit(
            data, epochs=2, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)])
    assert sum("the backup was written by" in str(w.message) for w in seen) == 1
    callback = tf_glp.callbacks.BackupAndRestore(backup)
    callback.set_model(_model(tf_glp.Strategy(cpu_replicas=4, update="replicas", chunking="none", micro_batches=4)))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*the backup was written by")
        callback._warn_if_the_replicas_changed(2)  # noqa: SLF001


class TestErrors:
    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="update must be 'host', 'replicas' or 'auto', got 'gpu'"):
            tf_glp.Strategy(update="gpu")
        with pytest.raises(ValueError, match="chunking"):
            tf_glp.Strategy(cpu_replicas=2, chunking=0)
        with pytest.raises(ValueError, match="compression must be None, 'bf16' or 'fp16', got 'int8'"):
            tf_glp.Strategy(cpu_replicas=2, compression="int8")
        with pytest.raises(ValueError, match="cpu_replicas must be at least 1, got 0"):
            tf_glp.Strategy(cpu_replicas=0)

    def test_bad_cpu_replicas_from_the_environment(self, monkeypatch):
        monkeypatch.setenv("TF_GLP_CPU_REPLICAS", "two")
        with pytest.raises(ValueError, match="TF_GLP_CPU_REPLICAS must be an integer >= 1, got 'two'"):
            tf_glp.Strategy()
        monkeypatch.setenv("TF_GLP_CPU_REPLICAS", "4")
        assert tf_glp.Strategy().num_replicas_in_sync == 4

    def test_too_many_cpu_replicas_after_initialisation(self):
        tf.config.list_logical_devices("CPU")  # TensorFlow fixes its devices here (conftest asked for 4)
        with pytest.raises(RuntimeError, match="already initialised its devices with 4"):
            tf_glp.Strategy(cpu_replicas=6)

    def test_jit_compile_true_is_refused(self):
        strategy = tf_glp.Strategy(cpu_replicas=2)
        with pytest.raises(ValueError, match="does not support jit_compile=True"):
            _model(strategy, jit_compile=True)

    def test_float64_model_trains_through_the_generic_path(self):
        # No fused update for float64: Keras' own update on the host, same weights as MirroredStrategy.
        x, y = _digits(64)
        keras.config.set_dtype_policy("float64")
        try:
            weights = []
            for strategy in (tf_glp.Strategy(cpu_replicas=2, update="host", chunking="none"),
                             tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                                            cross_device_ops=tf.distribute.ReductionToOneDevice())):
                model = _model(strategy)
                model.fit(x.astype(np.float64), y, batch_size=32, epochs=2, shuffle=False, verbose=0)
                assert model.weights[0].dtype == "float64"
                weights.append(model.get_weights())
        finally:
            keras.config.set_dtype_policy("float32")
        for a, b in zip(*weights):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)

    def test_global_batch_not_divisible(self):
        strategy = tf_glp.Strategy(["/cpu:0", "/cpu:1", "/cpu:2"], chunking="none")
        model = _model(strategy)
        x, y = _digits(96)
        with pytest.raises(ValueError, match="global batch size 32 .* 3 replicas"):
            model.fit(x, y, batch_size=32, epochs=1, verbose=0)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_sparse_gradients_from_embedding_are_summed_not_dropped(optimizer, monkeypatch):
    # Adam too: Keras 3 updates an IndexedSlices gradient slice by slice
    # (it squares each slice before duplicates add up), so tf_glp keeps
    # embedding gradients sparse to learn what Keras learns.
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, size=(128, 6))
    y = rng.integers(0, 50, size=(128, 6))

    def train(strategy):
        keras.utils.set_random_seed(5)
        with strategy.scope():
            model = keras.Sequential([keras.Input((6,), dtype="int64"), keras.layers.Embedding(50, 4),
                                      keras.layers.LSTM(8, return_sequences=True), keras.layers.Dense(50)])
            model.compile(optimizer={"sgd": lambda: keras.optimizers.SGD(0.1),
                                     "adam": lambda: keras.optimizers.Adam(1e-2),
                                     "adamw": lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.1)}[optimizer](),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        return [w.numpy() for w in model.weights]

    reference = train(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                                     cross_device_ops=tf.distribute.ReductionToOneDevice()))
    fused = []
    original = tf_glp.ops.FusedKerasUpdate.apply
    monkeypatch.setattr(tf_glp.ops.FusedKerasUpdate, "apply", lambda self, *a, **k: fused.append(1) or original(self, *a, **k))
    for update in ("replicas", "host"):
        ours = train(tf_glp.Strategy(["/cpu:0", "/cpu:1"], update=update, chunking=2))
        for a, b in zip(ours, reference):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        # Under update="host" the dense variables still take the fused update.
        assert bool(fused) == (update == "host")


def test_dataset_that_ends_mid_step_trains_on_every_sample():
    # 100 samples, global batch 32: the last batch (4 samples) is split
    # unevenly over the replicas; the same as MirroredStrategy.
    x, y = _digits(100)

    def train(strategy):
        model = _model(strategy, optimizer=keras.optimizers.SGD(0.1))
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
        return [w.numpy() for w in model.weights]

    reference = train(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                                     cross_device_ops=tf.distribute.ReductionToOneDevice()))
    ours = train(tf_glp.Strategy(["/cpu:0", "/cpu:1"], update="host", chunking="none"))  # the host's sums
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_bf16_compression_trains_close_to_float32():
    x, y = _digits()
    plain = _model(tf_glp.Strategy(cpu_replicas=2, update="host", chunking="none"),
                   optimizer=keras.optimizers.SGD(0.1))
    compressed = _model(tf_glp.Strategy(cpu_replicas=2, update="host", chunking="none", compression="bf16"),
                        optimizer=keras.optimizers.SGD(0.1))
    a = plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history["loss"]
    b = compressed.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(a, b, rtol=2e-2)
    assert not all(np.array_equal(p.numpy(), q.numpy()) for p, q in zip(plain.weights, compressed.weights))
