"""How many lanes can a layer use? The analytical cap on the candidates the
start-up profiler times (GLP4NN, ICPP 2018, section "analytical model").

GLP4NN runs a layer's per-sample kernels on several CUDA streams at once.
More streams only help while (a) one sample's kernels leave part of the GPU
idle — the blocks of k concurrent kernels must fit the blocks the SMs can
hold at once, given each kernel's threads, registers and shared memory — and
(b) a kernel runs longer than it takes to launch the next one, otherwise
the launches, not the GPU, are the bottleneck. On a CPU the lanes are
threads: no more than the cores TensorFlow lets an op use, and no more than
leaves each lane enough work to pay for waking a thread.

Pure Python on shapes and device descriptions: testable without a GPU.
"""

from __future__ import annotations

import dataclasses
import math

from tf_glp._limits import MAX_CONCURRENCY
from tf_glp.profiling.gpu_device import GpuDescription, KernelLaunch


@dataclasses.dataclass(frozen=True)
class LayerWork:
    """One layer's forward work, split over the batch.

    Attributes:
        kind: "conv2d" or "dense".
        batch: Samples (conv2d) or rows (dense) that lanes share out.
        flops_per_sample: Multiply-adds x 2 of one sample's (row's) output.
        im2col_elements_per_sample: Elements of one sample's column matrix
            (conv2d; 0 for dense), the widest elementwise kernel.
    """

    kind: str
    batch: int
    flops_per_sample: float
    im2col_elements_per_sample: int = 0


# tf_glp's im2col kernel when the op library cannot say (gpu_device.py asks
# it): 256 threads, no shared memory, 34 registers as `nvcc -Xptxas -v`
# reports for sm_90 (32 for sm_80).
IM2COL_LAUNCH = KernelLaunch(threads_per_block=256, registers_per_thread=34, shared_bytes_per_block=0)


WARP = 32
REGISTERS_PER_WARP_UNIT = 256  # registers are given to warps in blocks of 256


def blocks_per_multiprocessor(gpu: GpuDescription, launch: KernelLaunch) -> int:
    """Resident blocks of one kernel per SM, limited by threads, blocks,
    registers (allocated per warp, in units of 256) and shared memory: what
    cudaOccupancyMaxActiveBlocksPerMultiprocessor computes, without the
    shared-memory allocation granularity (tf_glp's kernels use none)."""
    by_threads = gpu.max_threads_per_multiprocessor // launch.threads_per_block
    warps_per_block = -(-launch.threads_per_block // WARP)
    registers_per_warp = -(-launch.registers_per_thread * WARP // REGISTERS_PER_WARP_UNIT) * REGISTERS_PER_WARP_UNIT
    by_registers = (gpu.registers_per_multiprocessor // max(1, registers_per_warp)) // warps_per_block
    by_shared = (gpu.shared_bytes_per_multiprocessor // launch.shared_bytes_per_block
                 if launch.shared_bytes_per_block else gpu.max_blocks_per_multiprocessor)
    return max(0, min(gpu.max_blocks_per_multiprocessor, by_threads, by_registers, by_shared))


def gpu_cap(work: LayerWork, gpu: GpuDescription, launch: KernelLaunch = IM2COL_LAUNCH) -> tuple[int, str]:
    """The most lanes worth timing on `gpu`, and why."""
    resident = gpu.multiprocessors * blocks_per_multiprocessor(gpu, launch)
    elements = work.im2col_elements_per_sample or max(1, int(work.flops_per_sample // 2))
    blocks_per_sample = max(1, math.ceil(elements / launch.threads_per_block))
    by_occupancy = max(1, resident // blocks_per_sample)
    kernel_s = work.flops_per_sample / gpu.flops_per_s
    by_launch = max(1, math.floor(kernel_s / gpu.launch_overhead_s))
    cap = max(1, min(by_occupancy, by_launch, work.batch, MAX_CONCURRENCY))
    why = (f"{gpu.name}: one sample's kernel fills {blocks_per_sample} of {resident} resident blocks "
           f"(<= {by_occupancy} at once); it runs ~{kernel_s * 1e6:.1f} us per {gpu.launch_overhead_s * 1e6:.0f} us "
           f"launch (<= {by_launch}); batch {work.batch}")
    return cap, why


# A lane must have at least this much work to pay for waking a thread
# (about 10 us of one core's float32 GEMM).
MIN_FLOPS_PER_LANE = 2e5


def cpu_cap(work: LayerWork, threads: int) -> tuple[int, str]:
    """The most lanes worth timing on a CPU with `threads` threads for ops."""
    total = work.flops_per_sample * work.batch
    by_work = max(1, int(total // MIN_FLOPS_PER_LANE))
    cap = max(1, min(threads, by_work, work.batch, MAX_CONCURRENCY))
    why = f"{threads} threads for ops; {total / 1e6:.1f} MFLOP over {work.batch} samples (<= {by_work} lanes by work)"
    return cap, why


def candidates(cap: int) -> list[int]:
    """Lane counts to time: powers of two up to the cap, and the cap."""
    counts = [1]
    while counts[-1] * 2 <= cap:
        counts.append(counts[-1] * 2)
    if counts[-1] != cap:
        counts.append(cap)
    return counts
