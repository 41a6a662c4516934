"""tf_glp.Strategy with update="host" on one machine: the "host" concept
(concepts.py), its fused optimizer step in fused_host_step.py."""

from __future__ import annotations

import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.strategy import concepts
from tf_glp.strategy.devices import all_gpus
from tf_glp.strategy.host_copies import HostUpdateExtended
from tf_glp.strategy.strategy import HOST_DEVICE, ONE_MACHINE, Strategy


class HostStrategy(Strategy, tf.distribute.MirroredStrategy, placement=ONE_MACHINE,
                   serves=(concepts.HOST,)):
    """tf_glp.Strategy with update="host" (see Strategy)."""

    def _init_distribution(self) -> None:
        devices = self._set_up()
        tf.distribute.Strategy.__init__(self, HostMirroredExtended(self, devices, self._host_ops, HOST_DEVICE))


class HostMirroredExtended(HostUpdateExtended, compat.mirrored_extended_class()):
    """MirroredStrategy's extended object with the host homes and updates
    of update="host" on one machine (host_copies.py, which describes `on_host`)."""

    def __init__(self, container_strategy, devices, cross_device_ops, host_device: str, on_host=None):
        super().__init__(container_strategy, devices=devices, cross_device_ops=cross_device_ops)
        self._init_host_update(host_device, on_host)

    def _experimental_distribute_dataset(self, dataset, options):
        # One CPU replica: nothing to split and nothing to place (the
        # pipeline's tensors are in the replica's memory), so Keras iterates
        # the dataset as it does without a strategy. tf.distribute's
        # distributed iterator would add its get-next, its Optional and
        # their dispatch to every step (0.3-0.7 ms on a tiny model here,
        # benchmarks/step_trace.py). One GPU keeps it: it prefetches the
        # next batch onto the GPU while the step runs.
        if len(self.worker_devices) == 1 and not all_gpus(self.worker_devices):
            return dataset
        return super()._experimental_distribute_dataset(dataset, options)
