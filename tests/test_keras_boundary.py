"""One boundary to Keras' and TensorFlow's internals (tf_glp/_keras/).

Reads tf_glp's source (AST) and fails, naming file and line, on any reach
into a private TensorFlow/Keras module or attribute outside tf_glp/_keras/:

- an import of a private module (tensorflow.python, keras.src, any `_name`
  component), or such a module path as a string (importlib);
- `obj._name` (also via getattr/setattr/hasattr with a string) where
  `_name` is a private name of TensorFlow or Keras (found at test time in
  the installed sources of the modules tf_glp loads) that tf_glp does not
  define itself; on `self` inside a class derived from a TensorFlow/Keras
  class, also where tf_glp assigns it (that overwrites their state).

A private method of such a class that tf_glp overrides must be listed in
tf_glp._keras.compat.INTERNALS (checked against the installed versions).

Exempt: the implementer contract of public base classes, i.e. the private
methods that tf.distribute.StrategyExtended and tf.distribute.Strategy leave
to subclasses (they raise NotImplementedError there: `_create_variable`,
`_update`, ...).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pathlib
import re
import sys
import textwrap

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tf_glp"
BOUNDARY = PACKAGE / "_keras"
FOREIGN_ROOTS = ("tensorflow", "keras", "tf_keras")
PRIVATE_MODULE_PARTS = {"python", "src", "core", "_api", "tsl", "compiler"}


def _is_private_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] in FOREIGN_ROOTS and any(p in PRIVATE_MODULE_PARTS or p.startswith("_") for p in parts[1:])


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_names_in(tree: ast.AST) -> set[str]:
    """Private names a TensorFlow/Keras source defines: methods and class
    attributes of its classes, attributes it assigns."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name):
                    names.add(item.name)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name) and _private(t.id))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr):
            names.add(node.attr)
    return names


def _foreign_private_names() -> set[str]:
    """Private names of the TensorFlow/Keras modules that importing tf_glp's
    wings loads."""
    for module in ("tf_glp.strategy", "tf_glp.profiling.profiler", "tf_glp.callbacks", "tf_glp.layers"):
        importlib.import_module(module)
    names = set()
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not path or not path.endswith(".py") or name.split(".")[0] not in FOREIGN_ROOTS:
            continue
        try:
            text = pathlib.Path(path).read_text()
        except OSError:
            continue
        # By pattern, not by AST (a tenth of the time over some 2,000
        # files): indented defs and assignments, and attribute stores. It
        # finds a few local names too, which only makes the scan stricter.
        names.update(_FOREIGN_NAME.findall(text), _FOREIGN_STORE.findall(text))
    return names


_FOREIGN_NAME = re.compile(r"^[ \t]+(?:def |async def )?(_[A-Za-z]\w*)\s*(?:\(|=[^=]|:)", re.MULTILINE)
_FOREIGN_STORE = re.compile(r"\.(_[A-Za-z]\w*)\s*=[^=]")


