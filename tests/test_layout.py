"""The layout rules of tf_glp's source, read from its AST (as
test_keras_boundary.py reads the boundary):

- no import cycle between tf_glp's modules (function-level imports
  included: a lazy import hides a cycle, it does not remove it);
- the update concepts are compared by name only inside their registry
  (tf_glp/strategy/concepts.py): everywhere else holds an UpdateConcept and
  asks it (Note [One word: concept]);
- one file per strategy under tf_glp/strategy/, the base class's file kept
  small.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tf_glp"
REGISTRY = PACKAGE / "strategy" / "concepts.py"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, pathlib.Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """The tf_glp modules `path` imports: `from a import b` is module a.b
    where that is a module, else a."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                     for alias in node.names]
        else:
            continue
        out.update(name for name in names if name in modules)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_tf_glps_modules():
    modules = _sources()
    # A package's __init__ importing its own submodules is how a package
    # exports; the edge back (a submodule importing a name from its
    # package) is what would make that a cycle, and is kept.
    graph = {}
    for name, path in modules.items():
        edges = _imports(path, modules)
        if path.name == "__init__.py":
            edges = {e for e in edges if not e.startswith(name + ".")}
        graph[name] = edges
    assert _cycles(graph) == []


def _concept_names() -> set[str]:
    tree = ast.parse(REGISTRY.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if (isinstance(item, ast.Assign) and any(getattr(t, "id", None) == "name" for t in item.targets)
                        and isinstance(item.value, ast.Constant)):
                    names.add(item.value.value)
    return names


def _string_constants(node) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_string_constants(e) for e in node.elts)) if node.elts else set()
    return set()


def _concept_string_uses(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """Where a concept is used by its name: comparisons (==, !=, in, match)
    with a concept's name as a literal or with a concept's `.name`, a tuple,
    list or set literal holding concept names or concepts' `.name`s (a
    strategy class serving a name), a lookup in a dict literal keyed by
    them, and setattr of a `concept` attribute by name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                hit = _string_constants(operand) & names
                if hit:
                    found.append((node.lineno, f"compares with {sorted(hit)}"))
                if (isinstance(operand, ast.Attribute) and operand.attr == "name"
                        and "concept" in ast.unparse(operand.value).lower()):
                    found.append((node.lineno, f"compares {ast.unparse(operand)}"))
        elif isinstance(node, ast.match_case):
            hit = {c.value.value for c in ast.walk(node.pattern)
                   if isinstance(c, ast.MatchValue) and isinstance(c.value, ast.Constant)} & names
            if hit:
                found.append((node.pattern.lineno, f"matches {sorted(hit)}"))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            hit = set().union(*(_string_constants(e) for e in node.elts)) & names if node.elts else set()
            hit |= {ast.unparse(e) for e in node.elts if isinstance(e, ast.Attribute) and e.attr == "name"
                    and "concept" in ast.unparse(e.value).lower()}
            if hit:
                found.append((node.lineno, f"lists {sorted(hit)}"))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
            hit = set().union(*(_string_constants(k) for k in node.value.keys if k is not None)) & names
            if hit:
                found.append((node.lineno, f"looks up a dict keyed by {sorted(hit)}"))
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value == "concept"):
            found.append((node.lineno, "sets a concept by name"))
    return found


def test_the_concepts_are_compared_by_name_only_in_their_registry():
    names = _concept_names()
    assert names == {"host", "replicas", "all-reduce"}, names  # the registry as this test reads it
    offences = [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
                for path in sorted(PACKAGE.rglob("*.py")) if path != REGISTRY
                for line, what in _concept_string_uses(ast.parse(path.read_text()), names)]
    assert offences == [], "ask the UpdateConcept (tf_glp/strategy/concepts.py) instead:\n" + "\n".join(offences)


def test_the_concept_check_finds_what_it_looks_for():
    names = {"host", "replicas"}
    source = ("a == 'host'\nb in ('x', 'replicas')\n{'host': 1}[c]\nmatch d:\n    case 'replicas': pass\n"
              "e == 'auto'\nf.concept.name == g\nKINDS = ['host', 'x']\nsetattr(h, 'concept', i)\n"
              "j.name == k\nclass A(B, serves=(concepts.HOST.name,)): pass\nl = (m.name,)\n")
    assert sorted({line for line, _ in _concept_string_uses(ast.parse(source), names)}) == [1, 2, 3, 5, 7, 8, 9, 11]


def test_one_file_per_strategy_and_a_small_base():
    strategy = PACKAGE / "strategy"
    classes = {}
    for path in strategy.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Strategy"):
                classes.setdefault(path.name, []).append(node.name)
    assert classes == {
        "strategy.py": ["Strategy"], "one_device_strategy.py": ["SingleDeviceStrategy"],
        "host_strategy.py": ["HostStrategy"], "replica_strategy.py": ["ReplicaStrategy"],
        "auto_strategy.py": ["AutoStrategy"],
        "multi_worker_strategy.py": ["MultiWorkerReplicaStrategy", "MultiWorkerHostStrategy"]}
    assert len((strategy / "strategy.py").read_text().splitlines()) <= 350


# tf_glp's public names: those the docs describe (README.md, docs/). What only
# the package calls is private or on `extended`, as in tf.distribute; a name
# made public changes this list and its docs together.
PUBLIC = {
    "tf_glp": ["NativeStatus", "Strategy", "callbacks", "environment_cluster", "layers", "native_available", "ops",
               "plan", "profile", "slurm_cluster", "strategy"],
    "tf_glp.Strategy": ["chunking", "compression", "concept", "explain", "host_device", "reduce", "update",
                        "update_concept", "uses_gpus"],
}


def test_the_public_names_are_those_the_docs_describe():
    import tf_glp  # noqa: PLC0415
    from tf_glp import strategy  # noqa: PLC0415

    classes = [c for c in vars(strategy).values() if isinstance(c, type) and issubclass(c, strategy.Strategy)]
    defined = {name for cls in classes for base in cls.__mro__ if base.__module__.startswith("tf_glp")
               for name in vars(base) if not name.startswith("_")}
    assert sorted(tf_glp.__all__) == PUBLIC["tf_glp"]
    assert sorted(defined) == PUBLIC["tf_glp.Strategy"]
    docs = "\n".join(p.read_text() for p in [PACKAGE.parent / "README.md", *sorted((PACKAGE.parent / "docs").glob("*.md"))])
    undocumented = [name for names in PUBLIC.values() for name in names if f"`{name}" not in docs and
                    f"{name}(" not in docs and f".{name}" not in docs]
    assert undocumented == [], undocumented
