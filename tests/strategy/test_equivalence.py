"""tf_glp.Strategy trains to the same weights as MirroredStrategy on the same
devices with the same global batch, and bitwise the same from run to run."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_glp

STEPS = 20
BATCH_PER_REPLICA = 16


def _data(n_replicas):
    rng = np.random.default_rng(0)
    n = STEPS * BATCH_PER_REPLICA * n_replicas
    x = rng.standard_normal((n, 12)).astype(np.float32)
    y = (x @ rng.standard_normal((12, 3)).astype(np.float32) > 0).astype(np.float32)
    return x, y


def _optimizer(name):
    return {
        "sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
        "adam": lambda: keras.optimizers.Adam(1e-2),
        "adamw": lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.05),
        "rmsprop": lambda: keras.optimizers.RMSprop(1e-3, centered=True),
        "nadam": lambda: keras.optimizers.Nadam(1e-2),
        "lion": lambda: keras.optimizers.Lion(1e-3),
        "lamb": lambda: keras.optimizers.Lamb(1e-3),
        "adafactor": lambda: keras.optimizers.Adafactor(1e-2),
        "muon": lambda: keras.optimizers.Muon(1e-2),  # no fused update: Keras' own, on the host
    }[name]()


def train(strategy, optimizer_name, n_replicas):
    x, y = _data(n_replicas)
    keras.utils.set_random_seed(42)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((12,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(3),
        ])
        model.compile(optimizer=_optimizer(optimizer_name),
                      loss=keras.losses.BinaryCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=BATCH_PER_REPLICA * n_replicas, epochs=1, shuffle=False, verbose=0)
    return [w.numpy() for w in model.weights]


def _devices(n):
    return [f"/cpu:{i}" for i in range(n)]


def mirrored(n):
    # ReductionToOneDevice: MirroredStrategy's default collective all-reduce
    # cannot hold 2- and 4-replica groups in one process.
    return tf.distribute.MirroredStrategy(_devices(n), cross_device_ops=tf.distribute.ReductionToOneDevice())


CASES = [
    # (replicas, optimizer, update, chunking): every optimizer and mode on 2
    # replicas, with and without chunking; the fused ones again on 4.
    *[(2, opt, "host", 2) for opt in ("sgd", "adam", "adamw", "rmsprop", "nadam", "lion", "lamb", "adafactor",
                                              "muon")],
    *[(2, opt, "host", "none") for opt in ("sgd", "adamw")],
    *[(2, opt, "replicas", "8KB") for opt in ("sgd", "adam", "adamw")],
    (2, "adam", "replicas", "none"),
    *[(4, opt, "host", 3) for opt in ("sgd", "adam", "adamw")],
    (4, "adamw", "replicas", 2),
]


_REFERENCES: dict = {}


def _once(key, train):
    """MirroredStrategy's run, trained once for the cases that share it."""
    if key not in _REFERENCES:
        _REFERENCES[key] = train()
    return _REFERENCES[key]


@pytest.mark.parametrize("n_replicas,optimizer_name,update,chunking", CASES)
def test_same_weights_as_mirrored_strategy(n_replicas, optimizer_name, update, chunking, monkeypatch):
    fused_calls = []
    original_apply = tf_glp.ops.FusedKerasUpdate.apply
    monkeypatch.setattr(tf_glp.ops.FusedKerasUpdate, "apply",
                        lambda self, *a, **k: fused_calls.append(1) or original_apply(self, *a, **k))
    reference = _once((n_replicas, optimizer_name), lambda: train(mirrored(n_replicas), optimizer_name, n_replicas))
    ours = train(tf_glp.Strategy(_devices(n_replicas), update=update, chunking=chunking), optimizer_name, n_replicas)
    # The fused host update ran (at trace time, once per chunk) exactly when it should.
    assert bool(fused_calls) == (update == "host" and optimizer_name != "muon")
    assert len(ours) == len(reference)
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("update", ["host", "replicas"])
def test_bitwise_reproducible_run_to_run(update):
    first = train(tf_glp.Strategy(_devices(2), update=update, chunking=2), "adam", 2)
    second = train(tf_glp.Strategy(_devices(2), update=update, chunking=2), "adam", 2)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def _dataset_cases():
    x, y = _data(2)
    batch = BATCH_PER_REPLICA * 2
    full = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    partial = tf.data.Dataset.from_tensor_slices((x[:-6], y[:-6])).batch(batch)  # last batch of 26
    repeated = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()
    return {
        "batched": (full, {}),
        "partial_last_batch": (partial, {}),
        "steps_per_epoch": (repeated, {"steps_per_epoch": 7, "epochs": 2}),
    }


@pytest.mark.parametrize("case", ["batched", "partial_last_batch", "steps_per_epoch"])
@pytest.mark.parametrize("update", ["host", "replicas"])
def test_tf_data_input_same_weights_as_mirrored_strategy(case, update):
    def fit(strategy):
        dataset, kwargs = _dataset_cases()[case]
        keras.utils.set_random_seed(42)
        with strategy.scope():
            model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(3)])
            model.compile(optimizer=keras.optimizers.Adam(1e-2),
                          loss=keras.losses.BinaryCrossentropy(from_logits=True))
        history = model.fit(dataset, verbose=0, **{"epochs": 1, **kwargs}).history
        return history["loss"], [w.numpy() for w in model.weights]

    reference_loss, reference = _once(("tf.data", case), lambda: fit(mirrored(2)))
    loss, ours = fit(tf_glp.Strategy(_devices(2), update=update, chunking="none"))
    np.testing.assert_allclose(loss, reference_loss, rtol=1e-5)
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
