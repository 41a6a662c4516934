"""The lazy loader: cheap import, fallback with a reason, TF_GLP_NATIVE."""

import os
import subprocess
import sys
import warnings

import pytest

import tf_glp
from tf_glp import _native


def test_import_is_cheap():
    code = "import sys, tf_glp; print('tensorflow' in sys.modules, tf_glp._native._Loaded.state)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "None"]


def test_loads_in_a_process_without_gpu():
    code = ("import os; os.environ['CUDA_VISIBLE_DEVICES'] = ''; import tf_glp, tensorflow as tf; "
            "print(tf.config.list_physical_devices('GPU'), bool(tf_glp.native_available()))")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip().splitlines()[-1] == "[] True"


def _point_at(monkeypatch, path):
    monkeypatch.setattr(_native, "library_path", lambda: str(path))
    _native._reset_for_tests()


def test_missing_library_warns_once_and_falls_back(monkeypatch, tmp_path, native_mode):
    _point_at(monkeypatch, tmp_path / "_tf_glp_ops.so")
    with pytest.warns(RuntimeWarning, match="does not exist"):
        status = tf_glp.native_available()
    assert not status and "does not exist" in status.reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: later calls do not warn again
        assert _native.library() is None
        assert not tf_glp.native_available()
    assert str(status).startswith("fallback (pure TensorFlow)")


def test_required_native_raises(monkeypatch, tmp_path, native_mode):
    native_mode("1")
    _point_at(monkeypatch, tmp_path / "_tf_glp_ops.so")
    with pytest.raises(ImportError, match="TF_GLP_NATIVE=1"):
        tf_glp.native_available()


def test_library_for_another_tensorflow_is_refused(monkeypatch, tmp_path, native_mode):
    fake = tmp_path / "_tf_glp_ops.so"
    fake.write_bytes(b"\x7fELF...tf_glp built against TensorFlow 2.20.1\x00...")
    _point_at(monkeypatch, fake)
    with pytest.warns(RuntimeWarning, match="built for TensorFlow 2.20.1"):
        status = tf_glp.native_available()
    assert not status and "reinstall tf_glp" in status.reason


def test_file_without_marker_is_refused(monkeypatch, tmp_path, native_mode):
    fake = tmp_path / "_tf_glp_ops.so"
    fake.write_bytes(b"not a library")
    _point_at(monkeypatch, fake)
    with pytest.warns(RuntimeWarning, match="no build marker"):
        assert not tf_glp.native_available()


def test_bad_setting_is_reported(native_mode):
    native_mode("maybe")
    with pytest.raises(ValueError, match="TF_GLP_NATIVE must be 0, 1 or auto, got 'maybe'"):
        tf_glp.native_available()
