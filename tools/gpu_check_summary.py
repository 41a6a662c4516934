"""The GPU kit's text output (tools/gpu_check.sh) as JSON, for machines.

    python3 tools/gpu_check_summary.py gpu_check.txt [--exit-status N] > gpu_check.json

Standard library only (the GPU machine has no TensorFlow). Reads the lines
the kit and its test binaries print: "== driver: ...", "== building ... CUDA
code with NVCC (VERSION), archs: A", the "== ..." section headers, "device 0:
NAME (sm_XY), driver CUDA a.b, runtime CUDA c.d, GEMM: G", "[ OK ] test",
"[FAIL] test: message", "N passed, M failed", the timing table's rows and
"== profiler's GPU model: ..." (tools/gpu_describe.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys

_DEVICE = re.compile(r"device 0: (?P<name>.+) \(sm_(?P<sm>\d+)\), driver CUDA (?P<driver>[\d.]+), "
                     r"runtime CUDA (?P<runtime>[\d.]+), GEMM: (?P<gemm>.+)$")
_TIMING = re.compile(r"^(?P<layer>.+?)\s+(?P<k1>[\d.]+)\s+(?P<k2>[\d.]+)\s+(?P<k4>[\d.]+)\s+(?P<k8>[\d.]+)\s+"
                     r"(?P<ratio>[\d.]+)x$")


def summarize(text: str, exit_status: int | None = None) -> dict:
    summary: dict = {"exit_status": exit_status, "driver": None, "build": None, "profiler_gpu_model": None,
                     "sections": []}
    section = None
    in_timing = False
    for line in text.splitlines():
        line = line.rstrip()
        if line.startswith("== driver: "):
            summary["driver"] = line[len("== driver: "):]
        elif line.startswith("== building "):
            summary["build"] = line[len("== building "):]
        elif line.startswith("== profiler's GPU model: "):
            summary["profiler_gpu_model"] = line[len("== profiler's GPU model: "):]
        elif line.startswith("== ") and "tests" in line:
            section = {"name": line[3:], "device": None, "tests": {}, "passed": None, "failed": None,
                       "timings": []}
            summary["sections"].append(section)
            in_timing = False
        elif section is None:
            continue
        elif match := _DEVICE.match(line):
            section["device"] = {"name": match["name"], "sm": match["sm"], "driver_cuda": match["driver"],
                                 "runtime_cuda": match["runtime"], "gemm": match["gemm"]}
        elif line.startswith("[ OK ] "):
            section["tests"][line[len("[ OK ] "):]] = "ok"
        elif line.startswith("[FAIL] "):
            name, _, message = line[len("[FAIL] "):].partition(": ")
            section["tests"][name] = f"FAIL: {message}"
        elif match := re.match(r"^(\d+) passed, (\d+) failed$", line):
            section["passed"], section["failed"] = int(match[1]), int(match[2])
        elif line.startswith("GEMM: ") and "ms per step" in line:
            in_timing = True
            section["timing_gemm"] = line[len("GEMM: "):].split(".")[0]
        elif in_timing and " FAILED at k=" in line:
            section["timing_error"] = line.strip()
        elif in_timing and (match := _TIMING.match(line)):
            section["timings"].append({"layer": match["layer"], "ms": {k: float(match[f"k{k}"]) for k in (1, 2, 4, 8)},
                                       "best_over_k1": float(match["ratio"])})
    summary["all_passed"] = bool(summary["sections"]) and exit_status == 0 and all(
        s["failed"] == 0 for s in summary["sections"] if s["failed"] is not None)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log")
    parser.add_argument("--exit-status", type=int, default=None)
    args = parser.parse_args(argv)
    with open(args.log, errors="replace") as f:
        json.dump(summarize(f.read(), args.exit_status), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
