"""update="host": the model's variables as under MirroredStrategy, the
optimizer's state and step on the host.

The one rule (Note [One rule for update="host"]): everything Keras and
TensorFlow see of the model's variables is what they see under
MirroredStrategy (mirrored on the replicas, read and written from the
replicas as stock), and the optimizer step runs once per step on the host,
in cross-replica context, after the host sum.

CPU-assisted data parallelism (ICPE 2018) needs only the *optimizer step* on
the host. So HostUpdateExtended, the part of the extended objects of
update="host" (host_strategy.py, auto_strategy.py, multi_worker_strategy.py) that differs
from MirroredStrategy's, changes two things:

- Creation: a variable the optimizer creates (slots, EMA averages, gradient
  accumulators, Nadam's and Muon's extra state, the iteration counter,
  loss-scale state: whatever is created inside a Keras optimizer's name
  scope) is one plain variable on the host. Everything else (weights, batch
  statistics, seed-generator state, metrics) is created as MirroredStrategy
  creates it.
- Updates: a cross-replica update of a trainable mirrored variable
  (`extended.update`, which Keras' optimizer, weight decay, EMA overwrites,
  `set_weights` and `assign` all go through) runs once, on the variable's
  host copy, and the new value is then copied to the replicas. A host
  variable is updated once, where it lives. Other mirrored variables are
  updated per copy, as stock.

A trainable variable's host copy is its replica copy on the host device
when there is one (logical CPU replicas: the host's memory is the replicas'
memory, nothing to keep in sync), otherwise one host variable created at the
first update (GPU replicas) and refreshed from the first replica at the start
of every host update: a checkpoint restore or a write from inside a replica
reaches the replicas' copies without passing through `extended.update`.

During the optimizer step (`host_update`) the Keras variables the optimizer
updates point at their host copies, so every read and write Keras makes in
its step (update_step, weight decay, EMA, constraints, accumulation) goes to
the host; when the step ends, each updated variable is copied to the
replicas. TensorFlow runs each copy as soon as that variable's own update is
done (ordering is per variable), so the copies of the last layers overlap
the host's work on earlier ones.
"""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf

from tf_glp._keras import compat


def _device_index(devices, device: str) -> int | None:
    """The index of the first of `devices` that is `device` (a missing
    job/task matches any: a local device string), or None."""
    def canonical(name):
        spec = tf.DeviceSpec.from_string(name)
        return (spec.job, spec.task, (spec.device_type or "").upper(), spec.device_index or 0)

    wanted = canonical(device)
    return next((index for index, name in enumerate(devices)
                 if all(x == y or x is None or y is None for x, y in zip(canonical(name), wanted))), None)


