"""The optimizer step chosen at start-up (tf_glp/profiling/optimizer_step.py):
the choice rule, the fused step bitwise equal to Keras' own (Grappler's
arithmetic and dependency optimizers off: conftest.exact_arithmetic), also
where gradients are rounding noise around zero, the plan entry and its
reuse, and Keras' update kept where the fused one does not apply."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_glp.profiling import plan as plan_lib
from tf_glp.callbacks import ConcurrencyProfiler
from tf_glp.profiling import choice, optimizer_step

L = keras.layers


def test_choose():
    assert optimizer_step.choose([10.0, 10.2, 9.9, 10.1], [5.0, 5.1, 4.9, 5.2])[0] == "fused"
    assert optimizer_step.choose([10.0, 10.2, 9.9, 10.1], [9.8, 9.9, 9.7, 9.9])[0] == "native"  # under 5%
    # faster median, but the spreads overlap
    assert optimizer_step.choose([10.0, 14.0, 6.0, 10.0], [8.0, 12.0, 5.0, 9.0])[0] == "native"


@pytest.mark.parametrize("step_ms, rounds", [(10.0, 5), (1.0, 13), (0.1, optimizer_step.MAX_TRIALS)])
def test_short_updates_are_timed_in_more_rounds(step_ms, rounds, monkeypatch):
    """At least `trials` rounds; more while both updates' time stays under
    ROUNDS_BUDGET_S (25 ms: 13 rounds of 1 ms each), at most MAX_TRIALS."""
    class Clock:  # each update takes step_ms
        now = 0.0

        def perf_counter(self):
            Clock.now += step_ms / 1e3
            return Clock.now

    monkeypatch.setattr(optimizer_step, "time", Clock())
    variables = [keras.Variable(np.zeros((4, 3), np.float32)), keras.Variable(np.zeros((3,), np.float32))]
    native, fused = optimizer_step.time_updates(keras.optimizers.Adam(), variables, trials=5)
    assert len(native) == len(fused) == rounds
    assert native == pytest.approx([step_ms / 1e3] * rounds)


def _train(optimizer, callbacks, epochs=2, dtype=None):
    rng = np.random.default_rng(0)
    x, y = rng.random((96, 12), dtype=np.float32), rng.integers(0, 3, 96)
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((12,)),
                              L.Dense(16, activation="relu", kernel_constraint=keras.constraints.MaxNorm(1.0),
                                      dtype=dtype),
                              L.Dense(3, dtype=dtype)])
    model.compile(optimizer=optimizer(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=32, epochs=epochs, verbose=0, callbacks=callbacks).history
    return model, history["loss"]


OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(1e-2),
    "adamw_ema": lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.05, use_ema=True),
    "sgd_nesterov": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "sgd_clipnorm": lambda: keras.optimizers.SGD(0.05, clipnorm=0.1),
    # The other fused formulas, each with one of the options Keras applies
    # around its update step (not Ftrl: its pow is not TensorFlow's, it
    # matches to rounding, tests/ops/test_fused_table.py).
    "adam_amsgrad_schedule": lambda: keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(1e-2, decay_steps=2, decay_rate=0.5), amsgrad=True),
    "rmsprop_momentum_clipvalue": lambda: keras.optimizers.RMSprop(1e-2, momentum=0.5, clipvalue=0.5),
    "rmsprop_centered": lambda: keras.optimizers.RMSprop(1e-2, centered=True),
    "adagrad_global_clipnorm": lambda: keras.optimizers.Adagrad(1e-1, global_clipnorm=1.0),
    "adamax_decay": lambda: keras.optimizers.Adamax(1e-2, weight_decay=0.05),
    "adadelta": lambda: keras.optimizers.Adadelta(1.0),
    "lion_ema": lambda: keras.optimizers.Lion(1e-3, use_ema=True, ema_overwrite_frequency=2),
    "nadam_accumulation": lambda: keras.optimizers.Nadam(1e-2, gradient_accumulation_steps=2),
    "schedule_free_adamw": lambda: keras.optimizers.ScheduleFreeAdamW(1e-2, warmup_steps=2),
}


def _conv_bias_before_batch_norm():
    """Conv biases in front of BatchNormalization: their true gradient is
    zero, what reaches the optimizer is rounding noise, which Adam turns
    into steps of up to +-lr (what made ResNet50V2 differ, docs/numerics.md)."""
    return keras.Sequential([keras.Input((8, 8, 3)), L.Conv2D(8, 3, padding="same"), L.BatchNormalization(),
                             L.ReLU(), L.Conv2D(8, 3, padding="same"), L.BatchNormalization(), L.ReLU(),
                             L.GlobalAveragePooling2D(), L.Dense(3)])


def _fit_conv(optimizer, callbacks):
    rng = np.random.default_rng(1)
    x, y = rng.random((64, 8, 8, 3), dtype=np.float32), rng.integers(0, 3, 64)
    keras.utils.set_random_seed(5)
    model = _conv_bias_before_batch_norm()
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    loss = model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=callbacks).history["loss"]
    return model, loss, (x, y)


def test_fused_adam_is_bitwise_keras_on_near_zero_gradients(exact_arithmetic, monkeypatch, fused_calls):
    reference, reference_loss, (x, y) = _fit_conv(keras.optimizers.Adam(1e-2), [])
    monkeypatch.setattr(optimizer_step, "choose", lambda native, fused: ("fused", "forced by the test"))
    monkeypatch.setattr(choice, "choose", lambda candidates: (None, "forced by the test"))
    model, loss, _ = _fit_conv(keras.optimizers.Adam(1e-2),
                               [ConcurrencyProfiler(trials=1, plan_path=None, verbose=0, batch_size=16)])
    assert fused_calls and loss == reference_loss
    for a, b in zip(model.weights + model.optimizer.variables, reference.weights + reference.optimizer.variables,
                    strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=b.path)
    # The case is the one meant: the biases in front of BatchNormalization
    # get gradients that are noise next to their kernels'.
    with tf.GradientTape() as tape:
        logits = reference(x[:16], training=True)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y[:16], logits)
    convs = [layer for layer in reference.layers if isinstance(layer, L.Conv2D)]
    grads = tape.gradient(loss, [[conv.bias, conv.kernel] for conv in convs])
    for conv, (bias, kernel) in zip(convs, grads):
        assert np.abs(bias.numpy()).max() < 1e-5 * np.abs(kernel.numpy()).max(), conv.name


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_choice_trains_bitwise_like_keras(name, exact_arithmetic, monkeypatch, tmp_path, fused_calls):
    reference, reference_loss = _train(OPTIMIZERS[name], [])
    monkeypatch.setattr(optimizer_step, "choose", lambda native, fused: ("fused", "forced by the test"))
    # The layers keep TensorFlow's kernels (lanes compute the same to float32
    # rounding, not bitwise): this compares the optimizer step alone.
    monkeypatch.setattr(choice, "choose", lambda candidates: (None, "forced by the test"))
    path = str(tmp_path / "plan.json")
    model, loss = _train(OPTIMIZERS[name], [ConcurrencyProfiler(trials=1, plan_path=path, verbose=0, batch_size=32)])
    assert fused_calls  # the fused update ran
    assert loss == reference_loss
    for a, b in zip(model.weights + model.optimizer.variables, reference.weights + reference.optimizer.variables,
                    strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=b.path)
    entry = plan_lib.read(path).optimizer
    assert entry["choice"] == "fused" and entry["native_ms"] > 0 and entry["fused_ms"] > 0
    assert "optimizer step" in plan_lib.table(plan_lib.read(path))


def test_a_matching_plan_is_reused_without_timing(monkeypatch, tmp_path):
    path = str(tmp_path / "plan.json")
    _train(OPTIMIZERS["adam"], [ConcurrencyProfiler(trials=1, plan_path=path, verbose=0, batch_size=32)], epochs=1)
    stored = plan_lib.read(path).optimizer
    assert stored["optimizer_class"] == "Adam"

    def no_timing(*args, **kwargs):
        raise AssertionError("timed again although the plan matches")

    monkeypatch.setattr(optimizer_step, "time_updates", no_timing)
    callback = ConcurrencyProfiler(trials=1, plan_path=path, verbose=0, batch_size=32)
    model, _ = _train(OPTIMIZERS["adam"], [callback], epochs=1)
    assert callback.reused
    assert optimizer_step.uses_fused_update(model.optimizer) == (stored["choice"] == "fused")


@pytest.mark.parametrize("case", ["muon", "strategy", "float64", "off"])
def test_keras_update_stays_where_the_fused_one_does_not_apply(case, monkeypatch, fused_calls):
    monkeypatch.setattr(optimizer_step, "choose", lambda native, fused: ("fused", "forced by the test"))
    optimizer = (lambda: keras.optimizers.Muon(1e-2)) if case == "muon" else OPTIMIZERS["adam"]
    callback = ConcurrencyProfiler(trials=1, plan_path=None, verbose=0, batch_size=32,
                                   optimizer_step=case != "off")
    if case == "strategy":
        with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
            model, loss = _train(optimizer, [callback], epochs=1)
    elif case == "float64":
        model, loss = _train(optimizer, [callback], epochs=1, dtype="float64")
    else:
        model, loss = _train(optimizer, [callback], epochs=1)
    assert np.all(np.isfinite(loss))
    assert not fused_calls and not optimizer_step.uses_fused_update(model.optimizer)
    ok, why = optimizer_step.eligible(model)
    if case != "off":
        assert not ok and why


def test_plan_entry_round_trip_and_bad_entries(tmp_path):
    plan = plan_lib.Plan(header={"schema": 1}, layers=[], optimizer={
        "optimizer_class": "Adam", "choice": "fused", "reason": "r", "native_ms": 2.0, "fused_ms": 1.0})
    path = str(tmp_path / "p.json")
    plan_lib.write(plan, path)
    assert plan_lib.read(path).optimizer == plan.optimizer
    with pytest.raises(ValueError, match="optimizer must be null"):
        plan_lib.Plan.from_json({"header": {}, "layers": [], "optimizer": {"choice": "magic"}})
