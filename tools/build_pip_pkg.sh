#!/usr/bin/env bash
# Builds the tf_glp wheel around the Bazel-built op library:
#   bazel run //:build_pip_pkg -- OUTDIR
# OUTDIR is relative to where bazel was run. The wheel holds the same files
# as `pip wheel .` (tf_glp/**, tf_glp/_tf_glp_ops.so), with the metadata from
# the same pyproject.toml; only the op library comes from Bazel (//:tf_glp_ops)
# instead of setup.py's compiler calls. Nothing is downloaded.
set -euo pipefail

die() { echo "build_pip_pkg: error: $*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: bazel run //:build_pip_pkg -- OUTDIR"
out="${1%/}"
[ -n "$out" ] || out="/"
case "$out" in
  /*) ;;
  *) out="${BUILD_WORKING_DIRECTORY:-$PWD}/$out" ;;
esac

if [ -n "${RUNFILES_DIR:-}" ]; then
  runfiles="$RUNFILES_DIR"
elif [ -d "$0.runfiles" ]; then
  runfiles="$0.runfiles"
else
  die "no runfiles next to $0: run me with 'bazel run //:build_pip_pkg -- OUTDIR'"
fi
src="$runfiles/tf_glp"
[ -f "$src/_tf_glp_ops.so" ] || die "$src/_tf_glp_ops.so is missing"

# The Python that has the TensorFlow the library was built against (found by
# third_party/tf/tf_configure.bzl); it needs setuptools and wheel.
python="${TF_GLP_PYTHON:-}"
if [ -z "$python" ]; then
  python="$(cat "$runfiles/local_config_tf/python_bin" 2>/dev/null \
            || cat "$src/external/local_config_tf/python_bin")"
fi
"$python" -c "import setuptools, wheel" 2>/dev/null \
  || die "$python lacks setuptools or wheel (pip install 'setuptools>=64' wheel)"

stage="$(mktemp -d "${TMPDIR:-/tmp}/tf_glp_pip_pkg.XXXXXX")"
trap 'rm -rf "$stage"' EXIT

cp -L "$src/pyproject.toml" "$stage/"
for f in README.md LICENSE MANIFEST.in; do
  if [ -e "$src/$f" ]; then cp -L "$src/$f" "$stage/"; fi
done
cp -RL "$src/tf_glp" "$stage/tf_glp"
cp -L "$src/_tf_glp_ops.so" "$stage/tf_glp/_tf_glp_ops.so"
chmod -R u+w "$stage"

# Instead of setup.py (which compiles the library): the library is package
# data, and the distribution is platform-specific, so the wheel gets the same
# tag as pip's (cp311-cp311-linux_x86_64).
cat > "$stage/setup.py" <<'PY'
from setuptools import setup
from setuptools.dist import Distribution


class PrebuiltOpLibrary(Distribution):
    def has_ext_modules(self):
        return True


setup(distclass=PrebuiltOpLibrary, package_data={"tf_glp": ["_tf_glp_ops.so"]})
PY

mkdir -p "$out"
if ! log="$(cd "$stage" && "$python" -m pip wheel --no-deps --no-build-isolation \
             --no-index --wheel-dir "$out" . 2>&1)"; then
  echo "$log" >&2
  die "pip wheel failed (output above)"
fi
wheel="$(cd "$out" && ls -t tf_glp-*.whl | head -n 1)"
echo "build_pip_pkg: wrote $out/$wheel"
