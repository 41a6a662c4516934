"""tf_glp.Strategy as a drop-in for MirroredStrategy, over lists taken from
Keras itself at test time: every optimizer class keras.optimizers exports,
every constraint in keras.constraints, every convolution layer in
keras.layers (grouped variants too). A class Keras adds joins these tests
without anyone writing one. Each trains in both modes and is compared with
MirroredStrategy (ReductionToOneDevice): weights and optimizer variables to
rtol 1e-5 (the constraints and the convolutions as branches of one model per
list: one fit per strategy). Also: custom training loops (with and without accumulation and
explicit loss scaling), `strategy.run` variable reads, and `train_step`
overrides."""

import inspect
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_glp
from tf_glp.ops.keras_fused import FUSED_OPTIMIZER_TABLE

DEVICES = ["/cpu:0", "/cpu:1"]
MODES = ["host", "replicas"]
L = keras.layers
RTOL, ATOL = 1e-5, 1e-6


def mirrored():
    return tf.distribute.MirroredStrategy(DEVICES, cross_device_ops=tf.distribute.ReductionToOneDevice())


def glp(update):
    return tf_glp.Strategy(DEVICES, update=update, chunking="none")


# Optimizer classes that cannot be built without arguments: how to build one.
_OPTIMIZER_ARGUMENTS = {
    "LossScaleOptimizer": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-2)),
    "MultiOptimizer": lambda: _multi_optimizer(),
}


def _multi_optimizer():
    adam, sgd = keras.optimizers.Adam(1e-2), keras.optimizers.SGD(0.05, momentum=0.9)
    return keras.optimizers.MultiOptimizer(lambda variable: sgd if len(variable.shape) == 1 else adam)


def _optimizer_names():
    return sorted(name for name, cls in inspect.getmembers(keras.optimizers, inspect.isclass)
                  if issubclass(cls, keras.optimizers.Optimizer) and cls is not keras.optimizers.Optimizer)


def _make_optimizer(name):
    if name in _OPTIMIZER_ARGUMENTS:
        return _OPTIMIZER_ARGUMENTS[name]()
    return getattr(keras.optimizers, name)()


def _constraint_names():
    return sorted(name for name, cls in inspect.getmembers(keras.constraints, inspect.isclass)
                  if issubclass(cls, keras.constraints.Constraint) and cls is not keras.constraints.Constraint)


def _convolution_cases():
    """Every convolution layer class in keras.layers (aliases once), with a
    grouped variant where the class takes `groups`."""
    cases = {}
    for name, cls in inspect.getmembers(L, inspect.isclass):
        match = re.fullmatch(r"(Depthwise|Separable)?Conv(\d)D(Transpose)?", name)
        if not match:
            continue
        cases[name] = (cls, {})
        if "groups" in inspect.signature(cls.__init__).parameters and not match.group(1):
            cases[f"{name}-groups2"] = (cls, {"groups": 2})
    return cases


CONVOLUTIONS = _convolution_cases()


def _data(input_shape, n=32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, *input_shape)).astype(np.float32), rng.standard_normal((n, 3)).astype(np.float32)


def _train(strategy, make_layers, optimizer):
    x, y = _data((6, 6, 4))
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6, 6, 4)), *make_layers(), L.Flatten(), L.Dense(3)])
        model.compile(optimizer=optimizer(), loss="mse")
    history = model.fit(x, y, batch_size=8, shuffle=False, verbose=0).history
    # What the comparison reads: the loss, then (path, value) of every weight
    # and optimizer variable.
    return (history["loss"], [(v.path, v.numpy()) for v in model.weights],
            [(v.path, v.numpy()) for v in model.optimizer.variables])


_REFERENCES: dict = {}


def _reference(key, train):
    """A run the cases share, made by the first that reads it: stock
    MirroredStrategy's run for both modes, and a list's branched run for all
    its cases."""
    if key not in _REFERENCES:
        _REFERENCES[key] = train()
    return _REFERENCES[key]


