"""Where the fixed cost per training step goes: TensorFlow's profiler trace of
a model too small to compute anything, under plain Keras, MirroredStrategy
and tf_glp.Strategy.

    python benchmarks/step_trace.py                  # prints the breakdown
    python benchmarks/step_trace.py --write-results  # and RESULTS.md

Model: Dense 64 -> 32 -> 10, global batch 64, Adam (its step time is the
fixed cost). For each way, after a warm-up fit, STEPS steps run under
`tf.profiler.experimental` and the host plane of the trace is read
(XPlane): every op TensorFlow ran, with its duration. Ops are grouped by
what they do (the input pipeline, the forward and backward pass, the
merge and the reductions, the optimizer update, the metrics and logs, the
function calls and tf.distribute's bookkeeping); per step: how many ran and
their summed self time (an event's duration less the events nested in it).
The summed time is not the step time (the executor runs independent ops on
several threads, an iterator op's time is mostly waiting for the input
pipeline's own threads, and the time between ops is dispatch): the step
time, measured outside the profiler in interleaved rounds, is beside it.

Two more ways measure the floor: a train_step with the forward and
backward pass only (no gradient sum, no update) on one device and on two
MirroredStrategy replicas. The difference is what a second logical
replica costs whatever the strategy does with its gradients; the closing
line sets it beside MirroredStrategy's whole 2-device cost.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import os
import platform
import re
import statistics
import sys
import tempfile
import time

from results_file import write_section
from strategies import step_clock_class

STEPS = 20
ROUNDS = 7
# The floor: the forward and backward pass alone (no gradient sum, no
# update), on one device and on two replicas (MirroredStrategy). What the
# second costs over the first is the price of a second logical replica
# that no aggregation or update scheme can cut.
FLOOR_1, FLOOR_2 = "floor: forward+backward, 1 device", "floor: forward+backward, 2 replicas"
WAYS = ["plain Keras", "tf_glp.Strategy()", "Mirrored 1 device", "tf_glp 1 replica", "Mirrored 2 devices",
        "tf_glp host 2 replicas", "tf_glp replicas 2 replicas", FLOOR_1, FLOOR_2]
# (group, pattern on the op's type, pattern on its name), first match wins;
# the name without the function-call prefixes it runs under.
GROUPS = [
    ("function calls", re.compile(r"PartitionedCall|_Arg|_Retval|NoOp|Identity(N)?$"), None),
    ("input", re.compile(r"Iterator|Optional"), None),
    ("merge and reductions", re.compile(r"Collective|GlpHostReduce|AddN|Nccl|_Send|_Recv|Concat"), None),
    ("optimizer update", re.compile(r"^Glp.*(Apply|Update)|ResourceApply"), re.compile(r"(^|/)adam(_\d+)?/", re.I)),
    ("metrics and logs", re.compile(r"DivNoNan"), re.compile(r"metric|(^|/)(mean|total|count)", re.I)),
    ("forward and backward", re.compile(r"."), None),
]
_CALL_PREFIX = re.compile(r"^((Stateful)?PartitionedCall(_\d+)?/)+")


def _makers(tf, tf_glp):
    return {
        "plain Keras": tf.distribute.get_strategy,
        "tf_glp.Strategy()": tf_glp.Strategy,
        "Mirrored 1 device": lambda: tf.distribute.MirroredStrategy(["/cpu:0"]),
        "tf_glp 1 replica": lambda: tf_glp.Strategy(cpu_replicas=1, update="host"),
        "Mirrored 2 devices": lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
        "tf_glp host 2 replicas": lambda: tf_glp.Strategy(cpu_replicas=2, update="host"),
        "tf_glp replicas 2 replicas": lambda: tf_glp.Strategy(cpu_replicas=2, update="replicas"),
        FLOOR_1: tf.distribute.get_strategy,
        FLOOR_2: lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
    }


def _gradients_only_class(keras, tf):
    class GradientsOnly(keras.Sequential):
        """A train_step with the forward and backward pass only: every
        gradient is read (summed into one log, so none is pruned), none is
        summed across replicas or applied."""

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            grads = tape.gradient(loss, self.trainable_variables)
            return {"loss": loss, "gradients": tf.add_n([tf.reduce_sum(g) for g in grads])}

    return GradientsOnly


def _op_events(logdir: str):
    """(name, self time in µs) of every TensorFlow op event on the host
    plane: its duration less that of the events nested in it on the same
    thread (a function call contains its ops; counting both would count
    the ops twice)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: PLC0415

    space = xplane_pb2.XSpace()
    with open(sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))[-1], "rb") as f:
        space.ParseFromString(f.read())
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            events = sorted(line.events, key=lambda e: (e.offset_ps, -e.duration_ps))
            own = [e.duration_ps for e in events]
            stack: list[int] = []  # indices of the events that contain the current one
            for index, event in enumerate(events):
                while stack and events[stack[-1]].offset_ps + events[stack[-1]].duration_ps <= event.offset_ps:
                    stack.pop()
                if stack:
                    own[stack[-1]] -= event.duration_ps
                stack.append(index)
            for event, self_ps in zip(events, own):
                name = plane.event_metadata[event.metadata_id].name
                if _OP_EVENT.fullmatch(name):  # not the executor's or tf.data's own scopes ("A::B")
                    yield name, max(0, self_ps) / 1e6