def _foreign_base_names(path: pathlib.Path, class_name: str) -> set[str] | None:
    """The private names of the TensorFlow/Keras classes that tf_glp's
    top-level class `class_name` (in `path`) derives from; None where the
    class cannot be imported (a class made inside a function)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    try:
        cls = getattr(importlib.import_module(module), class_name)
    except (ImportError, AttributeError, ValueError):
        return None
    names = set()
    for base in cls.__mro__:
        if base.__module__.split(".")[0] in FOREIGN_ROOTS:
            try:
                names |= _private_names_in(ast.parse(textwrap.dedent(inspect.getsource(base))))
            except (OSError, TypeError, SyntaxError):
                continue
    return names


def _contract_names() -> set[str]:
    """Private methods public tf.distribute base classes leave to subclasses."""
    import tensorflow as tf  # noqa: PLC0415

    names = set()
    for public in (tf.distribute.StrategyExtended, tf.distribute.Strategy):
        for cls in public.__mro__:
            for name, member in vars(cls).items():
                if _private(name) and inspect.isfunction(member):
                    try:
                        source = textwrap.dedent(inspect.getsource(member))
                    except (OSError, TypeError):
                        continue
                    if "raise NotImplementedError" in source:
                        names.add(name)
    return names


def _listed_internals() -> set[str]:
    """The attributes tf_glp._keras.compat.INTERNALS lists (version-checked)."""
    from tf_glp._keras import compat  # noqa: PLC0415

    return {attribute for _, _, attribute in compat.INTERNALS}


class _Scan:
    """What tf_glp's own code defines, and where it reaches TF/Keras privates."""

    def __init__(self, files: list[pathlib.Path]):
        self.trees = {f: ast.parse(f.read_text(), filename=str(f)) for f in files}
        self.own_classes = {n.name for t in self.trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
        self.own = set()
        for tree in self.trees.values():
            self._collect_own(tree, foreign_class=False)

    def _derived_from_foreign(self, node: ast.ClassDef) -> bool:
        """Whether a class derives from anything but tf_glp's classes and builtins."""
        for base in node.bases:
            if isinstance(base, ast.Name) and (base.id in self.own_classes or hasattr(builtins, base.id)):
                continue
            return True
        return False

    def _collect_own(self, node, foreign_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                self.own.add(child.name)
                self._collect_own(child, self._derived_from_foreign(child))
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(child.name):
                self.own.add(child.name)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store) and _private(child.id):
                self.own.add(child.id)
            elif isinstance(child, ast.alias):
                self.own.add((child.asname or child.name).split(".")[0])
            elif (isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Store) and not foreign_class
                  and isinstance(child.value, ast.Name) and child.value.id == "self"):
                self.own.add(child.attr)  # tf_glp's own object's attribute
            self._collect_own(child, foreign_class)

    def violations(self, foreign: set[str], contract: set[str]) -> list[str]:
        found = []
        for path, tree in self.trees.items():
            where = path.relative_to(PACKAGE.parent)
            own_modules = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                           and (n.module or "").startswith("tf_glp") for a in n.names}
            self._visit(tree, where, foreign, contract, own_modules, None, found)
        return sorted(found, key=lambda v: (v.split(":")[0], int(v.split(":")[1]), v))

    def _visit(self, node, where, foreign, contract, own_modules, base_names, found) -> None:
        """base_names: inside a class derived from TensorFlow/Keras classes,
        their private names (all of `foreign` where they cannot be known);
        else None."""
        for child in ast.iter_child_nodes(node):
            inside = base_names
            if isinstance(child, ast.ClassDef):
                inside = None
                if self._derived_from_foreign(child):
                    known = _foreign_base_names(PACKAGE.parent / where, child.name) if node is self.trees.get(
                        PACKAGE.parent / where) else None
                    inside = foreign if known is None else known
            elif (isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and base_names is not None
                  and isinstance(node, ast.ClassDef) and child.name in base_names
                  and child.name not in contract and child.name not in _listed_internals()):
                found.append(f"{where}:{child.lineno}: overrides {child.name} without listing it in "
                             f"tf_glp._keras.compat.INTERNALS")
            elif isinstance(child, ast.Import):
                found += [f"{where}:{child.lineno}: imports {a.name}" for a in child.names if _is_private_module(a.name)]
            elif isinstance(child, ast.ImportFrom) and child.module:
                modules = [child.module] + [f"{child.module}.{a.name}" for a in child.names]
                found += [f"{where}:{child.lineno}: imports from {child.module}"
                          for m in modules[:1] if any(_is_private_module(m) for m in modules)]
            elif isinstance(child, ast.Constant) and isinstance(child.value, str) and _is_private_module(child.value):
                found.append(f"{where}:{child.lineno}: names the private module {child.value!r}")
            elif isinstance(child, ast.Attribute) and _private(child.attr) and child.attr not in contract:
                receiver = child.value
                is_self = isinstance(receiver, ast.Name) and receiver.id in {"self", "cls"}
                is_super = (isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name)
                            and receiver.func.id == "super")
                if isinstance(receiver, ast.Name) and receiver.id in own_modules:
                    pass
                elif is_self or is_super:
                    if base_names is not None and child.attr in base_names:
                        found.append(f"{where}:{child.lineno}: reaches {ast.unparse(child)}")
                elif child.attr in foreign and child.attr not in self.own:
                    found.append(f"{where}:{child.lineno}: reaches {ast.unparse(child)}")
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Name)
                  and child.func.id in {"getattr", "setattr", "hasattr"} and len(child.args) >= 2
                  and isinstance(child.args[1], ast.Constant) and isinstance(child.args[1].value, str)):
                name = child.args[1].value
                if _private(name) and name in foreign and name not in self.own and name not in contract:
                    found.append(f"{where}:{child.lineno}: reaches {child.func.id}(..., {name!r})")
            self._visit(child, where, foreign, contract, own_modules, inside, found)


