"""One concept, one workload, one replica count, one seed: the child process
of `python -m tf_glp.bench compare` (each concept runs in its own process:
TensorFlow fixes its logical devices at start-up, and strategies with
different device counts cannot share a process).

    python -m tf_glp.bench.run_concept '<json spec>'

Prints one line `RESULT <json>`: throughput after warm-up, the warm-up time,
the loss per step, the held-out metric after each evaluation, and the
training time at which a target was reached — or the error.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# After the log level: it imports TensorFlow.
from tf_glp.strategy import concepts as update_concepts, cpu_replica_devices  # noqa: E402

EVALUATIONS = 3  # held-out evaluations per run (at equal step intervals)
TF_GLP = "tf_glp-"  # the prefix of tf_glp's entries

# Concept name -> (what it is, whether it runs with one replica only).
CONCEPTS = {
    "plain-keras": ("plain Keras, no strategy (what most scripts run), the same global batch", True),
    "one-device": ("one device (OneDeviceStrategy), the same global batch", True),
    "mirrored-ring": ("synchronous all-reduce: MirroredStrategy, default (collective ring on CPUs)", False),
    "mirrored-host-reduce": ("centralised reduction: MirroredStrategy with ReductionToOneDevice('/cpu:0')", False),
    "central-storage": ("parameter-server style: CentralStorageStrategy (variables on '/cpu:0')", False),
    # One per update concept a user can set (tf_glp/strategy/concepts.py);
    # "all-reduce" is MirroredStrategy's, compared as "mirrored-*".
    **{f"{TF_GLP}{name}": (f"tf_glp.Strategy(update={name!r}): {concept.summary}", False)
       for name, concept in update_concepts.CONCEPTS.items() if concept.settable},
    "multi-worker-mirrored": ("multi-worker all-reduce: MultiWorkerMirroredStrategy, local workers", False),
    "tf_glp-multi-worker": ("tf_glp.Strategy(update='host') across local workers: host sums per worker, "
                            "collective all-reduce between workers", False),
}
# Run only with --workers, one replica per worker (started by tf_glp.launch).
MULTI_WORKER_CONCEPTS = ("multi-worker-mirrored", "tf_glp-multi-worker")


def _strategy(concept: str, devices: list[str]):
    import tensorflow as tf  # noqa: PLC0415

    import tf_glp  # noqa: PLC0415

    if concept == "plain-keras":
        return tf.distribute.get_strategy()  # the default strategy: no tf.distribute at all
    if concept == "one-device":
        return tf.distribute.OneDeviceStrategy(devices[0])
    if concept == "mirrored-ring":
        return tf.distribute.MirroredStrategy(devices)
    if concept == "mirrored-host-reduce":
        return tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice("/cpu:0"))
    if concept == "central-storage":
        return tf.distribute.experimental.CentralStorageStrategy(devices, parameter_device="/cpu:0")
    if concept == "tf_glp-multi-worker":  # multi-worker: TF_CONFIG is set
        return tf_glp.Strategy(devices, update=update_concepts.HOST.name)
    if concept.startswith(TF_GLP) and concept[len(TF_GLP):] in update_concepts.CONCEPTS:
        return tf_glp.Strategy(devices, update=concept[len(TF_GLP):])
    if concept == "multi-worker-mirrored":
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise ValueError(f"unknown concept {concept!r}; known: {', '.join(CONCEPTS)}")


def run(spec: dict) -> dict:
    import tensorflow as tf  # noqa: PLC0415

    replicas = spec["replicas"]
    devices = ([f"/gpu:{i}" for i in range(replicas)] if tf.config.list_physical_devices("GPU")
               else cpu_replica_devices(replicas))
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from tf_glp.bench import workloads  # noqa: PLC0415

    strategy = _strategy(spec["concept"], devices)
    workload = workloads.load(spec["workload"], spec.get("data"), spec.get("synthetic", False), spec["seed"])
    global_batch = spec["batch_per_replica"] * strategy.num_replicas_in_sync  # across workers, too
    keras.utils.set_random_seed(spec["seed"])
    with strategy.scope():
        model = workload.build()
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"] if workload.metric == "accuracy" else [])
    # The same data order for every concept: one seeded permutation, repeated.
    x, y = workload.train
    order = np.random.default_rng(spec["seed"]).permutation(len(x))
    dataset = (tf.data.Dataset.from_tensor_slices((x[order], y[order])).repeat()
               .batch(global_batch, drop_remainder=True).prefetch(2))
    steps, warmup = spec["steps"], spec["warmup_steps"]
    evaluations = max(1, min(EVALUATIONS, steps))
    per_evaluation = [steps // evaluations + (1 if i < steps % evaluations else 0) for i in range(evaluations)]

    ends, losses = [], []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ends.append(time.perf_counter())
            losses.append(float(logs["loss"]))

    x_test, y_test = workload.test
    start = time.perf_counter()
    history = []  # (training seconds so far, held-out metric)
    training_seconds = 0.0
    for count in per_evaluation:
        chunk_start = time.perf_counter()
        # Continue the data where the previous chunk stopped.
        model.fit(dataset.skip(len(ends)), steps_per_epoch=count, epochs=1, verbose=0, callbacks=[Clock()])
        training_seconds += ends[-1] - chunk_start
        evaluation = model.evaluate(x_test, y_test, batch_size=global_batch, verbose=0, return_dict=True)
        metric = evaluation["accuracy"] if workload.metric == "accuracy" else math.exp(min(50.0, evaluation["loss"]))
        history.append((training_seconds, metric))
    timed = ends[warmup:]
    steps_per_s = (len(timed) - 1) / (timed[-1] - timed[0]) if len(timed) > 1 else float("nan")
    target = spec.get("target")
    reached = None
    if target is not None:
        better = (lambda m: m >= target) if workload.metric == "accuracy" else (lambda m: m <= target)
        reached = next((seconds for seconds, metric in history if better(metric)), None)
    return {
        "ok": True,
        "devices": devices,
        "global_batch": global_batch,
        "warmup_s": (ends[warmup - 1] - start) if warmup else 0.0,
        "steps_per_s": steps_per_s,
        "samples_per_s": steps_per_s * global_batch,
        "losses": losses,
        "final_loss": losses[-1],
        "metric": workload.metric,
        "history": history,
        "final_metric": history[-1][1],
        "time_to_target_s": reached,
        "data_source": workload.source,
    }


def main() -> int:
    spec = json.loads(sys.argv[1])
    try:
        result = run(spec)
    except Exception as error:  # noqa: BLE001 (reported in the table, the other concepts still run)
        result = {"ok": False, "error": f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}",
                  "traceback": traceback.format_exc()[-4000:]}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
