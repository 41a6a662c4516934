"""The one win rule of tf_glp's start-up choices, with each choice's
threshold named here.

A candidate replaces the way in use only where it measured faster beyond
the spread: its median at least the choice's gain times faster, and its
interquartile range entirely below the way in use's (this machine's speed
drifts by phases of seconds; two overlapping ranges cannot tell the ways
apart). Each choice's gain is a constant below (the choices themselves:
tf_glp/tuning/__init__.py).

Two choices weigh other evidence and keep their own thresholds beside it: the
layer profiler's lane counts (profiling/choice.py, MIN_SPEEDUP) and
chunking="auto" (strategy/chunking_decision.py, min_gain).
"""

from __future__ import annotations

import statistics

# update="auto"'s concept against "host" (strategy/update_choice.py).
CONCEPT_GAIN = 1.05
# The fused update against Keras' own on one device (profiling/optimizer_step.py).
OPTIMIZER_STEP_GAIN = 1.05
# A number of steps per call, and XLA, against the way as compiled
# (strategy/execution_choice.py).
COUNT_GAIN = 1.05


def quartiles(times: list[float]) -> tuple[float, float, float]:
    """(lower quartile, median, upper quartile) of the timed rounds."""
    if len(times) < 2:
        return times[0], times[0], times[0]
    low, _, high = statistics.quantiles(times, n=4)
    return low, statistics.median(times), high


def beats(baseline: list[float], candidate: list[float], gain: float) -> tuple[bool, float]:
    """Whether the `candidate` times beat the `baseline` times beyond the
    spread (median at least `gain` times faster, interquartile ranges
    apart), and the measured gain (baseline median over candidate median)."""
    base_low, base_median, _ = quartiles(baseline)
    _, median, high = quartiles(candidate)
    measured = base_median / median if median > 0 else 1.0
    return measured >= gain and high < base_low, measured


def best_of(times: dict[str, list[float]], base: str, gain: float) -> tuple[str, float]:
    """Of the candidates in `times` that beat `base` beyond the spread, the
    one with the largest measured gain, and that gain; else (`base`, 1.0)."""
    best, best_gain = base, 1.0
    for name, ms in times.items():
        if name != base:
            wins, measured = beats(times[base], ms, gain)
            if wins and measured > best_gain:
                best, best_gain = name, measured
    return best, best_gain
