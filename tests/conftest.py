"""Shared test setup: quiet TensorFlow, four logical CPU devices (so that
strategies run with 2 and 4 replicas on any machine), fixed seeds."""

import gc
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 4
RAY_TESTS = Path(__file__).parent / "ray"

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS
)


# Tracing a step allocates objects by the hundred thousand: with Python's
# default thresholds (700, 10, 10) a small fit ran some 120 young collections
# (8% of its time); with these, a few (4%; 15 fits of test_drop_in.py, measured).
gc.set_threshold(50_000, 20, 20)


def pytest_addoption(parser):
    parser.addoption("--fuzz-cases", type=int, default=None,
                     help="cases for tests/ops/test_raw_op_fuzz.py (default: its fixed-seed sample)")
    parser.addoption("--ray", action="store_true",
                     help="collect tests/ray (the Ray Train tests), which the suite leaves out")


def pytest_ignore_collect(collection_path, config):
    # tests/ray runs as a step of its own (tools/dev.sh test: pytest --ray
    # tests/ray): its Ray workers and the suite's processes would share the
    # machine's two cores.
    if collection_path == RAY_TESTS and not config.getoption("--ray"):
        return True
    return None


# The files that take minutes, started first. With `--dist loadfile` each
# file runs whole in one process, handed out in collection order under
# tools/dev.sh's --no-loadscope-reorder (xdist's default hands out the files
# with the most tests first): started last, test_keras_own_tests.py kept
# one core busy alone for the last minutes of the run (2026-12-07/08).
SLOW_FIRST = ("strategy/test_keras_own_tests.py", "strategy/test_multi_worker_configurations.py",
              "strategy/test_multi_worker.py", "strategy/test_real_models.py", "test_examples.py",
              "test_engine_examples.py", "bench/test_compare.py")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        path = item.path.relative_to(Path(__file__).parent).as_posix()
        return SLOW_FIRST.index(path) if path in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # (stable: each file's tests keep their order)


def pytest_configure(config):
    # Read when the fuzz tests are collected (in every xdist worker too).
    if config.getoption("--fuzz-cases") is not None:
        os.environ["TF_GLP_FUZZ_CASES"] = str(config.getoption("--fuzz-cases"))


@pytest.fixture(scope="module", autouse=True)
def _earlier_objects_frozen():
    """Each test file starts with what the earlier ones left frozen
    (gc.freeze): TensorFlow's and Keras' modules, their caches, and the
    earlier files' uncollected garbage. A collection then walks only this
    file's objects: in a long-lived test process the collections that
    walked everything took 0.5-0.9 s each; with TensorFlow's and Keras'
    modules frozen, 0.15-0.3 s (a loop of 30 small fits, measured).

    The earlier files' garbage is frozen, not collected (each process
    holds at most about 4 GB so): collecting it stalled the suite. Now and
    then a collection frees a tf.data iterator abandoned in a reference
    cycle, and the iterator's destructor waits, with the GIL held, for one
    of tf.data's autotuning threads: py-spy and gdb during such pauses show
    the collecting thread in RootDataset::Iterator::~Iterator and two
    Model::OptimizeLoop threads in a timed wait (a 115-s pause with 0.8 s
    of CPU). Three of five suite runs paused 21-116 s so at the same
    boundary (after test_micro_batches.py); not reproduced with that file
    alone (TensorFlow 2.21). Such a pause inside a file still happens."""
    gc.freeze()
    yield


@pytest.fixture(autouse=True)
def _working_directory(tmp_path, monkeypatch):
    """Every test runs in its own folder, with its own plan cache: what
    tf_glp writes by default (tf_glp.Strategy's plan store, the profiler's
    plans) neither lands in the checkout or the user's cache nor
    carries from one test to the next (subprocesses inherit both)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TF_GLP_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture
def fused_calls(monkeypatch):
    """A list that gets one entry per call of tf_glp's fused Keras update."""
    import tf_glp

    calls = []
    original = tf_glp.ops.FusedKerasUpdate.apply
    monkeypatch.setattr(tf_glp.ops.FusedKerasUpdate, "apply",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    return calls


@pytest.fixture
def optimizer_step_winner(monkeypatch):
    """Injects the one-device optimizer step's timings:
    optimizer_step_winner("fused") makes the fused update measure 2x faster,
    optimizer_step_winner("native") Keras' update."""
    from tf_glp.profiling import optimizer_step

    def set_winner(winner):
        fast, slow = [0.001] * 5, [0.002] * 5
        monkeypatch.setattr(optimizer_step, "time_updates",
                            lambda *a, **k: (slow, fast) if winner == "fused" else (fast, slow))

    return set_winner


@pytest.fixture
def native_mode(monkeypatch):
    """Switches tf_glp between its native ops and the fallbacks in one test:
    `native_mode("0")` forces the fallback, `native_mode("auto")` restores."""
    from tf_glp import _native

    def switch(value: str) -> None:
        monkeypatch.setenv("TF_GLP_NATIVE", value)
        _native._reset_for_tests()

    yield switch
    monkeypatch.delenv("TF_GLP_NATIVE", raising=False)
    _native._reset_for_tests()


@pytest.fixture
def exact_arithmetic():
    """Grappler's arithmetic and dependency optimizers off: both rewrite a
    graph according to everything in it, so two programs that differ in one
    part (the optimizer update) can compute another part (the gradients)
    with other roundings. Bitwise comparisons of two programs need them off
    (ResNet50V2 with Adam: with the dependency optimizer on, 160 of 174
    gradients round differently once the fused update is in the graph;
    docs/numerics.md, "The fused optimizer update")."""
    options = ("arithmetic_optimization", "dependency_optimization")
    before = {name: tf.config.optimizer.get_experimental_options().get(name, True) for name in options}
    tf.config.optimizer.set_experimental_options({name: False for name in options})
    yield
    tf.config.optimizer.set_experimental_options(before)
