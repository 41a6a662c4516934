"""tf_glp's ops: native kernels with pure-TensorFlow fallbacks.

Every op here gives the same numbers on both paths (see tf_glp._native for
how the path is chosen).
"""

from tf_glp.ops.host_optimizers import (
    host_apply_adam,
    host_apply_momentum,
    host_apply_sgd,
)
from tf_glp.ops.host_reduce import host_reduce
from tf_glp.ops.keras_fused import FusedKerasUpdate, supports_fused_update

__all__ = [
    "FusedKerasUpdate",
    "host_apply_adam",
    "host_apply_momentum",
    "host_apply_sgd",
    "host_reduce",
    "supports_fused_update",
]
