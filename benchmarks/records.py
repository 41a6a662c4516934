"""Benchmark results as data: one JSON record per run, appended to
benchmarks/records/NAME.jsonl and never rewritten (git keeps the files'
history; a claim cites a record by its "id").

A record holds what a reader needs to trust or redo the run: its id, the
benchmark, date, commit (and whether the tree had changes), the machine (CPU
model, cores, ISA extensions TensorFlow's kernels use), the exact command,
and the benchmark's own figures (each way's per-repetition values, median
and spread, the ratios' too: `summary` computes them).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

RECORDS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "records")
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")


def machine() -> dict:
    """The CPU model, core count and the ISA extensions of TensorFlow's kernels."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "isa": [f for f in ISA_FLAGS if f in flags],
            "python": platform.python_version()}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()


def summary(values: list[float]) -> dict:
    """The values with their median and spread (min, max, interquartile range)."""
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else [ordered[0]] * 3
    return {"values": [round(v, 4) for v in values], "median": round(statistics.median(ordered), 4),
            "min": round(ordered[0], 4), "max": round(ordered[-1], 4),
            "iqr": [round(quartiles[0], 4), round(quartiles[2], 4)]}


def append(name: str, figures: dict, note: str = "") -> dict:
    """Appends this run's record to records/NAME.jsonl and returns it."""
    commit = _git("rev-parse", "--short=10", "HEAD")
    os.makedirs(RECORDS_DIR, exist_ok=True)
    path = os.path.join(RECORDS_DIR, f"{name}.jsonl")
    count = sum(1 for _ in open(path)) if os.path.exists(path) else 0
    record = {"id": f"{name}#{count + 1}", "benchmark": name,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit, "tree_changed": bool(_git("status", "--porcelain", "--untracked-files=no")),
              "machine": machine(), "command": " ".join(["python", *sys.argv]), "note": note, **figures}
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=False) + "\n")
    print(f"appended {record['id']} to {path}")
    return record


def read(name: str) -> list[dict]:
    """Every record of benchmark `name`, oldest first."""
    path = os.path.join(RECORDS_DIR, f"{name}.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []
