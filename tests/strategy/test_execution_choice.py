"""The steps per execution (and XLA) a one-device tf_glp.Strategy chooses at
the start of the first fit (tf_glp/strategy/execution_choice.py).

The clock is injected (each read moves it on by the way being timed), so
the choice is deterministic; what it trains is compared bit for bit with
plain Keras given the chosen value in compile."""

import json

import numpy as np
import pytest
import tensorflow as tf

import keras
import tf_glp
from tf_glp.strategy import execution_choice
from tf_glp.tuning import store

# 10 steps per epoch: the counts are 1 and 4, and Keras calls fit's function
# every 4 steps (4 + 4 + 2). The counts' measurement (rounds=2) takes 6 calls of
# 4 steps, two per epoch: the fourth epoch runs the winner.
BATCH, SAMPLES, EPOCHS, STRIDE = 64, 640, 4, 4


@pytest.fixture(autouse=True)
def _keras_update(optimizer_step_winner):
    """The optimizer step held at Keras' own update (timed, the fused one
    wins on these small models: its different graph rounds the gradients
    differently, and the comparisons with plain Keras are bitwise)."""
    optimizer_step_winner("native")


def _clock(ms: dict[str, float], calls: list | None = None):
    """A clock under which one step of each way takes `ms[label]`; the way
    timed is read from `clock.choice.current`."""
    now = [0.0]

    def clock():
        label = clock.choice.current
        if calls is not None:
            calls.append(label)
        now[0] += ms[label] * STRIDE / 1e3  # (a call's steps: the same for every way)
        return now[0]

    return clock


def _strategy(ms=None, calls=None, devices=None, **settings):
    strategy = tf_glp.Strategy(devices, plan_path=settings.pop("plan_path", None), **settings)
    choice = strategy._choices["execution"]  # noqa: SLF001 (the tests inject the clock and the thresholds)
    # Every way measured in every round (the rules that stop early have tests of their own).
    choice.budget, choice.probe_win, choice.xla_hint = float("inf"), float("inf"), float("inf")
    choice.rounds = 2
    if ms is not None:
        choice.clock = _clock(ms, calls)
        choice.clock.choice = choice
    return strategy


def _model(**compile_args):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((12,)), keras.layers.Dense(16, activation="relu"), keras.layers.BatchNormalization(),
        keras.layers.Dropout(0.3), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.RMSprop(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  **compile_args)
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.random((SAMPLES, 12), dtype=np.float32), rng.integers(0, 3, SAMPLES)


class Record(keras.callbacks.Callback):
    """What fit ran (epoch-level hooks only: it does not hold the choice back)."""

    def on_train_begin(self, logs=None):
        self.ways = getattr(self, "ways", []) + [(self.model.steps_per_execution, self.model.jit_compile)]


class CountBatches(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1


def _fit(model, callbacks=(), epochs=EPOCHS, verbose=0):
    x, y = _data()
    return model.fit(x, y, batch_size=BATCH, epochs=epochs, validation_data=(x[:128], y[:128]), verbose=verbose,
                     shuffle=False, callbacks=list(callbacks))


FAST_4 = {"1": 3.0, "4": 1.0, "XLA 4": 0.5}


def test_chosen_steps_per_execution_trains_bitwise_like_the_count_written_by_hand(tmp_path):
    strategy = _strategy(FAST_4)
    with strategy.scope():
        model = _model()
    traces, step = [], model.train_step
    model.train_step = lambda data: traces.append(1) or step(data)  # (runs once per trace)
    record = Record()
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "glp.weights.h5"), save_weights_only=True)
    history = _fit(model, [record, checkpoint])
    assert record.ways == [(4, False)]  # XLA measured fastest, but not allowed
    assert len(traces) == 3, traces  # 1, 4 and XLA 4, each once: the fit runs on the XLA weighing's traces
    assert (model.steps_per_execution, model.jit_compile) == (1, False)  # the user's again after fit
    explain = strategy.explain()
    assert "steps_per_execution=4, no XLA: 3.00x as fast as 1" in explain, explain
    assert "pass tf_glp.Strategy(allow_xla=True)" in explain, explain

    by_hand = _model(steps_per_execution=4)
    hand_checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "hand.weights.h5"), save_weights_only=True)
    hand_history = _fit(by_hand, [hand_checkpoint])
    assert history.history == hand_history.history
    for mine, theirs in zip(model.variables + model.optimizer.variables,
                            by_hand.variables + by_hand.optimizer.variables, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=mine.path)
    x, y = _data()
    assert model.evaluate(x, y, verbose=0) == by_hand.evaluate(x, y, verbose=0)
    saved, hand_saved = _model(), _model()
    saved.load_weights(str(tmp_path / "glp.weights.h5"))
    hand_saved.load_weights(str(tmp_path / "hand.weights.h5"))
    for mine, theirs in zip(saved.weights, hand_saved.weights, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())

    again = _fit(model, [record], epochs=1)  # the chosen way's functions are kept: no new measurement
    assert record.ways[-1] == (4, False) and len(again.history["loss"]) == 1


@pytest.mark.parametrize("update", ["host", "replicas"])
def test_replicas_choose_the_count_too_and_train_bitwise_like_the_count_written_by_hand(update):
    devices = ["/cpu:0", "/cpu:1"]
    calls = []
    strategy = _strategy(FAST_4, calls, devices, update=update)
    with strategy.scope():
        model = _model()
    record = Record()
    history = _fit(model, [record])
    assert record.ways == [(4, False)] and "XLA 4" not in calls  # XLA: one device only
    assert "steps_per_execution=4, no XLA: 3.00x as fast as 1" in strategy.explain()
    by_hand = tf_glp.Strategy(devices, update=update, plan_path=None)
    with by_hand.scope():
        model_by_hand = _model(steps_per_execution=4)
    assert history.history == _fit(model_by_hand).history
    for mine, theirs in zip(model.variables, model_by_hand.variables, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=mine.path)


def test_a_callback_with_batch_hooks_keeps_one_step_per_call_and_is_named():
    strategy = _strategy(FAST_4)
    with strategy.scope():
        model = _model()
    counter = CountBatches()
    _fit(model, [counter])
    assert counter.batches == EPOCHS * SAMPLES // BATCH  # every step, as the user wrote it
    explain = strategy.explain()
    assert "steps_per_execution kept at 1: CountBatches has batch-level hooks" in explain, explain
    assert "(not measured)" in explain, explain  # (measuring on the fit's steps would call them less often)
    _fit(model)  # measured: 4
    counter = CountBatches()
    _fit(model, [counter], epochs=1)
    assert counter.batches == SAMPLES // BATCH
    explain = strategy.explain()
    assert "kept at 1: CountBatches has batch-level hooks, which Keras would call every 4 steps (4 measured 3.00x " \
           "faster)" in explain, explain


def _epoch_scalars(folder, tag: str) -> list[float]:
    """The values TensorBoard wrote under `tag` in `folder`'s event files."""
    return [float(tf.make_ndarray(value.tensor)) for path in sorted(folder.glob("events.out.tfevents.*"))
            for event in tf.compat.v1.train.summary_iterator(str(path)) for value in event.summary.value
            if value.tag == tag]


def test_tensorboard_writing_per_epoch_lets_the_counts_be_measured(tmp_path):
    # Keras' TensorBoard as written by default (per epoch, no profiling) has
    # batch hooks that do the same at any count: the count is measured, and
    # its summaries are the fit's logs.
    strategy = _strategy(FAST_4)
    with strategy.scope():
        model = _model()
    record = Record()
    history = _fit(model, [record, keras.callbacks.TensorBoard(str(tmp_path))])
    assert record.ways == [(4, False)]
    assert "steps_per_execution=4, no XLA: 3.00x as fast as 1" in strategy.explain()
    assert _epoch_scalars(tmp_path / "train", "epoch_loss") == history.history["loss"]
    assert _epoch_scalars(tmp_path / "validation", "epoch_loss") == history.history["val_loss"]


