"""The fused update inside the host's optimizer step (the "host" concept,
concepts.py): Keras' `_backend_update_step` replaced by tf_glp's native
pass per variable, chunk by chunk (tf_glp.ops.FusedKerasUpdate), for the
optimizers that have one (tf_glp.ops.FUSED_OPTIMIZERS).

Gradients arrive per replica (summed here, in the same pass; across workers
first summed per worker, then across the workers), as a micro-batched
step's M gradients (MicroBatchGradients: every worker's, summed here in
order) or already summed on the host. Sparse gradients (IndexedSlices,
e.g. Embedding's) are concatenated on the host and go through Keras' own
update_step there, as Keras would run it (see concat_on_host).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.ops import FusedKerasUpdate, host_reduce
from tf_glp.strategy import compression as compression_lib
from tf_glp.strategy.cross_device_ops import byte_sizes, concat_on_host, is_sparse, local_components
from tf_glp.strategy.micro_batches import MicroBatchGradients


def apply(strategy, optimizer, grads: list, variables: list) -> None:
    """The fused update of `variables` (Keras variables) on their host copies."""
    variables = [strategy.extended.host_target(v) for v in variables]
    fused = FusedKerasUpdate(optimizer, update_step_only=True)
    host_ops = strategy._host_ops
    across = host_ops.across_workers
    summed = not any(isinstance(g, tf.distribute.DistributedValues) for g in grads)
    # Every worker's micro-batch gradients, already gathered.
    complete = any(isinstance(g, MicroBatchGradients) for g in grads)
    sparse = [i for i, g in enumerate(grads) if is_sparse(g)]
    dense = [i for i in range(len(grads)) if i not in sparse]
    per_variable = [local_components(grads[i]) for i in dense]
    sizes = byte_sizes(per_variable)  # planned on uncompressed sizes
    if not summed:
        per_variable = [compression_lib.for_host(parts, host_ops.scheme, host_ops.host_device)
                        for parts in per_variable]
    with tf.device(host_ops.host_device):
        for chunk in host_ops.in_chunks(per_variable, sizes):
            parts = [per_variable[i] for i in chunk]
            if across and not summed and not complete:
                # This worker's sum, then every worker's: one collective for
                # the chunk.
                parts = [[total] for total in across([host_reduce(p, output_dtype=tf.float32) for p in parts])]
            fused.apply(parts, [variables[dense[i]] for i in chunk], increment_iterations=False)
        for i in sparse:
            rows = concat_on_host(grads[i], tf.distribute.ReduceOp.SUM, host_ops.host_device)
            if across and not summed:
                rows = across([rows])[0]
            _apply_sparse_update(strategy, optimizer, rows, variables[i])


def _apply_sparse_update(strategy, optimizer, grad: tf.IndexedSlices, variable) -> None:
    """Keras' weight decay and update_step for one variable, on its host
    copy: what Keras' own step does with a sparse gradient. (Not
    compressed: the rows cross to the host as they are.)"""
    compat.apply_weight_decay_to_copy(optimizer, [variable])
    target = variable.value if isinstance(variable, keras.Variable) else variable
    strategy.extended.update(target, lambda v, g: optimizer.update_step(g, v, optimizer.learning_rate),
                             args=(grad,), group=False)
