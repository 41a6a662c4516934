// What tf_glp/_native.py needs to know about the op library:
//  * the TensorFlow version it was built against (custom ops are tied to that
//    version's C++ ABI), as a marker string that Python finds in the file's
//    bytes *before* loading it: loading it first with ctypes would run the
//    op registrations outside tf.load_op_library, which then sees no ops;
//  * which CPU kernels this machine runs, a C function read after loading.
#include "cc/core/cpu_features.h"

#ifndef TF_GLP_BUILT_AGAINST_TF
#error "TF_GLP_BUILT_AGAINST_TF must be defined by the build (setup.py, BUILD)"
#endif

extern "C" {

// `used`: kept in the file although no code reads it.
__attribute__((used)) static const char kBuildMarker[] =
    "tf_glp built against TensorFlow " TF_GLP_BUILT_AGAINST_TF;

__attribute__((visibility("default"))) const char* tf_glp_cpu_kernels() {
  return tf_glp::core::IsaName(tf_glp::core::ActiveIsa());
}

}  // extern "C"
