"""The plan store: where tf_glp.Strategy keeps its start-up choices between
runs, so that the next run of the same model on the same machine measures
nothing and trains as the first did.

By default one file per user and machine in the platform's cache folder
(`$TF_GLP_CACHE_DIR`, else `$XDG_CACHE_HOME/tf_glp`, else `~/.cache/tf_glp`),
so a script's working folder stays clean and two scripts in one folder do not
measure each other's models again; `plan_path=` names another file, None
keeps nothing. The file holds sections (SECTIONS below), each a list of
entries; an entry is found by its whole key (the model's shapes, batch,
devices, the machine: CPU model and instruction set, the TensorFlow, Keras
and tf_glp versions), and an entry whose key differs is never used.

Writers take a lock on a side file and replace the file atomically
(write_json); a file that cannot be read or written gives one warning and a
measurement, never an error. A section keeps its newest MAX_ENTRIES entries.

The start-up profiler's plans (tf_glp/profiling/plan.py: a file a user can
read with `python -m tf_glp.plan show`) are files of their own in the cache's
LAYER_PLANS folder, one per model and run (keyed_file), the newest
MAX_ENTRIES kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import tempfile
import warnings

AUTO = "auto"
ENVIRONMENT = "TF_GLP_CACHE_DIR"
FILE_NAME = "strategy_plans.json"
LAYER_PLANS = "layer_plans"
# The sections, one per start-up choice kept here (tuning/__init__.py lists them).
PLANS, EXECUTIONS, OPTIMIZER_STEPS, CHUNKINGS = "plans", "executions", "optimizer_steps", "chunkings"
SECTIONS = (PLANS, EXECUTIONS, OPTIMIZER_STEPS, CHUNKINGS)
# The key fields that say which model an entry is for; the others say where
# and how it ran.
MODEL_FIELDS = ("optimizer", "trainable")
SCHEMA = 3  # 3: the counts measured on the fit's own steps
# Entries kept per section; past it the oldest go (the cache holds every
# model, machine and version a user ran, and would otherwise only grow).
MAX_ENTRIES = 256

_warned: set[str] = set()


def cache_dir() -> str:
    """The folder of the default plan file."""
    if os.environ.get(ENVIRONMENT):
        return os.environ[ENVIRONMENT]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tf_glp")


def resolve(plan_path: str | None) -> str | None:
    """The file a `plan_path` setting names: AUTO, the cache's; None, none."""
    return os.path.join(cache_dir(), FILE_NAME) if plan_path == AUTO else plan_path


def keyed_file(folder: str, key) -> str:
    """The cache's file for `key` (anything JSON can write) in `folder`."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return os.path.join(cache_dir(), folder, f"{digest}.json")


def prune(folder: str) -> None:
    """Keeps the newest MAX_ENTRIES files of the cache's `folder`."""
    path = os.path.join(cache_dir(), folder)
    with contextlib.suppress(OSError):
        files = sorted((os.path.join(path, name) for name in os.listdir(path) if name.endswith(".json")),
                       key=os.path.getmtime)
        for old in files[:-MAX_ENTRIES]:
            os.unlink(old)


def machine() -> dict:
    """The key fields of the machine and versions an entry was measured on."""
    import keras  # noqa: PLC0415 (the package imports this module first)
    import tensorflow as tf  # noqa: PLC0415

    import tf_glp  # noqa: PLC0415

    return {"tf_glp": tf_glp.__version__, "tensorflow": tf.__version__, "keras": keras.__version__,
            "cpu": cpu_model(), "isa": tf_glp.native_available().cpu_kernels}


def model_key(model, **fields) -> dict:
    """An entry's key: the machine and versions, the model's optimizer class
    and trainable shapes and dtypes (not names: Keras numbers the names of
    every new model in a process), and the choice's own `fields`."""
    return {"schema": SCHEMA, **machine(), "optimizer": type(model.optimizer).__name__,
            "trainable": [[list(v.shape), str(v.dtype)] for v in model.trainable_variables], **fields}


def fit_key(model, strategy, batch: int | None, **fields) -> dict:
    """model_key for a fit under `strategy`: its devices and global `batch` too."""
    return model_key(model, devices=list(strategy.extended.worker_devices), global_batch=batch, **fields)


def write_json(path: str, data) -> None:
    """Writes `data` as JSON to `path` atomically (a reader sees the old
    file or the new one, never half)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".tf_glp.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def cpu_model() -> str:
    """The CPU's model name (Linux), else what Python's platform module says."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _warn_once(message: str, who: str) -> None:
    """Warns once per process for each message (a script that builds many
    models gets one warning about an unwritable cache, not one per model)."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(f"{who}: {message}", stacklevel=3)


def _sections(path: str) -> dict:
    """The file's sections; {} for no file; raises ValueError or OSError for
    one that is not a JSON object of known sections."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict) or not set(data) <= set(SECTIONS):
        raise ValueError(f"not a list of plans (a JSON object of {', '.join(map(repr, SECTIONS))})")
    return data


def _readable(entry, valid) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("key"), dict) and valid(entry)


def _same_model(a: dict, b: dict) -> bool:
    return all(a.get(field) == b.get(field) for field in MODEL_FIELDS)


def read_plan(path: str, key: dict, section: str, valid, who: str) -> dict | None:
    """The entry stored at `path` for `key`, or None: no file, or no entry
    for this model (measured, then added); with a warning, a file that
    cannot be read or an entry for this model written on another machine,
    versions or setting (measured again, then replaced)."""
    try:
        entries = _sections(path).get(section, [])
        if not isinstance(entries, list) or not all(_readable(e, valid) for e in entries):
            raise ValueError(f"{section!r} is not a list of entries with a key and a known choice")
    except (OSError, ValueError) as error:
        _warn_once(f"{path} is not a readable plan ({error}); measuring again", who)
        return None
    for entry in entries:
        if entry["key"] == key:
            return entry
    foreign = [entry for entry in entries if _same_model(entry["key"], key)]
    if foreign and path != resolve(AUTO):  # (the cache keeps every machine's entries: not news)
        differ = sorted(field for field in key if foreign[0]["key"].get(field) != key[field])
        warnings.warn(f"{who}: {path} holds this model's plan for another machine or "
                      f"setting ({', '.join(differ)} differ); measuring again", stacklevel=2)
    return None


@contextlib.contextmanager
def _locked(path: str):
    """An exclusive lock for writing `path` (a side file, so that the
    atomic replace of `path` does not drop it)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_entry(path: str, key: dict, entry: dict, section: str, valid, who: str) -> None:
    """Adds this key's entry ({"key": key, **entry}) to the section of
    `path`, replacing one for the same key (in the cache) or the same model
    (in a file of the user's), keeping the other sections; entries that
    cannot be read (`valid`) are dropped, and the oldest past MAX_ENTRIES;
    a file that cannot be read is replaced whole. A file that cannot be
    written gives one warning."""
    same = (lambda k: k == key) if path == resolve(AUTO) else (lambda k: _same_model(k, key))
    try:
        with _locked(path):
            try:
                sections = _sections(path)
            except (OSError, ValueError):
                sections = {}
            kept = sections.get(section)
            entries = [e for e in (kept if isinstance(kept, list) else [])
                       if _readable(e, valid) and not same(e["key"])]
            entries.append({"key": key, **entry})
            write_json(path, {**sections, section: entries[-MAX_ENTRIES:]})
    except OSError as error:
        _warn_once(f"cannot write the plan {path} ({error}); the next run measures again", who)
