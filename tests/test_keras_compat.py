"""The Keras / TensorFlow internals tf_glp relies on (tf_glp/_keras_compat.py)
exist in the installed versions and behave as it expects. A newer Keras that
changes one fails here, by name, before anything trains wrongly."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_glp import _keras_compat


def test_installed_versions_are_those_written_for():
    assert keras.__version__.startswith(_keras_compat.WRITTEN_FOR["keras"] + "."), keras.__version__
    assert tf.__version__.startswith(_keras_compat.WRITTEN_FOR["tensorflow"] + "."), tf.__version__


def test_every_class_level_internal_exists():
    assert _keras_compat.missing_internals() == []
    _keras_compat.require_internals()


def test_missing_internals_are_named(monkeypatch):
    monkeypatch.setitem(_keras_compat.INTERNALS, ("keras.src.trainers.trainer", "Trainer", "_gone"), "a test")
    assert _keras_compat.missing_internals() == ["keras.src.trainers.trainer.Trainer._gone (a test)"]
    with pytest.raises(RuntimeError, match=r"written for Keras 3\.15 .* lack: .*Trainer\._gone"):
        _keras_compat.require_internals()


def _built(optimizer, variables):
    optimizer.build(variables)
    return optimizer


def test_optimizer_internals_on_real_optimizers():
    variables = [keras.Variable(np.ones((3, 2), np.float32), name="w"), keras.Variable(np.zeros(2, np.float32))]
    adam = _built(keras.optimizers.AdamW(use_ema=True, gradient_accumulation_steps=2), variables)
    for index, variable in enumerate(variables):
        assert _keras_compat.variable_index(adam, variable) == index
        first, second = _keras_compat.adam_slots(adam, index)
        assert first.shape == second.shape == variable.shape
        assert _keras_compat.accumulator(adam, variable).shape == variable.shape
    assert [a.shape for a in _keras_compat.ema_averages(adam)] == [v.shape for v in variables]
    assert _keras_compat.built_variables(adam) == variables
    assert _keras_compat.uses_weight_decay(adam, variables[0])
    adam.exclude_from_weight_decay(var_names=["w"])
    assert not _keras_compat.uses_weight_decay(adam, variables[0])
    assert int(_keras_compat.step_counter(adam).numpy()) == 0
    clipped = _keras_compat.clip_gradients(keras.optimizers.SGD(clipvalue=0.5), [tf.constant([2.0, -2.0])])
    np.testing.assert_array_equal(clipped[0].numpy(), [0.5, -0.5])
    variable = keras.Variable(np.full(2, 4.0, np.float32))
    sgd = _built(keras.optimizers.SGD(0.1, weight_decay=0.5), [variable])
    _keras_compat.apply_weight_decay_to_copy(sgd, [variable])
    np.testing.assert_allclose(variable.numpy(), 4.0 - 4.0 * 0.5 * 0.1)


def test_dataset_batch_size():
    data = tf.data.Dataset.from_tensor_slices(np.zeros((10, 3), np.float32))
    assert _keras_compat.dataset_batch_size(data.batch(4, drop_remainder=True)) == 4
    assert _keras_compat.dataset_batch_size(data.batch(4)) == 4  # partial last batch: from BatchDataset


def test_layer_internals_that_twins_share():
    for layer in (keras.layers.Dense(3), keras.layers.Conv2D(2, 3)):
        layer.build((None, 5) if isinstance(layer, keras.layers.Dense) else (None, 6, 6, 1))
        assert layer._kernel is layer.kernel
        assert isinstance(layer._build_shapes_dict, dict)
