"""Preemption signals under tf_glp's BackupAndRestore on one process
(tf_glp/callbacks/preemption.py; across workers: test_multi_worker.py):
the signal saves at the next step and exits with 143, and the restarted fit
ends where the uninterrupted one ends."""

import json
import os
import signal

import keras
import numpy as np
import pytest

import tf_glp
from tf_glp.callbacks import preemption


@pytest.fixture(autouse=True)
def _one_device(monkeypatch):
    monkeypatch.delenv("TF_GLP_CPU_REPLICAS", raising=False)


class SignalAt(keras.callbacks.Callback):
    """Sends this process `signal` once its step count reaches `step`."""

    def __init__(self, step, number=signal.SIGTERM):
        super().__init__()
        self.step, self.number, self.sent = step, number, False

    def on_train_batch_end(self, batch, logs=None):
        if not self.sent and int(self.model.optimizer.iterations.numpy()) >= self.step:
            self.sent = True
            os.kill(os.getpid(), self.number)


def _fit(backup, callbacks=()):
    x = np.random.default_rng(0).random((160, 8), dtype=np.float32)
    y = (x.sum(1) > 4).astype("int32")
    keras.utils.set_random_seed(3)
    with tf_glp.Strategy(plan_path=None).scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dropout(0.2), keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
              callbacks=[*callbacks, keras.callbacks.BackupAndRestore(str(backup), save_freq=1000)])
    return [w.numpy() for w in model.weights + model.optimizer.variables]


@pytest.mark.parametrize("name", ["TERM", "USR1"])
def test_a_preemption_signal_saves_at_the_next_step_and_the_restart_ends_where_it_would_have(
        tmp_path, monkeypatch, capsys, name):
    number = getattr(signal, f"SIG{name}")
    monkeypatch.setenv(preemption.SIGNALS_VARIABLE, "TERM,USR1")
    before = signal.getsignal(number)
    uninterrupted = _fit(tmp_path / "never")
    with pytest.raises(SystemExit) as exited:
        _fit(tmp_path / "backup", [SignalAt(5, number)])
    assert exited.value.code == preemption.EXIT_CODE
    assert signal.getsignal(number) is before  # (the handler was there only while fit trained)
    metadata = json.loads((tmp_path / "backup" / "training_metadata.json").read_text())
    step = metadata["step"]
    assert step >= 5 and f"preempted (SIG{name}'s signal): saved at step {step}" in capsys.readouterr().out
    resumed = _fit(tmp_path / "backup")
    for a, b in zip(resumed, uninterrupted, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not (tmp_path / "backup").exists()  # (a whole fit: the backup is removed, as Keras' is)


def test_bad_preemption_settings_are_named(monkeypatch):
    monkeypatch.setenv(preemption.SIGNALS_VARIABLE, "TERM,KILL")
    with pytest.raises(ValueError, match="'KILL' is not a signal a process can catch"):
        preemption.signals()
    monkeypatch.setenv(preemption.SIGNALS_VARIABLE, "TERM,NOPE")
    with pytest.raises(ValueError, match="'NOPE' is not a signal"):
        preemption.signals()
    monkeypatch.setenv(preemption.EXIT_CODE_VARIABLE, "0")
    with pytest.raises(ValueError, match="must be an exit status in 1..255, got '0'"):
        preemption.exit_code()
    with pytest.raises(ValueError, match="preemption_check_every must be an integer >= 0 .0: never., got -1"):
        tf_glp.callbacks.BackupAndRestore("/tmp/never", preemption_check_every=-1)
