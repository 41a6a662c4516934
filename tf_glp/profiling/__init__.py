"""The start-up profiler's model (concurrency_model.py, pure Python) and
measurements (profiler.py); used by tf_glp.callbacks.ConcurrencyProfiler and
tf_glp.profile."""
