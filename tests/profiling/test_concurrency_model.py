"""The analytical cap on lane counts: on this CPU and on a described GPU
(described by a fake CUDA driver: the properties an H200 reports)."""

import dataclasses

import pytest

import tf_glp
from tf_glp.profiling import concurrency_model as model
from tf_glp.profiling import choice, device_facts, gpu_device

# What cuDeviceGetAttribute reports for an H200 (attribute number: value).
H200_ATTRIBUTES = {13: 1_980_000, 16: 132, 39: 2048, 75: 9, 76: 0, 81: 233_472, 82: 65_536, 106: 32}


class FakeDriver:
    """libcuda's four calls that gpu_device uses, for a GPU that is not here."""

    def __init__(self, attributes, name=b"NVIDIA H200"):
        self.attributes, self.name = attributes, name

    def cuInit(self, flags):
        return 0

    def cuDeviceGet(self, device, ordinal):
        device._obj.value = ordinal
        return 0

    def cuDeviceGetName(self, buffer, length, device):
        buffer.value = self.name[:length - 1]
        return 0

    def cuDeviceGetAttribute(self, value, number, device):
        if number not in self.attributes:
            return 1  # CUDA_ERROR_INVALID_VALUE
        value._obj.value = self.attributes[number]
        return 0


H200 = gpu_device.describe(FakeDriver(H200_ATTRIBUTES))


def test_the_driver_describes_the_gpu():
    assert H200.name == "NVIDIA H200 (sm_90)"
    assert (H200.multiprocessors, H200.max_threads_per_multiprocessor, H200.max_blocks_per_multiprocessor,
            H200.registers_per_multiprocessor, H200.shared_bytes_per_multiprocessor) == (132, 2048, 32, 65536, 233472)
    # 132 SMs x 128 float32 FMA lanes x 2 flops x 1.98 GHz = 66.9 TFLOP/s peak.
    assert H200.flops_per_s == pytest.approx(0.75 * 66.9e12, rel=1e-3)
    a100 = gpu_device.describe(FakeDriver({**H200_ATTRIBUTES, 13: 1_410_000, 16: 108, 75: 8, 76: 0}))
    assert a100.flops_per_s == pytest.approx(0.75 * 19.5e12, rel=1e-2)  # 64 lanes per SM on sm_80
    broken = dict(H200_ATTRIBUTES)
    del broken[82]
    assert gpu_device.describe(FakeDriver(broken)) is None
    assert gpu_device.describe(None) is None


def test_no_gpu_here_means_no_description_and_the_default_launch():
    # This machine has no CUDA driver; the op library's query then fails
    # cleanly (built with CUDA or not) and the profiler uses the default.
    status = tf_glp.native_available()
    assert gpu_device.im2col_launch(status.path if status.available else None) is None
    assert device_facts.gpu_kernel_launch() == model.IM2COL_LAUNCH


def test_occupancy_limits():
    # 256 threads (8 warps), 34 registers: a warp gets 34 x 32 = 1088
    # registers rounded up to 1280, so 51 warps' worth of 64 Ki: 6 blocks
    # (threads alone would allow 8).
    assert model.blocks_per_multiprocessor(H200, model.IM2COL_LAUNCH) == 6
    light = dataclasses.replace(model.IM2COL_LAUNCH, registers_per_thread=32)
    assert model.blocks_per_multiprocessor(H200, light) == 8
    heavy = model.KernelLaunch(threads_per_block=256, registers_per_thread=128, shared_bytes_per_block=100 << 10)
    assert model.blocks_per_multiprocessor(H200, heavy) == 2  # shared memory and registers bind


def test_the_profiler_uses_the_described_gpu(monkeypatch):
    monkeypatch.setattr(device_facts, "device_kind", lambda: "gpu")
    monkeypatch.setattr(device_facts, "gpu_description", lambda: H200)
    work = model.LayerWork("conv2d", batch=32, flops_per_sample=2 * 16 * 16 * 9 * 32 * 64,
                           im2col_elements_per_sample=16 * 16 * 9 * 32)
    assert device_facts.cap_for(work) == model.gpu_cap(work, H200, model.IM2COL_LAUNCH)
    monkeypatch.setattr(device_facts, "gpu_description", lambda: None)
    cap, why = device_facts.cap_for(work)
    assert cap == 8 and "driver" in why


def test_gpu_cap_small_layer_is_bounded_by_launch_overhead_and_batch():
    # LeNet's first convolution: tiny per-sample kernels, launches dominate.
    lenet = model.LayerWork("conv2d", batch=64, flops_per_sample=2 * 24 * 24 * 25 * 20, im2col_elements_per_sample=24 * 24 * 25)
    cap, why = model.gpu_cap(lenet, H200)
    assert cap == 1 and "launch" in why
    fast_launch = dataclasses.replace(H200, launch_overhead_s=1e-12)
    cap, _ = model.gpu_cap(lenet, fast_launch)
    assert cap == min(64, 132 * 6 // -(-24 * 24 * 25 // 256))  # occupancy bound: resident blocks / blocks per sample


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


def _candidates(*timings):
    from tf_glp.profiling.plan import Candidate  # noqa: PLC0415

    return [Candidate(k, median, spread) for k, (median, spread) in zip([None, 1, 2, 4], timings)]


@pytest.mark.parametrize("timings,expected", [
    # k=2 clearly faster (2.5x, outside native's spread, even though native is noisy).
    (((0.500, 0.184), (0.300, 0.020), (0.200, 0.040)), 2),
    # The same with k=1 within k=2's spread: the simpler k=1 (2.3x).
    (((0.500, 0.184), (0.215, 0.020), (0.200, 0.040)), 1),
    # Faster but not by MIN_SPEEDUP (1.9x): native.
    (((0.38, 0.01), (0.20, 0.01), (0.21, 0.01)), None),
    # 2.5x faster by the medians but inside native's spread: native.
    (((0.50, 0.70), (0.20, 0.0), (0.45, 0.0)), None),
    # One trial (no spread): the fastest, if 2x faster.
    (((0.80, 0.0), (0.39, 0.0), (0.40, 0.0)), 1),
    (((0.30, 0.0), (0.29, 0.0), (0.31, 0.0)), None),
])
def test_choice_needs_a_clear_speedup_and_prefers_fewer_lanes(timings, expected):
    assert choice.MIN_SPEEDUP == 2.0
    choice_made, reason = choice.choose(_candidates(*timings))
    assert choice_made == expected, reason


def test_choice_reasons_name_the_rule():
    assert "needs 2.0x" in choice.choose(_candidates((0.39, 0.01), (0.30, 0.01)))[1]
    assert choice.choose(_candidates((0.30, 0.01), (0.35, 0.01)))[1] == "fastest (0.300 ms)"


def test_the_model_and_the_plan_are_pure_python():
    # What the docstrings promise: planning code loads without TensorFlow.
    import subprocess
    import sys

    code = ("import sys; import tf_glp.profiling.concurrency_model, tf_glp.profiling.gpu_device, "
            "tf_glp.profiling.choice, tf_glp.plan; print('tensorflow' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"


def test_the_lane_limit_is_the_native_cores():
    import pathlib
    import re

    from tf_glp._limits import MAX_CONCURRENCY

    header = (pathlib.Path(__file__).parents[2] / "cc" / "core" / "lane_pool.h").read_text()
    assert int(re.search(r"kMaxLanes = (\d+);", header).group(1)) == MAX_CONCURRENCY
