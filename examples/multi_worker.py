"""One training script for every way a cluster starts workers.

    python examples/multi_worker.py OUT_DIR                                   # one process
    python -m tf_glp.launch --workers 2 examples/multi_worker.py OUT_DIR      # 2 local workers
    kubectl apply -f examples/kubernetes/indexed-job.yaml                     # 2 pods
    sbatch examples/slurm/train.sbatch                                        # 2 SLURM tasks

The script does not change between them: `tf_glp.Strategy()` finds the
cluster in the environment the engine sets (TF_CONFIG from tf_glp.launch or
a TFJob; TF_GLP_WORKER_HOSTS and the pod's JOB_COMPLETION_INDEX in an
Indexed Job), and under `srun` it reads SLURM's variables
(`tf_glp.slurm_cluster()`). It trains a small CNN on scikit-learn's 8x8
digits (no download), 32 per replica and step, with Keras'
BackupAndRestore in OUT_DIR/backup: a worker sent SIGTERM (a pod's
eviction, SLURM's preemption) makes every worker save at one step they
agree on and exit with status 143; started again, the job resumes there and
ends where it would have ended. The chief writes the model to
OUT_DIR/model.keras and prints its test accuracy.

    python examples/multi_worker.py OUT_DIR --samples 512 --epochs 2

is a few-second run (tests/test_engine_examples.py).
"""

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import tf_glp  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("out", help="the job's folder, shared by every worker (the backup, the model)")
parser.add_argument("--samples", type=int, default=1500, help="training digits (default: 1500 of 1797)")
parser.add_argument("--epochs", type=int, default=8)
args = parser.parse_args()

# srun sets SLURM's variables and no TF_CONFIG; every other engine here is found by tf_glp.Strategy itself.
resolver = tf_glp.slurm_cluster() if "SLURM_PROCID" in os.environ else None
strategy = tf_glp.Strategy(cluster_resolver=resolver)
chief = strategy.extended.should_checkpoint
if chief:
    print(strategy.explain().splitlines()[0], flush=True)

batch = 32 * strategy.num_replicas_in_sync  # the global batch: every replica gets 32
digits = load_digits()
x = (digits.images[..., None] / 16.0).astype(np.float32)
y = digits.target.astype(np.int64)
if not batch <= args.samples <= 1500:  # (the digits past 1500 are the test set)
    parser.error(f"--samples must be between the global batch ({batch}) and 1500, got {args.samples}")
train = args.samples - args.samples % batch  # whole batches only: every worker gets its share of each
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
model.fit(x[:train], y[:train], batch_size=batch, epochs=args.epochs, shuffle=False, verbose=2,
          callbacks=[keras.callbacks.BackupAndRestore(os.path.join(args.out, "backup"), save_freq=50)])

# Every worker saves (as with TensorFlow's multi-worker strategies); only the chief's file is kept.
with tempfile.TemporaryDirectory() as scratch:
    model.save(os.path.join(args.out if chief else scratch, "model.keras"))
# Whole batches of the 297 digits left out; every worker evaluates (the metrics are summed across them).
test = 1500 + (len(x) - 1500) // batch * batch
if test > 1500:
    accuracy = model.evaluate(x[1500:test], y[1500:test], batch_size=batch, verbose=0)[1]
    if chief:
        print(f"test accuracy: {accuracy:.3f}", flush=True)
elif chief:
    print(f"no test accuracy: a global batch of {batch} is more than the {len(x) - 1500} test digits", flush=True)
