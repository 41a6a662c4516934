"""Facts about the device the profiler times on: which kind, how many
threads an op may use, the GPU's properties and tf_glp's kernel launch as
compiled, and from those the cap on a layer's lane count."""

from __future__ import annotations

import os

import tensorflow as tf

import tf_glp
from tf_glp.profiling import concurrency_model, gpu_device


def device_kind() -> str:
    return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"


def op_threads() -> int:
    """The threads TensorFlow lets one op use (its intra-op pool)."""
    return tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count() or 1


def gpu_description() -> concurrency_model.GpuDescription | None:
    """The first GPU's properties, from the CUDA driver (None without one)."""
    if not tf.config.list_physical_devices("GPU"):
        return None
    return gpu_device.describe(gpu_device.load_driver())


def gpu_kernel_launch() -> concurrency_model.KernelLaunch:
    """tf_glp's im2col kernel as compiled for the GPU (the op library says,
    once it is loaded), else the documented default."""
    status = tf_glp.native_available()  # loads the library first: see gpu_device.im2col_launch
    launch = gpu_device.im2col_launch(status.path if status.available else None)
    return launch or concurrency_model.IM2COL_LAUNCH


def device_string() -> str:
    if device_kind() == "gpu":
        gpus = tf.config.list_physical_devices("GPU")
        return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
    return f"CPU, {op_threads()} op threads"


def cap_for(work: concurrency_model.LayerWork) -> tuple[int, str]:
    if device_kind() == "gpu":
        gpu = gpu_description()
        if gpu is None:
            return min(8, work.batch), "the CUDA driver did not describe the GPU: at most 8 lanes"
        return concurrency_model.gpu_cap(work, gpu, gpu_kernel_launch())
    return concurrency_model.cpu_cap(work, op_threads())
