#!/usr/bin/env bash
# The README's two commands, each self-contained on a fresh machine that has
# Python 3.11, pip and a C++ compiler:
#   tools/dev.sh quickstart   # install into .venv, run examples/quickstart.py
#   tools/dev.sh test         # install into .venv, run native + Python tests
#                             # (then the Ray Train tests, unless pytest args are given)
#   tools/dev.sh sanitize     # the native core tests under ASan + UBSan (CI)
#   tools/dev.sh claims       # the docs' citations and numbers against the tests
#                             # and benchmark records (CI; tools/claims.py; no install:
#                             # needs the .venv that `test` built)
# TF_GLP_VENV picks another virtual environment folder (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${TF_GLP_VENV:-.venv}"
PY="$VENV/bin/python"

install() {
  if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
  fi
  "$PY" -m pip install -q --upgrade pip "setuptools>=77" wheel
  # TensorFlow first: the op library is compiled against it (setup.py), and
  # --no-build-isolation reuses this one instead of a second 2 GB copy.
  "$PY" -m pip install -q "tensorflow==2.21.*"
  "$PY" -m pip install -q --no-build-isolation -e ".[test,examples,ray]"
}

native_tests() {
  # The framework-agnostic core, built and tested without TensorFlow, in
  # build folder $1 with CMake options $2... (the sanitizer build: any
  # finding fails a test).
  local build="$1"
  shift
  "$VENV/bin/cmake" -S cc -B "$build" "$@" > /dev/null
  if ! "$VENV/bin/cmake" --build "$build" -j "$(nproc)" > "$build/build.log" 2>&1; then
    cat "$build/build.log"
    exit 1
  fi
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$VENV/bin/ctest" --test-dir "$build" --output-on-failure
}

case "${1:-}" in
  quickstart)
    install
    shift
    exec "$PY" examples/quickstart.py "$@"
    ;;
  test)
    install
    shift
    native_tests build/cc -DCMAKE_BUILD_TYPE=Release
    # Three pytest processes (pytest-xdist), each test file whole in one of
    # them (its module fixtures built once): much of the suite is Python
    # tracing, process start-up and workers waiting on each other, which
    # leave a core idle; on the 2-core machine 3 processes ran the suite in
    # 16.3 min where 2 took 18.5, and 14.6 with --no-loadscope-reorder
    # below (2026-12-07/08).
    # --max-worker-restart 0: a worker that dies (a segfault inside
    # TensorFlow was seen once, 2026-12-04, in a tf.data iterator's
    # teardown during evaluate()) ends the run at once, naming its test;
    # with restarts, xdist 3.8's loadfile scheduler can wait forever
    # (pytest-dev/pytest-xdist issue 1378).
    # --no-loadscope-reorder: files are handed out in collection order
    # (tests/conftest.py's SLOW_FIRST first), not xdist's default of the
    # files with the most tests first, which started the longest test
    # (Keras' own, 3 tests) last.
    "$PY" -m pytest -q -n "${TF_GLP_TEST_PROCESSES:-3}" --dist loadfile --no-loadscope-reorder \
      --max-worker-restart 0 "$@"
    # The Ray Train tests, a step of their own (a local Ray cluster whose
    # workers would otherwise share the cores with the suite's processes);
    # left out when pytest arguments pick tests.
    if [ $# -eq 0 ]; then
      exec "$PY" -m pytest -q -p no:xdist --ray tests/ray
    fi
    ;;
  sanitize)
    install
    # The core and its tests with AddressSanitizer and UndefinedBehaviorSanitizer
    # (cc/CMakeLists.txt, TF_GLP_SANITIZE).
    native_tests build/cc_sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTF_GLP_SANITIZE=ON
    ;;
  claims)
    shift
    # Markdown files as arguments (paths from the repository root) check
    # those; none, tools/claims.py's CHECKED_FILES. It collects the tests
    # (pytest --collect-only imports TensorFlow): the venv that `test`
    # installed, no install of its own.
    exec "$PY" tools/claims.py "$@"
    ;;
  *)
    echo "usage: tools/dev.sh quickstart|test|sanitize|claims [extra args]" >&2
    exit 2
    ;;
esac
