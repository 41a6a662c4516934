"""The Bazel wheel and `pip wheel .` hold the same files and code.

Both wheels are built by tools/bazel_ci.sh, which then runs this file with
TF_GLP_BAZEL_WHEEL and TF_GLP_PIP_WHEEL naming them; without those variables
the comparison is skipped (building both wheels takes minutes), and only the
listing helper's own tests run. By hand:

    tools/bazel_ci.sh                       # builds both, runs this file
    TF_GLP_BAZEL_WHEEL=dist/tf_glp-...whl TF_GLP_PIP_WHEEL=wheelhouse/tf_glp-...whl \\
        .venv/bin/python -m pytest -q tests/test_wheel_contents.py
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import zipfile

import pytest

_MARKER = re.compile(rb"tf_glp built against TensorFlow ([0-9][0-9A-Za-z.+-]*)\x00")
_OP_LIBRARY = "tf_glp/_tf_glp_ops.so"


def wheel_files(path: str) -> set[str]:
    """The files a wheel installs, without its build metadata (*.dist-info/)."""
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
    return {name for name in names if not name.endswith("/") and ".dist-info/" not in name}


def wheel_tag(path: str) -> str:
    """The wheel's compatibility tag from its file name (python-abi-platform)."""
    stem = os.path.basename(path)[: -len(".whl")]
    return "-".join(stem.split("-")[-3:])


@pytest.fixture(scope="module")
def wheels() -> tuple[str, str]:
    bazel = os.environ.get("TF_GLP_BAZEL_WHEEL")
    pip = os.environ.get("TF_GLP_PIP_WHEEL")
    if not (bazel and pip):
        pytest.skip(
            "TF_GLP_BAZEL_WHEEL / TF_GLP_PIP_WHEEL not set: tools/bazel_ci.sh "
            "builds both wheels and runs this comparison"
        )
    for path in (bazel, pip):
        assert os.path.isfile(path), f"no such wheel: {path}"
    return bazel, pip


def test_same_files(wheels: tuple[str, str]) -> None:
    bazel, pip = wheels
    bazel_files, pip_files = wheel_files(bazel), wheel_files(pip)
    assert bazel_files == pip_files, (
        f"only in the Bazel wheel: {sorted(bazel_files - pip_files)}; "
        f"only in the pip wheel: {sorted(pip_files - bazel_files)}"
    )
    assert _OP_LIBRARY in bazel_files


def test_same_tag(wheels: tuple[str, str]) -> None:
    bazel, pip = wheels
    assert wheel_tag(bazel) == wheel_tag(pip)


def test_same_python_files_byte_for_byte(wheels: tuple[str, str]) -> None:
    bazel, pip = wheels
    with zipfile.ZipFile(bazel) as b, zipfile.ZipFile(pip) as p:
        differing = [
            name
            for name in sorted(wheel_files(bazel) & wheel_files(pip))
            if not name.endswith(".so") and b.read(name) != p.read(name)
        ]
    assert not differing, f"files that differ between the wheels: {differing}"


def test_both_libraries_carry_the_same_build_marker(wheels: tuple[str, str]) -> None:
    """tf_glp/_native.py refuses a library without it (cc/tf/library_info.cc)."""
    markers = []
    for path in wheels:
        with zipfile.ZipFile(path) as wheel:
            match = _MARKER.search(wheel.read(_OP_LIBRARY))
        assert match, f"{path}: {_OP_LIBRARY} has no 'tf_glp built against TensorFlow' marker"
        markers.append(match.group(1))
    assert markers[0] == markers[1]


# Symbols the linker itself defines (their presence depends on the linker's
# command line, not on the code).
_LINKER_SYMBOLS = {"__bss_start", "_edata", "_end"}


def dynamic_symbols(library: bytes, tmp_dir: str) -> tuple[set[str], set[str]]:
    """(defined, undefined) dynamic symbol names of a shared library, by nm."""
    path = os.path.join(tmp_dir, "library.so")
    with open(path, "wb") as f:
        f.write(library)

    def names(option: str) -> set[str]:
        output = subprocess.run(["nm", "-D", option, path], check=True, capture_output=True, text=True).stdout
        return {line.split()[-1] for line in output.splitlines() if line.strip()}

    return names("--defined-only") - _LINKER_SYMBOLS, names("--undefined-only")


def test_both_libraries_hold_the_same_code(wheels: tuple[str, str], tmp_path) -> None:
    """Same exported and imported symbols: the same ops, kernels and CUDA
    code, linked against the same TensorFlow and CUDA runtime entry points."""
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    symbols = []
    for index, path in enumerate(wheels):
        with zipfile.ZipFile(path) as wheel:
            folder = tmp_path / str(index)
            folder.mkdir()
            symbols.append(dynamic_symbols(wheel.read(_OP_LIBRARY), str(folder)))
    (bazel_defined, bazel_undefined), (pip_defined, pip_undefined) = symbols
    assert bazel_defined == pip_defined, (
        f"defined only by the Bazel library: {sorted(bazel_defined - pip_defined)[:20]}; "
        f"only by setup.py's: {sorted(pip_defined - bazel_defined)[:20]}"
    )
    assert bazel_undefined == pip_undefined, (
        f"needed only by the Bazel library: {sorted(bazel_undefined - pip_undefined)[:20]}; "
        f"only by setup.py's: {sorted(pip_undefined - bazel_undefined)[:20]}"
    )


def test_wheel_files_leaves_out_metadata_and_folders(tmp_path) -> None:
    path = tmp_path / "tf_glp-0.1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("tf_glp/", "")
        wheel.writestr("tf_glp/__init__.py", "")
        wheel.writestr("tf_glp/_tf_glp_ops.so", b"\x7fELF")
        wheel.writestr("tf_glp-0.1.0.dist-info/RECORD", "")
        wheel.writestr("tf_glp-0.1.0.dist-info/METADATA", "")
    assert wheel_files(str(path)) == {"tf_glp/__init__.py", "tf_glp/_tf_glp_ops.so"}
    assert wheel_tag(str(path)) == "cp311-cp311-linux_x86_64"
