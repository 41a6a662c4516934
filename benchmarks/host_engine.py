"""Host engine benchmark: host_reduce and fused optimizer updates against
TensorFlow, numpy, Keras and the machine's measured memory ceiling, in one run.

    python benchmarks/host_engine.py                  # print the tables
    python benchmarks/host_engine.py --write-results  # and write its section of RESULTS.md
    python benchmarks/host_engine.py --shared-parameter  # a fused update whose parameter is shared

Every timing is the best of several repeats (the machines are noisy), and
peers are measured interleaved with tf_glp so that drift hits both alike.
TensorFlow ops are timed inside one tf.function that runs K reductions in a
row, so Python and dispatch overhead do not count for either side.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import os
import platform
import statistics
import subprocess
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_glp  # noqa: E402
from results_file import write_section  # noqa: E402
from tf_glp.ops import FusedKerasUpdate, host_reduce  # noqa: E402

MB = 1 << 20
REPEATS = 5


def best_time(fn, repeats: int = REPEATS) -> float:
    fn()  # warm-up (tracing, page faults)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def repeated(reduce_fn, inputs: list[tf.Tensor], length: int):
    """A tf.function running `length` reductions of the same inputs, one after
    the other. As when gradients are aggregated, the inputs stay alive, so
    each output is a new buffer (no op can reuse an input's memory)."""

    @tf.function
    def run():
        firsts = []
        for _ in range(length):
            with tf.control_dependencies(firsts[-1:]):
                firsts.append(reduce_fn(inputs)[:1])
        return tf.concat(firsts, 0)

    return lambda: run().numpy()


def ceiling_gbps() -> tuple[float, float]:
    """Copy bandwidth (read + write) of 128 MB through numpy: one thread, and
    one thread per core on its own slice (numpy releases the GIL in copyto).
    The larger is the ceiling."""
    src = np.ones(128 * MB // 4, np.float32)
    dst = np.empty_like(src)
    single = 2 * src.nbytes / best_time(lambda: np.copyto(dst, src)) / 1e9
    workers = os.cpu_count() or 1
    bounds = np.linspace(0, src.size, workers + 1).astype(int)
    pool = concurrent.futures.ThreadPoolExecutor(workers)

    def threaded():
        list(pool.map(lambda i: np.copyto(dst[bounds[i]:bounds[i + 1]], src[bounds[i]:bounds[i + 1]]), range(workers)))

    multi = 2 * src.nbytes / best_time(threaded) / 1e9
    pool.shutdown()
    return single, multi


def numpy_reduce(arrays: list[np.ndarray]):
    out = np.empty_like(arrays[0])

    def run():
        np.add(arrays[0], arrays[1], out=out)
        for a in arrays[2:]:
            np.add(out, a, out=out)

    return run


def reduce_table(ceiling: float) -> tuple[list[str], dict]:
    rows = ["| tensor | N | host_reduce GB/s | tf.add_n GB/s | numpy GB/s | ours/add_n | ours/numpy | ours/ceiling |",
            "|---|---|---|---|---|---|---|---|"]
    ratios = {}
    for size in (64 << 10, 1 * MB, 16 * MB, 128 * MB):
        for n in (2, 4, 8):
            if size == 64 << 10 and n != 4:
                continue
            elements = size // 4
            with tf.device("/cpu:0"):
                inputs = [tf.random.stateless_uniform([elements], seed=[i, 1]) for i in range(n)]
            arrays = [t.numpy() for t in inputs]
            length = max(2, min(200, (256 * MB) // (size * (n + 1))))
            useful = (n + 1) * size * length
            ours = repeated(host_reduce, inputs, length)
            theirs = repeated(tf.add_n, inputs, length)
            ours_s = theirs_s = float("inf")
            for _ in range(2):  # interleave
                ours_s = min(ours_s, best_time(ours))
                theirs_s = min(theirs_s, best_time(theirs))
            numpy_s = best_time(numpy_reduce(arrays)) * length
            g_ours, g_tf, g_np = useful / ours_s / 1e9, useful / theirs_s / 1e9, useful / numpy_s / 1e9
            label = f"{size // 1024} KB" if size < MB else f"{size // MB} MB"
            rows.append(f"| {label} | {n} | {g_ours:.1f} | {g_tf:.1f} | {g_np:.1f} | {g_ours / g_tf:.2f}x | "
                        f"{g_ours / g_np:.2f}x | {g_ours / ceiling:.0%} |")
            ratios[(size, n)] = (g_ours / g_tf, g_ours / ceiling)
            print(rows[-1], flush=True)
    return rows, ratios


def optimizer_table(ceiling: float) -> tuple[list[str], dict]:
    rows = ["| update | params | tf_glp fused Mparam/s | Keras Mparam/s | fused/Keras | roofline Mparam/s | fused/roofline |",
            "|---|---|---|---|---|---|---|"]
    ratios = {}
    params = 8 * MB  # 8 M float32 parameters in 8 variables of 1 M each
    shapes = [(MB,)] * 8
    cases = [
        ("Adam", lambda: keras.optimizers.Adam(1e-3), 28),  # read g,w,m,v; write w,m,v
        ("SGD momentum", lambda: keras.optimizers.SGD(1e-2, momentum=0.9), 20),  # read g,w,m; write w,m
    ]
    for name, make, bytes_per_param in cases:
        with tf.device("/cpu:0"):
            grads = [tf.random.stateless_normal(s, seed=[i, 2]) for i, s in enumerate(shapes)]
            keras_vars = [keras.Variable(tf.zeros(s)) for s in shapes]
            fused_vars = [keras.Variable(tf.zeros(s)) for s in shapes]
        keras_opt, fused_opt = make(), make()
        keras_opt.build(keras_vars)
        fused_opt.build(fused_vars)
        fused = FusedKerasUpdate(fused_opt)
        steps = 5

        @tf.function
        def keras_steps():
            for _ in range(steps):
                keras_opt.apply(grads, keras_vars)

        @tf.function
        def fused_steps():
            for _ in range(steps):
                fused.apply([[g] for g in grads], fused_vars)

        with tf.device("/cpu:0"):
            k_s = f_s = float("inf")
            for _ in range(2):
                f_s = min(f_s, best_time(fused_steps, 3))
                k_s = min(k_s, best_time(keras_steps, 3))
        rate_f, rate_k = params * steps / f_s / 1e6, params * steps / k_s / 1e6
        roofline = ceiling * 1e9 / bytes_per_param / 1e6
        rows.append(f"| {name} | 8 M | {rate_f:.0f} | {rate_k:.0f} | {rate_f / rate_k:.2f}x | {roofline:.0f} | {rate_f / roofline:.0%} |")
        ratios[name] = (rate_f / rate_k, rate_f / roofline)
        print(rows[-1], flush=True)
    return rows, ratios


def shared_parameter_table() -> list[str]:
    """A fused Adam step on a parameter whose buffer three other variables
    share (as update="host" leaves the host copy on logical CPU replicas:
    Note [Writing a shared parameter]) against one nobody shares; the shared
    case also assigns the new value to the three, as update="host" does.
    Interleaved, best and median of 200 rounds each."""
    shape = (2048, 2048)  # 4 M parameters, 16 MB
    with tf.device("/cpu:0"):
        grads = [tf.random.stateless_normal(shape, seed=[i, 3]) for i in range(4)]
        alone = [tf.Variable(tf.random.stateless_normal(shape, seed=[9, 9])) for _ in range(3)]
        shared = [tf.Variable(tf.random.stateless_normal(shape, seed=[9, 9])) for _ in range(3)]
    others = []
    for index in range(3):
        device = f"/cpu:{index + 1}" if len(tf.config.list_logical_devices("CPU")) > index + 1 else "/cpu:0"
        with tf.device(device):
            others.append(tf.Variable(tf.zeros(shape)))

    @tf.function
    def step_alone():
        tf_glp.ops.host_apply_adam(*alone, grads, 1e-3, 0.1, 0.001, 1e-7)

    @tf.function
    def step_shared():
        tf_glp.ops.host_apply_adam(*shared, grads, 1e-3, 0.1, 0.001, 1e-7)
        value = shared[0].read_value()
        for other in others:
            with tf.device(other.device):
                other.assign(value)

    times = {"alone": [], "shared": []}
    step_alone(), step_shared(), step_shared()
    for index in range(200):
        for name, fn in (("alone", step_alone), ("shared", step_shared))[::1 if index % 2 else -1]:
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    rows = ["| Adam step, 4 M parameters | best (ms) | median (ms) |", "|---|---|---|"]
    for name, label in (("alone", "parameter buffer not shared"),
                        ("shared", "shared with 3 variables (+ the 3 assigns)")):
        rows.append(f"| {label} | {1000 * min(times[name]):.2f} | {1000 * statistics.median(times[name]):.2f} |")
        print(rows[-1], flush=True)
    return rows


def machine() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores, TensorFlow {tf.__version__}, {tf_glp.native_available().cpu_kernels or 'fallback'} kernels"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-results", action="store_true",
                        help="write the tables into their section of benchmarks/RESULTS.md")
    parser.add_argument("--shared-parameter", action="store_true",
                        help="only the fused update of a shared parameter buffer (on 4 logical CPUs)")
    args = parser.parse_args()
    if args.shared_parameter:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
        rows = shared_parameter_table()
        if args.write_results:
            write_section("Fused update of a shared parameter buffer", "\n".join([
                f"Date: {datetime.date.today().isoformat()}. "
                f"Machine: {machine()}. Command: `python benchmarks/host_engine.py --shared-parameter "
                f"--write-results`; 200 interleaved rounds.", "", *rows, ""]))
        return
    print("tf_glp:", tf_glp.native_available())
    start = time.time()
    single, multi = ceiling_gbps()
    ceiling = max(single, multi)
    print(f"measured ceiling: numpy copy of 128 MB (read+write) {single:.1f} GB/s on one thread, "
          f"{multi:.1f} GB/s on {os.cpu_count()} threads")
    reduce_rows, reduce_ratios = reduce_table(ceiling)
    opt_rows, opt_ratios = optimizer_table(ceiling)
    speed_add_n, of_ceiling = reduce_ratios[(128 * MB, 4)]
    targets = [
        f"- host_reduce N=4 128 MB: {speed_add_n:.2f}x tf.add_n (target 3x), {of_ceiling:.0%} of ceiling (target 80%)",
        f"- fused Adam 8 M params: {opt_ratios['Adam'][0]:.2f}x Keras (target 1.5x), {opt_ratios['Adam'][1]:.0%} of roofline (target 70%)",
        f"- host_reduce 64 KB N=4: {reduce_ratios[(64 << 10, 4)][0]:.2f}x tf.add_n (target >= 1x)",
    ]
    print("\n".join(targets))
    elapsed = time.time() - start
    print(f"benchmark took {elapsed:.0f} s")
    if args.write_results:
        section = [
            f"Date: {datetime.date.today().isoformat()}. "
            f"Machine: {machine()}. Command: `python benchmarks/host_engine.py --write-results` ({elapsed:.0f} s).",
            f"Measured ceiling: numpy copy of 128 MB (read + write), {single:.1f} GB/s on one thread, {multi:.1f} GB/s "
            f"on {os.cpu_count()} threads; the larger is used. GB/s count useful bytes (N inputs read + 1 output written); "
            "tf.add_n and host_reduce timed as K reductions of the same live inputs in a row inside one tf.function "
            "(each output a new buffer, as in gradient aggregation), numpy as `np.add(..., out=)` passes (single-threaded).",
            "",
            *reduce_rows,
            "",
            "Fused optimizer updates (5 steps over 8 variables of 1 M float32 parameters, inside tf.function, on CPU variables; "
            "roofline = ceiling / bytes per parameter: Adam 28 B, SGD momentum 20 B):",
            "",
            *opt_rows,
            "",
            "Targets:",
            *targets,
            "",
        ]
        write_section("Host engine", "\n".join(section))


if __name__ == "__main__":
    main()
