"""tf_glp's compiler flags, defined once, and Bazel's per-file instruction-set split.

COMMON_FLAGS, X86_FLAGS, ISA_FLAGS and CUDA_ARCHS below are the flags of every
build: setup.py, cc/CMakeLists.txt and tools/gpu_check.sh read these four
assignments from this file (keep them literal lists / a literal dict, one
assignment each; tests/test_build_flags.py checks that every reader gets
them). This file loads nothing from TensorFlow, so `bazel test //cc/...`
needs no TensorFlow (the op library's macro is in build_defs.bzl).
"""

COMMON_FLAGS = ["-O3", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-pthread"]

X86_FLAGS = ["-march=x86-64-v2", "-DTF_GLP_HAVE_X86_KERNELS"]

# Per-file instruction sets: only files with these suffixes get them; the
# kernels in them are picked at run time (cc/core/cpu_features.cc), and they
# are built on x86-64 only.
ISA_FLAGS = {
    "_avx2.cc": ["-mavx2", "-mf16c"],
    "_avx512.cc": ["-mavx512f", "-mavx512bw", "-mavx2", "-mf16c"],
}

# sm_75 (Turing) to sm_90 (Hopper), plus PTX for newer GPUs (as setup.py).
CUDA_ARCHS = ["75", "80", "86", "89", "90"]

X86_64 = "//third_party:x86_64"

def x86_only(values):
    return select({X86_64: values, "//conditions:default": []})

# Bazel's own default flags (-fstack-protector, -fno-omit-frame-pointer,
# -std=c++0x, ...) are turned off so that the objects are compiled with the
# flags above, as setup.py compiles them.
TF_GLP_FEATURES = ["-default_compile_flags"]

# The native core, its tests, and (with TensorFlow's flags added) the op
# library: C++17, as setup.py gets from tf.sysconfig and CMake from
# CMAKE_CXX_STANDARD.
CORE_COPTS = COMMON_FLAGS + ["-std=c++17"] + x86_only(X86_FLAGS)

def split_by_isa(srcs):
    """Splits file names into (plain, {suffix: [files]}) by ISA_FLAGS."""
    plain = []
    by_isa = {suffix: [] for suffix in ISA_FLAGS}
    for src in srcs:
        matched = False
        for suffix in ISA_FLAGS:
            if src.endswith(suffix):
                by_isa[suffix].append(src)
                matched = True
                break
        if not matched:
            plain.append(src)
    return plain, by_isa

def _isa_name(suffix):
    return suffix[1:].split(".")[0]  # "_avx2.cc" -> "avx2"

def isa_filegroups(name, srcs, visibility = None):
    """Filegroups `name` (plain files) and `name_<isa>` (e.g. name_avx2).

    For packages that hand their sources to a tf_glp_op_library in another
    package (which cannot see file names through a filegroup).
    """
    plain, by_isa = split_by_isa(srcs)
    native.filegroup(name = name, srcs = plain, visibility = visibility)
    for suffix, files in by_isa.items():
        native.filegroup(name = name + "_" + _isa_name(suffix), srcs = files, visibility = visibility)

def tf_glp_cc_library(
        name,
        srcs = [],
        hdrs = [],
        isa_srcs = None,
        copts = [],
        deps = [],
        features = [],
        **kwargs):
    """A cc_library whose `*_avx2.cc` / `*_avx512.cc` files get their ISA flags.

    Bazel has no per-file copts, so each instruction set gets its own
    always-linked library (`name_avx2`, ...), compiled on x86-64 only.

    Args:
      name: the library.
      srcs: source files; those with an ISA_FLAGS suffix are split off.
      hdrs: headers, visible to every part.
      isa_srcs: instead of splitting srcs by name, {suffix: [labels]}
        (e.g. filegroups made by isa_filegroups in another package).
      copts: flags for every file (the ISA flags are added to them).
      deps: dependencies of every part.
      features: extra features (TF_GLP_FEATURES are always on).
      **kwargs: passed to the main cc_library (visibility, testonly, ...).
    """
    if isa_srcs == None:
        srcs, isa_srcs = split_by_isa(srcs)
    headers = name + "_headers"
    native.cc_library(
        name = headers,
        hdrs = hdrs,
        deps = deps,
        visibility = ["//visibility:private"],
        testonly = kwargs.get("testonly", False),
    )
    parts = []
    for suffix, files in isa_srcs.items():
        if not files:
            continue
        part = name + "_" + _isa_name(suffix)
        native.cc_library(
            name = part,
            srcs = x86_only(files),
            copts = copts + x86_only(ISA_FLAGS[suffix]),
            deps = [":" + headers],
            features = TF_GLP_FEATURES + features,
            alwayslink = True,
            visibility = ["//visibility:private"],
            testonly = kwargs.get("testonly", False),
        )
        parts.append(":" + part)
    native.cc_library(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        copts = copts,
        deps = [":" + headers] + parts + deps,
        features = TF_GLP_FEATURES + features,
        **kwargs
    )
