"""The strategy wing's registries: the update concepts (concepts.py), the
compression schemes (compression.py), the strategy classes the factory
picks from, and the hooks contract the Keras patches call
(tf_glp/_keras/patches.py StrategyHooks)."""

import inspect
import re

import numpy as np
import pytest
import tensorflow as tf

import tf_glp
from tf_glp._keras import patches
from tf_glp._keras.patches import StrategyHooks
from tf_glp.strategy import Strategy, compression, concept_model, concepts, devices

DEVICES = ["/cpu:0", "/cpu:1"]


def test_every_concept_says_what_it_is_and_what_it_moves():
    assert list(concepts.CONCEPTS) == ["host", "replicas", "all-reduce"]
    for name, concept in concepts.CONCEPTS.items():
        assert concept.name == name and concept.summary
        traffic = concept.traffic(gpus=4, parameters=1000, state_bytes_per_parameter=24)
        assert all(value >= 0 for value in vars(traffic).values())
    assert concepts.SETTINGS == ("host", "replicas", "auto")  # all-reduce: only through "auto"
    assert list(concept_model.CONCEPTS) == [*concepts.CONCEPTS, "one GPU"]
    with pytest.raises(ValueError, match="unknown update concept 'ring'; known: 'host', 'replicas', 'all-reduce'"):
        concepts.get("ring")


def test_the_factory_has_a_class_for_every_placement_and_setting():
    for placement in (devices.ONE_DEVICE, devices.ONE_MACHINE, devices.WORKERS):
        for setting in concepts.SETTINGS:
            cls = Strategy._classes[(placement, concepts.served(setting))]
            assert issubclass(cls, Strategy) and cls.__module__.endswith("_strategy"), (placement, setting)
    public = {name for name in tf_glp.strategy.__all__ if name.endswith("Strategy")}
    assert public == {cls.__name__ for cls in Strategy._classes.values()} | {"Strategy"}


@pytest.mark.parametrize("update", concepts.SETTINGS)
def test_each_strategy_runs_its_settings_concept_and_keeps_the_hooks_contract(update):
    strategy = tf_glp.Strategy(DEVICES, update=update)
    assert strategy.update_concept is concepts.for_setting(update) and strategy.concept == strategy.update_concept.name
    assert isinstance(strategy, StrategyHooks)
    one_device = tf_glp.Strategy(update=update)
    assert isinstance(one_device, StrategyHooks) and one_device._is_one_device


def test_the_hooks_contract_lists_exactly_the_hooks_the_patches_call():
    """StrategyHooks is what tf_glp/_keras/patches.py calls on a strategy:
    no hook it never calls (fit_setup's own calls are the strategy
    package's business), none it calls unlisted."""
    source = inspect.getsource(patches)
    called = set(re.findall(r"\bstrategy\.(_[a-z_]+)\(", source))
    listed = {name for name, value in vars(StrategyHooks).items()
              if name.startswith("_") and not name.startswith("__") and callable(value)}
    assert called == listed, (sorted(called - listed), sorted(listed - called))


@pytest.mark.parametrize("name", list(compression.SCHEMES))
def test_every_compression_scheme_crosses_and_comes_back(name):
    scheme = compression.get(name)
    values = tf.constant([1.0, -2.5, 1e-3, 3.0e4], tf.float32)
    wire = compression.compress([values, tf.constant([1, 2])], scheme)
    assert wire[0].dtype == scheme.wire_dtype and wire[1].dtype == tf.int32  # only float32 is encoded
    np.testing.assert_allclose(scheme.decode(wire[0]).numpy(), values.numpy(), rtol=1e-2)
    assert compression.for_host([values], scheme, "/cpu:0")[0].dtype == (
        scheme.wire_dtype if scheme.fused_readable else tf.float32)
    huge = tf.constant([1e6], tf.float32)
    if scheme.can_overflow:
        with pytest.raises(tf.errors.InvalidArgumentError, match="does not fit in float16"):
            compression.compress([huge], scheme)
        assert np.isinf(compression.compress([huge], scheme, overflow="propagate")[0].numpy()).all()
    else:
        assert np.isfinite(compression.compress([huge], scheme)[0].numpy()).all()
    assert compression.get(None) is None