def test_inputs_and_targets_given_as_lists_are_read_as_keras_reads_them():
    # Two inputs of different shapes and two outputs, as Python lists: the
    # XLA weighing's batch keeps them apart, as Keras' adapter does (tf.data
    # would stack a list into one tensor).
    def model_and_fit(**compile_args):
        keras.utils.set_random_seed(0)
        a, b = keras.Input((3,)), keras.Input((5,))
        joined = keras.layers.Concatenate()([keras.layers.Dense(4)(a), keras.layers.Dense(4)(b)])
        model = keras.Model([a, b], [keras.layers.Dense(1)(joined), keras.layers.Dense(2)(joined)])
        model.compile(optimizer=keras.optimizers.RMSprop(1e-2), loss=["mse", "mse"], **compile_args)
        rng = np.random.default_rng(0)
        x = [rng.random((SAMPLES, 3), dtype=np.float32), rng.random((SAMPLES, 5), dtype=np.float32)]
        y = [rng.random((SAMPLES, 1), dtype=np.float32), rng.random((SAMPLES, 2), dtype=np.float32)]
        return model, model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, shuffle=False)

    strategy = _strategy(FAST_4)
    with strategy.scope():
        model, history = model_and_fit()
    assert "steps_per_execution=4, no XLA: 3.00x as fast as 1" in strategy.explain()
    by_hand, hand_history = model_and_fit(steps_per_execution=4)
    assert list(history.history.values()) == list(hand_history.history.values())  # (the layers' names differ)
    for mine, theirs in zip(model.variables, by_hand.variables, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def test_an_explicit_setting_is_kept():
    calls = []
    strategy = _strategy({"2": 2.0, "XLA 2": 5.0}, calls)
    with strategy.scope():
        model = _model(steps_per_execution=2)
    record = Record()
    _fit(model, [record])
    assert record.ways == [(2, False)]
    assert set(calls) == {"2", "XLA 2"}  # only XLA measured, at the user's count

    never = []
    strategy = _strategy({}, never)
    with strategy.scope():
        model = _model(steps_per_execution=2, jit_compile=False)
    _fit(model, [record])
    assert never == [] and record.ways[-1] == (2, False)
    assert "as given in compile (not measured)" in strategy.explain()


@pytest.mark.parametrize("allow_xla", [False, True])
def test_xla_is_chosen_only_with_consent(allow_xla):
    strategy = _strategy(FAST_4, allow_xla=allow_xla)
    with strategy.scope():
        model = _model()
    record = Record()
    _fit(model, [record])
    assert record.ways == [(4, allow_xla)]
    assert model.jit_compile is False  # evaluate and predict run as compiled
    explain = strategy.explain()
    assert ("XLA (with Keras optimizer update)" in explain) == allow_xla, explain
    assert ("optimizer step: Keras' own (XLA compiles the step" in explain) == allow_xla, explain
    assert "XLA at 4: 2.00x faster, beyond the spread" in explain, explain


def test_the_plan_file_is_reused_and_keeps_the_other_sections(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text('{"plans": []}')
    strategy = _strategy(FAST_4, plan_path=str(plan))
    with strategy.scope():
        model = _model()
    _fit(model, verbose=2)
    printed = [line for line in capsys.readouterr().out.splitlines() if "execution:" in line]
    assert len(printed) == 1 and printed[0].startswith("tf_glp.Strategy: execution: steps_per_execution=4, no XLA")
    never = []
    reused = _strategy({}, never, plan_path=str(plan), allow_xla=True)  # (consent is not part of the key)
    with reused.scope():
        model = _model()
    record = Record()
    _fit(model, [record])
    assert never == [] and record.ways == [(4, True)]
    assert f"reused {plan}" in reused.explain()
    sections = json.loads(plan.read_text())
    assert sections["plans"] == [] and len(sections["executions"]) == 1


def test_short_fits_go_on_with_the_rounds_where_the_last_stopped_and_trace_nothing_again(monkeypatch):
    """A loop of short fits on one model (one epoch of 10 steps each, calls
    of 4, 4, 2): the first fit's rounds stop undecided and it keeps 1; each
    next fit goes on with the rounds from where the last stopped, instead of
    starting again, so the rounds of one long fit are timed once in all;
    XLA is tried once; each count's function is traced once in all, and a
    fit after the decision measures and traces nothing."""
    calls = []
    strategy = _strategy(FAST_4, calls)
    choice = strategy._choices["execution"]  # noqa: SLF001
    choice.xla_hint = 0.0  # (XLA not measured: the fits are too short for it)
    with strategy.scope():
        model = _model()
    traces, step = [], model.train_step
    model.train_step = lambda data: traces.append(1) or step(data)  # (runs once per trace)
    xla_tries = []
    measure = execution_choice.xla_rounds.measure
    monkeypatch.setattr(execution_choice.xla_rounds, "measure", lambda *args: xla_tries.append(1) or measure(*args))
    timed, traced = [], []
    for _ in range(4):
        calls.clear()
        _fit(model, epochs=1)
        timed.append([label for label in calls[::2] if label])
        traced.append(len(traces))
        if len(timed) == 1:
            assert "fit ended before the counts were measured (1 calls timed so far" in strategy.explain()
    # Fit 1: 1's first call is timed (XLA's weighing traced and ran it before
    # fit), 4's first call traces; fit 2: 4 and 1 timed; fit 3: 4 timed once
    # more, decided. (Every full call of a fit is timed, its last one too.)
    assert timed == [["1"], ["4", "1"], ["4"], []], timed
    assert "steps_per_execution=4, no XLA: 3.00x as fast as 1" in strategy.explain(), strategy.explain()
    assert len(xla_tries) == 1
    # Count 1's trace (XLA's weighing, before fit 1) and count 4's, both in fit 1; nothing after.
    assert traced == [2, 2, 2, 2], traced


class LoggingTensorBoard(keras.callbacks.TensorBoard):
    """A subclass that brings a batch hook of its own."""

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)


class QuietCheckpoint(keras.callbacks.ModelCheckpoint):
    """A subclass whose own hooks are epoch-level only."""

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)


