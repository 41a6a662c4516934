"""Builds tf_glp and its native op library, tf_glp/_tf_glp_ops.so.

The op library is compiled with the system C++ compiler and TensorFlow's own
flags (tf.sysconfig): custom ops are tied to the C++ ABI of the TensorFlow
they are built against, which is why tensorflow is pinned to one minor
version in pyproject.toml. When nvcc is found (or TF_GLP_CUDA=1), CUDA
sources (cc/**/*.cu.cc, cc/cuda/*.cu) are compiled too and linked against the
CUDA runtime that TensorFlow itself loads; TF_GLP_CUDA=0 turns that off.

Environment: CXX (compiler, default g++), NVCC (default: nvcc on PATH, then
/usr/local/cuda/bin/nvcc), TF_GLP_CUDA (auto / 1 / 0), TF_GLP_BUILD_JOBS.
"""

from __future__ import annotations

import ast
import concurrent.futures
import glob
import os
import platform
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))

# The compiler flags are defined once, in third_party/flags.bzl (Bazel's),
# and read from there by this file, cc/CMakeLists.txt and tools/gpu_check.sh.
FLAGS_FILE = os.path.join(ROOT, "third_party", "flags.bzl")


def read_flags(path: str = FLAGS_FILE) -> dict:
    """flags.bzl's literal assignments (COMMON_FLAGS, X86_FLAGS, ISA_FLAGS:
    per-file instruction sets, CUDA_ARCHS)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    names = ("COMMON_FLAGS", "X86_FLAGS", "ISA_FLAGS", "CUDA_ARCHS")
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) in names}


_FLAGS = read_flags()
COMMON_FLAGS = _FLAGS["COMMON_FLAGS"]
X86_FLAGS = _FLAGS["X86_FLAGS"]
ISA_FLAGS = _FLAGS["ISA_FLAGS"]
CUDA_ARCHS = _FLAGS["CUDA_ARCHS"]


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def _sources(pattern: str) -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True))


def cxx_sources() -> list[str]:
    sources = _sources("cc/core/*.cc") + _sources("cc/tf/**/*.cc")
    sources = [s for s in sources if not s.endswith(".cu.cc")]
    if not _is_x86():
        sources = [s for s in sources if not s.endswith(tuple(ISA_FLAGS))]
    return sources


def cuda_sources() -> list[str]:
    return _sources("cc/**/*.cu.cc") + _sources("cc/cuda/*.cu")


def find_nvcc() -> str | None:
    setting = os.environ.get("TF_GLP_CUDA", "auto").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return None
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if nvcc is None and os.path.exists("/usr/local/cuda/bin/nvcc"):
        nvcc = "/usr/local/cuda/bin/nvcc"
    if nvcc is None and setting in ("1", "true", "yes", "on"):
        raise SystemExit(
            "tf_glp: TF_GLP_CUDA=1 but no nvcc was found (set NVCC=/path/to/nvcc "
            "or put it on PATH)."
        )
    return nvcc


def find_cxx() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None or shutil.which(cxx) is None:
        raise SystemExit(
            "tf_glp: no C++ compiler found, so the native op library cannot be "
            "built. Install one (Debian/Ubuntu: apt-get install g++) or set CXX. "
            "(Set TF_GLP_NATIVE=0 at run time to use the pure-TensorFlow ops.)"
        )
    return cxx


def tensorflow_flags() -> tuple[list[str], list[str], str]:
    try:
        import tensorflow as tf  # noqa: PLC0415 (only needed at build time)
    except ImportError as error:
        raise SystemExit(
            "tf_glp: building the op library needs TensorFlow importable "
            f"({error}). pip's isolated build installs it from pyproject.toml; "
            "with --no-build-isolation, install tensorflow==2.21.* first."
        ) from error
    compile_flags = list(tf.sysconfig.get_compile_flags())
    link_flags = list(tf.sysconfig.get_link_flags())
    return compile_flags, link_flags, tf.__version__


def _newer(target: str, dependencies: list[str]) -> bool:
    """True when target exists and is newer than every dependency."""
    if not os.path.exists(target):
        return False
    stamp = os.path.getmtime(target)
    return all(os.path.exists(d) and os.path.getmtime(d) <= stamp for d in dependencies)


def _object_is_current(obj: str) -> bool:
    """True when obj is newer than its source, every header the compiler
    listed in obj.d (written by -MMD / nvcc -MD), this file and the flags."""
    depfile = obj + ".d"
    if not os.path.exists(depfile):
        return False
    with open(depfile) as f:
        text = f.read().replace("\\\n", " ")
    dependencies = [d for d in text.partition(":")[2].split() if d != "\\"]
    return _newer(obj, [*dependencies, os.path.abspath(__file__), FLAGS_FILE])


class BuildNativeOps(build_ext):
    """Compiles the op library with TensorFlow's flags (see module doc)."""

    def get_ext_filename(self, fullname: str) -> str:
        # A TensorFlow op library, not a Python extension module: no ABI tag,
        # so tf_glp/_native.py finds it by its plain name.
        return os.path.join(*fullname.split(".")) + ".so"

    def build_extension(self, ext: Extension) -> None:
        output = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(output), exist_ok=True)
        cxx = find_cxx()
        tf_compile, tf_link, tf_version = tensorflow_flags()
        # Objects live in the source tree, not in build_temp (which pip makes
        # anew for every editable install), so rebuilds are incremental; they
        # depend on the TensorFlow headers, hence one folder per version.
        object_dir = os.path.join(ROOT, "build", "native", f"tf{tf_version}")
        os.makedirs(object_dir, exist_ok=True)
        base = [
            *COMMON_FLAGS, *tf_compile, f"-I{ROOT}", "-Wno-deprecated-declarations",
            f'-DTF_GLP_BUILT_AGAINST_TF="{tf_version}"',
        ]
        if _is_x86():
            base += X86_FLAGS

        jobs = []
        for source in cxx_sources():
            extra = next((f for suffix, f in ISA_FLAGS.items() if source.endswith(suffix)), [])
            obj = os.path.join(object_dir, os.path.relpath(source, ROOT).replace(os.sep, "_") + ".o")
            jobs.append((obj, source, [cxx, *base, *extra, "-MMD", "-MF", obj + ".d", "-c", source, "-o", obj]))

        nvcc = find_nvcc()
        cuda = nvcc is not None and bool(cuda_sources())
        if cuda:
            gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in CUDA_ARCHS]
            gencode.append(f"-gencode=arch=compute_{CUDA_ARCHS[-1]},code=compute_{CUDA_ARCHS[-1]}")
            for source in cuda_sources():
                obj = os.path.join(object_dir, os.path.relpath(source, ROOT).replace(os.sep, "_") + ".o")
                command = [
                    nvcc, "-x", "cu", "-std=c++17", "-O3", "-DGOOGLE_CUDA=1",
                    "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC",
                    "-Xcompiler", "-ffp-contract=off",
                    *[f for f in tf_compile if f.startswith(("-I", "-D"))],
                    f"-I{ROOT}", *gencode, "-MD", "-MF", obj + ".d", "-c", source, "-o", obj,
                ]
                jobs.append((obj, source, command))

        def compile_one(job):
            obj, source, command = job
            if _object_is_current(obj):
                return obj
            print(" ".join(command), flush=True)
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(
                    f"tf_glp: compiling {os.path.relpath(source, ROOT)} failed:\n"
                    f"{result.stdout}{result.stderr}"
                )
            return obj

        workers = int(os.environ.get("TF_GLP_BUILD_JOBS", os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            objects = list(pool.map(compile_one, jobs))

        if _newer(output, objects):
            return
        link = [
            cxx, "-shared", *objects, "-o", output, *tf_link, "-pthread",
            # Find libtensorflow_framework.so.2 next to us in site-packages.
            "-Wl,-rpath,$ORIGIN/../tensorflow",
        ]
        # No -lcudart: CUDA runtime calls bind to the runtime TensorFlow loads.
        print(" ".join(link), flush=True)
        subprocess.run(link, check=True)


if __name__ == "__main__":  # as setuptools runs it; tests import read_flags
    setup(
        ext_modules=[Extension("tf_glp._tf_glp_ops", sources=[])],
        cmdclass={"build_ext": BuildNativeOps},
    )
