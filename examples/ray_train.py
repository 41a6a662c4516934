"""tf_glp under Ray Train: Keras 3 on several workers, checkpoints in Ray's storage.

    pip install -e ".[ray,examples]"
    python examples/ray_train.py [--workers 2] [--address auto] [--storage /shared/or/s3/path]

Starts a local Ray cluster (or joins `--address`), then trains the
quickstart's CNN on scikit-learn's 8x8 digits with 2 Ray workers. Each
worker builds `tf_glp.Strategy()` inside `train_loop_per_worker`: Ray's
TensorflowTrainer writes TF_CONFIG, and the strategy becomes its
multi-worker form (stock MultiWorkerMirroredStrategy fails there under
Keras 3: keras-team/keras issue 20585). `tf_glp.callbacks.RayCheckpoint`
hands the whole training state to Ray every epoch, and a worker that
dies is restarted by Ray (`max_failures=2`) from the last one, losing
nothing.

Ray's TensorflowTrainer sets TF_USE_LEGACY_KERAS=1 in every worker: a
script that imports `tf.keras` there gets Keras 2 (tf_keras, if installed)
instead of Keras 3. Import `keras` itself, as here.

    TF_GLP_EXAMPLE_SMALL=1 python examples/ray_train.py

runs a few-second version for CI (tests/ray).
"""

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
SMALL = os.environ.get("TF_GLP_EXAMPLE_SMALL") == "1"

import ray  # noqa: E402
import ray.train  # noqa: E402
from ray.train.tensorflow import TensorflowTrainer  # noqa: E402


def train_loop_per_worker(config):
    import keras  # noqa: PLC0415 (in the worker, after Ray wrote TF_CONFIG)
    from sklearn.datasets import load_digits  # noqa: PLC0415

    import tf_glp  # noqa: PLC0415

    strategy = tf_glp.Strategy()  # one replica per GPU, or one per CPU worker
    context = ray.train.get_context()
    if context.get_world_rank() == 0:
        print(strategy.explain())
    # The global batch: 64 per replica, as many replicas as the cluster has;
    # whole batches only, so every worker gets its share of each.
    batch = 64 * strategy.num_replicas_in_sync
    digits = load_digits()
    samples = config["samples"] - config["samples"] % batch
    x = (digits.images[..., None] / 16.0).astype("float32")[:samples]
    y = digits.target[:samples]
    keras.utils.set_random_seed(0)  # the same initial weights on every worker
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = model.fit(x, y, batch_size=batch, epochs=config["epochs"], shuffle=False, verbose=0,
                        callbacks=[tf_glp.callbacks.RayCheckpoint()])
    if context.get_world_rank() == 0:
        print(f"final loss {history.history['loss'][-1]:.4f}, accuracy {history.history['accuracy'][-1]:.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--address", default=None, help="a Ray cluster to join (default: start one here)")
    parser.add_argument("--storage", default=None, help="Ray's storage_path (default: a temporary folder)")
    args = parser.parse_args()
    ray.init(address=args.address, include_dashboard=False,
             runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"}})
    storage = args.storage or tempfile.mkdtemp(prefix="tf_glp_ray_")
    trainer = TensorflowTrainer(
        train_loop_per_worker,
        train_loop_config={"samples": 512 if SMALL else 1797, "epochs": 2 if SMALL else 8},
        scaling_config=ray.train.ScalingConfig(num_workers=args.workers),
        run_config=ray.train.RunConfig(name="tf_glp_digits", storage_path=storage,
                                       failure_config=ray.train.FailureConfig(max_failures=2)))
    result = trainer.fit()
    print(f"Ray Train finished: last checkpoint {result.checkpoint.path if result.checkpoint else None}, "
          f"metrics {result.metrics}")


if __name__ == "__main__":
    main()
