"""tf_glp.Strategy with update="replicas" on one machine (the concept:
concepts.py): a MirroredStrategy as TensorFlow builds it, with tf_glp's
reductions (HostCrossDeviceOps)."""

from __future__ import annotations

import tensorflow as tf

from tf_glp.strategy import concepts
from tf_glp.strategy.strategy import ONE_MACHINE, Strategy

_MirroredStrategy = tf.distribute.MirroredStrategy  # as imported (a test replaces the public name)


class ReplicaStrategy(Strategy, tf.distribute.MirroredStrategy, placement=ONE_MACHINE,
                      serves=(concepts.REPLICAS,)):
    """tf_glp.Strategy with update="replicas" (see Strategy)."""

    def _init_distribution(self) -> None:
        devices = self._set_up()
        _MirroredStrategy.__init__(self, devices=devices, cross_device_ops=self._host_ops)
