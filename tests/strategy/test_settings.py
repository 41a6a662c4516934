"""tf_glp.Strategy's settings: typed once, one frozen object, in explain()."""

import dataclasses

import pytest

import tf_glp
from tf_glp.strategy import HostStrategy, ReplicaStrategy
from tf_glp.strategy.settings import Settings

DEVICES = ["/cpu:0", "/cpu:1"]


def test_one_object_holds_what_the_user_passed():
    strategy = tf_glp.Strategy(DEVICES, update="replicas", chunking=2)
    assert strategy.settings == Settings(devices=tuple(DEVICES), update="replicas", chunking=2)
    assert strategy.update == "replicas" and strategy.chunking == 2 and strategy.compression is None
    assert strategy.explain().startswith(
        "tf_glp.Strategy(devices=('/cpu:0', '/cpu:1'), update='replicas', chunking=2, compression=None) on 2 replicas")
    with pytest.raises(dataclasses.FrozenInstanceError):
        strategy.settings.update = "host"


def test_update_defaults_to_auto_and_a_class_constructed_directly_implies_its_update():
    default = tf_glp.Strategy(DEVICES)
    assert type(default).__name__ == "AutoStrategy" and default.update == "auto" and default.concept == "host"
    assert ReplicaStrategy(DEVICES).update == "replicas" and ReplicaStrategy(DEVICES).settings.update == "replicas"
    assert HostStrategy(DEVICES).update == "host"


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(update="gpu"), "update must be 'host', 'replicas' or 'auto', got 'gpu'"),
    (dict(devices=DEVICES, cpu_replicas=2), "pass either devices or cpu_replicas, not both"),
    (dict(devices=[]), "devices must not be empty"),
])
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tf_glp.Strategy(**kwargs)


def test_the_docstring_example():
    assert repr(Settings(update="replicas", chunking=4, micro_batches=2)) == (
        "Settings(update='replicas', chunking=4, compression=None, micro_batches=2)")
