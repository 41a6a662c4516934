"""The guard that every worker trains the same model.

Across workers every update is computed from the same cross-worker sums, so
the workers' weights and optimizer states stay bitwise equal; a bug that
broke that (with one replica per worker the fused update once applied each
worker's own gradients, until 2026-12-07) would train a different model on
each worker and report success. So at the end of every epoch — the end of `fit`
included — the workers compare a checksum per variable (their trainable
variables and the optimizer's, the state every update writes), in one
collective of 2 integers per variable, and stop with an error naming the
first variable that differs. It runs under every setting: `fit_setup.prepare`
adds it, first, to every multi-worker fit. Batch statistics and metrics are
not compared: they are per replica, as under MirroredStrategy.

The checksum is the sum of the values' bit patterns as integers: any change
of one value changes it. Its cost is one read of the variables at memory
speed per epoch (measured: docs/scaling-out.md).
"""

from __future__ import annotations

import keras
import tensorflow as tf


def checksum(value) -> tf.Tensor:
    """An int64 checksum of a tensor's bits: the sum of its elements' bit
    patterns read as integers of their width (wrapping on overflow)."""
    value = tf.convert_to_tensor(value)
    if value.dtype.is_floating:
        value = tf.bitcast(value, {2: tf.int16, 4: tf.int32, 8: tf.int64}[value.dtype.size])
    return tf.reduce_sum(tf.cast(value, tf.int64))


class WorkersInSync(keras.callbacks.Callback):
    """Stops a multi-worker fit whose workers no longer hold the same
    variables (see the module docstring): RuntimeError on every worker,
    naming the first variable that differs.

    Args:
        strategy: The multi-worker tf_glp.Strategy the model trains under.

    Example:
        >>> model.fit(x, y, callbacks=[WorkersInSync(strategy)])  # (fit adds it itself)
    """

    def __init__(self, strategy):
        super().__init__()
        self._strategy = strategy
        self._checksums = None  # a tf.function over the model's variables, traced at the first check

    def _variables(self) -> list:
        return [*self.model.trainable_variables, *self.model.optimizer.variables]

    def on_epoch_end(self, epoch, logs=None):
        variables = self._variables()
        if self._checksums is None:
            self._checksums = tf.function(lambda: tf.stack([checksum(v.value) for v in self._variables()]),
                                          autograph=False)  # (autograph would write a file to TMPDIR per worker)
        sums = self._checksums().numpy().tolist()
        differing = self._strategy.extended.differing_on_workers(sums)
        if differing:
            first = variables[differing[0]]
            raise RuntimeError(
                f"tf_glp.Strategy (worker {self._strategy.extended.worker_id}): after epoch {epoch + 1} the "
                f"workers hold different values of {len(differing)} of {len(variables)} variables, first "
                f"{first.path!r}: they no longer train the same model, so training stopped. Every update "
                f"keeps the workers bitwise equal: either a callback or custom code changed a variable on some "
                f"workers only, or this is a bug in tf_glp (please report it with strategy.explain()).")
