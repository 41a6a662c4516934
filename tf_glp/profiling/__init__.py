"""The start-up profiler. Pure Python, no TensorFlow: the analytical model
(concurrency_model.py, gpu_device.py), the choice rule (choice.py) and the
plan (plan.py, also `python -m tf_glp.plan`). With TensorFlow: the device
facts (device_facts.py), the layers' timing (timing.py), profiling a model
(profiler.py) and the optimizer step's choice (optimizer_step.py); used by
tf_glp.callbacks.ConcurrencyProfiler and tf_glp.profile."""
