"""The library's import graph (sol_ext/*.py, read with ast): no cycle, and no private name taken across modules."""
from __future__ import annotations

import ast
from pathlib import Path

from common import REPO_ROOT

PACKAGE = REPO_ROOT / "sol_ext"
MODULES = {path.stem: path for path in sorted(PACKAGE.glob("*.py"))}  # the library, not sol_ext/driver/


def _from_package(names):
    """``from . import x`` (or ``from sol_ext import x``): a sibling module, the compiled extension or a
    subpackage (not library modules: skipped), or a name the package defines (``"__init__"``)."""
    for name in names:
        if name in MODULES:
            yield name, []
        elif not any(PACKAGE.glob(f"{name}*")):
            yield "__init__", [name]


def _imports(path: Path):
    """``(module, names)`` for every import from sol_ext anywhere in the file (lazy ones too: a cycle
    closed inside a function is still a cycle): the module imported from, and the names taken from it."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names]
            if node.level == 1:
                inner = (node.module or "").split(".")
            elif node.level == 0 and (node.module or "").split(".")[0] == "sol_ext":
                inner = node.module.split(".")[1:]
            else:
                continue
            if inner and inner[0]:
                yield inner[0], names
            else:
                yield from _from_package(names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "sol_ext":
                    yield (parts[1] if len(parts) > 1 else "__init__"), []


def _graph():
    return {
        name: {target for target, _ in _imports(path) if target in MODULES and target != name}
        for name, path in MODULES.items()
    }


def test_the_graph_sees_the_imports():
    graph = _graph()
    assert {"_validation", "_dispatch"} <= graph["ops"]
    assert "_extension" in graph["_dispatch"]
    assert "loss" in graph["__init__"]


def _cycles(graph):
    """Every cycle reachable in ``graph`` (one per back edge of a depth-first search), as lists of modules."""
    cycles, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_library_has_no_import_cycle():
    """A module imported by the package (``__init__``) may not import the package back, and no chain of
    sibling imports (module level or inside functions) comes back to where it started."""
    assert _cycles(_graph()) == []


def test_the_extension_module_is_a_leaf():
    """``_extension`` loads the compiled ops; every module can import it first because it imports no other."""
    assert _graph()["_extension"] == set()


def test_no_private_name_is_imported_across_modules():
    """What a module needs from another has a real (internal) name there: no ``from X import _name``. Private
    modules themselves (``from . import _validation as check``) are fine."""
    taken = [
        f"{name}.py: from {module} import {imported}"
        for name, path in MODULES.items()
        for module, names in _imports(path)
        for imported in names
        if imported.startswith("_") and module != name
    ]
    assert taken == []


def test_the_private_name_check_sees_a_private_import(tmp_path):
    source = tmp_path / "example.py"
    source.write_text("from .ops import _hidden, shown\nfrom . import _validation as check\n", encoding="utf-8")
    assert list(_imports(source)) == [("ops", ["_hidden", "shown"]), ("_validation", [])]


# -- the sol-ext program (sol_ext/driver/ and its data/ package) ----------------------------------

DRIVER = PACKAGE / "driver"


def _driver_modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the driver (a package by its ``__init__.py``)."""
    modules = {}
    for path in sorted(DRIVER.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _driver_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Driver module -> the driver modules it imports anywhere in the file (lazy imports and
    ``TYPE_CHECKING`` blocks too); ``from .data import x`` is the package ``data``, or its module
    ``x`` where there is one."""
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                found = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module
                         for a in node.names]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            targets |= {m for m in found if m in modules and m != name}
        graph[name] = targets
    return graph


def test_the_driver_graph_sees_the_imports():
    graph = _driver_graph(_driver_modules())
    assert {"sol_ext.driver.fit", "sol_ext.driver.checkpoint"} <= graph["sol_ext.driver.train"]
    assert "sol_ext.driver.data.load" in graph["sol_ext.driver.data"]
    assert "sol_ext.driver.options" in graph["sol_ext.driver.cli"]


def test_the_driver_has_no_import_cycle():
    """No chain of imports inside the program, at module level, inside functions or for type
    checking only, comes back to where it started (the command line and its options included)."""
    assert _cycles(_driver_graph(_driver_modules())) == []