# Fused updates that match Keras' to rounding only (docs/numerics.md: Ftrl's
# pow, Lamb's sums): compared against each array's largest value.
TO_ROUNDING = {"Ftrl", "Lamb", "Adafactor"}


def _assert_same(ours, reference, what):
    np.testing.assert_allclose(ours[0], reference[0], rtol=RTOL, err_msg=f"{what}: loss")
    for mine, theirs in zip(ours[1:], reference[1:], strict=True):
        assert len(mine) == len(theirs), what
        for (_, a), (path, b) in zip(mine, theirs, strict=True):
            atol = RTOL * max(1.0, float(np.abs(b).max())) if what in TO_ROUNDING else ATOL
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=atol, err_msg=f"{what}: {path}")


def test_the_lists_come_from_keras():
    assert {"Adam", "SGD", "Nadam", "Muon", "Adafactor", "LossScaleOptimizer"} <= set(_optimizer_names())
    assert {"MaxNorm", "NonNeg", "UnitNorm", "MinMaxNorm"} <= set(_constraint_names())
    assert {"Conv1D", "Conv2D-groups2", "Conv3D", "DepthwiseConv2D", "SeparableConv2D",
            "Conv2DTranspose"} <= set(CONVOLUTIONS)


@pytest.mark.parametrize("update", MODES)
@pytest.mark.parametrize("name", _optimizer_names())
def test_every_keras_optimizer(name, update, fused_calls):
    def layers():
        return [L.Conv2D(4, 3, activation="relu"), L.BatchNormalization()]

    reference = _reference(("optimizer", name), lambda: _train(mirrored(), layers, lambda: _make_optimizer(name)))
    ours = _train(glp(update), layers, lambda: _make_optimizer(name))
    _assert_same(ours, reference, name)
    # The table's classes, and the two wrappers here (around Adam / SGD).
    fusable = name in {row.name for row in FUSED_OPTIMIZER_TABLE} | {"LossScaleOptimizer", "MultiOptimizer"}
    assert bool(fused_calls) == (update == "host" and fusable), name


# Constraints and convolutions: one model per list, a branch per case (the
# layers under test on their own input, flattened and joined before one Dense
# head), so a list trains in one fit per strategy; each case compares its own
# branch's weights and optimizer variables (and the shared loss and head).
def _train_branches(strategy, branches, optimizer):
    """branches: {case: (input_shape, make_layers(name))}. Returns the loss, every
    weight and optimizer variable by path, each case's weight paths (the
    head's under "head") and how many fused updates ran."""
    keras.utils.set_random_seed(3)
    shapes = sorted({shape for shape, _ in branches.values()}, key=len)
    data = {shape: _data(shape, seed=i)[0] for i, shape in enumerate(shapes)}
    calls = []
    fused = tf_glp.ops.FusedKerasUpdate.apply
    tf_glp.ops.FusedKerasUpdate.apply = lambda self, *a, **k: calls.append(1) or fused(self, *a, **k)
    try:
        with strategy.scope():
            inputs = {shape: keras.Input(shape) for shape in shapes}
            joined, owned = [], {}
            for case, (shape, make_layers) in branches.items():
                x, layers = inputs[shape], make_layers(case)
                for layer in layers:
                    x = layer(x)
                joined.append(L.Flatten()(x))
                owned[case] = layers
            owned["head"] = [L.Dense(3, name="head")]
            # (Named layers: the paths are the same in every run of the process.)
            model = keras.Model([inputs[s] for s in shapes], owned["head"][0](L.Concatenate()(joined)),
                                name="branches")
            model.compile(optimizer=optimizer(), loss="mse")
        history = model.fit([data[s] for s in shapes], _data(shapes[0])[1], batch_size=8, shuffle=False,
                            verbose=0).history
    finally:
        tf_glp.ops.FusedKerasUpdate.apply = fused
    return (history["loss"], {v.path: v.numpy() for v in model.weights},
            # (Without the optimizer's name, numbered per process: adam_1/...)
            {v.path.split("/", 1)[-1]: v.numpy() for v in model.optimizer.variables},
            {case: [v.path for layer in layers for v in layer.weights] for case, layers in owned.items()},
            len(calls))


