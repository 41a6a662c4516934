"""Keras callbacks: `ConcurrencyProfiler`, the start-up profiler (GLP4NN)."""

from tf_glp.callbacks.concurrency_profiler import ConcurrencyProfiler

__all__ = ["ConcurrencyProfiler"]
