"""Checkpoints that live where Ray Train keeps them: tf_glp's
BackupAndRestore, with Ray's storage in place of a shared folder.

Under Ray Train the workers rarely share a filesystem; what they share is
the run's `storage_path`, reached through `ray.train.report` and
`ray.train.get_checkpoint`. This callback writes the same backup as
`tf_glp.callbacks.BackupAndRestore` (weights, optimizer slots, the
random-generator states Keras leaves out, the epoch and the batches done in
it) into a folder of its own on each worker, and hands the chief's to Ray as
a `ray.train.Checkpoint` every `save_freq` batches; the other workers report
too (Ray's report is a barrier every worker must reach). When Ray restarts
the workers (a worker died, with `FailureConfig(max_failures>=1)`), or the
run is started again under the same `RunConfig(name, storage_path)` (on as
many workers or another count), every worker fetches the latest checkpoint
and the fit resumes at the batch after it, as BackupAndRestore's does.

A preemption notice (`ray.train.get_preemption_info()`, set when a node of
the run is being drained, e.g. a spot instance reclaimed) is read every
`preemption_check_every` steps, at the same step on every worker, which
agree through one collective (any worker's notice counts): then every worker
saves and reports at once, so the restart loses at most those steps. A
preemption signal does the same, then exits (BackupAndRestore's).

The latest checkpoint: Ray registers a reported checkpoint only when its
controller next polls the workers (every 2 s), so a worker that dies just
after a report loses that checkpoint to `ray.train.get_checkpoint()`, which
then returns an older one (seen: a kill 2 steps after a report resumed 3
steps earlier). The checkpoint was uploaded whole before the report
returned, so the restore also looks in the run's storage folder (through
Ray's storage context, a DeveloperAPI) and takes the checkpoint that got
furthest among the whole ones there and Ray's own.
"""

from __future__ import annotations

import json
import posixpath
import shutil
import tempfile

from tf_glp.callbacks import preemption
from tf_glp.callbacks.backup_and_restore import METADATA, BackupAndRestore


def _ray_train():
    try:
        import ray.train  # noqa: PLC0415 (an optional dependency: the "ray" extra)
    except ImportError as error:
        raise ImportError("tf_glp.callbacks.RayCheckpoint needs Ray Train: pip install 'tf_glp[ray]' "
                          "(or 'ray[train]')") from error
    return ray.train


class RayCheckpoint(BackupAndRestore):
    """Saves the whole training state to Ray Train and restores it on
    restart (see the module docstring). Use it inside Ray Train's
    `train_loop_per_worker`, in place of `BackupAndRestore`.

    Args:
        save_freq: "epoch" or a number of batches between checkpoints.
            Defaults to `"epoch"`.
        preemption_check_every: Steps between reads of Ray's preemption
            notice (0: never). Defaults to 10.

    Example:
        >>> def train_loop_per_worker(config):
        ...     strategy = tf_glp.Strategy()
        ...     ...
        ...     model.fit(dataset, epochs=5, callbacks=[tf_glp.callbacks.RayCheckpoint(save_freq=100)])
    """

    def __init__(self, save_freq="epoch", preemption_check_every: int = 10):
        preemption.check_every("RayCheckpoint", preemption_check_every)  # (before Ray's context is read)
        self._ray_train = _ray_train()
        self._context = self._ray_train.get_context()  # (raises outside a Ray Train worker)
        super().__init__(tempfile.mkdtemp(prefix="tf_glp_ray_checkpoint_"), save_freq=save_freq,
                         preemption_check_every=preemption_check_every)
        self._metrics: dict[str, float] = {}

    def on_train_begin(self, logs=None):
        checkpoint = self._latest_checkpoint()
        if checkpoint is not None:
            shutil.rmtree(self.backup_dir, ignore_errors=True)
            checkpoint.to_directory(self.backup_dir)
        super().on_train_begin(logs)

    def _latest_checkpoint(self):
        """The checkpoint that got furthest: Ray's latest registered one, or
        a whole one in the run's storage folder (see the module docstring)."""
        registered = self._ray_train.get_checkpoint()
        candidates = [registered]
        try:
            storage = self._context.get_storage()
            filesystem, folder = storage.storage_filesystem, storage.experiment_fs_path
        except (AttributeError, NotImplementedError):  # (a DeveloperAPI: Ray's own choice alone)
            filesystem = None
        if filesystem is not None:
            import pyarrow.fs  # noqa: PLC0415 (Ray Train's dependency)

            found = filesystem.get_file_info(pyarrow.fs.FileSelector(folder, allow_not_found=True))
            candidates += [self._ray_train.Checkpoint(info.path, filesystem=filesystem) for info in found
                           if info.type == pyarrow.fs.FileType.Directory]
        steps = {id(c): _step_if_whole(c) for c in candidates if c is not None}
        whole = [c for c in candidates if c is not None and steps[id(c)] is not None]
        # (None of them whole by this callback's record, e.g. written by an
        # earlier tf_glp: Ray's choice, as BackupAndRestore reads it.)
        return max(whole, key=lambda c: steps[id(c)], default=registered)

    def on_train_batch_end(self, batch, logs=None):
        self._keep_metrics(logs)
        super().on_train_batch_end(batch, logs)  # (saves where a preemption notice or signal came)

    def _notice(self) -> bool:
        """Ray's preemption notice (a Ray without get_preemption_info gives none)."""
        return getattr(self._ray_train, "get_preemption_info", lambda: None)() is not None

    def on_epoch_end(self, epoch, logs=None):
        self._keep_metrics(logs)
        super().on_epoch_end(epoch, logs)

    def _keep_metrics(self, logs) -> None:
        self._metrics = {name: float(value) for name, value in (logs or {}).items()
                         if getattr(value, "shape", ()) == () and _is_number(value)}

    def save_backup(self) -> None:
        super().save_backup()  # the chief's backup in backup_dir, written atomically
        metrics = {**self._metrics, "epoch": self._epoch, "batches_done": self._batches_done}
        checkpoint = (self._ray_train.Checkpoint.from_directory(self.backup_dir) if self._writes_backup_dir()
                      else None)
        self._ray_train.report(metrics, checkpoint=checkpoint)

    def on_train_end(self, logs=None):
        # Ray's copies stay in its storage; this worker's local folder goes.
        shutil.rmtree(self.backup_dir, ignore_errors=True)


def _step_if_whole(checkpoint) -> int | None:
    """The step a checkpoint written by this callback holds, or None when
    it is not one or not whole (its weights file missing or short)."""
    filesystem, folder = checkpoint.filesystem, checkpoint.path
    try:
        with filesystem.open_input_stream(posixpath.join(folder, METADATA)) as f:
            metadata = json.loads(f.read())
        size = filesystem.get_file_info(posixpath.join(folder, metadata["weights"])).size
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if "step" not in metadata or size is None or size != metadata.get("weights_bytes"):
        return None
    return int(metadata["step"])


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
