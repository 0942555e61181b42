"""The rules of ARCHITECTURE.md that a reading of the source can check."""

from __future__ import annotations

import ast
from pathlib import Path

import dumpdb
import dumpdb.layouts.base as layouts_base

PACKAGE = Path(dumpdb.__file__).parent

# None left: storage is reached through public methods (Archive.reader, TensorStore, ObjectStore).
KNOWN_STORAGE_PRIVATES: set[str] = set()
# Modules of dumpdb/layouts/ that hold shared helpers, not layouts.
SHARED_LAYOUT_MODULES = {"base", "mindspore_kit", "mindspore_ir", "cann_pb", "flat_npy", "dump_data_pb2"}
# statistic-only is a special case of mindspore-sync (a subclass), the one allowed pair.
REFINES = {("statistic_only", "mindspore_sync")}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        if not path.name.endswith("_pb2.py"):
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def test_no_module_uses_another_modules_private_names():
    found: dict[str, str] = {}  # private name used -> where
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    found[ast.unparse(node)] = f"{path.name}:{node.lineno}"
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dumpdb"):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        found[a.name] = f"{path.name}:{node.lineno}"
    unexpected = {name: where for name, where in found.items() if name not in KNOWN_STORAGE_PRIVATES}
    assert unexpected == {}


def test_layouts_use_only_the_shared_modules_not_each_other():
    for path, tree in _modules():
        if path.parent.name != "layouts" or path.stem in SHARED_LAYOUT_MODULES | {"__init__"}:
            continue
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "dumpdb.layouts":
                    names = [a.name for a in node.names]
                elif node.module.startswith("dumpdb.layouts."):
                    names = [node.module.rsplit(".", 1)[1]]
            for name in names:
                # base's names re-exported by the package (register, Layout, TensorEntry, ...) are shared too
                if hasattr(layouts_base, name) or name in SHARED_LAYOUT_MODULES:
                    continue
                assert (path.stem, name) in REFINES, f"{path.name} imports layout module {name}"


def test_the_import_layers_of_pyproject_hold():
    """`lint-imports` (import-linter, contracts in pyproject.toml ``[tool.importlinter]``): each
    package imports only the layers below it, so no import circle runs through them; function-level
    and TYPE_CHECKING imports count, which the AST rules above do not follow."""
    import os
    import subprocess
    import sys

    repo = PACKAGE.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _base_name(node: ast.expr) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def test_no_class_overrides_a_private_method_of_a_class_in_another_module():
    # Extension goes through public seams (a protocol, a registry), not by replacing another
    # module's private steps (ingest's sinks: dumpdb.ingestion.pipeline.IngestSink).
    classes: dict[str, list[tuple[Path, set[str], list[str | None]]]] = {}
    other_names: dict[str, str] = {}  # a module-level second name of a class (X = Y)
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                methods = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                classes.setdefault(node.name, []).append((path, methods, [_base_name(b) for b in node.bases]))
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                other_names[node.targets[0].id] = node.value.id

    def ancestors(name: str, seen: frozenset[str]) -> list[tuple[Path, set[str]]]:
        out = []
        for path, methods, bases in classes.get(name, classes.get(other_names.get(name, ""), [])):
            out.append((path, methods))
            out += [a for b in bases if b and b not in seen for a in ancestors(b, seen | {name})]
        return out

    overrides = sorted(
        f"{path.relative_to(PACKAGE)}: {name}.{method} overrides {base_path.relative_to(PACKAGE)}"
        for name, defs in classes.items() for path, methods, bases in defs
        for base in bases if base for base_path, base_methods in ancestors(base, frozenset({name}))
        if base_path != path for method in methods & base_methods if _private(method))
    assert overrides == []


def test_no_module_aliases_a_private_name():
    # A name has one spelling: no public alias of a private (``Pipeline = _Pipeline``) and no
    # private second name of another (``_Loaded = Loaded``).
    aliases = []
    for path, tree in _modules():
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target, value = node.targets[0].id, node.value
                if (isinstance(value, (ast.Name, ast.Attribute)) and _private(_base_name(value) or "")) or \
                        (_private(target) and isinstance(value, ast.Name)):
                    aliases.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {target} = {ast.unparse(value)}")
    assert aliases == []


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the dumpdb modules it imports, anywhere in its body (function-level and
    TYPE_CHECKING imports count: each runs the other module's code first, or would). ``from
    pkg import sub`` is an edge to the submodule ``pkg.sub``, not to ``pkg``. Edges into the
    root package are left out: ``dumpdb/__init__.py`` is the public facade that re-exports the
    API (``from dumpdb import __version__`` in a submodule reads a constant it sets first)."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in paths}

    def resolve(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in paths]
                names = subs if len(subs) == len(node.names) else [base, *subs]
            for name in names:
                target = resolve(name)
                if target and target not in (module, "dumpdb") and module != "dumpdb":
                    graph[module].add(target)
    return graph


def test_no_import_circle():
    """Issue 27's acceptance, read from the code's own imports: no two modules reach each
    other (strongly connected components of the import graph above, Tarjan's algorithm)."""
    graph = _import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert len(graph) > 80 and sum(map(len, graph.values())) > 200  # the graph was read
    assert circles == []