def test_callbacks_that_mind_the_steps_per_call():
    kept = execution_choice.batch_hook_callbacks([
        LoggingTensorBoard("/tmp/t"), QuietCheckpoint("x.weights.h5", save_weights_only=True)])
    assert kept == ["LoggingTensorBoard"]
    kept = execution_choice.batch_hook_callbacks([
        keras.callbacks.History(), keras.callbacks.ProgbarLogger(), keras.callbacks.EarlyStopping(),
        keras.callbacks.ModelCheckpoint("x.weights.h5", save_weights_only=True),
        keras.callbacks.ModelCheckpoint("x.weights.h5", save_weights_only=True, save_freq=5),
        keras.callbacks.TerminateOnNaN(), tf_glp.callbacks.BackupAndRestore("/tmp/b"), CountBatches(),
        keras.callbacks.LambdaCallback(on_epoch_end=print), keras.callbacks.LambdaCallback(on_train_batch_end=print),
        keras.callbacks.TensorBoard("/tmp/t"), keras.callbacks.TensorBoard("/tmp/t", update_freq=5),
        keras.callbacks.TensorBoard("/tmp/t", profile_batch=2)])
    assert kept == ["ModelCheckpoint", "TerminateOnNaN", "CountBatches", "LambdaCallback", "TensorBoard",
                    "TensorBoard"]


def test_the_first_round_weighs_the_rest():
    """Note [Counts on the real steps]: after one round of count 1 and the
    largest (16), two calls each, a clear win is taken; more rounds run only
    where their steps (3 more calls of 16 at the slower count) are at most a
    quarter of the steps left; else the first round decides for fits as
    long, by the same rule (1 only where faster beyond the spread)."""
    weigh = execution_choice._weigh  # noqa: SLF001
    choice = tf_glp.Strategy(plan_path=None)._choices["execution"]  # noqa: SLF001
    assert weigh(choice, 20_000, 20_000, [1.0, 1.0], [0.8, 0.8], 16) == (None, "", False)
    assert weigh(choice, 20_000, 192, [1.0, 1.0], [1.02, 1.02], 16) == (None, "", False)  # (48: a quarter of 192)
    count, why, final = weigh(choice, 20_000, 150, [1.0, 1.0], [0.8, 0.8], 16)
    assert (count, final) == (16, False) and "16 steps per call 1.25x as fast as 1 in a first round (1 runs only " \
        "where it is faster beyond the spread), kept for fits of up to 20000 steps: more rounds would run 48 of " \
        "the 150 steps left at the slower count, more than 0.25 of them" in why, why
    assert weigh(choice, 5_000, 150, [1.0, 1.01], [1.02, 1.0], 16)[0] == 16  # (1 not faster beyond the spread)
    count, why, final = weigh(choice, 5_000, 150, [1.0, 1.0], [1.2, 1.2], 16)
    assert (count, final) == (1, False) and "0.83x as fast as 1 in a first round" in why, why
    count, why, final = weigh(choice, 600, 600, [3.0, 3.0], [1.0, 1.0], 16)  # a clear win
    assert (count, final) == (16, True) and why.startswith("3.00x faster than 1 in a first round, at least 1.5x")


