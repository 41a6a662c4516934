"""The start-up profiler: its model (concurrency_model.py and gpu_device.py,
pure Python, no TensorFlow), the layers' measurements and choices
(profiler.py) and the optimizer step's (optimizer_step.py); used by
tf_glp.callbacks.ConcurrencyProfiler and tf_glp.profile."""
