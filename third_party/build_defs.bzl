"""tf_glp_op_library: the one macro for TensorFlow custom-op libraries.

Like tensorflow/addons' custom_op_library: every op library gets the same
flags, which are setup.py's (see flags.bzl), TensorFlow's own (tf.sysconfig,
through @local_config_tf), the build marker tf_glp/_native.py looks for
(-DTF_GLP_BUILT_AGAINST_TF="<TensorFlow version>"), and the CUDA sources
compiled by nvcc when @local_config_cuda found one.
"""

load("@local_config_cuda//:build_defs.bzl", "CUDA_ENABLED", "NVCC")
load("@local_config_tf//:build_defs.bzl", "TF_COMPILE_FLAGS", "TF_VERSION")
load(":flags.bzl", "CORE_COPTS", "CUDA_ARCHS", "TF_GLP_FEATURES", "tf_glp_cc_library")

# setup.py adds this one: TensorFlow's headers print ~100 deprecation warnings.
_TF_WARNINGS = ["-Wno-deprecated-declarations"]

def tf_build_marker_define():
    # Bazel splits copts like a shell: the quotes survive as part of the macro.
    return '-DTF_GLP_BUILT_AGAINST_TF=\\"%s\\"' % TF_VERSION

def _nvcc_command(inputs, output):
    gencode = ["-gencode=arch=compute_%s,code=sm_%s" % (a, a) for a in CUDA_ARCHS]
    gencode.append("-gencode=arch=compute_%s,code=compute_%s" % (CUDA_ARCHS[-1], CUDA_ARCHS[-1]))
    flags = [
        "-x cu",
        "-std=c++17",
        "-O3",
        "-DGOOGLE_CUDA=1",
        "--expt-relaxed-constexpr",
        "-Xcompiler -fPIC",
        "-Xcompiler -ffp-contract=off",
        "-Iexternal/local_config_tf/include",
        "-I.",
    ] + [f for f in TF_COMPILE_FLAGS if f.startswith("-D")] + gencode

    # One archive of all CUDA objects, compiled in parallel; the .pic.lo name
    # makes Bazel link it whole (alwayslink), like setup.py's object list. It
    # is empty when there are no CUDA sources (their filegroup may be empty,
    # and Bazel cannot tell before running this). nvcc's output (warnings
    # from TensorFlow's headers) is shown only when it fails, as setup.py does.
    return """
set -e
objects=$$(mktemp -d)
trap 'rm -rf "$$objects"' EXIT
pids=""
for src in $(locations {inputs}); do
  case "$$src" in
    *.cu.cc|*.cu) ;;
    *) continue ;;
  esac
  obj="$$objects/$$(echo "$$src" | tr / _).o"
  (
    if ! {nvcc} {flags} -c "$$src" -o "$$obj" > "$$obj.log" 2>&1; then
      echo "nvcc failed on $$src:" >&2
      cat "$$obj.log" >&2
      exit 1
    fi
  ) &
  pids="$$pids $$!"
done
failed=0
for pid in $$pids; do wait $$pid || failed=1; done
[ $$failed -eq 0 ]
rm -f $(location {output})
ar rcs $(location {output}) $$(find "$$objects" -name '*.o' | sort)
""".format(inputs = inputs, nvcc = NVCC, flags = " ".join(flags), output = output)

def tf_glp_op_library(
        name,
        library_name,
        srcs = [],
        hdrs = [],
        isa_srcs = None,
        cuda_srcs = [],
        deps = [],
        copts = [],
        linkopts = [],
        visibility = None):
    """A TensorFlow custom-op library (a .so for tf.load_op_library).

    Makes `library_name` (a cc_binary with linkshared = 1) and `name`, a
    filegroup holding just that file.

    Args:
      name: the target to build (e.g. "tf_glp_ops").
      library_name: the .so file's name (e.g. "_tf_glp_ops.so").
      srcs: C++ sources (core and bindings); `*_avx2.cc` / `*_avx512.cc` get
        their instruction-set flags (flags.bzl), unless isa_srcs is given.
      hdrs: headers the sources include.
      isa_srcs: {suffix: [labels]} of instruction-set sources, when srcs are
        filegroups from another package (see flags.bzl's isa_filegroups).
      cuda_srcs: CUDA sources (.cu.cc, .cu), compiled by nvcc when
        @local_config_cuda found one, left out otherwise.
      deps: more cc_library dependencies.
      copts: extra compile flags.
      linkopts: extra link flags.
      visibility: of `name`.
    """
    objects = name + "_objects"
    cuda = []
    if cuda_srcs and CUDA_ENABLED:
        archive = name + "_cuda.pic.lo"

        # Never empty (the sentinel), so that $(locations) works when the
        # CUDA filegroups are.
        inputs = name + "_cuda_inputs"
        native.filegroup(
            name = inputs,
            srcs = cuda_srcs + ["//third_party/cuda:cuda_configure.bzl"],
        )
        native.genrule(
            name = name + "_cuda",
            srcs = [":" + inputs] + hdrs + ["@local_config_tf//:tf_headers"],
            outs = [archive],
            cmd = _nvcc_command(":" + inputs, archive),
            message = "Compiling CUDA sources of %s with %s" % (name, NVCC),
        )
        cuda = [":" + archive]

    tf_glp_cc_library(
        name = objects,
        srcs = srcs + cuda,
        hdrs = hdrs,
        isa_srcs = isa_srcs,
        copts = CORE_COPTS + TF_COMPILE_FLAGS + _TF_WARNINGS + [tf_build_marker_define()] + copts,
        deps = ["@local_config_tf//:tf_header_lib"] + deps,
        alwayslink = True,
        visibility = ["//visibility:private"],
    )

    framework = "@local_config_tf//:libtensorflow_framework.so.2"
    native.cc_binary(
        name = library_name,
        deps = [":" + objects],
        linkshared = True,
        # As setup.py: TensorFlow's framework library by its path (its soname
        # becomes the NEEDED entry; no Bazel rpath), found at run time next to
        # us in site-packages; no -lcudart (CUDA calls bind to the runtime
        # TensorFlow loads).
        additional_linker_inputs = [framework],
        linkopts = [
            "$(location %s)" % framework,
            "-pthread",
            "-Wl,-rpath,$$ORIGIN/../tensorflow",
        ] + linkopts,
        features = TF_GLP_FEATURES,
        visibility = visibility,
    )
    native.filegroup(
        name = name,
        srcs = [":" + library_name],
        visibility = visibility,
    )