def test_the_count_is_switched_within_the_first_epoch_and_trains_bitwise_like_the_count_written_by_hand():
    """One epoch of 224 steps (14 calls of 16): 1 traced and timed, 16
    traced and timed, 1 and 16 again (the first round), a third round
    (16 and 1); the last 6 calls run 16."""
    calls = []
    strategy = _strategy({"1": 3.0, "16": 1.0}, calls)
    choice = strategy._choices["execution"]  # noqa: SLF001
    choice.xla_hint, choice.rounds = 0.0, 3  # (XLA not measured: its rounds would read the clock too)
    with strategy.scope():
        model = _model()
    traces, step = [], model.train_step
    model.train_step = lambda data: traces.append(1) or step(data)  # (runs once per trace)
    rng = np.random.default_rng(1)
    x, y = rng.random((224 * BATCH, 12), dtype=np.float32), rng.integers(0, 3, 224 * BATCH)
    history = model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    assert [label for label in calls[::2] if label] == ["1", "16", "1", "16", "16", "1"], calls
    assert "steps_per_execution=16, no XLA: 3.00x as fast as 1 by the medians" in strategy.explain(), \
        strategy.explain()
    # One trace per count, count 1's by XLA's weighing (before fit, on a copy of the first batch).
    assert len(traces) == 2, traces
    by_hand = _model(steps_per_execution=16)
    assert history.history == by_hand.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False).history
    for mine, theirs in zip(model.variables + model.optimizer.variables,
                            by_hand.variables + by_hand.optimizer.variables, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=mine.path)


def test_an_epochs_last_shorter_call_runs_at_the_largest_count_once_it_is_traced(monkeypatch):
    """Epochs of 10 steps (4 + 4 + 2), XLA not weighed: once 4 is traced (the
    first epoch's second call), an epoch's last, shorter call runs in one
    call of 4 (it stops where the epoch's data ends), before 4 has won and
    after. Count 1 runs its two timed calls: 8 steps."""
    runs = {1: 0, 4: 0}
    function_at = execution_choice.CountRounds._function

    def counted(self, count):
        function = function_at(self, count)

        def run(iterator):
            runs[count] += 1
            return function(iterator)
        return run

    monkeypatch.setattr(execution_choice.CountRounds, "_function", counted)
    strategy = _strategy(FAST_4)
    strategy._choices["execution"].xla_hint = 0.0  # noqa: SLF001 (XLA not weighed: its traces would be 1's and 4's)
    with strategy.scope():
        model = _model()
    _fit(model)
    assert "steps_per_execution=4, no XLA: 3.00x as fast as 1" in strategy.explain(), strategy.explain()
    # (4: its trace, two timed calls, every epoch's last call, the 3 full calls after it won.)
    assert runs == {1: 8, 4: 10}, runs
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * SAMPLES // BATCH


def test_one_step_per_call_runs_only_where_it_is_faster_beyond_the_spread():
    strategy = _strategy({"1": 1.0, "4": 3.0, "XLA 4": 3.0})
    with strategy.scope():
        model = _model()
    _fit(model)
    assert "steps_per_execution=1, no XLA: 1 faster than 4 steps per call beyond the spread (3.00x)" in \
        strategy.explain(), strategy.explain()


