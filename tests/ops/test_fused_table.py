"""The fused-update tables: tf_glp/ops/host_optimizers.py's HostUpdate rows
against the registered ops and the native kinds' traits (Note [Update
kinds]), keras_fused.py's FusedOptimizer rows against Keras' optimizers
(Note [Fusing a Keras optimizer]), and FUSED_OPTIMIZERS against both."""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

import tf_glp
from tf_glp.ops.host_optimizers import HOST_UPDATES, apply_host_update
from tf_glp.ops.keras_fused import (
    FUSED_OPTIMIZER_TABLE,
    FUSED_OPTIMIZERS,
    fused_optimizer,
    supports_fused_update,
    update_bytes_per_parameter,
)

TABLE_CLASSES = {row.optimizer_class for row in FUSED_OPTIMIZER_TABLE}

# Optimizer classes that cannot be built without arguments (as in
# tests/strategy/test_drop_in.py).
_OPTIMIZER_ARGUMENTS = {
    "LossScaleOptimizer": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()),
    "MultiOptimizer": lambda: keras.optimizers.MultiOptimizer(lambda variable: keras.optimizers.Adam()),
}

# Settings that choose each of a row's host updates (default: the class's
# defaults only).
_SETTINGS = {
    "SGD": [{}, {"momentum": 0.9}, {"momentum": 0.9, "nesterov": True}],
}


def _keras_optimizer_names():
    return sorted(name for name, cls in inspect.getmembers(keras.optimizers, inspect.isclass)
                  if issubclass(cls, keras.optimizers.Optimizer) and cls is not keras.optimizers.Optimizer)


def _make(name):
    if name in _OPTIMIZER_ARGUMENTS:
        return _OPTIMIZER_ARGUMENTS[name]()
    return getattr(keras.optimizers, name)()


@pytest.mark.parametrize("update", HOST_UPDATES, ids=lambda u: u.op_name)
def test_host_update_rows_match_their_ops(update, native_mode):
    """The row's slots and scalars are the registered op's inputs, in order;
    one native run passes the kernel's own check that the op's inputs are
    those of its kind's traits (HostApplyOp's constructor)."""
    if not tf_glp.native_available():
        pytest.skip("native library not in use")
    native_mode("auto")
    op_def = op_def_registry.get(update.op_type)
    assert op_def is not None, update.op_type
    resources = [arg.name for arg in op_def.input_arg if arg.type == tf.resource.as_datatype_enum]
    assert resources == ["var", *update.slot_names]
    names = [arg.name for arg in op_def.input_arg]
    assert names == ["var", *update.slot_names, "grads", *update.scalar_names, "weight_decay", "decay_learning_rate"]
    attrs = {attr.name for attr in op_def.attr}
    assert attrs == {"N", "T", "use_weight_decay", *update.attr_names}
    assert update.bytes_per_parameter == {0: 12, 1: 20, 2: 28}[len(update.slot_names)]  # as the C++ test

    var = tf.Variable([1.0, 2.0])
    slots = [tf.Variable([0.0, 0.0]) for _ in update.slot_names]
    apply_host_update(update, var, slots, [tf.ones(2), tf.ones(2)], [0.1] * len(update.scalar_names),
                      {name: True for name in update.attr_names})
    assert np.all(np.isfinite(var.numpy()))
    assert not np.array_equal(var.numpy(), [1.0, 2.0])


@pytest.mark.parametrize("row", FUSED_OPTIMIZER_TABLE, ids=lambda r: r.name)
def test_table_rows_give_their_updates_what_they_take(row):
    settings = _SETTINGS.get(row.name, [{}])
    chosen = set()
    for kwargs in settings:
        opt = row.optimizer_class(**kwargs)
        var = keras.Variable(np.ones([3], np.float32))
        opt.build([var])
        assert fused_optimizer(opt) is row
        update = row.host_update(opt)
        assert update in row.host_updates
        chosen.add(update)
        slots = row.slots(opt, 0)
        assert len(slots) == len(update.slot_names)
        assert all(isinstance(s, tf.Variable) and s.shape == var.shape for s in slots)
        assert len(row.step_scalars(opt, tf.constant(0.01))) == len(update.scalar_names)
        assert set(row.attrs(opt)) == set(update.attr_names)
        assert update_bytes_per_parameter(opt) == update.bytes_per_parameter
    assert chosen == set(row.host_updates), "add settings to _SETTINGS that choose each update"


def test_fused_optimizers_names_exactly_the_table():
    names = [row.name for row in FUSED_OPTIMIZER_TABLE]
    assert len(set(names)) == len(names)
    assert FUSED_OPTIMIZERS == ", ".join(names[:-1]) + " and " + names[-1]
    assert FUSED_OPTIMIZERS == "SGD, Adam and AdamW"  # today's table; update with it
    assert tf_glp.ops.FUSED_OPTIMIZERS is FUSED_OPTIMIZERS and "FUSED_OPTIMIZERS" in tf_glp.ops.__all__


@pytest.mark.parametrize("name", _keras_optimizer_names())
def test_every_keras_optimizer_is_fused_exactly_when_in_the_table(name):
    opt = _make(name)
    ok, why = supports_fused_update(opt)
    assert ok == (type(opt) in TABLE_CLASSES), (name, why)
    if not ok:
        assert why == f"{name} has no fused host update ({FUSED_OPTIMIZERS} do)"


def test_subclasses_are_not_fused_unless_listed():
    class MyAdam(keras.optimizers.Adam):
        pass

    assert issubclass(keras.optimizers.AdamW, keras.optimizers.Adam)
    assert fused_optimizer(keras.optimizers.AdamW()).optimizer_class is keras.optimizers.AdamW
    ok, why = supports_fused_update(MyAdam())
    assert not ok and why == f"MyAdam has no fused host update ({FUSED_OPTIMIZERS} do)"


def test_bytes_per_parameter_for_the_cost_model():
    assert update_bytes_per_parameter() == 28  # no optimizer known: Adam's, as before the table
    assert update_bytes_per_parameter(keras.optimizers.RMSprop()) == 28
    assert update_bytes_per_parameter(keras.optimizers.Adam()) == 28
    assert update_bytes_per_parameter(keras.optimizers.AdamW()) == 28
    assert update_bytes_per_parameter(keras.optimizers.SGD()) == 12
    assert update_bytes_per_parameter(keras.optimizers.SGD(momentum=0.9)) == 20
