"""ChunkingTuner: the measured search of chunking="auto" (ICPE 2018's
runtime algorithm), run on the first real training steps.

Start from the cost model's chunk count; time a few steps per candidate;
move to twice as many chunks while that is faster, and if the first move up
was slower, to half as many while that is faster; stop at the first
candidate slower than the previous one and keep the fastest measured. Every
step of the search is an ordinary training step (the chunking changes when
work starts, never what is computed), so no work is wasted and the result
does not change. Each new candidate retraces the train function; the first
step after a retrace is not timed.
"""

from __future__ import annotations

import logging
import statistics
import time

import keras

from tf_glp.strategy import cost_model

logger = logging.getLogger("tf_glp")


class ChunkingTuner(keras.callbacks.Callback):
    """Picks the chunk count of a tf_glp.Strategy with chunking="auto".

    Added to `fit` automatically by tf_glp.Strategy; add it yourself only to
    change its settings.

    Args:
        strategy: The tf_glp.Strategy to tune.
        timed_steps: Steps timed per candidate (after one untimed warm-up step).

    Example:
        >>> model.fit(x, y, callbacks=[ChunkingTuner(strategy, timed_steps=5)])
    """

    def __init__(self, strategy, timed_steps: int = 3):
        super().__init__()
        if timed_steps < 1:
            raise ValueError(f"timed_steps must be >= 1, got {timed_steps}")
        self.strategy = strategy
        self.timed_steps = timed_steps
        self._candidate: int | None = None
        self._times: list[float] = []
        self._warm = False
        self._start = 0.0
        self._direction = "up"
        self._previous = 0.0  # measured time of the candidate the search stepped from
        self._max_chunks = 1

    def on_train_begin(self, logs=None):
        s = self.strategy
        if s._tuned:
            return
        variables = self.model.trainable_variables
        from tf_glp.strategy.strategy import gradient_workload  # noqa: PLC0415 (circular)

        s._workload = gradient_workload(variables, s.num_replicas_in_sync)
        self._max_chunks = max(1, len(variables))
        rates = s.host_rates()
        first = cost_model.best_chunk_count(s._workload, rates, self._max_chunks)
        s._search = []
        self._switch_to(first)

    def _switch_to(self, chunks: int) -> None:
        s = self.strategy
        s._set_auto_chunks(chunks)
        s._search.append({"components": cost_model.predict(s._workload, s.host_rates(), chunks), "measured": None})
        self._candidate, self._times, self._warm = chunks, [], False
        self.model.make_train_function(force=True)

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        s = self.strategy
        if s._tuned or self._candidate is None:
            return
        elapsed = time.perf_counter() - self._start
        if not self._warm:  # the step that traced the new train function
            self._warm = True
            return
        self._times.append(elapsed)
        if len(self._times) < self.timed_steps:
            return
        measured = statistics.median(self._times)
        s._search[-1]["measured"] = measured
        self._next_candidate()

    def _next_candidate(self) -> None:
        s = self.strategy
        tried = [row for row in s._search if row["measured"] is not None]
        counts = {row["components"].chunks for row in tried}
        last = tried[-1]
        improved = len(tried) == 1 or last["measured"] <= self._previous
        nxt = None
        if self._direction == "up":
            if improved and self._candidate < self._max_chunks:
                nxt, self._previous = min(self._candidate * 2, self._max_chunks), last["measured"]
            else:
                # Going up stopped helping (or cannot go further): if the
                # starting point is still the best, try fewer chunks from it.
                start = tried[0]
                self._direction = "down"
                if min(tried, key=lambda r: r["measured"]) is start:
                    nxt, self._previous = start["components"].chunks // 2, start["measured"]
        elif improved:
            nxt, self._previous = self._candidate // 2, last["measured"]
        if nxt is None or nxt < 1 or nxt in counts:
            self._finish()
        else:
            self._switch_to(nxt)

    def _finish(self) -> None:
        s = self.strategy
        tried = [row for row in s._search if row["measured"] is not None]
        # The model's compute time, from the first measurement; predictions
        # for the later candidates follow from it (explain() shows both).
        first = tried[0]
        compute = max(0.0, first["measured"] - first["components"].exposed)
        for row in s._search:
            c = row["components"]
            row["components"] = cost_model.Components(
                c.chunks, compute, c.transfer, c.host_reduce, c.host_update, c.exposed)
        best = min(tried, key=lambda row: row["measured"])
        s._set_auto_chunks(best["components"].chunks)
        s._tuned = True
        self._candidate = None
        self.model.make_train_function(force=True)
        logger.info("%s", s.explain())

    def on_train_end(self, logs=None):
        s = self.strategy
        if not s._tuned and self._candidate is not None:
            # Training ended mid-search: keep the best measured so far (or the
            # model's choice) and search again in the next fit.
            tried = [row for row in s._search if row["measured"] is not None]
            if tried:
                s._set_auto_chunks(min(tried, key=lambda row: row["measured"])["components"].chunks)
            self._candidate = None
