"""The workers-in-sync matrix as one job (run by tf_glp.launch, a simulated
`srun`, or alone as the one-process reference).

    python sync_matrix_job.py OUT_DIR CONFIG [CONFIG ...]

Each CONFIG is `update/replicas/micro_batches[/compression]`: update auto,
host or replicas; replicas "default" (cpu_replicas not given: what a user
gets) or a count per worker; micro_batches "none" or M; compression, when
given, "bf16" or "fp16". One process trains every
configuration in turn, each from the same seed on the same data (a small
model with BatchNormalization and Dropout, Adam, 2 epochs of 5 steps, global
batch 16), and writes OUT_DIR/w{task}.npz (task: the worker's index) with, per configuration, the trainable
weights and the optimizer's variables, keyed `{config}|trainable{i}` and
`{config}|optimizer{i}`, the first replica's batch statistics
`{config}|statistics{i}`, and `{config}|strategy`, the strategy's class; with
2 replicas per worker and no micro_batches, evaluate()'s loss and predict()'s
results too (`{config}|evaluation`, `{config}|predictions`). `--diverge` adds one more fit
of the first configuration in which worker 1 changes a weight of its own before the second epoch,
and keeps the error that stops it (the workers-in-sync guard's test) as `diverged|error`.

With `--as-workers W` (alone, no TF_CONFIG) it trains each configuration on
one machine with the replicas W such workers have in all (W x the count per
worker; "default" is one per worker): the reference the cluster must match. Sharing one process
between configurations keeps the matrix cheap: one TensorFlow start-up per
worker instead of one per configuration.

Configurations with micro_batches must come last: they turn Grappler's
arithmetic optimizer off (as the other micro-batched tests do, for bitwise
comparisons), and every function traced after that is traced without it.
"""

import argparse
import json
import os

import numpy as np


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--as-workers", type=int, default=None,
                        help="one process: every config with the replicas of this many workers")
    parser.add_argument("--diverge", action="store_true",
                        help="then a fit in which worker 1 adds 1e-3 to the first layer's bias before epoch 2")
    parser.add_argument("--engine", default=None, choices=["slurm"], help="the cluster from SLURM's variables")
    args = parser.parse_args(argv)

    import tensorflow as tf

    import tf_glp

    # Every configuration shares this process's devices: as many logical
    # CPUs as the largest replica count, set before TensorFlow starts.
    def replicas_of(config):
        count = config.split("/")[1]
        if args.as_workers:
            return args.as_workers * (1 if count == "default" else int(count))
        return None if count == "default" else int(count)

    tf_glp.strategy.cpu_replica_devices(max(replicas_of(c) or 1 for c in args.configs))
    resolver = tf_glp.slurm_cluster() if args.engine == "slurm" else None

    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(160, 8)).astype("float32")
    y = (x[:, :4].sum(1) > x[:, 4:].sum(1)).astype("int32")
    task = int(os.environ.get("SLURM_PROCID") or json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {}).get(
        "index", 0))

    class Diverge(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                bias = self.model.layers[0].bias
                bias.assign(bias + 1e-3)

    results = {}
    micro_batched = False
    for config in [*args.configs, *(["diverged"] if args.diverge else [])]:
        diverged = config == "diverged"
        config = args.configs[0] if diverged else config
        update, _, micro, *compression = config.split("/")
        micro_batches = None if micro == "none" else int(micro)
        if micro_batches and not micro_batched:
            tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
            micro_batched = True
        assert micro_batches or not micro_batched or diverged, "configurations with micro_batches must come last"
        strategy = tf_glp.Strategy(update=update, cpu_replicas=replicas_of(config), micro_batches=micro_batches,
                                   compression=compression[0] if compression else None, cluster_resolver=resolver)
        keras.utils.set_random_seed(1)
        with strategy.scope():
            model = keras.Sequential([
                keras.Input((8,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.BatchNormalization(),
                keras.layers.Dropout(0.2),
                keras.layers.Dense(2),
            ])
            model.compile(optimizer=keras.optimizers.Adam(1e-2),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).take(5)
        if diverged:
            try:
                model.fit(data, epochs=2, verbose=0, callbacks=[Diverge()] if task == 1 else [])
            except RuntimeError as error:
                results["diverged|error"] = np.array(str(error))
            continue
        model.fit(data, epochs=2, verbose=0)
        results[f"{config}|strategy"] = np.array(type(strategy).__name__)
        results[f"{config}|replicas"] = np.array(strategy.num_replicas_in_sync)
        results.update({f"{config}|trainable{i}": v.numpy() for i, v in enumerate(model.trainable_weights)})
        results.update({f"{config}|optimizer{i}": v.numpy() for i, v in enumerate(model.optimizer.variables)})
        # The first replica's batch statistics (per replica, as under MirroredStrategy).
        results.update({f"{config}|statistics{i}": v.numpy() for i, v in enumerate(model.non_trainable_weights)})
        if config.split("/")[1:3] == ["2", "none"]:  # evaluate() and predict() across workers (gathered)
            results[f"{config}|evaluation"] = np.array(model.evaluate(data, verbose=0))
            results[f"{config}|predictions"] = model.predict(x[:32], batch_size=16, verbose=0)
        print("trained", config, type(strategy).__name__, strategy.num_replicas_in_sync, flush=True)
    np.savez(os.path.join(args.out, f"w{task}.npz"), **results)


if __name__ == "__main__":
    main()
