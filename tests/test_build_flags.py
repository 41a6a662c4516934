"""The compiler flags are defined once (third_party/flags.bzl, Bazel's) and
every other build reads them from there: setup.py, cc/CMakeLists.txt and the
GPU kit (tools/gpu_check.sh). Each reader is run and compared."""

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _setup_module():
    spec = importlib.util.spec_from_file_location("tf_glp_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines; setup() runs only as __main__
    return module


FLAGS = _setup_module().read_flags()


def test_the_definition_has_what_the_kernels_rely_on():
    assert "-ffp-contract=off" in FLAGS["COMMON_FLAGS"]  # Note [Deterministic accumulation]
    assert "-DTF_GLP_HAVE_X86_KERNELS" in FLAGS["X86_FLAGS"]
    assert set(FLAGS["ISA_FLAGS"]) == {"_avx2.cc", "_avx512.cc"}
    assert all(arch.isdigit() for arch in FLAGS["CUDA_ARCHS"])


def test_setup_py_uses_them():
    setup = _setup_module()
    assert (setup.COMMON_FLAGS, setup.X86_FLAGS, setup.ISA_FLAGS, setup.CUDA_ARCHS) == (
        FLAGS["COMMON_FLAGS"], FLAGS["X86_FLAGS"], FLAGS["ISA_FLAGS"], FLAGS["CUDA_ARCHS"])


def test_the_gpu_kit_reads_them():
    out = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), "--print-flags"], capture_output=True,
                         text=True, check=True).stdout
    printed = {name: rest.split() for name, _, rest in (line.partition(" ") for line in out.splitlines())}
    assert printed == {"COMMON_FLAGS": FLAGS["COMMON_FLAGS"], "X86_FLAGS": FLAGS["X86_FLAGS"],
                       **FLAGS["ISA_FLAGS"]}


def test_cmake_reads_them(tmp_path):
    cmake = shutil.which("cmake", path=os.path.dirname(sys.executable)) or shutil.which("cmake")
    if cmake is None:
        pytest.skip("no cmake")
    out = subprocess.run([cmake, "-S", str(ROOT / "cc"), "-B", str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout
    match = re.search(r"tf_glp flags \(third_party/flags.bzl\): (.*); avx2 files: (.*); avx512 files: (.*)", out)
    assert match, out
    common, avx2, avx512 = (group.split(";") for group in match.groups())
    x86 = FLAGS["X86_FLAGS"] if platform.machine().lower() in ("x86_64", "amd64") else []
    assert common == FLAGS["COMMON_FLAGS"] + ["-Wall"] + x86
    assert (avx2, avx512) == (FLAGS["ISA_FLAGS"]["_avx2.cc"], FLAGS["ISA_FLAGS"]["_avx512.cc"])
