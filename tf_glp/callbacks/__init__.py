"""Keras callbacks: `ConcurrencyProfiler`, the start-up profiler (GLP4NN), and
`BackupAndRestore`, Keras' fault-tolerance callback with batch-level resume
and chief-only writes across workers."""

from tf_glp.callbacks.backup_and_restore import BackupAndRestore
from tf_glp.callbacks.concurrency_profiler import ConcurrencyProfiler

__all__ = ["BackupAndRestore", "ConcurrencyProfiler"]
