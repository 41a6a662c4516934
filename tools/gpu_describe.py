"""Prints what tf_glp's start-up profiler reads about GPU 0 from the CUDA
driver (tf_glp/profiling/gpu_device.py), without TensorFlow: the GPU
machine has none. tools/gpu_check.sh runs it; exit status 1 if the driver
did not describe the device."""

from __future__ import annotations

import importlib.util
import os
import sys

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tf_glp", "profiling", "gpu_device.py")


def main() -> int:
    # The file alone: importing the tf_glp package would import TensorFlow.
    spec = importlib.util.spec_from_file_location("gpu_device", _PATH)
    gpu_device = importlib.util.module_from_spec(spec)
    sys.modules["gpu_device"] = gpu_device  # dataclasses look their module up
    spec.loader.exec_module(gpu_device)
    gpu = gpu_device.describe(gpu_device.load_driver())
    if gpu is None:
        print("== profiler's GPU model: FAILED (the CUDA driver did not describe device 0)")
        return 1
    print(f"== profiler's GPU model: {gpu.name}, {gpu.multiprocessors} SMs, {gpu.max_threads_per_multiprocessor} "
          f"threads / {gpu.max_blocks_per_multiprocessor} blocks / {gpu.registers_per_multiprocessor} registers / "
          f"{gpu.shared_bytes_per_multiprocessor} shared bytes per SM, {gpu.flops_per_s / 1e12:.1f} TFLOP/s "
          f"sustained float32 (assumed {gpu_device.SUSTAINED_SHARE:.0%} of peak)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
