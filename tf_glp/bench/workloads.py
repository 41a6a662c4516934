"""The comparison's workloads, as in the DIDL 2018 paper's field: a CNN on
Fashion-MNIST and an LSTM language model on Penn Treebank, read from the
standard files in `--data DIR`; without them, real data that ships offline
(scikit-learn's 8x8 digits; the documentation strings of Python's standard
library); random data only when asked (`synthetic`). `MODULE:FN` plugs in a
user's own: FN() returns (model, (x, y), (x_test, y_test)) with numpy
arrays, the model not yet compiled, giving logits for integer labels (it is
compiled with Adam and sparse categorical cross-entropy; reported: accuracy).
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import importlib
import inspect
import os
import re

import numpy as np

SEQUENCE = 20
VOCABULARY = 2000


@dataclasses.dataclass
class Workload:
    name: str
    build: object  # () -> uncompiled keras.Model (call inside the strategy scope)
    train: tuple  # (x, y) numpy arrays
    test: tuple
    metric: str  # "accuracy" (higher is better) or "perplexity" (lower)
    source: str  # where the data came from


def load(name: str, data_dir: str | None, synthetic: bool, seed: int) -> Workload:
    if name == "cnn":
        return _cnn(data_dir, synthetic, seed)
    if name == "lstm":
        return _lstm(data_dir, synthetic, seed)
    if ":" in name:
        return _user(name)
    raise ValueError(f"workload must be 'cnn', 'lstm' or MODULE:FN, got {name!r}")


def _cnn(data_dir, synthetic, seed) -> Workload:
    import keras  # noqa: PLC0415

    if synthetic:
        rng = np.random.default_rng(seed)
        x, y = rng.random((4096, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, 4096)
        train, test, source = (x[:3584], y[:3584]), (x[3584:], y[3584:]), "synthetic 28x28 images"
    elif data_dir and _idx_path(data_dir, "train-images-idx3-ubyte"):
        train = (_idx(data_dir, "train-images-idx3-ubyte")[..., None] / 255.0, _idx(data_dir, "train-labels-idx1-ubyte"))
        test = (_idx(data_dir, "t10k-images-idx3-ubyte")[..., None] / 255.0, _idx(data_dir, "t10k-labels-idx1-ubyte"))
        train = (train[0].astype(np.float32), train[1].astype(np.int64))
        test = (test[0].astype(np.float32), test[1].astype(np.int64))
        source = f"Fashion-MNIST IDX files in {data_dir}"
    else:
        from sklearn.datasets import load_digits  # noqa: PLC0415

        digits = load_digits()
        x = (digits.images[..., None] / 16.0).astype(np.float32)
        y = digits.target.astype(np.int64)
        order = np.random.default_rng(0).permutation(len(x))
        x, y = x[order], y[order]
        train, test, source = (x[:1500], y[:1500]), (x[1500:], y[1500:]), "scikit-learn's 8x8 digits (no --data)"
    shape = train[0].shape[1:]

    def build():
        return keras.Sequential([
            keras.Input(shape),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ])

    return Workload("cnn", build, train, test, "accuracy", source)


def _idx_path(data_dir, stem):
    for name in (stem, stem + ".gz"):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    return None


def _idx(data_dir, stem) -> np.ndarray:
    """An IDX file (the MNIST format): magic, dimensions, then uint8 data."""
    path = _idx_path(data_dir, stem)
    if path is None:
        raise ValueError(f"--data {data_dir}: {stem} is missing")
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


# Modules whose documentation makes the offline English text (importing them
# has no side effects).
_DOC_MODULES = ("os", "json", "re", "collections", "itertools", "functools", "argparse", "subprocess", "threading",
                "socket", "logging", "unittest", "typing", "pathlib", "datetime", "decimal", "fractions", "statistics",
                "random", "string", "textwrap", "difflib", "csv", "zipfile", "tarfile", "shutil", "tempfile",
                "pickle", "copy", "heapq", "bisect", "inspect", "ast", "email.message", "http.client", "asyncio")


def _stdlib_text() -> str:
    parts = []
    for name in _DOC_MODULES:
        module = importlib.import_module(name)
        parts.append(inspect.getdoc(module) or "")
        for _, member in sorted(vars(module).items()):
            if (inspect.isfunction(member) or inspect.isclass(member)) and getattr(member, "__module__", "") == name:
                parts.append(inspect.getdoc(member) or "")
    return "\n".join(parts)


def _lstm(data_dir, synthetic, seed) -> Workload:
    import keras  # noqa: PLC0415

    if synthetic:
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, VOCABULARY, 60_000)
        valid_ids, source = rng.integers(0, VOCABULARY, 6_000), "synthetic token ids"
    else:
        if data_dir and os.path.exists(os.path.join(data_dir, "ptb.train.txt")):
            train_text = open(os.path.join(data_dir, "ptb.train.txt")).read()
            valid_text = open(os.path.join(data_dir, "ptb.valid.txt")).read()
            source = f"Penn Treebank files in {data_dir}"
        else:
            text = _stdlib_text()
            cut = int(len(text) * 0.9)
            train_text, valid_text = text[:cut], text[cut:]
            source = "documentation strings of Python's standard library (no --data)"
        words = re.findall(r"[a-z']+|[.,;:()]", train_text.lower())
        vocabulary = [w for w, _ in collections.Counter(words).most_common(VOCABULARY - 1)]
        index = {w: i + 1 for i, w in enumerate(vocabulary)}  # 0: unknown
        ids = np.array([index.get(w, 0) for w in words], np.int64)
        valid_ids = np.array([index.get(w, 0) for w in re.findall(r"[a-z']+|[.,;:()]", valid_text.lower())], np.int64)

    def windows(tokens):
        count = (len(tokens) - 1) // SEQUENCE
        x = tokens[: count * SEQUENCE].reshape(count, SEQUENCE)
        y = tokens[1: count * SEQUENCE + 1].reshape(count, SEQUENCE)
        return x.astype(np.int64), y.astype(np.int64)

    def build():
        return keras.Sequential([
            keras.Input((SEQUENCE,), dtype="int64"),
            keras.layers.Embedding(VOCABULARY, 64),
            keras.layers.LSTM(128, return_sequences=True),
            keras.layers.Dense(VOCABULARY),
        ])

    return Workload("lstm", build, windows(ids), windows(valid_ids), "perplexity", source)


def _user(spec: str) -> Workload:
    module_name, _, function_name = spec.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"workload {spec!r}: cannot load {function_name} from {module_name}: {error}") from error

    def build():
        return function()[0]

    # The user's function makes model and data together: call it once now for the data.
    _, train, test = function()
    return Workload(spec, build, tuple(train), tuple(test), "accuracy", f"{spec}()")