def _assert_same_branch(ours, reference, case):
    """The loss, then the weights and optimizer variables of `case`'s branch
    and of the head (Keras names an optimizer variable after its weight's
    path, "/" written "_": Adam keeps two per weight)."""
    np.testing.assert_allclose(ours[0], reference[0], rtol=RTOL, err_msg=f"{case}: loss")
    assert ours[3] == reference[3] and ours[1].keys() == reference[1].keys() and ours[2].keys() == reference[2].keys()
    weights = ours[3][case] + ours[3]["head"]
    flat = {w.replace("/", "_") for w in weights}
    slots = [path for path in reference[2] if path.rsplit("_", 1)[0] in flat]
    assert weights and len(slots) == 2 * len(weights), (case, weights, slots)
    for got, expected, paths in ((ours[1], reference[1], weights), (ours[2], reference[2], slots)):
        for path in paths:
            np.testing.assert_allclose(got[path], expected[path], rtol=RTOL, atol=ATOL, err_msg=f"{case}: {path}")


def _every_constraint(strategy):
    def branch(name):
        constraint = getattr(keras.constraints, name)
        return (6, 6, 4), lambda case: [
            L.Conv2D(4, 3, kernel_constraint=constraint(), bias_constraint=constraint(), name=case),
            L.Dense(5, kernel_constraint=constraint(), name=f"{case}_dense")]

    return _train_branches(strategy, {name: branch(name) for name in _constraint_names()},
                           lambda: keras.optimizers.Adam(0.05))


@pytest.mark.parametrize("update", MODES)
@pytest.mark.parametrize("name", _constraint_names())
def test_every_keras_constraint(name, update):
    reference = _reference("constraints", lambda: _every_constraint(mirrored()))
    ours = _reference(("constraints", update), lambda: _every_constraint(glp(update)))
    _assert_same_branch(ours, reference, name)
    assert bool(ours[4]) == (update == "host")  # constraints no longer keep the fused update out


def _every_convolution(strategy):
    def branch(case):
        cls, extra = CONVOLUTIONS[case]
        rank = int(re.search(r"(\d)D", cls.__name__).group(1))
        if "Depthwise" in cls.__name__:
            return (5,) * rank + (4,), lambda case: [cls(kernel_size=2, name=case, **extra)]
        return (5,) * rank + (4,), lambda case: [cls(4, kernel_size=2, name=case, **extra)]

    return _train_branches(strategy, {case: branch(case) for case in sorted(CONVOLUTIONS)},
                           lambda: keras.optimizers.Adam(0.01))


@pytest.mark.parametrize("update", MODES)
@pytest.mark.parametrize("case", sorted(CONVOLUTIONS))
def test_every_keras_convolution(case, update):
    reference = _reference("convolutions", lambda: _every_convolution(mirrored()))
    _assert_same_branch(_reference(("convolutions", update), lambda: _every_convolution(glp(update))),
                        reference, case)


# -- custom training loops ------------------------------------------------------
def _custom_loop(strategy, *, accumulation=None, loss_scaled=False, steps=6):
    x, y = _data((4,), n=16 * steps, seed=1)
    keras.utils.set_random_seed(5)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), L.Dense(8, activation="relu"), L.Dense(3)])
        optimizer = keras.optimizers.Adam(0.05, gradient_accumulation_steps=accumulation)
        if loss_scaled:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(16))

    def replica_step(inputs, targets):
        with tf.GradientTape() as tape:
            per_sample = keras.losses.mean_squared_error(targets, model(inputs, training=True))
            loss = tf.nn.compute_average_loss(per_sample, global_batch_size=16)
            scaled = optimizer.scale_loss(loss) if loss_scaled else loss
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step(inputs, targets):
        losses = strategy.run(replica_step, args=(inputs, targets))
        return strategy.reduce("SUM", losses, axis=None)

    losses = [float(step(*batch)) for batch in dataset]
    return losses, [v.numpy() for v in model.weights], [v.numpy() for v in optimizer.variables]


