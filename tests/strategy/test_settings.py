"""tf_glp.Strategy's settings: typed once, one frozen object, in explain();
each default in one place, every check at construction."""

import dataclasses
import inspect

import pytest

import tf_glp
from tf_glp.strategy import AutoStrategy, HostStrategy, MultiWorkerHostStrategy, ReplicaStrategy, Strategy
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
    (dict(update="all-reduce"), "update must be 'host', 'replicas' or 'auto', got 'all-reduce'"),
    (dict(devices=DEVICES, cpu_replicas=2), "pass either devices or cpu_replicas, not both"),
    (dict(devices=[]), "devices must not be empty"),
    (dict(cpu_replicas=0), "cpu_replicas must be at least 1, got 0"),
    (dict(cpu_replicas="2"), "cpu_replicas must be None or an int, got '2'"),
    (dict(chunking=0), "chunking as a number of chunks must be >= 1, got 0"),
    (dict(chunking="lots"), "chunking must be 'auto', 'none', an int number of chunks, or a byte size"),
    (dict(compression="int8"), "compression must be None, 'bf16' or 'fp16', got 'int8'"),
    (dict(micro_batches=0), "micro_batches must be None or a positive int, got 0"),
    (dict(micro_batches=2, compression="bf16"), "compression='bf16' cannot apply to them"),
])
def test_bad_settings_are_named_before_anything_is_set_up(kwargs, message, monkeypatch):
    # Settings checks them all: no device is made and no strategy class runs.
    monkeypatch.setattr(Strategy, "_init_distribution", lambda self: pytest.fail("set up despite a bad setting"))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tf_glp.Strategy(**kwargs)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings(**kwargs)


@pytest.mark.parametrize("cls", [HostStrategy, ReplicaStrategy, AutoStrategy, MultiWorkerHostStrategy])
def test_a_contradictory_explicit_update_raises(cls):
    other = "replicas" if cls._implied_update != "replicas" else "host"
    with pytest.raises(ValueError, match=f"{cls.__name__} runs update={cls._implied_update!r}, got update={other!r}"):
        cls(DEVICES, update=other)


def test_each_setting_has_one_default_and_settings_are_built_by_keyword():
    parameters = inspect.signature(tf_glp.Strategy).parameters
    for field in dataclasses.fields(Settings):
        assert parameters[field.name].default == field.default, field.name
    assert set(parameters) == {field.name for field in dataclasses.fields(Settings)}
    with pytest.raises(TypeError):
        Settings(DEVICES)  # keyword only: no setting taken by its position


def test_the_docstring_example():
    assert repr(Settings(update="replicas", chunking=4, micro_batches=2)) == (
        "Settings(update='replicas', chunking=4, compression=None, micro_batches=2)")
