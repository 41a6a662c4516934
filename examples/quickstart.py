"""tf_glp quickstart: train a small CNN on real digits with tf_glp.Strategy.

    tools/dev.sh quickstart        (or: python examples/quickstart.py)

Uses scikit-learn's bundled 8x8 digit images (no download). Without GPUs the
strategy trains on one device (logical CPU replicas would share the same
cores), so this works on any machine. It ends by timing the same model
without tf_glp (as compiled by default, and with Keras' steps_per_execution
knob), in this process, so you see the ratios on your machine.

The global batch is 64 samples per replica (64 on one device), so it divides
by any replica count, as Keras requires. Without GPUs, TF_GLP_CPU_REPLICAS=N
trains N logical CPU replicas instead of one device (to try multi-replica code).

    TF_GLP_EXAMPLE_SMALL=1 python examples/quickstart.py

runs a few-second version for CI (tests/test_examples.py): 512 training
digits instead of 1500, 2 epochs instead of 8, 2 timing rounds instead of 16.
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
SMALL = os.environ.get("TF_GLP_EXAMPLE_SMALL") == "1"
train_size, epochs, rounds = (512, 2, 2) if SMALL else (1500, 8, 16)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import tf_glp  # noqa: E402

strategy = tf_glp.Strategy()  # all GPUs; without GPUs one device
keras.utils.set_random_seed(0)  # the same initial weights, dropout and batches on every run
print(f"tf_glp ops: {tf_glp.native_available()}")
print(f"strategy: {type(strategy).__name__} over {strategy.num_replicas_in_sync} replicas "
      f"{strategy.extended.worker_devices}")

digits = load_digits()
x = (digits.images[..., None] / 16.0).astype(np.float32)
y = digits.target.astype(np.int64)
rng = np.random.default_rng(0)
order = rng.permutation(len(x))
x, y = x[order], y[order]
x_train, y_train, x_test, y_test = x[:train_size], y[:train_size], x[1500:], y[1500:]


def build_and_compile(**compile_args):
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
                  metrics=["accuracy"], **compile_args)
    return model


with strategy.scope():
    model = build_and_compile()


class Throughput(keras.callbacks.Callback):
    """Samples per second of each epoch."""

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        rate = len(x_train) / (time.perf_counter() - self.start)
        print(f"epoch {epoch + 1}: loss {logs['loss']:.3f}, accuracy {logs['accuracy']:.3f}, {rate:,.0f} samples/s")


# The global batch: 64 samples per replica, as TensorFlow's distributed
# training guides scale it (each GPU gets the work one GPU would get alone).
# Keras 3 refuses a global batch that does not divide by the replica count.
batch_size = 64 * strategy.num_replicas_in_sync
model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, verbose=0, callbacks=[Throughput()])
loss, accuracy = model.evaluate(x_test, y_test, batch_size=batch_size, verbose=0)
print(f"test accuracy: {accuracy:.3f} on {len(x_test)} held-out digits")
print(strategy.explain())

# The same model without tf_glp, timed now in this process: as Keras
# compiles it by default and with steps_per_execution=16 (Keras' own knob:
# the same numbers, fewer calls); one epoch each, in interleaved rounds
# (machines drift between faster and slower phases), the fastest of each.
ways = {"tf_glp": model, "plain Keras": build_and_compile(),
        "steps_per_execution=16": build_and_compile(steps_per_execution=16)}
for trained in list(ways.values())[1:]:
    trained.fit(x_train, y_train, batch_size=batch_size, epochs=1, verbose=0)  # traces, as ours did
best = dict.fromkeys(ways, 0.0)
for _ in range(rounds):
    for name, trained in ways.items():
        start = time.perf_counter()
        trained.fit(x_train, y_train, batch_size=batch_size, epochs=1, verbose=0)
        best[name] = max(best[name], len(x_train) / (time.perf_counter() - start))
fastest = max(("plain Keras", "steps_per_execution=16"), key=best.get)
print(f"without tf_glp: {best['plain Keras']:,.0f} samples/s, with steps_per_execution=16: "
      f"{best['steps_per_execution=16']:,.0f}; with tf_glp: {best['tf_glp']:,.0f} samples/s "
      f"({best['tf_glp'] / best['plain Keras']:.2f}x plain Keras, {best['tf_glp'] / best[fastest]:.2f}x its fastest "
      f"way here; fastest of {rounds} interleaved epochs)")
