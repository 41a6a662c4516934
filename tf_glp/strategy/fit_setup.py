"""What tf_glp.Strategy checks and adds when `fit` starts (called by the
fit patch in tf_glp/_keras/patches.py through Strategy._prepare_fit).

- A global batch that does not divide by the replica count (or, with
  micro_batches, by M) is refused: see _check_global_batch. Across
  workers, every worker must use the same global batch.
- A plain keras.callbacks.BackupAndRestore becomes tf_glp's (_upgraded).
- Across workers, WorkersInSync checks at every epoch's end that the
  workers still hold the same variables (workers_in_sync.py).
- The start-up choices run, in order (startup_choices; the interface:
  tf_glp/tuning/__init__.py).
"""

from __future__ import annotations


import keras
import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.strategy import chunking_decision, execution_choice, micro_batches
from tf_glp.strategy.workers_in_sync import WorkersInSync
from tf_glp.tuning import rounds


def startup_choices(strategy) -> dict:
    """`strategy`'s start-up choices by what they choose, in the order fit
    runs them (listed in tf_glp/tuning/__init__.py), the strategy's own
    (`_own_choices`: the concept under update="auto"; on one device the
    optimizer step, decided at the first trace of the update) first."""
    return {**strategy._own_choices(), "execution": execution_choice.ExecutionChoice(strategy),
            "chunking": chunking_decision.ChunkingChoice(strategy)}


def prepare(model, strategy, arguments: dict) -> None:
    """Checks fit's arguments (as bound to Keras' fit signature) and adds
    tf_glp's callbacks to them, in place."""
    batch = _global_batch(arguments)
    _check_global_batch(batch, strategy.num_replicas_in_sync)
    if strategy.micro_batches:
        micro_batches.check_fit(model, strategy, batch, rounds.training_samples(arguments))
    across_workers = compat.in_multi_worker_mode(strategy)
    if across_workers:
        strategy.extended.check_same_on_every_worker(
            [batch or 0], "the workers' global batch sizes differ ({low} to {high}; 0: not known before "
            "training): every worker must use the same global batch size.")
    given = arguments.get("callbacks")
    callbacks = list(given or [])
    if not isinstance(given, keras.callbacks.CallbackList):  # a CallbackList is the user's, whole
        callbacks = [_upgraded(c) for c in callbacks]
    if across_workers:
        # First: workers found out of step stop before another callback saves or reports their weights.
        callbacks.insert(0, WorkersInSync(strategy))
    for choice in strategy._choices.values():
        callbacks.extend(choice.prepare(model, arguments, batch, callbacks))
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


def _check_global_batch(batch: int | None, replicas: int) -> None:
    """Each replica must get the same share of every full batch: otherwise
    Keras' per-replica loss scaling weights samples unequally."""
    if batch and batch % replicas:
        raise ValueError(
            f"tf_glp.Strategy: the global batch size {batch} does not divide by the {replicas} replicas, "
            f"so replicas would get unequal shares and Keras would weight samples unequally. "
            f"Use a multiple of {replicas}, e.g. {replicas * max(1, round(batch / replicas))}.")