class HostUpdateExtended:
    """Mixin for a MirroredExtended subclass: the host homes and host updates
    of the module docstring. Call `_init_host_update(host_device)` in
    `__init__`."""

    def _init_host_update(self, host_device: str, on_host=None) -> None:
        """`on_host()` says whether the optimizer state and step are on the
        host now (update="auto" switches concepts; default: always)."""
        self._glp_host_device = host_device
        self._glp_on_host = on_host or (lambda: True)
        self._glp_masters: dict[int, tf.Variable] = {}
        self._glp_pending: list | None = None  # variables to copy when the host update ends
        self._glp_lock = threading.RLock()
        self._glp_creating_host_copy = False

    @property
    def host_device(self) -> str:
        return self._glp_host_device

    # -- creation ------------------------------------------------------------
    def _create_variable(self, next_creator, **kwargs):
        if self._glp_creating_host_copy:
            return next_creator(**kwargs)
        if not self._glp_on_host() or not compat.creating_optimizer_variable():
            return super()._create_variable(next_creator, **kwargs)
        kwargs.pop("colocate_with", None)
        kwargs["initial_value"] = self._host_initial_value(kwargs)
        with tf.device(self._glp_host_device):
            return next_creator(**kwargs)

    def _host_initial_value(self, kwargs: dict):
        """The initial value of a host variable (across workers: the chief's)."""
        return kwargs["initial_value"]

    def _validate_colocate_with_variable(self, colocate_with_variable):
        # Keras colocates a slot with its variable; inside the host update
        # that is the host copy, a plain variable.
        if compat.is_distributed_variable(colocate_with_variable):
            super()._validate_colocate_with_variable(colocate_with_variable)

    # -- host copies -----------------------------------------------------------
    def has_host_copy(self, variable) -> bool:
        """Whether `variable` is a trainable mirrored variable (updated on the host)."""
        return compat.is_distributed_variable(variable) and not compat.is_sync_on_read(
            variable) and variable.trainable

    def host_copy(self, variable, *, refresh: bool = True):
        """The host copy of a trainable mirrored variable (see the module
        docstring); a separate host variable is refreshed from the first
        replica unless refresh=False."""
        index = _device_index([c.device for c in variable.values], self._glp_host_device)
        if index is not None:
            return variable.values[index]
        with self._glp_lock:
            master = self._glp_masters.get(id(variable))
            if master is None:
                first = variable.values[0]
                self._glp_creating_host_copy = True
                try:
                    with tf.init_scope(), tf.device(self._glp_host_device):
                        master = tf.Variable(first.read_value(), trainable=False,
                                             name=first.name.split(":")[0] + "/host")
                finally:
                    self._glp_creating_host_copy = False
                # Keras finds a variable's slots through its container
                # (TFOptimizer._var_key), as it does for the replica copies.
                compat.set_distributed_container(master, variable)
                self._glp_masters[id(variable)] = master
        # (Also right after creation: the creation ran eagerly, the refresh
        # is part of the step being built, so every step of it refreshes.)
        if refresh:
            master.assign(variable.values[0].read_value())
        return master

    def _copy_to_replicas(self, variable) -> None:
        host = self.host_copy(variable, refresh=False)
        with tf.device(host.device):
            value = host.read_value()
        for component in variable.values:
            if component is not host:
                with tf.device(component.device):
                    component.assign(value)

    def in_host_update(self) -> bool:
        """Whether the optimizer's host step is being built or run now."""
        return self._glp_pending is not None

    def host_target(self, variable):
        """What the host step writes for `variable`: a Keras variable as it
        is (it points at its host copy during the step), a raw trainable
        mirrored tf.Variable its host copy, queued for the copy to the
        replicas."""
        return self._write_target(variable) if self.has_host_copy(variable) else variable

    def _write_target(self, variable):
        """The host copy a write to this trainable mirrored variable goes to."""
        if self._glp_pending is None:
            return self.host_copy(variable)
        first_time = all(queued is not variable for queued in self._glp_pending)
        if first_time:
            self._glp_pending.append(variable)
        return self.host_copy(variable, refresh=first_time)

    @contextlib.contextmanager
    def host_update(self, keras_variables):
        """The optimizer step on the host for these Keras variables (see the module docstring)."""
        swapped = [(v, inner) for v in {id(v): v for v in keras_variables}.values()
                   if self.has_host_copy(inner := compat.keras_variable_value(v))]
        outer = self._glp_pending
        self._glp_pending = [inner for _, inner in swapped]
        for keras_variable, inner in swapped:
            compat.set_keras_variable_value(keras_variable, self.host_copy(inner))
        try:
            yield
        finally:
            for keras_variable, inner in swapped:
                compat.set_keras_variable_value(keras_variable, inner)
            pending, self._glp_pending = self._glp_pending, outer
        for variable in {id(v): v for v in pending}.values():
            self._copy_to_replicas(variable)

    # -- updates ------------------------------------------------------------
    def _update(self, var, fn, args, kwargs, group):
        if not self._glp_on_host():
            return super()._update(var, fn, args, kwargs, group)
        if compat.is_distributed_variable(var):
            if not self.has_host_copy(var):
                return super()._update(var, fn, args, kwargs, group)
            target = self._write_target(var)
            index = _device_index([c.device for c in var.values], self._glp_host_device) or 0
        else:
            target, index = var, (_device_index(self.worker_devices, var.device) or 0)
        # No UpdateContext: a mirrored variable written inside `fn` (one the
        # optimizer does not own) is then written on every copy, once.
        with tf.device(target.device):
            result = fn(target, *compat.select_replica(index, args),
                        **compat.select_replica(index, kwargs))
        if compat.is_distributed_variable(var) and self._glp_pending is None:
            self._copy_to_replicas(var)
        return result if group else tf.nest.map_structure(self._local_results, result)

    def read_var(self, var):
        if isinstance(var, tf.distribute.DistributedValues):
            return super().read_var(var)
        return tf.identity(var.read_value())
