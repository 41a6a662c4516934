"""tf_configure: the installed pip TensorFlow as the repository @local_config_tf.

Like tensorflow/custom-op's tf_configure, but without its shell scripts: one
Python call asks the installed TensorFlow (tf.sysconfig) for its header folder,
its library folder, its compile and link flags and its version, and the
repository exposes them:

    @local_config_tf//:tf_header_lib          cc_library, TensorFlow's headers
    @local_config_tf//:libtensorflow_framework.so.2
                                              the library to link against
    @local_config_tf//:build_defs.bzl         TF_VERSION, TF_COMPILE_FLAGS
                                              (tf.sysconfig's, minus -I),
                                              TF_LINK_FLAGS, PYTHON
    @local_config_tf//:python_bin             file holding that Python's path

Which Python: $TF_GLP_PYTHON, else $PYTHON_BIN_PATH, else the workspace's
.venv/bin/python (the one tools/dev.sh makes), else python3 on PATH. The
repository is re-made when one of those variables changes; after
reinstalling TensorFlow in the same environment, run `bazel sync --configure`
(or `bazel clean --expunge`).
"""

_PYTHON_ENV = ["TF_GLP_PYTHON", "PYTHON_BIN_PATH"]

_QUERY = """
import json, os, sys
import tensorflow as tf
lib = tf.sysconfig.get_lib()
print(json.dumps({
    "version": tf.__version__,
    "include": tf.sysconfig.get_include(),
    "lib": lib,
    "compile_flags": tf.sysconfig.get_compile_flags(),
    "link_flags": tf.sysconfig.get_link_flags(),
    "python": sys.executable,
}))
"""

def _fail(message):
    fail("\n[tf_configure] " + message + "\n")

def find_python(repository_ctx):
    """The Python interpreter that has the TensorFlow to build against."""
    for name in _PYTHON_ENV:
        value = repository_ctx.os.environ.get(name, "").strip()
        if value:
            path = repository_ctx.which(value) if "/" not in value else repository_ctx.path(value)
            if path == None or not path.exists:
                _fail("%s=%s: no such Python interpreter" % (name, value))
            return path
    venv = repository_ctx.path(Label("@//:WORKSPACE")).dirname.get_child(".venv").get_child("bin").get_child("python")
    if venv.exists:
        return venv
    python = repository_ctx.which("python3")
    if python == None:
        _fail("no Python found: set TF_GLP_PYTHON to a Python that has tensorflow installed")
    return python

def _tf_configure_impl(repository_ctx):
    python = find_python(repository_ctx)
    result = repository_ctx.execute([python, "-c", _QUERY], quiet = True)
    if result.return_code != 0:
        _fail(("%s cannot import tensorflow (install tensorflow==2.21.* into it, or " +
               "set TF_GLP_PYTHON to a Python that has it):\n%s") % (python, result.stderr))

    # TensorFlow may print log lines first: the JSON is the last line.
    info = json.decode(result.stdout.strip().splitlines()[-1])
    library = info["lib"] + "/libtensorflow_framework.so.2"
    if not repository_ctx.path(library).exists:
        _fail("%s does not exist (is this a pip TensorFlow?)" % library)

    repository_ctx.symlink(info["include"], "include")
    repository_ctx.symlink(library, "libtensorflow_framework.so.2")
    compile_flags = [f for f in info["compile_flags"] if not f.startswith("-I")]

    repository_ctx.file("BUILD", """\
# Made by //third_party/tf:tf_configure.bzl from {python} (TensorFlow {version}).
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "tf_header_lib",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

exports_files([
    "libtensorflow_framework.so.2",
    "python_bin",
    "build_defs.bzl",
])

filegroup(
    name = "tf_headers",
    srcs = glob(["include/**"]),
)
""".format(python = info["python"], version = info["version"]))

    repository_ctx.file("build_defs.bzl", """\
\"\"\"The pip TensorFlow found by tf_configure (made from tf.sysconfig).\"\"\"

TF_VERSION = {version}
TF_COMPILE_FLAGS = {compile_flags}
TF_LINK_FLAGS = {link_flags}
TF_INCLUDE_DIR = {include}
PYTHON = {python}
""".format(
        version = repr(info["version"]),
        compile_flags = repr(compile_flags),
        link_flags = repr(info["link_flags"]),
        include = repr(info["include"]),
        python = repr(str(python)),
    ))
    repository_ctx.file("python_bin", str(python) + "\n")

tf_configure = repository_rule(
    implementation = _tf_configure_impl,
    environ = _PYTHON_ENV,
    local = True,
    configure = True,
    doc = "Exposes the installed pip TensorFlow as a repository (see module doc).",
)
