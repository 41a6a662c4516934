"""Appending a dated section to benchmarks/RESULTS.md (older sections stay)."""

from __future__ import annotations

import os

RESULTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")


def append_section(text: str, path: str = RESULTS_PATH) -> None:
    existing = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    with open(path, "w") as f:
        f.write(existing.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n")
    print(f"appended to {path}")
