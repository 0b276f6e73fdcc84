"""The package's shape: subpackages by layer, imports only down or sideways, no import cycle.

Serial and MPI-free: it reads the sources (every ``import``, also those inside functions) and
checks the rules docs/layout.md states.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "mpidist"

#: The layers, bottom up. A module may import from its own layer or a lower one, never a higher.
LAYERS = {
    "_version": -1,  # a leaf: any layer may read the version
    "core": 0, "gpu": 0,
    "checks": 1,
    "calls": 2, "start": 2,
    "training": 3, "torch": 3, "groupby": 3, "integrations": 3,
    "": 4,  # mpidist/ itself: the public API (__init__) and the commands (__main__, run, flight)
}
#: Modules directly in mpidist/: the API, the commands, the version.
TOP_LEVEL_LIMIT = 12
MODULE_LINE_LIMIT = 400


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The mpidist modules ``name`` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("mpidist"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("mpidist"))
    found.discard(name)
    return {m for m in found if m in MODULES}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer_of(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 2 or (len(parts) == 2 and MODULES[module].name == "__init__.py") else ""
    if len(parts) == 2 and parts[1] == "_version":
        key = "_version"
    assert key in LAYERS, f"{module}: subpackage {key!r} has no layer in test_layout.LAYERS"
    return LAYERS[key]


def test_every_import_goes_down_or_sideways():
    upward = [f"{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})"
              for m, targets in sorted(GRAPH.items()) for t in sorted(targets) if layer_of(t) > layer_of(m)]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    # Tarjan's strongly connected components: any component of more than one module is a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
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
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_at_most_twelve_modules_at_the_top():
    top = sorted(p.name for p in SRC.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= TOP_LEVEL_LIMIT, top


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_over_400_lines(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MODULE_LINE_LIMIT, f"{MODULES[name]} has {lines} lines"


@pytest.mark.parametrize("package", sorted(p.parent.name for p in SRC.glob("*/__init__.py")))
def test_each_subpackage_says_what_it_holds_and_may_import(package):
    doc = ast.get_docstring(ast.parse((SRC / package / "__init__.py").read_text())) or ""
    assert len(doc.splitlines()) >= 2, f"mpidist/{package}/__init__.py needs a docstring"
    assert "Imports:" in doc, f"mpidist/{package}/__init__.py must say what it may import"
    assert package in LAYERS, f"mpidist/{package}/ has no layer in test_layout.LAYERS"


def test_the_rules_can_fail():
    """The checks above see real edges: the public API imports every layer."""
    assert {layer_of(t) for t in GRAPH["mpidist"]} >= {0, 1, 2}
    assert "mpidist.core.errors" in GRAPH["mpidist.core.groups"]
