"""Keras' own tests, as shipped in the installed keras package, with
tf_glp.Strategy (keras_tests_plugin.py): the distribution tests with it in
place of MirroredStrategy, in both modes; the callback, optimizer, model and
saving tests with every test case inside a one-device tf_glp.Strategy() (its
start-up choices: the counts measured on the tests' own steps, the fused
update). Every test that passes
stock passes with tf_glp.Strategy, but for the exceptions listed with their
reasons. Each run is a fresh process (Keras' tests reset TensorFlow's
context and configure their own logical devices); tf_glp's two distribution
runs go at once, as do the two halves of the one-device run; stock's runs
only when tf_glp failed a test."""

import functools
import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import keras
import pytest

KERAS_SRC = pathlib.Path(keras.__file__).parent / "src"
# The distribution tests of the TensorFlow backend (every
# keras/src/backend/tensorflow/*distribute*_test.py the installed Keras has)
# and the distribution case of the EMA-swapping callback's tests.
FILES = sorted(str(p) for p in (KERAS_SRC / "backend" / "tensorflow").glob("*distribute*_test.py"))
EXTRA = [str(KERAS_SRC / "callbacks" / "swap_ema_weights_test.py")
         + "::SwapEMAWeightsTest::test_swap_ema_weights_with_tf_distribute"]

# Tests that cannot pass with tf_glp.Strategy, with the reason (also in
# docs/strategy.md, "Keras' own tests").
CANNOT_PASS: dict[str, str] = {
    "optimizer_distribute_test.py::OptimizerDistributeTest::test_gradient_accumulation":
        "its gradient is one tensor object shared by both replicas, which TensorFlow's merge counts once "
        "(Keras' test_ema relies on that). tf_glp sums the replicas before it accumulates, so it "
        "accumulates that gradient once and moves the weights by it at the update; stock accumulates "
        "per replica and sums at the update, counting it twice. With per-replica gradients, as in "
        "training, tf_glp's weights are stock's after every step: "
        "test_drop_in.py::test_keras_gradient_accumulation_sequence.",
}


# Keras' tests of what fit runs and saves: every keras/src/callbacks/*_test.py,
# optimizers/*_test.py, models/*_test.py and saving/*_test.py the installed
# Keras has, and BatchNormalization's.
ONE_DEVICE_FILES = sorted(str(p) for p in [
    *(KERAS_SRC / "callbacks").glob("*_test.py"), *(KERAS_SRC / "optimizers").glob("*_test.py"),
    *(KERAS_SRC / "models").glob("*_test.py"), *(KERAS_SRC / "saving").glob("*_test.py"),
    KERAS_SRC / "layers" / "normalization" / "batch_normalization_test.py"])
_REPLACED = ("tf_glp's BackupAndRestore takes the place of the user's keras.callbacks.BackupAndRestore "
             "(fit_setup.py: chief-only atomic backups that resume at the batch); the test reads or corrupts the "
             "private state and files of the user's object, which then stay untouched")
ONE_DEVICE_CANNOT_PASS: dict[str, str] = {
    "backup_and_restore_test.py::BackupAndRestoreCallbackTest::test_best_case_step":
        _REPLACED + "; and the resumed fit starts at the batch of the backup, where Keras' starts the epoch again "
        "(its forward-pass counter ends at 15, Keras' at 17: Keras trains that epoch's first batches twice)",
    "backup_and_restore_test.py::BackupAndRestoreCallbackTest::test_best_case_epoch": _REPLACED,
    "backup_and_restore_test.py::BackupAndRestoreCallbackTest::test_backup_corrupted": _REPLACED,
    "swap_ema_weights_test.py::SwapEMAWeightsTest::test_swap_ema_weights_with_tf_distribute":
        "it makes a MirroredStrategy of its own inside tf_glp's scope, which TensorFlow refuses to mix; it runs "
        "with tf_glp.Strategy in MirroredStrategy's place among the distribution tests (EXTRA)",
    "saving_lib_test.py::SavingBattleTest::test_legacy_load_skips_missing_nested_containers":
        "its fixture file (test_data/pre_pr22362_nested_container.keras) is not in the installed package: it "
        "fails without tf_glp too",
}


