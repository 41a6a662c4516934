"""The concurrency plan: what the start-up profiler measured and chose, per layer.

    python -m tf_glp.plan show PLAN.json [--plot out.png]

A plan is JSON: a header that decides whether it can be reused (schema,
the machine and versions as the plan store keys them, device, batch size) and
one entry per layer (name, class, input shape, dtype, every candidate's
median and spread, the analytical cap, the choice and why). Pure Python:
reading, matching, writing (atomically) and printing need no TensorFlow.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from tf_glp.tuning import store

SCHEMA = 1


@dataclasses.dataclass
class Candidate:
    concurrency: int | None  # None: TensorFlow's own kernel
    median_ms: float
    spread_ms: float  # interquartile range of the timed trials

    @property
    def label(self) -> str:
        return "native" if self.concurrency is None else f"k={self.concurrency}"


@dataclasses.dataclass
class LayerPlan:
    name: str
    layer_class: str
    input_shape: list[int]
    dtype: str
    config: dict  # what the layer computes (units, filters, kernel size, strides, ...)
    cap: int
    cap_reason: str
    candidates: list[Candidate]
    choice: int | None
    reason: str

    def candidate(self, concurrency: int | None) -> Candidate | None:
        return next((c for c in self.candidates if c.concurrency == concurrency), None)


@dataclasses.dataclass
class Plan:
    header: dict
    layers: list[LayerPlan]
    notes: list[str] = dataclasses.field(default_factory=list)  # e.g. the Strategy's chunking decision
    # The optimizer step chosen at start-up (tf_glp.profiling.optimizer_step):
    # {"optimizer_class", "choice": "native" | "fused", "reason", "native_ms", "fused_ms",
    # "timed_parameters", "parameters"}, or None.
    optimizer: dict | None = None
    # The layers the profiler left as they are, and why (profiler.layers_to_profile).
    left_alone: list[dict] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Plan:
        """Raises ValueError (naming what is wrong) for anything malformed."""
        try:
            header = data["header"]
            if not isinstance(header, dict):
                raise TypeError("header is not an object")
            layers = []
            for entry in data["layers"]:
                layer = LayerPlan(**{**entry, "candidates": [Candidate(**c) for c in entry["candidates"]]})
                _check_layer(layer)
                layers.append(layer)
            optimizer = data.get("optimizer")
            if optimizer is not None and (not isinstance(optimizer, dict)
                                          or optimizer.get("choice") not in ("native", "fused")):
                raise TypeError(f"optimizer must be null or an object with choice 'native' or 'fused', "
                                f"got {optimizer!r}")
            left_alone = data.get("left_alone", [])
            if not isinstance(left_alone, list) or not all(
                    isinstance(entry, dict) and all(isinstance(entry.get(key), str)
                                                    for key in ("name", "layer_class", "reason"))
                    for entry in left_alone):
                raise TypeError(f"left_alone must be a list of {{name, layer_class, reason}} strings, "
                                f"got {left_alone!r}")
            return cls(header=header, layers=layers, notes=[str(n) for n in data.get("notes", [])],
                       optimizer=optimizer, left_alone=left_alone)
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"not a tf_glp plan: {error!r}") from error

    def mismatch(self, header: dict, layers: list[tuple[str, list[int], str, dict]]) -> str | None:
        """Why this plan does not fit `header` and `layers` ((class, input
        shape, dtype, config) each, in model order), or None if it can be
        reused. Layer names do not count: Keras numbers unnamed layers per
        process."""
        for key, value in header.items():
            if self.header.get(key) != value:
                return f"{key} is {self.header.get(key)!r} in the plan, {value!r} here"
        mine = [(layer.layer_class, list(layer.input_shape), layer.dtype, layer.config) for layer in self.layers]
        if mine != [(c, list(s), d, dict(k)) for c, s, d, k in layers]:
            return "the model's layers, their input shapes or their configurations differ"
        return None


def _check_layer(layer: LayerPlan) -> None:
    """Raises TypeError for fields of the wrong type (a hand-edited plan)."""
    def is_count(value):
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    problems = []
    if not isinstance(layer.name, str) or not isinstance(layer.layer_class, str) or not isinstance(layer.dtype, str):
        problems.append("name, layer_class and dtype must be strings")
    if not isinstance(layer.input_shape, list) or not all(is_count(d) for d in layer.input_shape):
        problems.append(f"input_shape must be a list of sizes, got {layer.input_shape!r}")
    if not isinstance(layer.config, dict):
        problems.append(f"config must be an object, got {layer.config!r}")
    if not (layer.choice is None or is_count(layer.choice)):
        problems.append(f"choice must be null or a lane count, got {layer.choice!r}")
    if not is_count(layer.cap):
        problems.append(f"cap must be a lane count, got {layer.cap!r}")
    for c in layer.candidates:
        if not (c.concurrency is None or is_count(c.concurrency)) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in (c.median_ms, c.spread_ms)):
            problems.append(f"bad candidate {c!r}")
    if problems:
        raise TypeError(f"layer {layer.name!r}: " + "; ".join(problems))


def read(path: str) -> Plan:
    """Reads a plan; raises OSError or ValueError."""
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"not valid JSON: {error}") from error
    header = data.get("header") if isinstance(data, dict) else None
    if not isinstance(header, dict) or header.get("schema") != SCHEMA:
        raise ValueError(f"not a tf_glp plan of schema {SCHEMA}")
    return Plan.from_json(data)


def write(plan: Plan, path: str) -> None:
    """Writes atomically (store.write_json)."""
    store.write_json(path, plan.to_json())


def table(plan: Plan) -> str:
    """The compact table: layer, input shape, native ms, best k ms, choice,
    speed-up over native, the analytical cap."""
    rows = [("layer", "input shape", "native ms", "best k ms", "choice", "speed-up", "cap")]
    for layer in plan.layers:
        native = layer.candidate(None)
        lanes = [c for c in layer.candidates if c.concurrency is not None]
        best = min(lanes, key=lambda c: c.median_ms) if lanes else None
        chosen = layer.candidate(layer.choice)
        speedup = native.median_ms / chosen.median_ms if native and chosen and chosen.median_ms > 0 else 1.0
        rows.append((layer.name, "x".join(str(d) for d in layer.input_shape),
                     f"{native.median_ms:.3f}" if native else "-",
                     f"{best.median_ms:.3f} ({best.label})" if best else "-",
                     "native" if layer.choice is None else f"k={layer.choice}",
                     f"{speedup:.2f}x", str(layer.cap)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    if plan.optimizer:
        lines.append(optimizer_line(plan.optimizer))
    lines += [f"left as it is: {entry['name']} ({entry['layer_class']}): {entry['reason']}"
              for entry in plan.left_alone]
    return "\n".join(lines + [f"{note}" for note in plan.notes])


def optimizer_line(record: dict) -> str:
    """An optimizer-step record (optimizer_step.record, its timings optional)
    as `plan show` and a one-device tf_glp.Strategy's explain() print it."""
    chosen = "tf_glp's fused update" if record.get("choice") == "fused" else "Keras' own"
    said = ", ".join(str(record[key]) for key in ("optimizer_class", "reason") if record.get(key))
    if all(key in record for key in ("native_ms", "fused_ms", "timed_parameters", "parameters")):
        said += (f"; timed on {record['timed_parameters']:,} of {record['parameters']:,} parameters: Keras "
                 f"{record['native_ms']:.3f} ms, fused {record['fused_ms']:.3f} ms")
    if record.get("sparse_parameters"):
        said += (f"; the {record['sparse_parameters']:,} parameters with sparse gradients (IndexedSlices) take "
                 f"Keras' update either way, not timed")
    said += f"; {record['source']}" if record.get("source") else ""
    return f"optimizer step: {chosen}" + (f" ({said})" if said else "")


