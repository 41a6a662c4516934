"""tf_glp's ops: native kernels with pure-TensorFlow fallbacks.

Every op here gives the same numbers on both paths (to rounding for the
fused updates whose HostUpdate.exact is False, in host_optimizers.py; see
tf_glp._native for how the path is chosen).

Note [No AutoGraph in tf_glp]
Public ops are marked `tf.autograph.experimental.do_not_convert`: they are
plain Python that builds TensorFlow ops, and when a user's tf.function calls
them AutoGraph would otherwise rewrite their Python control flow (and the
lazy loader's state handling) for nothing.
"""

from tf_glp.ops.concurrent import concurrent_conv2d, concurrent_matmul
from tf_glp.ops.host_optimizers import (
    host_apply_adam,
    host_apply_momentum,
    host_apply_sgd,
)
from tf_glp.ops.host_reduce import host_reduce
from tf_glp.ops.keras_fused import FUSED_OPTIMIZERS, FusedKerasUpdate, supports_fused_update

__all__ = [
    "concurrent_conv2d",
    "concurrent_matmul",
    "FUSED_OPTIMIZERS",
    "FusedKerasUpdate",
    "host_apply_adam",
    "host_apply_momentum",
    "host_apply_sgd",
    "host_reduce",
    "supports_fused_update",
]