def _start(update: str, tmp_path, files=(*FILES, *EXTRA)):
    """Starts one run of Keras' tests `files` ("stock", "host", "replicas"
    or "one-device") in folder `tmp_path`."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    report = tmp_path / f"{update}.xml"
    env = dict(os.environ, TF_GLP_KERAS_TESTS_UPDATE=update, KERAS_BACKEND="tensorflow",
               PYTHONPATH=os.pathsep.join([str(pathlib.Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    args = [sys.executable, "-m", "pytest", "-q", "-p", "keras_tests_plugin", "-p", "no:cacheprovider",
            "--continue-on-collection-errors", f"--junitxml={report}", "--rootdir", str(KERAS_SRC), *files]
    process = subprocess.Popen(args, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    return process, report


# A test file or test that needs what Keras' tests may use and tf_glp does not
# install (remote_monitor_test.py imports Keras' repository conftest;
# orbax_checkpoint_test.py needs orbax-checkpoint): failed on any strategy.
MISSING = ("collection failure", "ImportError", "ModuleNotFoundError")


def _outcomes(process, report) -> dict[str, str]:
    """{test id: "passed" | "failed: ..." | "skipped"} of one finished run."""
    output, _ = process.communicate(timeout=900)
    assert report.exists(), output[-6000:]
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        module = case.get("classname").rsplit(".", 1)[0].rsplit(".", 1)[-1]
        name = f"{module}.py::{case.get('classname').split('.')[-1]}::{case.get('name')}"
        detail = case.find("failure") if case.find("failure") is not None else case.find("error")
        message = (detail.get("message") or "") if detail is not None else ""
        if case.find("skipped") is not None or message.startswith(MISSING):
            outcomes[name] = "skipped"  # (the test's own decision, or a package this machine lacks)
        elif detail is not None:
            outcomes[name] = "failed: " + message[:300]
        else:
            outcomes[name] = "passed"
    return outcomes


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """tf_glp's two runs, started together (much of each is Python start-up
    and tracing, one core's work); stock MirroredStrategy's run only when
    one of them failed a test (see `stock_passes`)."""
    started = {update: _start(update, tmp_path_factory.mktemp(update)) for update in ("host", "replicas")}
    return {update: _outcomes(*run) for update, run in started.items()}


@pytest.fixture(scope="module")
def stock_passes(tmp_path_factory):
    """Whether stock MirroredStrategy passes a test: its run starts when
    first asked, once."""

    @functools.cache
    def passed(files: tuple[str, ...]) -> frozenset[str]:
        outcomes = _outcomes(*_start("stock", tmp_path_factory.mktemp("stock"), files))
        return frozenset(name for name, outcome in outcomes.items() if outcome == "passed")

    return lambda name, files=(*FILES, *EXTRA): name in passed(tuple(files))


@pytest.mark.parametrize("update", ["host", "replicas"])
def test_keras_distribution_tests_pass_with_tf_glp(update, runs, stock_passes):
    ours = runs[update]
    # Keras' files were found and run: the distribution tests themselves,
    # not an empty selection.
    assert sum(outcome == "passed" for outcome in ours.values()) >= 15, ours
    # Every test stock MirroredStrategy passes passes with tf_glp (stock runs
    # only if tf_glp failed one: a test failing on both is Keras' own). A
    # skip is the test's own decision about this machine (today: "tf_keras
    # not installed"), taken before any strategy runs.
    failing = {name: outcome for name, outcome in ours.items()
               if outcome.startswith("failed") and name not in CANNOT_PASS and stock_passes(name)}
    assert not failing, failing
    # Each listed exception still exists in the installed Keras (else the
    # list is stale and must shrink).
    assert set(CANNOT_PASS) <= set(ours), set(CANNOT_PASS) - set(ours)


def test_keras_fit_tests_pass_with_every_model_under_one_device_tf_glp(tmp_path, stock_passes):
    # Two runs at once, each half of the files (alternately, in size order, so
    # the halves take about as long): the suite's longest test, most of it
    # one core's Python.
    by_size = sorted(ONE_DEVICE_FILES, key=os.path.getsize, reverse=True)
    halves = [by_size[0::2], by_size[1::2]]
    started = [_start("one-device", tmp_path / str(i), files) for i, files in enumerate(halves)]
    ours = {name: outcome for run in started for name, outcome in _outcomes(*run).items()}
    assert sum(outcome == "passed" for outcome in ours.values()) >= 400, ours
    failing = {name: outcome for name, outcome in ours.items()
               if outcome.startswith("failed") and name not in ONE_DEVICE_CANNOT_PASS
               and stock_passes(name, ONE_DEVICE_FILES)}
    assert not failing, failing
    # Each listed exception still fails (else the list is stale and must shrink).
    assert {name: ours.get(name) for name in ONE_DEVICE_CANNOT_PASS
            if not str(ours.get(name)).startswith("failed")} == {}
