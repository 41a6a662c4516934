"""tools/gpu_check_summary.py: the GPU kit's text output as JSON. The log
below is written in the exact formats the kit and its test binaries print
(tools/gpu_check.sh, cc/tests/test_main.h, cc/tests/cuda_lanes_test.cu)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check_summary", ROOT / "tools" / "gpu_check_summary.py")
gpu_check_summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check_summary)

LOG = """\
== building the core with g++, CUDA code with /usr/local/cuda/bin/nvcc (Build cuda_13.0.r13.0), archs: 90
== built in 41 s: build/gpu_check/cuda_lanes_test, build/gpu_check/concurrent_layers_test
== driver: 580.65.06, NVIDIA H200 (code from nvcc 13.0 needs a driver that supports that CUDA version)
== CPU core tests
[ OK ] GemmMatchesInOrderReferenceBitForBit
10 passed, 0 failed
== GPU tests (cuBLAS where it loads)
device 0: NVIDIA H200 (sm_90), driver CUDA 13.0, runtime CUDA 13.0, GEMM: libcublas.so.13
[ OK ] PoolIsPerDeviceLazyAndReused
[FAIL] MatMulMatchesCpuAndIsBitwiseTheSameForEveryLaneCount: element 3: 1.000000 vs 2.000000
7 passed, 1 failed

GEMM: libcublas.so.13. Forward + input grad + filter grad, ms per step (median of 10):
layer (batch)                            k=1       k=2       k=4       k=8  best/k1
LeNet conv1 (64)                       0.210     0.150     0.120     0.118    1.78x
== GPU tests with the built-in GEMM (TF_GLP_CUDA_GEMM=builtin)
device 0: NVIDIA H200 (sm_90), driver CUDA 13.0, runtime CUDA 13.0, GEMM: built-in tiled GEMM
[ OK ] PoolIsPerDeviceLazyAndReused
8 passed, 0 failed
== profiler's GPU model: NVIDIA H200 (sm_90), 132 SMs, 2048 threads / 32 blocks / 65536 registers / 233472 shared bytes per SM, 50.2 TFLOP/s sustained float32 (assumed 75% of peak)
"""


def test_summary_has_versions_devices_tests_and_timings():
    summary = gpu_check_summary.summarize(LOG, exit_status=1)
    assert summary["driver"].startswith("580.65.06, NVIDIA H200")
    assert "archs: 90" in summary["build"]
    cpu, cublas, builtin = summary["sections"]
    assert cpu["name"] == "CPU core tests" and cpu["passed"] == 10
    assert cublas["device"] == {"name": "NVIDIA H200", "sm": "90", "driver_cuda": "13.0", "runtime_cuda": "13.0",
                                "gemm": "libcublas.so.13"}
    assert cublas["tests"]["PoolIsPerDeviceLazyAndReused"] == "ok"
    assert cublas["tests"]["MatMulMatchesCpuAndIsBitwiseTheSameForEveryLaneCount"] == \
        "FAIL: element 3: 1.000000 vs 2.000000"
    assert (cublas["passed"], cublas["failed"]) == (7, 1)
    assert cublas["timings"] == [{"layer": "LeNet conv1 (64)", "ms": {1: 0.21, 2: 0.15, 4: 0.12, 8: 0.118},
                                  "best_over_k1": 1.78}]
    assert builtin["device"]["gemm"] == "built-in tiled GEMM" and builtin["failed"] == 0
    assert summary["profiler_gpu_model"].startswith("NVIDIA H200 (sm_90), 132 SMs")
    assert summary["all_passed"] is False


def test_gpu_describe_says_when_the_driver_does_not_describe_a_gpu():
    import ctypes  # noqa: PLC0415

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        pass
    else:
        pytest.skip("this machine has a CUDA driver")
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_describe.py")], capture_output=True, text=True)
    assert out.returncode == 1
    line = out.stdout.strip()
    assert line == "== profiler's GPU model: FAILED (the CUDA driver did not describe device 0)"
    assert gpu_check_summary.summarize(line)["profiler_gpu_model"].startswith("FAILED")


def test_command_line_writes_json(tmp_path):
    log = tmp_path / "gpu_check.txt"
    log.write_text(LOG.replace("[FAIL] MatMul", "[ OK ] MatMul").replace("7 passed, 1 failed", "8 passed, 0 failed"))
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check_summary.py"), str(log),
                          "--exit-status", "0"], capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["all_passed"] is True
