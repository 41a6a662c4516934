"""Lazy loading of the native op library, and the switch to pure-TF ops.

`import tf_glp` loads nothing native. The first op that wants the library
calls `library()`, which loads `_tf_glp_ops.so` once with
`tf.load_op_library`. If the file is missing, fails to load, or was built
against another TensorFlow minor version (custom ops are tied to
TensorFlow's C++ ABI), tf_glp warns once and every op uses its pure-TensorFlow
fallback, which computes the same numbers to rounding (docs/numerics.md).

Environment:
    TF_GLP_NATIVE=0   never load; use the fallbacks.
    TF_GLP_NATIVE=1   a failed load is an error (ImportError).
    (unset / auto)    load if possible, else warn once and fall back.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import threading
import warnings
from types import ModuleType

_LIBRARY_NAME = "_tf_glp_ops.so"
_MARKER = re.compile(rb"tf_glp built against TensorFlow ([0-9][0-9A-Za-z.+-]*)\x00")
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class NativeStatus:
    """Which implementation tf_glp's ops use, and why.

    Truthy when the native library is in use.

    Attributes:
        available: True when the native op library is loaded and used.
        reason: A sentence saying why (or why not).
        path: Path of the op library file (whether or not it loaded).
        cpu_kernels: Vector instruction set of the native CPU code, host
            kernels and the layers' GEMM alike ("avx512", "avx2" or
            "scalar"; TF_GLP_ISA lowers it), or "" without the library.

    Example:
        >>> import tf_glp
        >>> status = tf_glp.native_available()
        >>> print(status)  # e.g. "native: ... (CPU kernels: avx512)"
    """

    available: bool
    reason: str
    path: str
    cpu_kernels: str = ""

    def __bool__(self) -> bool:
        return self.available

    def __str__(self) -> str:
        prefix = "native" if self.available else "fallback (pure TensorFlow)"
        return f"{prefix}: {self.reason}"


def library_path() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIBRARY_NAME)


def _mode() -> str:
    value = os.environ.get("TF_GLP_NATIVE", "auto").strip().lower()
    if value in ("0", "false", "no", "off"):
        return "off"
    if value in ("1", "true", "yes", "on"):
        return "required"
    if value in ("", "auto"):
        return "auto"
    raise ValueError(f"TF_GLP_NATIVE must be 0, 1 or auto, got {value!r}")


def _built_against(path: str) -> str | None:
    """The TensorFlow version in the library's build marker (see
    cc/tf/library_info.cc), read from the file without loading it."""
    with open(path, "rb") as f:
        match = _MARKER.search(f.read())
    return match.group(1).decode() if match else None


def _try_load() -> tuple[NativeStatus, ModuleType | None]:
    import tensorflow as tf  # noqa: PLC0415 (lazy: keeps `import tf_glp` cheap)

    path = library_path()
    if not os.path.exists(path):
        return NativeStatus(False, f"{path} does not exist (tf_glp was not built with its op library)", path), None
    built_for = _built_against(path)
    if built_for is None:
        return NativeStatus(False, f"{path} carries no build marker (not a tf_glp op library?)", path), None
    if built_for.split(".")[:2] != tf.__version__.split(".")[:2]:
        reason = f"{path} was built for TensorFlow {built_for} but TensorFlow {tf.__version__} is installed"
        return NativeStatus(False, f"{reason}; reinstall tf_glp to rebuild it", path), None
    try:
        module = tf.load_op_library(path)
        # Already loaded by TensorFlow: this only looks up a C function.
        info = ctypes.CDLL(path)
        info.tf_glp_cpu_kernels.restype = ctypes.c_char_p
        cpu_kernels = info.tf_glp_cpu_kernels().decode()
    except (tf.errors.NotFoundError, OSError, AttributeError) as error:
        return NativeStatus(False, f"tf.load_op_library({path}) failed: {error}", path), None
    reason = f"{path}, built for TensorFlow {built_for} (CPU kernels: {cpu_kernels})"
    return NativeStatus(True, reason, path, cpu_kernels), module


class _Loaded:
    """The load decision, kept on an object rather than in module globals:
    the first load can happen while AutoGraph converts a user's tf.function,
    and AutoGraph-converted code does not reliably write `global` names."""

    state: NativeStatus | None = None
    module: ModuleType | None = None


def _ensure_loaded() -> None:
    if _Loaded.state is not None:
        return
    with _lock:
        if _Loaded.state is not None:
            return
        mode = _mode()
        if mode == "off":
            state, module = NativeStatus(False, "disabled by TF_GLP_NATIVE=0", library_path()), None
        else:
            state, module = _try_load()
            if not state.available:
                if mode == "required":
                    raise ImportError(f"tf_glp: TF_GLP_NATIVE=1 but the native op library is unusable: {state.reason}")
                warnings.warn(
                    f"tf_glp: using pure-TensorFlow ops in place of the native ones (the same results to rounding, docs/numerics.md; their speed is not measured): {state.reason}. "
                    "Set TF_GLP_NATIVE=0 to silence this.",
                    RuntimeWarning,
                    stacklevel=3,
                )
        _Loaded.module = module
        _Loaded.state = state


def native_available() -> NativeStatus:
    """Says whether tf_glp's ops run natively or on pure-TF fallbacks, and why.

    Loads the op library on first call (see module doc for TF_GLP_NATIVE).

    Returns:
        A NativeStatus, truthy when the native library is in use.

    Example:
        >>> import tf_glp
        >>> if not tf_glp.native_available():
        ...     print("pure-TensorFlow fallback:", tf_glp.native_available().reason)
    """
    _ensure_loaded()
    assert _Loaded.state is not None
    return _Loaded.state


def library() -> ModuleType | None:
    """The loaded op module, or None when ops must use their fallbacks."""
    _ensure_loaded()
    return _Loaded.module


def _reset_for_tests() -> None:
    """Forgets the load decision so tests can change TF_GLP_NATIVE."""
    with _lock:
        _Loaded.state, _Loaded.module = None, None
