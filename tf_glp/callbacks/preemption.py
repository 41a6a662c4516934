"""Preemption signals, caught so that a backup is saved before the engine's
SIGKILL.

Kubernetes evicts a pod with SIGTERM and kills it after the grace period
(30 s by default); SLURM preempts with SIGTERM, or the signal of
`--signal=B:USR1@120`, before SIGKILL; spot reclaims do the same. While
tf_glp's BackupAndRestore trains, these signals set a flag instead of ending
the process; the callback reads it at a step boundary that every worker
agrees on, saves, and exits with EXIT_CODE (backup_and_restore.py).

The signals: SIGTERM, or the names in TF_GLP_PREEMPTION_SIGNALS (e.g.
"TERM,USR1"). A second signal while the first waits for its step ends the
process as the signal would (the process may be stuck, e.g. waiting on a
dead worker, where no step boundary comes).
"""

from __future__ import annotations

import os
import signal
import threading

SIGNALS_VARIABLE = "TF_GLP_PREEMPTION_SIGNALS"
EXIT_CODE_VARIABLE = "TF_GLP_PREEMPTION_EXIT_CODE"
# 128 + SIGTERM: what a shell reports for a process SIGTERM ended, so an
# engine that restarts or requeues on that status does so here too.
EXIT_CODE = 143


def check_every(who: str, every) -> None:
    """Refuses a `preemption_check_every` that is not None or an integer >= 0."""
    if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 0):
        raise ValueError(f"{who}: preemption_check_every must be an integer >= 0 (0: never), got {every!r}")


def signals() -> list[signal.Signals]:
    """The preemption signals (see the module docstring)."""
    names = os.environ.get(SIGNALS_VARIABLE, "TERM")
    found = []
    for name in (n.strip().upper() for n in names.split(",") if n.strip()):
        member = getattr(signal.Signals, name if name.startswith("SIG") else f"SIG{name}", None)
        if member is None or member in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"{SIGNALS_VARIABLE}={names!r}: {name!r} is not a signal a process can catch "
                             f"(e.g. TERM, USR1, INT)")
        found.append(member)
    return found


def exit_code() -> int:
    """The status a preempted process exits with (TF_GLP_PREEMPTION_EXIT_CODE, default EXIT_CODE)."""
    text = os.environ.get(EXIT_CODE_VARIABLE, str(EXIT_CODE))
    try:
        code = int(text)
    except ValueError:
        code = -1
    if not 0 < code < 256:
        raise ValueError(f"{EXIT_CODE_VARIABLE} must be an exit status in 1..255, got {text!r}")
    return code


class PreemptionSignals:
    """The preemption signals' handlers, while installed: `received` names
    the first signal that came (None before)."""

    def __init__(self):
        self.received: str | None = None
        self._previous: dict = {}

    def install(self) -> bool:
        """Installs the handlers; False where Python allows none (a thread
        other than the main one: the signals keep their action)."""
        if self._previous or threading.current_thread() is not threading.main_thread():
            return bool(self._previous)
        for number in signals():
            self._previous[number] = signal.signal(number, self._handle)
        return True

    def _handle(self, number, frame) -> None:
        if self.received is not None:  # the second one: as if no handler were there
            self.uninstall()
            os.kill(os.getpid(), number)
            return
        self.received = signal.Signals(number).name

    def uninstall(self) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
