"""Where update="host" keeps each variable: the host, or every replica.

CPU-assisted data parallelism (ICPE 2018) keeps the master weights and the
optimizer state on the host, which applies the update once per step. Nothing
in that idea forbids the replicas from owning their own non-trainable state,
and Keras relies on them doing so: batch statistics, random-generator state
and loss-scale counters are written from inside the replicas' step, where a
single host copy has no way to tell how the replicas' writes combine (stock
CentralStorageStrategy fails there: "You must specify an aggregation method
to update a AggregatingVariable in Replica Context"), and metric variables
must be per replica or evaluate() sums the wrong things.

So `HostExtended` (CentralStorageStrategy's extended object) decides per
variable, at creation, from the arguments Keras passes to `tf.Variable`
(`variable_home`):

| variable | home | behaves as under |
|---|---|---|
| trainable (weights) | host, one copy | CentralStorageStrategy |
| created `colocate_with` a host variable (optimizer slots, EMA averages, gradient accumulators) | host, one copy; aggregation NONE becomes ONLY_FIRST_REPLICA | CentralStorageStrategy |
| `synchronization=ON_READ` (metrics) | every replica, sync-on-read | MirroredStrategy |
| non-trainable, aggregation NONE (batch statistics, seed-generator state, loss scale) | every replica, mirrored, updated per copy | MirroredStrategy |
| non-trainable with an aggregation (optimizer iterations, learning rate) | host, one copy, aggregated | CentralStorageStrategy |

EMA averages are written from the replicas with the same value on every
replica (the weights are shared), so ONLY_FIRST_REPLICA gives exactly
MirroredStrategy's result with one host write instead of one per replica.

The rules rest on the creation arguments of TensorFlow 2.21 and Keras 3.15
(`trainable`, `synchronization`, `aggregation`, `colocate_with`);
tests/strategy/test_real_models.py::test_variable_homes_under_update_host
checks each one against real Keras objects, so a change in either library
fails loudly there; the TensorFlow methods overridden here are listed in
tf_glp/_keras_compat.py.
"""

from __future__ import annotations

import enum

import tensorflow as tf
from tensorflow.python.distribute import distribute_utils, mirrored_strategy
from tensorflow.python.distribute import parameter_server_strategy
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.ops import array_ops

_AGGREGATION = tf.VariableAggregation
_SYNC = tf.VariableSynchronization


class Home(enum.Enum):
    HOST = "host"
    REPLICAS = "replicas"


def variable_home(kwargs: dict) -> Home:
    """The home of a variable created with these `tf.Variable` arguments."""
    colocate_with = kwargs.get("colocate_with")
    if colocate_with is not None and not isinstance(colocate_with, tf.distribute.DistributedValues):
        return Home.HOST  # a slot of a host variable (or a numpy_dataset.SingleDevice)
    if colocate_with is not None:
        return Home.REPLICAS  # a slot of a replicated variable
    synchronization = kwargs.get("synchronization") or _SYNC.AUTO
    if synchronization == _SYNC.ON_READ:
        return Home.REPLICAS
    trainable = kwargs.get("trainable")
    if trainable is None:
        trainable = True  # tf.Variable's default for ON_WRITE / AUTO
    aggregation = kwargs.get("aggregation") or _AGGREGATION.NONE
    if not trainable and aggregation == _AGGREGATION.NONE:
        return Home.REPLICAS
    return Home.HOST


def host_variable_arguments(kwargs: dict) -> dict:
    """The creation arguments of a host variable: slots written from the
    replicas (EMA averages) take the first replica's value; slots written by
    the host update are unaffected."""
    if kwargs.get("colocate_with") is not None and kwargs.get("aggregation") in (None, _AGGREGATION.NONE):
        return dict(kwargs, aggregation=_AGGREGATION.ONLY_FIRST_REPLICA)
    return kwargs


class HostExtended(parameter_server_strategy.ParameterServerStrategyExtended):
    """CentralStorageStrategy's extended object with per-variable homes.

    Host variables behave exactly as in CentralStorageStrategy; replicated
    ones exactly as in MirroredStrategy (creation, per-copy update, reads).
    """

    def __init__(self, container_strategy, compute_devices, parameter_device):
        super().__init__(container_strategy, compute_devices=compute_devices, parameter_device=parameter_device)
        # MirroredExtended's variable creation reads `_devices`.
        self._devices = tuple(self._compute_devices)

    # MirroredStrategy's initial values for copies 1..N (read from copy 0).
    _get_variable_creator_initial_value = mirrored_strategy.MirroredExtended._get_variable_creator_initial_value

    def _create_variable(self, next_creator, **kwargs):
        if variable_home(kwargs) is Home.REPLICAS:
            return mirrored_strategy.MirroredExtended._create_variable(self, next_creator, **kwargs)
        return super()._create_variable(next_creator, **host_variable_arguments(kwargs))

    def _validate_colocate_with_variable(self, colocate_with_variable):
        if isinstance(colocate_with_variable, values_lib.DistributedVariable):
            distribute_utils.validate_colocate_distributed_variable(colocate_with_variable, self)
        else:
            super()._validate_colocate_with_variable(colocate_with_variable)

    def _update(self, var, fn, args, kwargs, group):
        if isinstance(var, values_lib.DistributedVariable):
            return mirrored_strategy.MirroredExtended._update(self, var, fn, args, kwargs, group)
        return super()._update(var, fn, args, kwargs, group)

    def read_var(self, var):
        if distribute_utils.is_sync_on_read(var):
            return var._get_cross_replica()  # noqa: SLF001 (TensorFlow's own read_var does this)
        if distribute_utils.is_mirrored(var):
            return array_ops.identity(var._get())  # noqa: SLF001
        return super().read_var(var)

    def value_container(self, val):
        container = super().value_container(val)
        if container is not val:
            return container
        return distribute_utils.value_container(val)

    def _reduce_to(self, reduce_op, value, destinations, options):
        if distribute_utils.is_mirrored(value) and reduce_op == tf.distribute.ReduceOp.MEAN:
            return value  # as MirroredStrategy: the copies are equal
        return super()._reduce_to(reduce_op, value, destinations, options)
