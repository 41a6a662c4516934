"""The GPU facts the analytical model needs, asked of the GPU itself.

GLP4NN's model (concurrency_model.gpu_cap) needs each SM's limits (resident
threads, blocks, registers, shared memory), the SM count, the device's
float32 rate, and the resources of tf_glp's own kernel as compiled for it.
The device's come from the CUDA driver (libcuda, which TensorFlow loads for
any GPU it sees) through cuDeviceGetAttribute, whose attribute numbers are
fixed in cuda.h; the kernel's from the op library's tf_glp_im2col_launch
(cudaFuncGetAttributes, cc/cuda/concurrent_ops.h). ctypes only, so nothing
here needs a build or TensorFlow (tools/gpu_check.sh runs describe() on the
GPU machine, which has no TensorFlow), and the functions take the library
as an argument so that tests can describe a GPU that is not there.
"""

from __future__ import annotations

import ctypes
import dataclasses


@dataclasses.dataclass(frozen=True)
class KernelLaunch:
    """A tf_glp CUDA kernel's launch resources (cc/cuda/concurrent_ops.cu)."""

    threads_per_block: int
    registers_per_thread: int
    shared_bytes_per_block: int


@dataclasses.dataclass(frozen=True)
class GpuDescription:
    """The device properties the model needs (describe() reads them from the driver)."""

    name: str
    multiprocessors: int
    max_threads_per_multiprocessor: int
    max_blocks_per_multiprocessor: int
    registers_per_multiprocessor: int
    shared_bytes_per_multiprocessor: int
    flops_per_s: float  # sustained float32 GEMM rate
    launch_overhead_s: float = 5e-6


# CUdevice_attribute values (cuda.h).
_CLOCK_KHZ = 13
_MULTIPROCESSORS = 16
_THREADS_PER_MULTIPROCESSOR = 39
_CAPABILITY_MAJOR = 75
_CAPABILITY_MINOR = 76
_SHARED_BYTES_PER_MULTIPROCESSOR = 81
_REGISTERS_PER_MULTIPROCESSOR = 82
_BLOCKS_PER_MULTIPROCESSOR = 106

# The share of the peak float32 FMA rate that a layer's GEMMs are assumed to
# sustain (an assumption: it only scales the kernel-time vs launch-overhead
# bound).
SUSTAINED_SHARE = 0.75


def float32_lanes_per_multiprocessor(major: int, minor: int) -> int:
    """float32 FMAs per clock per SM (CUDA C++ Programming Guide, table of
    arithmetic instruction throughput): 64 on compute capability 6.0, 7.x
    and 8.0, 128 on the others from 5.0 on."""
    return 64 if (major, minor) in ((6, 0), (8, 0)) or major == 7 else 128


def load_driver():
    """libcuda, or None where there is no CUDA driver."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def describe(driver, ordinal: int = 0) -> GpuDescription | None:
    """The description of CUDA device `ordinal` (TensorFlow's GPU:ordinal:
    both number the devices the driver shows), or None if `driver` is None
    or any call fails."""
    device, name = ctypes.c_int(), ctypes.create_string_buffer(256)
    if (driver is None or driver.cuInit(0) != 0 or driver.cuDeviceGet(ctypes.byref(device), ordinal) != 0
            or driver.cuDeviceGetName(name, len(name), device) != 0):
        return None

    def attribute(number: int) -> int | None:
        value = ctypes.c_int()
        return value.value if driver.cuDeviceGetAttribute(ctypes.byref(value), number, device) == 0 else None

    values = {number: attribute(number) for number in (
        _CLOCK_KHZ, _MULTIPROCESSORS, _THREADS_PER_MULTIPROCESSOR, _CAPABILITY_MAJOR, _CAPABILITY_MINOR,
        _SHARED_BYTES_PER_MULTIPROCESSOR, _REGISTERS_PER_MULTIPROCESSOR, _BLOCKS_PER_MULTIPROCESSOR)}
    if any(value is None or value <= 0 for key, value in values.items() if key != _CAPABILITY_MINOR):
        return None
    major, minor = values[_CAPABILITY_MAJOR], values[_CAPABILITY_MINOR]
    peak = 2.0 * values[_MULTIPROCESSORS] * float32_lanes_per_multiprocessor(major, minor) * values[_CLOCK_KHZ] * 1e3
    return GpuDescription(
        name=f"{name.value.decode(errors='replace')} (sm_{major}{minor})",
        multiprocessors=values[_MULTIPROCESSORS],
        max_threads_per_multiprocessor=values[_THREADS_PER_MULTIPROCESSOR],
        max_blocks_per_multiprocessor=values[_BLOCKS_PER_MULTIPROCESSOR],
        registers_per_multiprocessor=values[_REGISTERS_PER_MULTIPROCESSOR],
        shared_bytes_per_multiprocessor=values[_SHARED_BYTES_PER_MULTIPROCESSOR],
        flops_per_s=SUSTAINED_SHARE * peak,
    )


def im2col_launch(op_library_path: str | None) -> KernelLaunch | None:
    """The im2col kernel's resources as compiled for the current GPU, from
    the op library at `op_library_path` (None: no library, a library built
    without CUDA, or no device: the call fails)."""
    if op_library_path is None:
        return None
    try:
        function = ctypes.CDLL(op_library_path).tf_glp_im2col_launch
    except (OSError, AttributeError):
        return None
    threads, registers, shared = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if function(ctypes.byref(threads), ctypes.byref(registers), ctypes.byref(shared)) != 0:
        return None
    return KernelLaunch(threads.value, registers.value, shared.value)
