"""tf_glp's start-up tuning kit: what the choices made at the start of a fit
share, and the interface each implements.

- rule.py: the one win rule, with each choice's threshold named;
- rounds.py: what the choices share to time ways on the user's model;
- store.py: the plan store (one cache per user and machine).

The choices (StartupChoice), in the order tf_glp/strategy/fit_setup.py runs
them (the one list of them; other modules point here): update="auto"'s
concept (strategy/update_choice.py) or, on one device, the optimizer step
(strategy/one_device_strategy.py; decided at the first trace of the
update, on the step's own gradients: profiling/optimizer_step.py), the
steps per execution and XLA (strategy/execution_choice.py), chunking="auto"
(strategy/chunking_decision.py). Their win thresholds: rule.py. The
layer profiler (tf_glp/callbacks/concurrency_profiler.py) is a callback the
user adds, with a plan of its own.
"""

from __future__ import annotations

from typing import Protocol


class StartupChoice(Protocol):
    """One start-up choice, as fit_setup runs it."""

    def prepare(self, model, arguments: dict, batch: int | None, callbacks: list) -> list:
        """At the start of fit, before Keras builds its step (`arguments`:
        fit's, bound; `batch`: the global batch where known; `callbacks`:
        fit's so far): decides what can be decided now (from the plan store,
        or by measuring) and returns the callbacks to add to fit (those that
        measure on its steps, announce, put the user's settings back)."""