@pytest.fixture(scope="module")
def foreign_and_contract():
    return _foreign_private_names(), _contract_names()


def _outside_the_boundary() -> list[pathlib.Path]:
    return [f for f in sorted(PACKAGE.rglob("*.py")) if BOUNDARY not in f.parents]


def test_no_private_tensorflow_or_keras_reach_outside_the_boundary(foreign_and_contract):
    violations = _Scan(_outside_the_boundary()).violations(*foreign_and_contract)
    assert violations == [], "private TensorFlow/Keras internals outside tf_glp/_keras/:\n" + "\n".join(violations)


def test_private_imports_live_in_at_most_two_boundary_files():
    files = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            if any(_is_private_module(n) for n in names):
                files.add(path.relative_to(PACKAGE.parent))
    assert len(files) <= 2 and all(str(f).startswith("tf_glp/_keras/") for f in files), files


PLANTED = '''
import keras
from tensorflow.python.distribute import values as values_lib
from tf_glp import plan

class Mine(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        self._chief_worker_only = True      # Keras' private state, overwritten
        plan._private_helper()              # tf_glp's own module: fine

def reach(model, optimizer):
    strategy = getattr(model, "_distribution_strategy", None)
    return optimizer._trainable_variables, keras.utils._private_thing, strategy
'''


def test_the_scan_fails_on_planted_reaches(tmp_path, foreign_and_contract, monkeypatch):
    planted = PACKAGE / "strategy" / "planted_for_the_test.py"
    tmp_file = tmp_path / "planted.py"
    tmp_file.write_text(PLANTED)
    scan = _Scan([tmp_file])
    scan.trees = {planted: scan.trees[tmp_file]}  # reported as if it lived in tf_glp/strategy/
    foreign, contract = foreign_and_contract
    violations = scan.violations(foreign | {"_private_thing"}, contract)
    assert violations == [
        "tf_glp/strategy/planted_for_the_test.py:3: imports from tensorflow.python.distribute",
        "tf_glp/strategy/planted_for_the_test.py:8: reaches self._chief_worker_only",
        "tf_glp/strategy/planted_for_the_test.py:12: reaches getattr(..., '_distribution_strategy')",
        "tf_glp/strategy/planted_for_the_test.py:13: reaches keras.utils._private_thing",
        "tf_glp/strategy/planted_for_the_test.py:13: reaches optimizer._trainable_variables",
    ], violations


def _wing(module: str) -> str:
    """tf_glp.strategy.cluster -> strategy; tf_glp.plan -> plan."""
    return module.split(".")[1] if "." in module else module


def test_the_wings_import_each_other_without_a_circle():
    """Imports between tf_glp's parts (lazy ones inside functions included)
    go one way: _keras at the bottom, strategy at the top. The package
    root (tf_glp/__init__.py, whose attributes load the parts lazily) is
    every module's parent and left out."""
    edges: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "__init__.py":
            continue
        source = _wing(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tf_glp."):
                targets = [_wing(node.module)]
            elif isinstance(node, ast.ImportFrom) and node.module == "tf_glp":
                targets = [a.name for a in node.names if (PACKAGE / a.name).exists()
                           or (PACKAGE / f"{a.name}.py").exists()]
            else:
                continue
            edges.setdefault(source, set()).update(t for t in targets if t != source)

    def circle_from(start, path):
        for nxt in sorted(edges.get(path[-1], ())):
            if nxt == start:
                return path + [nxt]
            if nxt not in path:
                found = circle_from(start, path + [nxt])
                if found:
                    return found
        return None

    circles = [" -> ".join(c) for c in (circle_from(w, [w]) for w in sorted(edges)) if c]
    assert circles == [], circles
    assert edges.get("_keras", set()) == set(), edges.get("_keras")  # the boundary imports nothing of tf_glp's
