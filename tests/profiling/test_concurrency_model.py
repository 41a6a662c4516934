"""The analytical cap on lane counts: on this CPU and on a described GPU."""

import dataclasses

import pytest

from tf_glp.profiling import concurrency_model as model

H200 = model.KNOWN_GPUS["H200"]


def test_occupancy_limits():
    # 256 threads, 32 registers: 8 blocks by threads, 8 by registers on an SM
    # of 2048 threads and 64 Ki registers.
    assert model.blocks_per_multiprocessor(H200, model.IM2COL_LAUNCH) == 8
    heavy = model.KernelLaunch(threads_per_block=256, registers_per_thread=128, shared_bytes_per_block=100 << 10)
    assert model.blocks_per_multiprocessor(H200, heavy) == 2  # shared memory and registers bind


def test_gpu_cap_small_layer_is_bounded_by_launch_overhead_and_batch():
    # LeNet's first convolution: tiny per-sample kernels, launches dominate.
    lenet = model.LayerWork("conv2d", batch=64, flops_per_sample=2 * 24 * 24 * 25 * 20, im2col_elements_per_sample=24 * 24 * 25)
    cap, why = model.gpu_cap(lenet, H200)
    assert cap == 1 and "launch" in why
    fast_launch = dataclasses.replace(H200, launch_overhead_s=1e-12)
    cap, _ = model.gpu_cap(lenet, fast_launch)
    assert cap == min(64, 132 * 8 // -(-24 * 24 * 25 // 256))  # occupancy bound: resident blocks / blocks per sample


def test_gpu_cap_large_layer_fills_the_gpu_alone():
    big = model.LayerWork("conv2d", batch=128, flops_per_sample=2 * 56 * 56 * 9 * 256 * 256,
                          im2col_elements_per_sample=56 * 56 * 9 * 256)
    cap, why = model.gpu_cap(big, H200)
    assert cap == 1 and "resident blocks" in why


def test_cpu_cap_threads_and_work():
    work = model.LayerWork("dense", batch=256, flops_per_sample=2 * 784 * 2048)
    assert model.cpu_cap(work, threads=2)[0] == 2
    assert model.cpu_cap(work, threads=16)[0] == 16
    tiny = model.LayerWork("dense", batch=4, flops_per_sample=2 * 8 * 4)
    cap, why = model.cpu_cap(tiny, threads=16)
    assert cap == 1 and "by work" in why


@pytest.mark.parametrize("cap,expected", [(1, [1]), (2, [1, 2]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8])])
def test_candidates(cap, expected):
    assert model.candidates(cap) == expected


def test_known_gpus_by_whole_word():
    assert model.known_gpu("NVIDIA H200").name == "H200"
    assert model.known_gpu("NVIDIA L4").name == "L4"
    assert model.known_gpu("NVIDIA L40S") is None
    assert model.known_gpu("Tesla T4").name == "T4"
