"""The choice rule: from each candidate's timed median and spread, which
lane count a layer runs with (TensorFlow's kernel unless a lane count is
clearly faster). Pure Python, no TensorFlow: testable on made-up timings."""

from __future__ import annotations

from tf_glp.profiling import plan as plan_lib
from tf_glp.tuning import rule

# A lane count replaces TensorFlow's kernel only if it measured at least this
# much faster alone. A layer timed alone is not the layer inside a training
# step (other ops' threads, caches, fusions): on the 2-core CI machine Dense
# lane counts measured up to 1.54x faster alone ran 6-9% slower in the step,
# while a one-channel convolution measured 1.4-2.9x faster alone made the
# step faster (benchmarks/RESULTS.md, "Start-up profiler", alone vs in the step).
MIN_SPEEDUP = 2.0


def spread(times: list[float]) -> float:
    """The interquartile range of the timed trials (0 for one trial)."""
    low, _, high = rule.quartiles(times)
    return high - low


def within_spread(a: plan_lib.Candidate, b: plan_lib.Candidate) -> bool:
    """Whether the two candidates' interquartile ranges overlap (each taken
    as its median +- half its spread): the measurements cannot tell them apart."""
    return abs(a.median_ms - b.median_ms) <= (a.spread_ms + b.spread_ms) / 2


def choose(candidates: list[plan_lib.Candidate]) -> tuple[int | None, str]:
    """TensorFlow's kernel (candidates[0]) unless a lane count measured
    clearly faster (at least MIN_SPEEDUP times, and outside its spread);
    then the fewest lanes within the spread of the fastest lane count."""
    native, lanes = candidates[0], candidates[1:]
    clear = [c for c in lanes if c.median_ms * MIN_SPEEDUP <= native.median_ms and not within_spread(c, native)]
    if not clear:
        fastest = min(candidates, key=lambda c: c.median_ms)
        if fastest is native:
            return None, f"fastest ({native.median_ms:.3f} ms)"
        return None, (f"no lane count clearly faster ({fastest.label}: {native.median_ms / fastest.median_ms:.2f}x, "
                      f"needs {MIN_SPEEDUP}x outside the spread)")
    best = min(clear, key=lambda c: c.median_ms)
    simplest = next(c for c in clear if c is best or within_spread(c, best))  # fewer lanes first
    if simplest is best:
        return best.concurrency, f"fastest ({best.median_ms:.3f} ms, {native.median_ms / best.median_ms:.2f}x native)"
    return simplest.concurrency, (f"within the spread of the fastest ({best.label}, {best.median_ms:.3f} ms), "
                                  f"and simpler")
