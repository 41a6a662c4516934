"""A plain Keras training script whose only tf_glp line is the callback.

    python examples/existing_script.py

The ConcurrencyProfiler times each Conv2D / Dense layer before the first
step, at each lane count and with TensorFlow's own kernel. A layer runs on
lanes only where they measure at least 2x faster than TensorFlow's kernel,
beyond the spread of the timings; otherwise it keeps TensorFlow's kernel.
It also times Keras' optimizer update against tf_glp's fused one and keeps
the one that measures faster beyond the spread.
The profiler writes its plan to the user's cache (it prints where); the
next run reuses the plan without profiling. Uses scikit-learn's bundled 8x8 digits
(no download).

    TF_GLP_EXAMPLE_SMALL=1 python examples/existing_script.py

runs a few-second version for CI (tests/test_examples.py): 512 training
digits instead of 1500, 1 epoch instead of 3.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
SMALL = os.environ.get("TF_GLP_EXAMPLE_SMALL") == "1"
train_size, epochs = (512, 1) if SMALL else (1500, 3)

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
model.fit(x[:train_size], y[:train_size], batch_size=64, epochs=epochs, verbose=2,
          callbacks=[tf_glp.callbacks.ConcurrencyProfiler(batch_size=64)])  # the one tf_glp line
print(f"test accuracy: {model.evaluate(x[1500:], y[1500:], verbose=0)[1]:.3f}")