def _assert_same_loop(ours, reference):
    np.testing.assert_allclose(ours[0], reference[0], rtol=RTOL)
    for a, b in zip(ours[1] + ours[2], reference[1] + reference[2], strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("update", MODES)
@pytest.mark.parametrize("loss_scaled", [False, True], ids=["plain", "loss_scaled"])
def test_custom_training_loop(loss_scaled, update):
    _assert_same_loop(_custom_loop(glp(update), loss_scaled=loss_scaled),
                      _custom_loop(mirrored(), loss_scaled=loss_scaled))


@pytest.mark.parametrize("update", MODES)
@pytest.mark.parametrize("loss_scaled", [False, True], ids=["plain", "loss_scaled"])
def test_gradient_accumulation_in_a_custom_loop_matches_one_device(loss_scaled, update):
    # Stock MirroredStrategy cannot run this loop inside a tf.function (Keras
    # puts a merge_call inside a cond); Keras' own eager test of it runs in
    # test_keras_own_tests.py. The reference: the same loop on one device.
    _assert_same_loop(_custom_loop(glp(update), accumulation=3, loss_scaled=loss_scaled),
                      _custom_loop(tf.distribute.get_strategy(), accumulation=3, loss_scaled=loss_scaled))


@pytest.mark.parametrize("update", MODES)
def test_keras_gradient_accumulation_sequence(update):
    """Keras' own test_gradient_accumulation (eager strategy.run), with each
    replica's own gradient tensor as in training (Keras' test shares one
    tensor object, see test_keras_own_tests.py), step by step against
    stock: the same weights after every step; the accumulator holds the
    replicas' sum where stock's holds one replica's share."""

    def steps(strategy):
        with strategy.scope():
            variable = keras.Variable([[1.0, 2.0], [3.0, 4.0]])
            grads = tf.constant([[1.0, 1.0], [2.0, 2.0]])
            optimizer = keras.optimizers.SGD(learning_rate=1.0, gradient_accumulation_steps=3)
            seen = []
            for _ in range(4):
                strategy.run(lambda: optimizer.apply_gradients([(tf.identity(grads), variable)]))
                seen.append((variable.numpy(), optimizer._accumulated_gradients[0].numpy(),
                             int(optimizer.iterations.numpy())))
        return seen

    for (weights, accumulator, iterations), (ref_weights, ref_accumulator, ref_iterations) in zip(
            steps(glp(update)), steps(mirrored()), strict=True):
        np.testing.assert_array_equal(weights, ref_weights)
        np.testing.assert_array_equal(accumulator, 2 * ref_accumulator)
        assert iterations == ref_iterations
    assert not np.array_equal(ref_weights, [[1.0, 2.0], [3.0, 4.0]])


@pytest.mark.parametrize("update", MODES)
def test_strategy_run_reads_each_replicas_copy(update):
    strategy = glp(update)
    with strategy.scope():
        layer = L.Dense(2)
        layer.build((None, 3))
    values = strategy.run(lambda: layer.kernel.value)
    assert isinstance(values, tf.distribute.DistributedValues)
    copies = strategy.experimental_local_results(values)
    assert len(copies) == 2 and {c.device.split(":")[-1] for c in copies} == {"0", "1"}
    for copy in copies:
        np.testing.assert_array_equal(copy.numpy(), layer.kernel.numpy())


@pytest.mark.parametrize("update", MODES)
def test_train_step_override(update):
    class ClippedModel(keras.Model):
        """A custom train_step: its own loss, gradient clipping and metric."""

        def __init__(self):
            super().__init__()
            self.hidden, self.out = L.Dense(8, activation="relu"), L.Dense(3)
            self.tracker = keras.metrics.Mean(name="loss")

        def call(self, inputs):
            return self.out(self.hidden(inputs))

        def train_step(self, data):
            inputs, targets = data
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(self(inputs, training=True) - targets))
                loss = loss / self.distribute_strategy.num_replicas_in_sync
            grads = tape.gradient(loss, self.trainable_variables)
            grads = [tf.clip_by_value(g, -0.1, 0.1) for g in grads]
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

        @property
        def metrics(self):
            return [self.tracker]

    x, y = _data((4,), n=64, seed=2)

    def train(strategy):
        keras.utils.set_random_seed(9)
        with strategy.scope():
            model = ClippedModel()
            model.compile(optimizer=keras.optimizers.RMSprop(0.01))
        history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
        return history["loss"], [v.numpy() for v in model.weights + model.optimizer.variables]

    reference, ours = train(mirrored()), train(glp(update))
    np.testing.assert_allclose(ours[0], reference[0], rtol=RTOL)
    for a, b in zip(ours[1], reference[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("optimizer", ["Adam", "Nadam"])
def test_host_copies_apart_from_the_replicas(optimizer, tmp_path):
    """Replicas that do not include the host device (as GPUs do not): each
    weight's host copy is then a separate host variable, refreshed from the
    first replica at every step, so weights written past the optimizer (a
    checkpoint restore writes the replicas' copies directly) are what the
    next step starts from."""
    devices = ["/cpu:1", "/cpu:2"]
    x, y = _data((6, 6, 4))

    def train(strategy):
        keras.utils.set_random_seed(3)
        with strategy.scope():
            model = keras.Sequential([keras.Input((6, 6, 4)), L.Conv2D(4, 3), L.Flatten(), L.Dense(3)])
            model.compile(optimizer=getattr(keras.optimizers, optimizer)(0.01), loss="mse")
        checkpoint = tf.train.Checkpoint(model=model)
        saved = checkpoint.save(str(tmp_path / f"{type(strategy).__name__}" / "ckpt"))
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        checkpoint.restore(saved)  # back to the initial weights, behind the optimizer's back
        history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0).history
        return history["loss"], [v.numpy() for v in model.weights + model.optimizer.variables]

    strategy = tf_glp.Strategy(devices, update="host", chunking="none")
    ours = train(strategy)
    reference = train(tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice()))
    np.testing.assert_allclose(ours[0], reference[0], rtol=RTOL)
    for a, b in zip(ours[1], reference[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    assert strategy.extended._glp_masters  # the separate host copies were used


def test_separate_host_copies_are_refreshed_in_every_step():
    """The same traced step, called again after the replicas' copies were
    written directly (as a checkpoint restore writes them): the update
    starts from what the replicas hold, as under stock MirroredStrategy."""
    devices = ["/cpu:1", "/cpu:2"]

    def run(strategy):
        with strategy.scope():
            variable = keras.Variable(np.ones((3, 2), np.float32))
            optimizer = keras.optimizers.SGD(0.5)

        @tf.function
        def step():
            strategy.run(lambda: optimizer.apply_gradients([(tf.ones((3, 2)) * 0.1, variable)]))

        step()
        for copy in variable.value.values:  # behind the optimizer's back
            copy.assign(np.full((3, 2), 4.0, np.float32))
        step()
        return [copy.numpy() for copy in variable.value.values]

    ours = run(tf_glp.Strategy(devices, update="host", chunking="none"))
    reference = run(tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice()))
    for a, b in zip(ours, reference, strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL)
    np.testing.assert_allclose(ours[0], 4.0 - 0.5 * 0.2, rtol=RTOL)
