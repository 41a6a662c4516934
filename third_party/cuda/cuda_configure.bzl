"""cuda_configure: @local_config_cuda, CUDA on when nvcc is there, off otherwise.

Same rule as setup.py's find_nvcc():
    TF_GLP_CUDA=0 (or false/no/off)   off
    NVCC=/path/to/nvcc                that nvcc
    otherwise                         nvcc on PATH, then /usr/local/cuda/bin/nvcc
    TF_GLP_CUDA=1 and none found      an error
The repository holds one file, @local_config_cuda//:build_defs.bzl, with
CUDA_ENABLED and NVCC; the tf_glp_op_library macro compiles CUDA sources with a
genrule calling that nvcc (no CUDA toolchain needed: the op library links
against the CUDA runtime TensorFlow loads, like setup.py's build).
"""

_ENV = ["TF_GLP_CUDA", "NVCC", "PATH"]

def find_nvcc(repository_ctx):
    setting = repository_ctx.os.environ.get("TF_GLP_CUDA", "auto").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return None
    nvcc = None
    value = repository_ctx.os.environ.get("NVCC", "").strip()
    if value:
        nvcc = repository_ctx.which(value) if "/" not in value else repository_ctx.path(value)
        if nvcc == None or not nvcc.exists:
            fail("\n[cuda_configure] NVCC=%s: no such file\n" % value)
    if nvcc == None:
        nvcc = repository_ctx.which("nvcc")
    if nvcc == None and repository_ctx.path("/usr/local/cuda/bin/nvcc").exists:
        nvcc = repository_ctx.path("/usr/local/cuda/bin/nvcc")
    if nvcc == None and setting in ("1", "true", "yes", "on"):
        fail("\n[cuda_configure] TF_GLP_CUDA=1 but no nvcc was found (set NVCC=/path/to/nvcc or put it on PATH)\n")
    return nvcc

def _cuda_configure_impl(repository_ctx):
    nvcc = find_nvcc(repository_ctx)
    repository_ctx.file("BUILD", 'exports_files(["build_defs.bzl"])\n')
    repository_ctx.file("build_defs.bzl", """\
\"\"\"Made by //third_party/cuda:cuda_configure.bzl.\"\"\"

CUDA_ENABLED = {enabled}
NVCC = {nvcc}
""".format(enabled = nvcc != None, nvcc = repr(str(nvcc) if nvcc else "")))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = _ENV,
    local = True,
    configure = True,
    doc = "Finds nvcc (see module doc).",
)
