"""The plan store (tf_glp/tuning/store.py): one cache per user and machine,
where a second run finds every start-up choice of the first; a cache that
cannot be written warns once and never stops training; two writers at once
lose nothing."""

import json
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

import tf_glp
from tf_glp.tuning import store


def _fit(**settings):
    strategy = tf_glp.Strategy(**settings)
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.random((64, 8), dtype=np.float32), rng.random((64, 2), dtype=np.float32), batch_size=16,
              epochs=2, shuffle=False, verbose=0)
    return strategy, [w.numpy() for w in model.weights]


def test_where_the_cache_is(monkeypatch, tmp_path):
    monkeypatch.setenv(store.ENVIRONMENT, str(tmp_path / "mine"))
    assert store.resolve("auto") == str(tmp_path / "mine" / store.FILE_NAME)
    assert store.resolve("my_plans.json") == "my_plans.json" and store.resolve(None) is None
    monkeypatch.delenv(store.ENVIRONMENT)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store.cache_dir() == str(tmp_path / "xdg" / "tf_glp")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert store.cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "tf_glp")
    with pytest.raises(ValueError, match="plan_path must be 'auto', a file's path or None, got 3"):
        tf_glp.Strategy(plan_path=3)
    assert tf_glp.Strategy(plan_path=tmp_path / "p.json").settings.plan_path == str(tmp_path / "p.json")


def test_a_second_run_reuses_every_choice_and_trains_the_same_weights(tmp_path):
    """The default plan_path: the user's cache (the suite's conftest points
    TF_GLP_CACHE_DIR at a folder of the test's), not the working folder."""
    first, weights = _fit()
    cache = store.resolve("auto")
    assert os.path.dirname(cache) == os.environ[store.ENVIRONMENT]
    sections = json.loads(open(cache).read())
    [step] = sections[store.OPTIMIZER_STEPS]
    assert step["key"]["optimizer"] == "Adam" and step["key"]["update"] == "adam"
    assert step["key"]["cpu"] and step["key"]["keras"] == keras.__version__
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".json")]  # the working folder stays clean
    second, again = _fit()
    assert f"reused {cache}" in second.explain() and f"reused {cache}" not in first.explain()
    assert (step["choice"] == "fused") == ("tf_glp's fused update" in second.explain())
    for a, b in zip(weights, again, strict=True):
        np.testing.assert_array_equal(a, b)


def test_models_built_by_fit_are_keyed_by_their_own_shapes(tmp_path):
    """A Sequential without an Input is built by fit: built from the first
    batch before its key is made, two such models of different widths get
    entries of their own (with an empty key the second reused the first's)."""
    plan = str(tmp_path / "plan.json")
    rng = np.random.default_rng(0)
    x, y = rng.random((1024, 8), dtype=np.float32), rng.integers(0, 2, 1024)
    for units in (16, 64):
        strategy = tf_glp.Strategy(plan_path=plan)
        with strategy.scope():
            model = keras.Sequential([keras.layers.Dense(units, activation="relu"), keras.layers.Dense(2)])
            model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=16, epochs=2, verbose=0)
        assert "reused" not in strategy.explain(), strategy.explain()
    entries = json.loads(open(plan).read())[store.EXECUTIONS]
    assert [entry["key"]["trainable"][0][0] for entry in entries] == [[8, 16], [8, 64]]


def test_a_cache_that_cannot_be_written_warns_once_and_trains(tmp_path, monkeypatch):
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    monkeypatch.setenv(store.ENVIRONMENT, str(blocked))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, weights = _fit()
        _fit()
    cannot = [str(w.message) for w in caught if "cannot write the plan" in str(w.message)]
    assert len(cannot) == 1, cannot
    assert all(np.all(np.isfinite(w)) for w in weights)


def test_the_cache_keeps_the_newest_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "MAX_ENTRIES", 3)
    path = str(tmp_path / store.FILE_NAME)
    monkeypatch.setenv(store.ENVIRONMENT, str(tmp_path))
    assert store.resolve("auto") == path
    for model in range(5):
        store.write_entry(path, {"model": model}, {"choice": "x"}, store.PLANS, lambda e: True, "test")
    store.write_entry(path, {"model": 9}, {"choice": "y"}, store.EXECUTIONS, lambda e: True, "test")
    with open(path) as f:
        sections = json.load(f)
    assert [e["key"]["model"] for e in sections[store.PLANS]] == [2, 3, 4]
    assert [e["key"]["model"] for e in sections[store.EXECUTIONS]] == [9]


def test_two_writers_at_once_lose_nothing(tmp_path):
    """Two processes add 40 entries each to one file at the same time: the
    file stays readable and holds all 80 (a lock around each
    read-modify-write, an atomic replace)."""
    path = tmp_path / "shared.json"
    writer = (
        "import sys\n"
        "from tf_glp.tuning import store\n"
        "for i in range(40):\n"
        "    key = {'optimizer': sys.argv[1], 'trainable': i}\n"
        "    store.write_entry(sys.argv[2], key, {'choice': 'host'}, store.PLANS, lambda e: True, 'test')\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    processes = [subprocess.Popen([sys.executable, "-c", writer, name, str(path)], env=env,
                                  stderr=subprocess.DEVNULL) for name in ("A", "B")]
    assert [p.wait(timeout=120) for p in processes] == [0, 0]
    entries = json.loads(path.read_text())[store.PLANS]
    assert sorted((e["key"]["optimizer"], e["key"]["trainable"]) for e in entries) == sorted(
        (name, i) for name in ("A", "B") for i in range(40))


def test_the_profilers_plan_folder_keeps_the_newest_files(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "MAX_ENTRIES", 3)
    monkeypatch.setenv(store.ENVIRONMENT, str(tmp_path))
    paths = [store.keyed_file(store.LAYER_PLANS, {"model": model}) for model in range(5)]
    assert len(set(paths)) == 5 and paths[0] == store.keyed_file(store.LAYER_PLANS, {"model": 0})
    for age, path in enumerate(paths):
        store.write_json(path, {})
        os.utime(path, (1_000 + age, 1_000 + age))
    store.prune(store.LAYER_PLANS)
    assert sorted(os.listdir(tmp_path / store.LAYER_PLANS)) == sorted(os.path.basename(p) for p in paths[2:])
