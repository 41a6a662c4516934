"""A plain Keras training script whose only tf_glp line is the callback.

    python examples/existing_script.py

The ConcurrencyProfiler times each Conv2D / Dense layer before the first
step, runs each at its fastest concurrency (or TensorFlow's own kernel when
nothing is faster), and writes glp_plan.json; the next run reuses the plan
without profiling. Uses scikit-learn's bundled 8x8 digits (no download).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import tf_glp  # noqa: E402

digits = load_digits()
x = (digits.images[..., None] / 16.0).astype(np.float32)
y = digits.target.astype(np.int64)
keras.utils.set_random_seed(0)

model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
    keras.layers.Conv2D(64, 3, activation="relu"),
    keras.layers.Flatten(),
    keras.layers.Dense(128, activation="relu"),
    keras.layers.Dense(10),
])
model.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
model.fit(x[:1500], y[:1500], batch_size=64, epochs=3, verbose=2,
          callbacks=[tf_glp.callbacks.ConcurrencyProfiler(batch_size=64)])  # the one tf_glp line
print(f"test accuracy: {model.evaluate(x[1500:], y[1500:], verbose=0)[1]:.3f}")
