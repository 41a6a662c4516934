"""A pytest plugin that runs Keras' own tests (the files that ship inside the
installed keras package) with tf_glp.Strategy: wherever they construct
`tf.distribute.MirroredStrategy`, or around every test case. Nothing is
copied: the tests are Keras' files as installed; only the constructor, or
the test case's setUp, is replaced at run time.

    TF_GLP_KERAS_TESTS_UPDATE=host python -m pytest -p keras_tests_plugin <keras test file>

TF_GLP_KERAS_TESTS_UPDATE: "host" or "replicas" (tf_glp.Strategy's mode in
place of MirroredStrategy); "one-device" (every Keras test case runs inside
the scope of a one-device tf_glp.Strategy(), so the models it builds train
under tf_glp's start-up choices); or "stock" (nothing replaced: the
baseline). Used by test_keras_own_tests.py.

TF_GLP_KERAS_TESTS_SCOPE=two-replicas (by hand, too slow for the suite):
every test case runs inside the scope of a strategy over two logical CPU
replicas, tf_glp.Strategy(update=TF_GLP_KERAS_TESTS_UPDATE) or, for
"stock", MirroredStrategy; docs/strategy.md ("Keras' own tests") has the
command and what it found.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _every_test_case_in(make_strategy) -> None:
    """Runs every Keras test case inside the scope of `make_strategy()`."""
    from keras.src.testing import test_case

    set_up = test_case.TestCase.setUp

    def in_a_strategy(self):
        # After Keras' setUp, which clears the session (a scope entered
        # before it could not be left).
        set_up(self)
        scope = make_strategy().scope()
        scope.__enter__()
        self.addCleanup(scope.__exit__, None, None, None)

    test_case.TestCase.setUp = in_a_strategy


def pytest_configure(config):
    update = os.environ.get("TF_GLP_KERAS_TESTS_UPDATE", "stock")
    if update not in ("stock", "host", "replicas", "one-device"):
        raise ValueError(f"TF_GLP_KERAS_TESTS_UPDATE must be 'stock', 'host', 'replicas' or 'one-device', "
                         f"got {update!r}")
    import tensorflow as tf

    two_replicas, devices = os.environ.get("TF_GLP_KERAS_TESTS_SCOPE") == "two-replicas", ["/cpu:0", "/cpu:1"]
    if two_replicas:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    if update == "stock":
        if two_replicas:
            _every_test_case_in(lambda: tf.distribute.MirroredStrategy(devices))
        return
    import tf_glp

    if two_replicas:
        _every_test_case_in(lambda: tf_glp.Strategy(devices, update=update, plan_path=None))
        return
    if update == "one-device":
        _every_test_case_in(lambda: tf_glp.Strategy(plan_path=None))
        return

    strategy_class = tf_glp.Strategy  # imported (its classes defined) before the constructor is replaced

    def mirrored_strategy(devices=None, cross_device_ops=None):
        # The devices Keras asks for; tf_glp's own host reductions in place
        # of the cross-device ops.
        return strategy_class(devices, update=update)

    tf.distribute.MirroredStrategy = mirrored_strategy
