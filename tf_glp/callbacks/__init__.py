"""Keras callbacks: `ConcurrencyProfiler`, the start-up profiler (GLP4NN);
`BackupAndRestore`, Keras' fault-tolerance callback with batch-level resume
and chief-only writes across workers; `RayCheckpoint`, the same backup kept
in Ray Train's storage (needs the "ray" extra)."""

from tf_glp.callbacks.backup_and_restore import BackupAndRestore
from tf_glp.callbacks.concurrency_profiler import ConcurrencyProfiler
from tf_glp.callbacks.ray_checkpoint import RayCheckpoint

__all__ = ["BackupAndRestore", "ConcurrencyProfiler", "RayCheckpoint"]