def bar_chart(plan: Plan, width: int = 640, bar_height: int = 18):
    """A per-layer chart as an RGB uint8 array (numpy, no plotting library):
    for each layer a grey bar for the native kernel and a blue one for the
    choice, lengths proportional to their time.

    Args:
        plan: The plan to draw.
        width: Image width in pixels. Defaults to `640`.
        bar_height: Pixel rows per bar (2 of them a gap). Defaults to `18`.
    """
    import numpy as np  # noqa: PLC0415

    rows = max(1, len(plan.layers))
    image = np.full((rows * (2 * bar_height + 8) + 8, width, 3), 255, np.uint8)
    longest = max([c.median_ms for layer in plan.layers for c in layer.candidates] + [1e-9])
    for i, layer in enumerate(plan.layers):
        top = 8 + i * (2 * bar_height + 8)
        for j, (candidate, color) in enumerate(((layer.candidate(None), (150, 150, 150)),
                                                (layer.candidate(layer.choice), (40, 90, 200)))):
            if candidate is None:
                continue
            length = int((width - 16) * candidate.median_ms / longest)
            image[top + j * bar_height: top + (j + 1) * bar_height - 2, 8:8 + max(1, length)] = color
    return image


def _plot(plan: Plan, path: str) -> None:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as error:
        raise SystemExit("--plot needs matplotlib: pip install 'tf_glp[plot]'") from error
    names = [layer.name for layer in plan.layers]
    native = [(layer.candidate(None).median_ms if layer.candidate(None) else 0.0) for layer in plan.layers]
    chosen = [(layer.candidate(layer.choice).median_ms if layer.candidate(layer.choice) else 0.0)
              for layer in plan.layers]
    figure, axes = plt.subplots(figsize=(8, 0.5 + 0.4 * len(names)))
    positions = range(len(names))
    axes.barh([p + 0.2 for p in positions], native, height=0.4, label="native", color="0.6")
    axes.barh([p - 0.2 for p in positions], chosen, height=0.4, label="chosen", color="tab:blue")
    axes.set_yticks(list(positions), names)
    axes.set_xlabel("forward + backward, ms")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)


def main(argv: list[str] | None = None) -> int:
    """`python -m tf_glp.plan show PATH [--plot PNG]`; returns the exit status.

    Args:
        argv: The command-line arguments, without the program name.
            Defaults to `None` (sys.argv[1:]).
    """
    parser = argparse.ArgumentParser(prog="python -m tf_glp.plan", description="Show a tf_glp concurrency plan.")
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="print a plan's header and table")
    show.add_argument("path")
    show.add_argument("--plot", metavar="PNG", help="also draw the per-layer chart (needs matplotlib)")
    args = parser.parse_args(argv)
    try:
        plan = read(args.path)
    except (OSError, ValueError) as error:
        print(f"tf_glp.plan: cannot read {args.path}: {error}", file=sys.stderr)
        return 1
    print(", ".join(f"{key}={value}" for key, value in plan.header.items()))
    print(table(plan))
    for layer in plan.layers:
        print(f"{layer.name}: {layer.reason}; cap {layer.cap} ({layer.cap_reason})")
    if args.plot:
        _plot(plan, args.plot)
        print(f"chart written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
