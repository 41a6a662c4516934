"""Writing benchmarks/RESULTS.md: one section per subject. `write_section`
replaces the section of the same subject (git keeps the history)."""

from __future__ import annotations

import os
import re

RESULTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")


def _existing(path: str) -> str:
    return open(path).read() if os.path.exists(path) else "# Benchmark results\n"


def write_section(subject: str, body: str, path: str = RESULTS_PATH) -> None:
    """Puts `## subject` with `body` in place of the section with that
    heading (or at the end, if there is none)."""
    existing = _existing(path).rstrip("\n") + "\n"
    section = f"## {subject}\n\n{body.rstrip()}\n"
    pattern = re.compile(rf"^## {re.escape(subject)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(existing):
        updated = pattern.sub(lambda _: section + "\n", existing, count=1).rstrip("\n") + "\n"
    else:
        updated = existing + "\n" + section
    with open(path, "w") as f:
        f.write(updated)
    print(f"wrote '{subject}' in {path}")
