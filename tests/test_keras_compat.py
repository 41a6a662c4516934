"""The Keras / TensorFlow internals tf_glp relies on (tf_glp/_keras/compat.py)
exist in the installed versions and behave as it expects. A newer Keras that
changes one fails here, by name, before anything trains wrongly."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_glp._keras import compat
from tf_glp.ops.keras_fused import FUSED_OPTIMIZER_TABLE


def test_installed_versions_are_those_written_for():
    assert keras.__version__.startswith(compat.WRITTEN_FOR["keras"] + "."), keras.__version__
    assert tf.__version__.startswith(compat.WRITTEN_FOR["tensorflow"] + "."), tf.__version__


def test_every_class_level_internal_exists():
    assert compat.missing_internals() == []
    compat.require_internals()


def test_missing_internals_are_named(monkeypatch):
    monkeypatch.setitem(compat.INTERNALS, ("keras.src.trainers.trainer", "Trainer", "_gone"), "a test")
    assert compat.missing_internals() == ["keras.src.trainers.trainer.Trainer._gone (a test)"]
    with pytest.raises(RuntimeError, match=r"written for Keras 3\.15 .* lack: .*Trainer\._gone"):
        compat.require_internals()


def _built(optimizer, variables):
    optimizer.build(variables)
    return optimizer


def test_optimizer_internals_on_real_optimizers():
    variables = [keras.Variable(np.ones((3, 2), np.float32), name="w"), keras.Variable(np.zeros(2, np.float32))]
    adam = _built(keras.optimizers.AdamW(use_ema=True, gradient_accumulation_steps=2), variables)
    for index, variable in enumerate(variables):
        assert compat.variable_index(adam, variable) == index
    assert compat.built_variables(adam) == variables
    # Built from a tuple (as `apply_gradients(zip(...))` builds it), inside a
    # wrapper: still a list, the inner optimizer's variables included.
    wrapped = _built(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()), tuple(variables))
    assert compat.built_variables(wrapped) == variables
    assert compat.uses_weight_decay(adam, variables[0])
    adam.exclude_from_weight_decay(var_names=["w"])
    assert not compat.uses_weight_decay(adam, variables[0])
    variable = keras.Variable(np.full(2, 4.0, np.float32))
    sgd = _built(keras.optimizers.SGD(0.1, weight_decay=0.5), [variable])
    compat.apply_weight_decay_to_copy(sgd, [variable])
    np.testing.assert_allclose(variable.numpy(), 4.0 - 4.0 * 0.5 * 0.1)


@pytest.mark.parametrize("row", FUSED_OPTIMIZER_TABLE, ids=lambda row: row.name)
def test_every_fused_optimizers_slot_lists(row):
    """The private slot lists each FusedOptimizer row names (through
    compat.optimizer_slot), with every setting that changes them."""
    settings = {"SGD": [{"momentum": 0.9}], "Adam": [{"amsgrad": True}], "AdamW": [{"amsgrad": True}],
                "RMSprop": [{"centered": True, "momentum": 0.9}]}.get(row.name, [{}])
    for kwargs in settings:
        variables = [keras.Variable(np.ones((3, 2), np.float32)), keras.Variable(np.zeros(2, np.float32))]
        optimizer = _built(row.optimizer_class(**kwargs), variables)
        for index, variable in enumerate(variables):
            slots = [compat.optimizer_slot(optimizer, name, index) for name in row.slot_attributes(optimizer)]
            update = row.host_update(optimizer)
            assert slots and all(slot.shape == update.slot_shape(k, variable.shape)
                                 for k, slot in enumerate(slots)), row.name
            assert len({id(slot) for slot in slots}) == len(slots)
    nadam = _built(keras.optimizers.Nadam(), [keras.Variable(np.ones(2, np.float32))])
    assert float(compat.nadam_u_product(nadam).numpy()) == 1.0


def test_learning_rate_is_callable_as_adafactor_tests_it():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=10, decay_rate=0.5)
    assert compat.learning_rate_is_callable(keras.optimizers.Adafactor(schedule))
    assert compat.learning_rate_is_callable(keras.optimizers.Adafactor(lambda: 0.01))
    assert not compat.learning_rate_is_callable(keras.optimizers.Adafactor(0.01))


def test_optimizer_variables_are_told_apart_by_the_name_scope():
    """update="host" puts exactly the variables a Keras optimizer creates on
    the host (host_copies.py): this watches every tf.Variable created while
    a model, an optimizer (with EMA, accumulation, loss scaling) and a
    metric are built."""
    seen = []

    def creator(next_creator, **kwargs):
        seen.append((kwargs.get("name"), compat.creating_optimizer_variable()))
        return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.BatchNormalization()])
        optimizer = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.Nadam(use_ema=True, gradient_accumulation_steps=2))
        optimizer.build(model.trainable_variables)
        keras.metrics.Mean()
    model_names = {v.name for v in model.variables}
    assert seen and {name for name, _ in seen} >= model_names | {"iteration", "step_counter"}
    for name, from_optimizer in seen:
        assert from_optimizer == (name not in model_names | {"total", "count"}), name


def test_a_keras_variable_can_point_at_another_tf_variable():
    variable = keras.Variable(np.ones(2, np.float32))
    inner = compat.keras_variable_value(variable)
    other = tf.Variable(np.zeros(2, np.float32))
    compat.set_keras_variable_value(variable, other)
    variable.assign([3.0, 4.0])
    np.testing.assert_array_equal(other.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(inner.numpy(), [1.0, 1.0])
    assert compat.keras_variable_value(other) is other  # a tf.Variable as it is


def test_dataset_batch_size():
    data = tf.data.Dataset.from_tensor_slices(np.zeros((10, 3), np.float32))
    assert compat.dataset_batch_size(data.batch(4, drop_remainder=True)) == 4
    assert compat.dataset_batch_size(data.batch(4)) == 4  # partial last batch: from BatchDataset


def test_tensorboard_profiles_as_profile_batch_asks(tmp_path):
    assert not compat.tensorboard_profiles(keras.callbacks.TensorBoard(str(tmp_path)))  # Keras' default: 0
    assert compat.tensorboard_profiles(keras.callbacks.TensorBoard(str(tmp_path), profile_batch=(2, 3)))


def test_layer_internals_that_twins_share():
    for layer in (keras.layers.Dense(3), keras.layers.Conv2D(2, 3)):
        layer.build((None, 5) if isinstance(layer, keras.layers.Dense) else (None, 6, 6, 1))
        assert layer._kernel is layer.kernel
        assert isinstance(layer._build_shapes_dict, dict)


def test_trainer_and_layer_internals_of_micro_batches():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.5, name="drop"), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    assert compat.call_has_training_arg(model) is True
    assert isinstance(compat.loss_tracker(model), keras.metrics.Mean)
    assert "drop" in [layer.name for layer in compat.all_layers(model)]
    assert not compat.nothing_to_build(model)  # the optimizer, the compiled loss: not built yet
    model.fit(np.ones((2, 4), np.float32), np.zeros((2, 2), np.float32), verbose=0)
    assert compat.nothing_to_build(model)
    x, y = np.ones((2, 4), np.float32), np.zeros((2, 2), np.float32)
    loss = compat.compute_loss(model, x, y, model(x), None)
    assert loss.shape == ()
