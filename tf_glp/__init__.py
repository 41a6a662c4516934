"""tf_glp: faster Keras 3 / TensorFlow training without changing what is learned.

Four parts:
- `tf_glp.Strategy`: a tf.distribute.Strategy for data parallelism in which
  the host CPUs sum the replicas' gradients and apply the optimizer once,
  chunk by chunk (CPU-assisted data parallelism); without GPUs it trains on
  one device through plain Keras' path, with the fused optimizer update
  where that measures faster.
- `tf_glp.layers` with `tf_glp.callbacks.ConcurrencyProfiler` (also
  `tf_glp.profile`, `tf_glp.plan`): a layer's independent work over a pool
  of lanes (CUDA streams or CPU threads), the lanes per layer chosen by a
  start-up profiler and kept in a plan file (GLP4NN).
- `tf_glp.slurm_cluster()`, `tf_glp.environment_cluster()`: the cluster
  of workers from SLURM's variables, or from a rank and a host list (where
  no TF_CONFIG is written), for `Strategy(cluster_resolver=...)`.
- `python -m tf_glp.bench compare`: the same model trained under each
  distributed-training concept, throughput, scaling and loss side by side.

Underneath: `tf_glp.ops`, the host-engine and concurrent ops (native C++
with pure-TensorFlow fallbacks), and `tf_glp.native_available()`, which
implementation is in use, and why.

`import tf_glp` is cheap: TensorFlow and the native library are loaded on
first use of a submodule that needs them.

Example:
    >>> import tensorflow as tf, tf_glp
    >>> tf_glp.ops.host_reduce([tf.ones(3), tf.ones(3)]).numpy()
    array([2., 2., 2.], dtype=float32)
"""

from __future__ import annotations

import importlib
from typing import Any

from tf_glp._native import NativeStatus, native_available

__version__ = "0.1.0"

# Loaded on first use (they import TensorFlow): name -> (module, attribute or None for the module).
_LAZY = {"Strategy": ("tf_glp.strategy", "Strategy"), "profile": ("tf_glp.profiling.profiler", "profile"),
         "slurm_cluster": ("tf_glp.strategy.resolvers", "slurm_cluster"),
         "environment_cluster": ("tf_glp.strategy.resolvers", "environment_cluster"),
         "callbacks": ("tf_glp.callbacks", None), "layers": ("tf_glp.layers", None), "ops": ("tf_glp.ops", None),
         "plan": ("tf_glp.profiling.plan", None), "strategy": ("tf_glp.strategy", None)}
__all__ = ["NativeStatus", "native_available", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'tf_glp' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    globals()[name] = module if attribute is None else getattr(module, attribute)
    return globals()[name]
