"""chunking="auto", decided at start-up so that it never costs more than it wins.

ICPE 2018 tunes the chunk count with a measured search during training. Each
candidate retraces the train function, and a search that outlives the first
fit() retraces again in the next: on a real run that cost more than the best
chunking ever gave back. So the choice is made once, in the first fit:

1. Where chunking cannot help it is not tried: on logical CPU replicas the
   host's work runs on the same cores as the replicas' compute, so there is
   nothing to overlap it with. One chunk, no measurement, no retrace.
2. Otherwise (GPUs) the first steps run with one chunk, the train function
   Keras traces anyway. Their median time calibrates the cost model's
   compute term (cost_model.py); the model then names the best chunk count.
3. If the model promises less than `min_gain`, one chunk it is (no retrace).
   Else the train function is retraced once for that count and timed; it is
   kept only if it measures faster than one chunk, else the one-chunk
   function, kept aside, comes back (no second retrace).
4. If fit() ends first, what was measured decides; later fits never search.

Across workers every worker measures and then takes the chief's decision
(each chunk's sums cross the workers, so all must chunk alike); the chief
alone keeps it, and in the next run its stored decision is every worker's.

A decision made by 2. or 3. goes to the plan store's "chunkings" section
(tf_glp/tuning/store.py): the next run of the same model, batch, devices,
compression and concept reuses it without measuring.
"""

from __future__ import annotations

import statistics
import time

import keras

from tf_glp.strategy import cost_model
from tf_glp.strategy.chunking import Trial
from tf_glp.tuning import rounds, store

WHO = "tf_glp.Strategy (chunking)"
CPU_REASON = ("chunking cannot help here: the replicas are logical CPU devices that share the host's cores, "
              "so the host's work has no idle device time to hide in (no measurement, no retrace)")


def decide_without_measuring(strategy) -> bool:
    """Makes the decision when no measurement is needed; True if made."""
    chunking = strategy.chunking_state
    if chunking.decided:
        return True
    if not strategy.uses_gpus():
        chunking.decide(1, CPU_REASON)
        return True
    return False


class ChunkingChoice:
    """chunking="auto" as a start-up choice (tf_glp/tuning): decided
    without measuring where it can be, else by ChunkingDecision on the
    first fit's steps."""

    def __init__(self, strategy):
        self._strategy = strategy

    def prepare(self, model, arguments: dict, batch: int | None, callbacks: list) -> list:
        strategy = self._strategy
        if decide_without_measuring(strategy) or any(isinstance(c, ChunkingDecision) for c in callbacks):
            return []
        decision = ChunkingDecision(strategy)
        path = store.resolve(strategy.settings.plan_path)
        if not path or not rounds.keyed(model, arguments, batch):
            return [decision]
        key = store.fit_key(model, strategy, batch, compression=strategy.compression,
                            update=strategy.update_concept.name)
        # Across workers the chief's plan store decides for every worker (a
        # worker's own could hold another count), and only the chief writes.
        chief = strategy.extended.should_checkpoint
        stored = store.read_plan(path, key, store.CHUNKINGS, _valid_entry, WHO) if chief else None
        chunks = _chiefs(strategy, stored["chunks"] if stored else 0)
        if chunks:
            strategy.chunking_state.decide(chunks, f"{stored['reason']} (reused {path})" if stored
                                           else "the chief's decision, reused from its plan store")
            return []
        if chief:
            decision._remember = (path, key)
        return [decision]


def _chiefs(strategy, value: int) -> int:
    """Across workers, the chief's `value` (see the module docstring). Every
    worker comes here at the same point (the start of fit, or the step its
    phase ends on: the phases count steps)."""
    agree = getattr(strategy.extended, "agree_with_the_chief", None)
    return agree([value])[0] if agree else value


def _valid_entry(entry: dict) -> bool:
    chunks = entry.get("chunks")
    return isinstance(chunks, int) and chunks >= 1 and isinstance(entry.get("reason"), str)


