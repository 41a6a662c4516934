"""tf_glp quickstart: train a small CNN on real digits with tf_glp.Strategy.

    tools/dev.sh quickstart        (or: python examples/quickstart.py)

Uses scikit-learn's bundled 8x8 digit images (no download). Without GPUs the
strategy runs 2 logical CPU replicas, so this works on any machine.
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import tf_glp  # noqa: E402

# Create the strategy first: on a machine without GPUs it sets up logical CPU
# devices, which TensorFlow allows only before it runs its first op.
strategy = tf_glp.Strategy()  # update="host", chunking="auto"
keras.utils.set_random_seed(0)  # the same weights, batches and accuracy on every run
print(f"tf_glp ops: {tf_glp.native_available()}")
print(f"strategy: {type(strategy).__name__} over {strategy.num_replicas_in_sync} replicas "
      f"{strategy.extended.worker_devices}")

digits = load_digits()
x = (digits.images[..., None] / 16.0).astype(np.float32)
y = digits.target.astype(np.int64)
rng = np.random.default_rng(0)
order = rng.permutation(len(x))
x, y = x[order], y[order]
x_train, y_train, x_test, y_test = x[:1500], y[:1500], x[1500:], y[1500:]

with strategy.scope():
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])


class Throughput(keras.callbacks.Callback):
    """Samples per second of each epoch."""

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        rate = len(x_train) / (time.perf_counter() - self.start)
        print(f"epoch {epoch + 1}: loss {logs['loss']:.3f}, accuracy {logs['accuracy']:.3f}, {rate:,.0f} samples/s")


batch_size = 32 * strategy.num_replicas_in_sync  # divisible by the replica count
model.fit(x_train, y_train, batch_size=batch_size, epochs=8, verbose=0, callbacks=[Throughput()])
loss, accuracy = model.evaluate(x_test, y_test, batch_size=batch_size, verbose=0)
print(f"test accuracy: {accuracy:.3f} on {len(x_test)} held-out digits")
print(strategy.explain())
