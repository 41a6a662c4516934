"""BackupAndRestore that loses nothing: Keras' callback, made right for
tf_glp.Strategy, on one machine and across workers.

Keras 3.15's `keras.callbacks.BackupAndRestore` (kept by its arguments and
file names) falls short in four ways, each fixed here:

- Every worker writes the same files. Here only the chief writes
  `backup_dir`; the other workers still take part in the save (a save may
  read distributed variables, which is collective) but write to a temporary
  folder that is removed at once.
- It restores the epoch, not the batch: a job killed in the middle of an
  epoch trains that epoch's first batches twice. Here the backup records the
  batches done in its epoch, and the resumed run skips them (the batches
  are read from the input, so the data order is kept, and not trained on).
  The resumed epoch's logged metrics then cover the batches trained after
  the restart.
- Random-generator state (Dropout's seed generators) is not in Keras'
  weights files, so a resumed run draws other dropout masks than the
  uninterrupted one would. Here it is saved with the backup and restored.
- A process killed while writing leaves a half-written backup. Here the
  weights go to a new file and the metadata, which names that file, is
  replaced atomically last; a backup is either the old one or the new one.
- A preemption signal (SIGTERM, before the engine's SIGKILL) ends the
  process with everything since the last save lost. Here the signal is
  caught (preemption.py) and read every `preemption_check_every` steps, at
  the same step on every worker, which agree through one collective (any
  worker's signal counts): every worker saves there and exits with
  preemption.EXIT_CODE, and the restarted job resumes at that step.

tf_glp.Strategy's `fit` puts this class in place of a plain
`keras.callbacks.BackupAndRestore` with the same arguments, so existing
scripts need no change. Paths are local (or shared-filesystem) paths.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import warnings

import keras
import numpy as np

from tf_glp._keras import compat
from tf_glp.callbacks import preemption
from tf_glp.tuning import store

METADATA = "training_metadata.json"


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` with chief-only writes, batch-level
    resume and atomic backups (see the module docstring).

    Args:
        backup_dir: Folder for the backup (shared by the workers).
        save_freq: "epoch" or a number of batches. Defaults to `"epoch"`.
        double_checkpoint: Accepted for compatibility; every backup is
            already atomic (the previous one stays until the new one is whole).
            Defaults to `False`.
        delete_checkpoint: Remove `backup_dir` when training ends. Defaults
            to `True`.
        preemption_check_every: Steps between reads of the preemption
            signals (0: never, the signals keep their action). Defaults to
            `None`: every step on one process (a read costs nothing there),
            every 10 across workers (a read is a collective).

    Example:
        >>> model.fit(ds, epochs=3, callbacks=[tf_glp.callbacks.BackupAndRestore("/shared/backup", save_freq=50)])
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False, delete_checkpoint=True,
                 preemption_check_every: int | None = None):
        preemption.check_every(type(self).__name__, preemption_check_every)
        super().__init__(backup_dir, save_freq=save_freq, double_checkpoint=double_checkpoint,
                         delete_checkpoint=delete_checkpoint)
        self._epoch = 0
        self._batches_done = 0  # in the current epoch
        self._batches_to_skip = 0  # of the first epoch after a restore
        self._skipping = 0  # batches of the current epoch skipped
        self._preemption_check_every = preemption_check_every
        self._checks_done = 0  # preemption checks: one each time the step passes a multiple
        self._signals = preemption.PreemptionSignals()
        self._saved_for_notice = False

    @classmethod
    def from_keras(cls, callback: keras.callbacks.BackupAndRestore) -> BackupAndRestore:
        return cls(callback.backup_dir, save_freq=callback.save_freq, double_checkpoint=callback.double_checkpoint,
                   delete_checkpoint=callback.delete_checkpoint)

    # -- who writes ----------------------------------------------------------
    def _writes_backup_dir(self) -> bool:
        strategy = self.model.distribute_strategy
        return not compat.in_multi_worker_mode(strategy) or strategy.extended.should_checkpoint

    # -- restore -------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._restore()
        if self._check_every():
            self._signals.install()

    def _restore(self) -> None:  # (Keras' own restores in on_train_begin, through its _load_model)
        metadata_path = os.path.join(self.backup_dir, METADATA)
        metadata = None
        if os.path.exists(metadata_path):
            with open(metadata_path) as f:
                metadata = json.load(f)
        if metadata is None or "weights" not in metadata or not self.model.built:
            # Nothing saved, a backup written by Keras' own callback, or an
            # unbuilt model (Keras' error): Keras' own restore.
            compat.load_keras_backup(self)
            return
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        self.model.load_weights(os.path.join(self.backup_dir, metadata["weights"]))
        state = metadata.get("state_not_in_weights", [])
        variables = _state_not_in_weights(self.model)
        if isinstance(state, dict):  # written by an earlier tf_glp: {path: value}
            pairs = [(v, state[v.path]) for v in variables if v.path in state]
        elif len(state) == len(variables):
            # By model order, not path: Keras numbers unnamed generators per
            # process, so a model built again in one process has other paths.
            pairs = [(v, entry["value"]) for v, entry in zip(variables, state)]
        else:
            raise ValueError(f"tf_glp.callbacks.BackupAndRestore: the backup in {self.backup_dir} holds "
                             f"{len(state)} random-generator states, the model has {len(variables)}: is it the "
                             f"same model?")
        for variable, value in pairs:
            variable.assign(np.asarray(value, dtype=variable.dtype))
        compat.set_initial_epoch(self.model, metadata["epoch"])
        self._batches_to_skip = int(metadata.get("batches_done", 0))
        self._warn_if_the_replicas_changed(metadata.get("replicas"))

    def _warn_if_the_replicas_changed(self, saved) -> None:
        """Says once when a restore on another replica count changes the
        numbers: batch statistics and dropout masks are per replica, unless
        tf_glp.Strategy(micro_batches=M) makes them independent of it."""
        strategy = self.model.distribute_strategy
        replicas = strategy.num_replicas_in_sync
        if saved is None or saved == replicas or getattr(strategy, "micro_batches", None):
            return
        warnings.warn(f"tf_glp.callbacks.{type(self).__name__}: the backup was written by {saved} replicas, this "
                      f"run trains {replicas}: it continues, but not with the numbers the {saved} would have "
                      f"computed (batch statistics and dropout are per replica). "
                      f"tf_glp.Strategy(micro_batches=M), with M a multiple of both counts, keeps them.",
                      stacklevel=2)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._batches_done = 0
        self._skipping = self._batches_to_skip  # batches of this epoch read, not trained
        if self._batches_to_skip:
            self._skip_batches(self._batches_to_skip)
            self._batches_to_skip = 0

    def _skip_batches(self, count: int) -> None:
        """The next steps read their batches and do not train: the model
        continues at the batch after the backup, on the same data order."""
        model = self.model
        train_function = model.train_function
        per_step = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
        steps = [count // per_step]
        if not steps[0]:
            return

        def skipped_step(iterator):
            for _ in range(per_step):
                next(iterator)
            steps[0] -= 1
            if not steps[0]:
                model.train_function = train_function
            return {}

        model.train_function = skipped_step

    # -- save ----------------------------------------------------------------
    def on_train_batch_end(self, batch, logs=None):
        self._batches_done = batch + 1
        if batch < self._skipping:
            return  # a skipped batch: no backup (its weights are the restored ones, not this batch's)
        super().on_train_batch_end(batch, logs)
        self._check_preemption()

    # -- preemption ------------------------------------------------------------
    def _check_every(self) -> int:
        """Steps between preemption checks (0: none: where the workers
        cannot agree, another strategy across workers, the signals keep
        their action and save_freq alone saves)."""
        strategy = self.model.distribute_strategy
        across = compat.in_multi_worker_mode(strategy)
        if across and not hasattr(strategy.extended, "most_on_workers"):
            return 0
        if self._preemption_check_every is not None:
            return self._preemption_check_every
        return 10 if across else 1

    def _notice(self) -> bool:
        """Whether a preemption notice other than a signal came (RayCheckpoint: Ray's)."""
        return False

    def _check_preemption(self) -> None:
        """Every worker, at the same steps: 2 if any worker got a signal
        (save and exit), 1 if a notice (save), else 0 (one collective)."""
        every = self._check_every()
        checks = _step(self.model) // every if every else self._checks_done
        if checks == self._checks_done:
            return
        self._checks_done = checks
        mine = 2 if self._signals.received else int(not self._saved_for_notice and self._notice())
        strategy = self.model.distribute_strategy
        agreed = strategy.extended.most_on_workers(mine) if compat.in_multi_worker_mode(strategy) else mine
        if not agreed:
            return
        self.save_backup()
        self._saved_for_notice = True
        if agreed == 2:
            self._signals.uninstall()
            code = preemption.exit_code()
            print(f"tf_glp.callbacks.{type(self).__name__}: preempted ({self._signals.received or 'another worker'}"
                  f"'s signal): saved at step {_step(self.model)} in {self.backup_dir}; exiting with status {code} "
                  f"(the restarted job resumes there)", flush=True)
            raise SystemExit(code)

    def on_epoch_end(self, epoch, logs=None):
        self._epoch, self._batches_done = epoch + 1, 0
        super().on_epoch_end(epoch, logs)

    def _save_model(self):  # (Keras' callback calls it every save_freq batches)
        self.save_backup()

    def save_backup(self) -> None:
        """Writes the backup now; every worker takes part (call it at the
        same step on every worker: a save may read distributed variables)."""
        writes = self._writes_backup_dir()
        folder = self.backup_dir if writes else tempfile.mkdtemp(prefix="tf_glp_backup_")
        try:
            os.makedirs(folder, exist_ok=True)
            name = f"backup-epoch{self._epoch}-batch{self._batches_done}.weights.h5"
            partial = os.path.join(folder, f"partial-{os.getpid()}.weights.h5")
            self.model.save_weights(partial, overwrite=True)
            weights_bytes = os.path.getsize(partial)
            os.replace(partial, os.path.join(folder, name))
            store.write_json(os.path.join(folder, METADATA),
                             {"epoch": self._epoch, "batch": compat.last_batch_seen(self),
                              "batches_done": self._batches_done, "weights": name,
                              # (a copy of the backup is whole when its weights file has this size)
                              "weights_bytes": weights_bytes, "step": _step(self.model),
                              "replicas": self.model.distribute_strategy.num_replicas_in_sync,
                              "state_not_in_weights": [{"path": v.path, "value": np.asarray(v.numpy()).tolist()}
                                                       for v in _state_not_in_weights(self.model)]})
            for old in glob.glob(os.path.join(folder, "backup-*.weights.h5")):
                if os.path.basename(old) != name:
                    os.remove(old)
        finally:
            if not writes:
                shutil.rmtree(folder, ignore_errors=True)

    def on_train_end(self, logs=None):
        self._signals.uninstall()
        if self.delete_checkpoint and self._writes_backup_dir() and os.path.exists(self.backup_dir):
            shutil.rmtree(self.backup_dir)


def _step(model) -> int:
    """The optimizer's step count: how far training got (0 without one)."""
    optimizer = model.optimizer
    return int(optimizer.iterations.numpy()) if optimizer is not None and optimizer.built else 0


def _state_not_in_weights(model) -> list:
    """The model's variables that Keras' weights files leave out: the seed
    generators' states (equal on every replica and worker)."""
    saved = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in saved]