class ChunkingDecision(keras.callbacks.Callback):
    """Decides chunking="auto" during the first steps of the first fit (see
    the module docstring). Added to fit() by tf_glp.Strategy when needed.

    Args:
        strategy: The tf_glp.Strategy to decide for.
        timed_steps: Steps timed per candidate, after one untimed step that
            traces the train function. Defaults to `3`.
        min_gain: The smallest predicted relative gain worth one retrace.
            Defaults to `0.03`.

    Example:
        >>> model.fit(x, y, callbacks=[ChunkingDecision(strategy, timed_steps=5)])
    """

    def __init__(self, strategy, timed_steps: int = 3, min_gain: float = 0.03):
        super().__init__()
        if timed_steps < 1:
            raise ValueError(f"timed_steps must be >= 1, got {timed_steps}")
        if not 0 <= min_gain < 1:
            raise ValueError(f"min_gain must be in [0, 1), got {min_gain}")
        self.strategy = strategy
        self.timed_steps = timed_steps
        self.min_gain = min_gain
        self._phase: str | None = None  # "one", "candidate", or None when idle
        self._times: list[float] = []
        self._skip_next = True
        self._start = 0.0
        self._one_chunk_function = None
        self._one_chunk_time = 0.0
        self._remember: tuple[str, dict] | None = None  # (plan file, key) where ChunkingChoice keeps the decision

    def on_train_begin(self, logs=None):
        if decide_without_measuring(self.strategy):
            return
        sizes = [int(v.shape.num_elements() or 0) for v in self.model.trainable_variables]
        workload = cost_model.gradient_workload(sizes, self.strategy.num_replicas_in_sync)
        rates = self.strategy._host_rates(getattr(self.model, "optimizer", None))
        chunking = self.strategy.chunking_state
        chunking.start(workload, rates)
        chunking.use(1)
        chunking.record(Trial(1, cost_model.predict(workload, rates, 1)))
        self._begin_phase("one")

    def _begin_phase(self, phase: str) -> None:
        self._phase, self._times, self._skip_next = phase, [], True

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self._phase is None:
            return
        elapsed = time.perf_counter() - self._start
        if self._skip_next:  # the step that traced the train function
            self._skip_next = False
            return
        self._times.append(elapsed)
        if len(self._times) < self.timed_steps:
            return
        measured = statistics.median(self._times)
        if self._phase == "one":
            self._after_one_chunk(measured)
        else:
            self._after_candidate(measured)

    def _after_one_chunk(self, measured: float) -> None:
        chunking = self.strategy.chunking_state
        workload, rates = chunking.workload, chunking.rates
        compute = cost_model.calibrate_compute(workload, rates, measured)
        chunking.trials[0] = Trial(1, cost_model.predict(workload, rates, 1, compute), measured)
        best = cost_model.best_chunk_count(workload, rates, len(self.model.trainable_variables), compute)
        predicted = cost_model.predict(workload, rates, best, compute)
        worth = best > 1 and predicted.step <= measured * (1 - self.min_gain)
        chunks = _chiefs(self.strategy, best if worth else 1)
        if chunks == 1:
            self._finish(1, f"the calibrated model predicts {best} chunk(s) at {predicted.step * 1e3:.2f} ms against "
                            f"{measured * 1e3:.2f} ms measured for 1: "
                            + (f"under a {self.min_gain:.0%} gain, not worth a retrace" if not worth
                               else "the chief's choice is 1 chunk"))
            return
        chunking.record(Trial(chunks, cost_model.predict(workload, rates, chunks, compute)))
        self._one_chunk_time = measured
        self._one_chunk_function = self.model.train_function
        chunking.use(chunks)
        self.model.make_train_function(force=True)
        self._begin_phase("candidate")

    def _after_candidate(self, measured: float) -> None:
        trial = self.strategy.chunking_state.trials[-1]
        trial.measured = measured
        faster = measured < self._one_chunk_time
        reason = (f"measured {measured * 1e3:.2f} ms against {self._one_chunk_time * 1e3:.2f} ms for 1 chunk" if faster
                  else f"{trial.chunks} chunks measured {measured * 1e3:.2f} ms, not faster than "
                       f"{self._one_chunk_time * 1e3:.2f} ms for 1")
        if bool(_chiefs(self.strategy, int(faster))) != faster:
            reason, faster = f"the chief's choice (this worker: {reason})", not faster
        if faster:
            self._finish(trial.chunks, reason)
        else:
            self._back_to_one_chunk(reason)

    def _back_to_one_chunk(self, reason: str, measured: bool = True) -> None:
        # The one-chunk train function was kept aside: no second retrace.
        self.model.train_function = self._one_chunk_function
        self._finish(1, reason, measured)

    def _finish(self, chunks: int, reason: str, measured: bool = True) -> None:
        """Decides; a decision the measurement made is kept in the plan store."""
        self.strategy.chunking_state.decide(chunks, reason)
        self._phase = None
        self._one_chunk_function = None
        if measured and self._remember is not None:
            path, key = self._remember
            store.write_entry(path, key, {"chunks": chunks, "reason": reason}, store.CHUNKINGS, _valid_entry, WHO)

    def on_train_end(self, logs=None):
        if self._phase == "one":
            self._finish(1, "fit() ended before 1 chunk was timed; 1 chunk kept", measured=False)
        elif self._phase == "candidate":
            self._back_to_one_chunk("fit() ended before the candidate was timed; back to 1 chunk", measured=False)