def test_with_steps_per_epoch_or_validation_steps_only_a_count_that_divides_them():
    """Keras' loops make calls of N steps also where fewer are left (the
    input going on): 16 would train 32 steps of 20 per epoch, or validate on
    16 batches of 12. A count that divides both (4) is timed, and a later
    fit on Keras' own loop trains and validates as the user's own would."""
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()
    for steps, validation_steps in ((20, None), (32, 12)):
        strategy = _strategy({"1": 3.0, "4": 1.0, "16": 0.5, "XLA 4": 3.0, "XLA 16": 3.0})
        with strategy.scope():
            model = _model()
        fit = dict(steps_per_epoch=steps, epochs=2, verbose=0, validation_data=dataset,
                   validation_steps=validation_steps or steps)
        model.fit(dataset, **fit)  # measured on its steps
        history = model.fit(dataset, **fit).history  # the chosen count, on Keras' own loop
        assert "steps_per_execution=4, no XLA" in strategy.explain(), strategy.explain()
        assert int(model.optimizer.iterations.numpy()) == 4 * steps
        by_hand = _model()
        by_hand.fit(dataset, **fit)
        assert by_hand.fit(dataset, **fit).history == history


def test_a_kept_way_is_remembered_for_fits_as_long_and_a_longer_fit_measures_again(tmp_path):
    plan = str(tmp_path / "plan.json")
    first = _strategy(FAST_4, plan_path=plan)
    choice = first._choices["execution"]  # noqa: SLF001
    choice.budget, choice.rounds = 0.0, 3  # (one round after the first, and no steps to spare for it)
    with first.scope():
        model = _model()
    _fit(model)
    assert "steps_per_execution=4, no XLA: 4 steps per call 3.00x as fast as 1 in a first round (1 runs only " \
        "where it is faster beyond the spread), kept for fits of up to 40 steps: more rounds would run" in \
        first.explain(), first.explain()
    calls = []
    again = _strategy(FAST_4, calls, plan_path=plan)
    with again.scope():
        model = _model()
    record = Record()
    _fit(model, [record])
    assert calls == [] and record.ways == [(4, False)] and f"reused {plan}" in again.explain()
    longer = _strategy(FAST_4, calls, plan_path=plan)
    with longer.scope():
        model = _model()
    _fit(model, [record], epochs=EPOCHS + 1)
    assert calls and record.ways[-1] == (4, False)  # measured again, in rounds with the budget lifted
    assert "4, no XLA: 3.00x as fast as 1 by the medians" in longer.explain(), longer.explain()


def test_a_clear_first_round_is_taken_and_xla_without_consent_only_where_its_compile_is_small():
    calls = []
    strategy = _strategy({"1": 3.0, "4": 1.0, "XLA 4": 0.5}, calls)
    choice = strategy._choices["execution"]  # noqa: SLF001
    choice.probe_win, choice.xla_hint = execution_choice.PROBE_WIN, 0.0  # (any compile is too long here)
    with strategy.scope():
        model = _model()
    record = Record()
    _fit(model, [record])
    assert record.ways == [(4, False)]
    assert calls.count("1") == calls.count("4") == 4 and "XLA 4" not in calls  # one round: two calls of each
    explain = strategy.explain()
    assert "steps_per_execution=4, no XLA: 3.00x faster than 1 in a first round" in explain, explain
    assert "XLA not measured (allow_xla is off, and measuring it, about" in explain, explain


def test_allow_xla_is_a_bool_and_has_no_effect_with_replicas():
    with pytest.raises(ValueError, match="allow_xla must be True or False, got 'yes'"):
        tf_glp.Strategy(allow_xla="yes")
    strategy = tf_glp.Strategy(["/cpu:0", "/cpu:1"], allow_xla=True, plan_path=None)
    with strategy.scope(), pytest.warns(UserWarning, match=r"allow_xla=True\) has no effect with replicas"):
        _model()


def test_writing_one_section_keeps_the_other_and_drops_unreadable_entries(tmp_path):
    plan = tmp_path / "plan.json"
    key = {"optimizer": "Adam", "trainable": [[[2], "float32"]]}
    plan.write_text(json.dumps({"plans": [{"key": key, "choice": "host"}],
                                "executions": [{"no": "key"}, {"key": key, "steps_per_execution": "x"}]}))
    store.write_entry(str(plan), key, {"steps_per_execution": 4, "reason": "r"}, store.EXECUTIONS,
                      execution_choice._valid_entry, execution_choice.WHO)  # noqa: SLF001
    sections = json.loads(plan.read_text())
    assert sections == {"plans": [{"key": key, "choice": "host"}],
                        "executions": [{"key": key, "steps_per_execution": 4, "reason": "r"}]}
