"""Plans: JSON round trip, atomic writes, reuse decisions, the table and the CLI."""

import json
import os

import pytest

from tf_glp.profiling import plan as plan_lib


CONFIG = {"filters": 4, "kernel_size": [3, 3], "strides": [1, 1], "padding": "valid"}


def _plan(batch=32):
    header = {"schema": plan_lib.SCHEMA, "tf_glp": "0.1.0", "tensorflow": "2.21.0", "device": "CPU, 2 op threads",
              "isa": "avx512", "batch_size": batch}
    layer = plan_lib.LayerPlan(
        name="conv", layer_class="Conv2D", input_shape=[batch, 8, 8, 1], dtype="float32", config=CONFIG, cap=2,
        cap_reason="2 threads",
        candidates=[plan_lib.Candidate(None, 1.0, 0.1), plan_lib.Candidate(1, 1.2, 0.1), plan_lib.Candidate(2, 0.5, 0.05)],
        choice=2, reason="fastest")
    return plan_lib.Plan(header=header, layers=[layer])


def test_round_trip_and_reuse(tmp_path):
    path = str(tmp_path / "plan.json")
    plan_lib.write(_plan(), path)
    assert os.listdir(tmp_path) == ["plan.json"]  # no temporary file left behind
    loaded = plan_lib.read(path)
    assert loaded == _plan()
    assert loaded.mismatch(_plan().header, [("Conv2D", [32, 8, 8, 1], "float32", CONFIG)]) is None
    assert "batch_size is 32 in the plan, 64 here" in loaded.mismatch({**_plan().header, "batch_size": 64}, [])
    for other in (("Conv2D", [32, 9, 9, 1], "float32", CONFIG), ("Dense", [32, 8, 8, 1], "float32", CONFIG),
                  ("Conv2D", [32, 8, 8, 1], "float32", {**CONFIG, "filters": 8})):
        assert "differ" in loaded.mismatch(_plan().header, [other])


def test_atomic_write_keeps_the_old_plan_when_writing_fails(tmp_path, monkeypatch):
    path = str(tmp_path / "plan.json")
    plan_lib.write(_plan(), path)

    def broken_dump(obj, f, **kwargs):
        f.write('{"header": ')
        raise OSError("disk full")

    monkeypatch.setattr(plan_lib.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        plan_lib.write(_plan(64), path)
    assert os.listdir(tmp_path) == ["plan.json"]
    assert plan_lib.read(path) == _plan()


def _edited(**changes):
    data = _plan().to_json()
    data["layers"][0].update(changes)
    return json.dumps(data)


def _with_left_alone(left_alone):
    return json.dumps({**_plan().to_json(), "left_alone": left_alone})


def test_left_alone_layers_round_trip_and_are_in_the_table(tmp_path):
    path = str(tmp_path / "plan.json")
    plan = _plan()
    plan.left_alone = [{"name": "c1", "layer_class": "Conv1D", "reason": "not Conv2D or Dense"}]
    plan_lib.write(plan, path)
    assert plan_lib.read(path) == plan
    assert plan_lib.table(plan).splitlines()[-1] == "left as it is: c1 (Conv1D): not Conv2D or Dense"


@pytest.mark.parametrize("text", ["{not json", "[]", '{"header": []}', '{"header": {"schema": 1}}',
                                  '{"header": {"schema": 99}, "layers": []}',
                                  '{"header": {"schema": 1}, "layers": [{"name": "x"}]}',
                                  _edited(choice="2"), _edited(input_shape=None), _edited(cap=0), _edited(config=[]),
                                  _with_left_alone({}), _with_left_alone([{"name": "c1"}])])
def test_corrupt_plans_are_value_errors(tmp_path, text):
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(ValueError):
        plan_lib.read(str(path))


def test_table_and_chart():
    text = plan_lib.table(_plan())
    header, rule, row = text.splitlines()
    assert header.split()[:3] == ["layer", "input", "shape"]
    assert row.split() == ["conv", "32x8x8x1", "1.000", "0.500", "(k=2)", "k=2", "2.00x", "2"]
    image = plan_lib.bar_chart(_plan())
    assert image.ndim == 3 and image.shape[2] == 3 and image.dtype.name == "uint8"
    assert (image != 255).any()


def test_table_shows_an_optimizer_record_without_timings(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**_plan().to_json(), "optimizer": {"choice": "native"}}))
    plan = plan_lib.read(str(path))  # from_json asks only for the choice
    assert plan_lib.table(plan).splitlines()[-1] == "optimizer step: Keras' own"
    plan.optimizer["reason"] = "fused not faster"
    assert plan_lib.table(plan).splitlines()[-1] == "optimizer step: Keras' own (fused not faster)"
    plan.optimizer.update(optimizer_class="Adam", native_ms=2.0, fused_ms=1.0, timed_parameters=10, parameters=10,
                          choice="fused", reason="1.9x faster")
    assert plan_lib.table(plan).splitlines()[-1] == ("optimizer step: tf_glp's fused update (Adam, 1.9x faster; "
                                                     "timed on 10 of 10 parameters: Keras 2.000 ms, fused 1.000 ms)")


def test_cli_show(tmp_path, capsys):
    path = str(tmp_path / "plan.json")
    plan_lib.write(_plan(), path)
    assert plan_lib.main(["show", path]) == 0
    out = capsys.readouterr().out
    assert "batch_size=32" in out and "conv" in out and "cap 2 (2 threads)" in out
    assert plan_lib.main(["show", str(tmp_path / "missing.json")]) == 1
    assert json.loads(open(path).read())["header"]["schema"] == plan_lib.SCHEMA
