"""What tf_glp.Strategy checks and adds when `fit` starts (called by the
fit patch in tf_glp/_keras/patches.py through Strategy._prepare_fit).

- A global batch that does not divide by the replica count (or, with
  micro_batches, by M) is refused: replicas would get unequal shares and
  Keras would weight samples unequally.
- chunking="auto" is decided (chunking_decision.py); across workers, every
  worker must use the same global batch.
- A plain keras.callbacks.BackupAndRestore becomes tf_glp's (chief-only
  writes across workers, batch-level resume;
  tf_glp/callbacks/backup_and_restore.py).
- On one device, the optimizer step's decision (one_device_strategy.py).
- The steps per execution (and on one device, with allow_xla=True, XLA):
  measured before fit builds its step (execution_choice.py).
- update="auto" decides its concept, before fit builds anything
  (update_choice.py).
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.strategy import chunking_decision, micro_batches


def prepare(model, strategy, arguments: dict) -> None:
    """Checks fit's arguments (as bound to Keras' fit signature) and adds
    tf_glp's callbacks to them, in place."""
    batch = _global_batch(arguments)
    _check_global_batch(batch, strategy.num_replicas_in_sync)
    if strategy.micro_batches:
        micro_batches.check_fit(model, strategy, batch, training_samples(arguments))
    if compat.in_multi_worker_mode(strategy):
        strategy.extended.check_same_on_every_worker(
            [batch or 0], "the workers' global batch sizes differ ({low} to {high}; 0: not known before "
            "training): every worker must use the same global batch size.")
    announce = strategy._prepare_concept(model, arguments, batch)
    given = arguments.get("callbacks")
    callbacks = list(given or [])
    if announce is not None:
        callbacks.append(announce)
    if not isinstance(given, keras.callbacks.CallbackList):  # a CallbackList is the user's, whole
        callbacks = [_upgraded(c) for c in callbacks]
    callbacks.extend(strategy._prepare_execution(model, arguments, batch, callbacks))
    if not chunking_decision.decide_without_measuring(strategy):
        if not any(isinstance(c, chunking_decision.ChunkingDecision) for c in callbacks):
            callbacks.append(chunking_decision.ChunkingDecision(strategy))
    if strategy._is_one_device and not strategy.optimizer_step_decided(model.optimizer):
        callbacks.append(strategy.optimizer_step_decision())
    if callbacks != list(given or []):
        arguments["callbacks"] = callbacks


def _upgraded(callback):
    """A plain keras.callbacks.BackupAndRestore becomes tf_glp's, with the
    same arguments: chief-only writes across workers, batch-level resume,
    atomic backups (tf_glp/callbacks/backup_and_restore.py)."""
    from tf_glp.callbacks.backup_and_restore import BackupAndRestore  # noqa: PLC0415 (imports Keras callbacks)

    if type(callback) is keras.callbacks.BackupAndRestore:
        return BackupAndRestore.from_keras(callback)
    return callback


def _global_batch(arguments: dict) -> int | None:
    """fit's global batch size, where it can be known before training."""
    x = arguments.get("x")
    batch = arguments.get("batch_size")
    if isinstance(x, tf.data.Dataset):
        batch = compat.dataset_batch_size(x)
    elif batch is None and (hasattr(x, "shape") or isinstance(x, (list, tuple, dict))):
        batch = 32  # Keras' default batch size for arrays
    return batch


def training_samples(arguments: dict) -> int | None:
    """How many samples an epoch of fit trains on, for array inputs without
    steps_per_epoch (Keras keeps the first floor(n * (1 - validation_split))
    for training); None where that is not known before training."""
    x = arguments.get("x")
    first = tf.nest.flatten(x)[0] if isinstance(x, (list, tuple, dict)) and x else x
    if arguments.get("steps_per_epoch") or isinstance(x, tf.data.Dataset) or not getattr(first, "shape", None):
        return None
    samples = int(first.shape[0])
    split = arguments.get("validation_split") or 0.0
    return int(math.floor(samples * (1.0 - split)))


def _check_global_batch(batch: int | None, replicas: int) -> None:
    """Each replica must get the same share of every full batch: otherwise
    Keras' per-replica loss scaling weights samples unequally."""
    if batch and batch % replicas:
        raise ValueError(
            f"tf_glp.Strategy: the global batch size {batch} does not divide by the {replicas} replicas, "
            f"so replicas would get unequal shares and Keras would weight samples unequally. "
            f"Use a multiple of {replicas}, e.g. {replicas * max(1, round(batch / replicas))}.")