# A TensorFlow op's event is named "op name:OpType".
_OP_EVENT = re.compile(r"[^:]+:[A-Za-z_][A-Za-z0-9_]*")


def _group(event_name: str) -> str:
    name, op_type = event_name.rsplit(":", 1)
    name = _CALL_PREFIX.sub("", name)
    return next(group for group, by_type, by_name in GROUPS
                if by_type.search(op_type) or (by_name is not None and by_name.search(name)))


def measure() -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import tf_glp  # noqa: PLC0415

    tf_glp.strategy.cpu_replica_devices(2)
    rng = np.random.default_rng(0)
    x, y = rng.random((64 * 64, 64), dtype=np.float32), rng.integers(0, 10, 64 * 64)
    makers = _makers(tf, tf_glp)
    gradients_only = _gradients_only_class(keras, tf)
    models, results = {}, {}
    for way in WAYS:
        with makers[way]().scope():
            model_class = gradients_only if way in (FLOOR_1, FLOOR_2) else keras.Sequential
            model = model_class([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
            model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=64, steps_per_epoch=4, epochs=1, verbose=0)
        models[way] = model
        with tempfile.TemporaryDirectory() as logdir:
            tf.profiler.experimental.start(logdir)
            model.fit(x, y, batch_size=64, steps_per_epoch=STEPS, epochs=1, verbose=0)
            tf.profiler.experimental.stop()
            counts, micros = collections.Counter(), collections.Counter()
            for name, duration in _op_events(logdir):
                group = _group(name)
                counts[group] += 1
                micros[group] += duration
        results[way] = {"ops": {g: counts[g] / STEPS for g, _, _ in GROUPS},
                        "us": {g: micros[g] / STEPS for g, _, _ in GROUPS}}
    StepClock = step_clock_class(keras)  # noqa: N806
    times = {way: [] for way in WAYS}
    for index in range(ROUNDS):
        for way in WAYS[index % len(WAYS):] + WAYS[:index % len(WAYS)]:
            clock = StepClock()
            models[way].fit(x, y, batch_size=64, steps_per_epoch=17, epochs=1, verbose=0, callbacks=[clock])
            times[way].append(1e3 * (clock.ends[-1] - clock.ends[0]) / 16)
    for way in WAYS:
        results[way]["ms"] = {"fastest": min(times[way]), "median": statistics.median(times[way])}
    return results


def table(results: dict) -> list[str]:
    groups = [g for g, _, _ in GROUPS]
    rows = ["| way | step ms, fastest (median) | ops per step | " + " | ".join(groups) + " |",
            "|---" * (len(groups) + 3) + "|"]
    for way, r in results.items():
        rows.append(f"| {way} | {r['ms']['fastest']:.2f} ({r['ms']['median']:.2f}) | "
                    f"{sum(r['ops'].values()):.0f} | " + " | ".join(
                        f"{r['ops'][g]:.0f} ops, {r['us'][g]:.0f} µs" for g in groups) + " |")
    return rows


def fixed_costs(results: dict) -> str:
    """Each way's step over plain Keras (fastest rounds), and the floor's."""
    def fastest(way):
        return results[way]["ms"]["fastest"]

    plain = fastest("plain Keras")
    over = ", ".join(f"{way} {fastest(way) - plain:+.2f}" for way in WAYS[1:] if way not in (FLOOR_1, FLOOR_2))
    floor = fastest(FLOOR_2) - fastest(FLOOR_1)
    mirrored = fastest("Mirrored 2 devices") - plain
    return (f"Fixed cost over plain Keras, ms per step (fastest rounds): {over}. The second replica alone "
            f"(floor, 2 replicas over 1 device, no gradient sum, no update): {floor:+.2f} ms, "
            f"{floor / mirrored:.0%} of MirroredStrategy's 2-device cost ({mirrored:+.2f} ms).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    start = time.time()
    results = measure()
    rows = [*table(results), "", fixed_costs(results)]
    elapsed = time.time() - start
    print("\n".join(rows))
    if args.write_results:
        text = [f"Date {datetime.date.today().isoformat()}; machine: {platform.machine()}, {os.cpu_count()} cores, "
                f"no GPU. Command: `python benchmarks/step_trace.py --write-results` ({elapsed:.0f} s). Dense 64 -> "
                f"32 -> 10, batch 64, Adam; per step, from TensorFlow's profiler over {STEPS} steps: ops run and "
                f"their summed durations by group; the step time from {ROUNDS} interleaved rounds outside the "
                f"profiler.", "", *rows]
        write_section("Where the fixed cost per step goes", "\n".join(text))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
