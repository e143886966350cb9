"""The package's floors and what each may import, checked on the source alone (``ast``: no module
is imported, so this costs milliseconds and sees imports inside functions as well as at the top).

A module may import modules of its own floor and of the floors below it, never of a floor above;
and no chain of imports, at any level, comes back to where it started. The floors are the table
of docs/architecture.md; a new module must be placed on a floor there (the test says which it
lacks).

An import of ``a.b.c`` also runs the packages ``a`` and ``a.b``; those implicit imports of a
parent package are not arrows here (every package's ``__init__`` would otherwise close a circle
with the modules it gathers).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "raylf"

ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def floors(page: Path = ARCHITECTURE) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The floors of docs/architecture.md's table, lowest first: (name, the dotted modules and
    packages on it). The page users read is the one the code is held to."""
    out = []
    for match in re.finditer(r"^\| \d+ \| ([^|]+) \| ([^|]+) \|", page.read_text(), re.M):
        paths = re.findall(r"`([^`]+)`", match.group(2))
        out.append((match.group(1).strip(), tuple(
            p.removesuffix("/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            for p in paths)))
    return tuple(out)


FLOORS = floors()


def modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package by its own name)."""
    found = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` mod
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # a name inside a module: that module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module → the package's modules it imports."""
    known = modules(package)
    return {name: imports(name, path, known) for name, path in known.items()}


def floor_of(name: str) -> int | None:
    """The floor whose most specific entry holds ``name``."""
    best = None
    for level, (_, members) in enumerate(FLOORS):
        for member in members:
            if (name == member or name.startswith(member + ".")) and \
                    (best is None or len(member) > len(best[1])):
                best = (level, member)
    return None if best is None else best[0]


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Each import from a floor above the importer's, named with both floors."""

    def named(module: str) -> str:
        return f"{module} ({FLOORS[floor_of(module)][0]})"

    return [f"{named(a)} imports {named(b)}" for a, targets in sorted(edges.items())
            for b in sorted(targets) if floor_of(b) > floor_of(a)]


def circles(edges: dict[str, set[str]]) -> list[str]:
    """One chain per circle a depth-first walk closes, as a → b → … → a."""
    found, state = [], dict.fromkeys(edges, "new")  # new → open (on the path) → done

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for target in sorted(edges[name]):
            if state[target] == "open":
                found.append(" → ".join([*path[path.index(target):], name, target]
                                        if target in path else [name, target]))
            elif state[target] == "new":
                visit(target, [*path, name])
        state[name] = "done"

    for name in sorted(edges):
        if state[name] == "new":
            visit(name, [])
    return found


def test_every_module_is_on_a_floor():
    assert [name for name in graph() if floor_of(name) is None] == []


def test_no_module_imports_from_a_floor_above_its_own():
    assert upward(graph()) == []


def test_the_import_graph_has_no_circle():
    assert circles(graph()) == []


def test_the_checks_see_a_circle_and_an_upward_import_inside_a_function(tmp_path):
    """The checks above can fail: two modules importing each other, one of them from inside a
    function and from a floor above, are both reported."""
    package = tmp_path / "raylf"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "schema.py").write_text("def f():\n    from raylf import config\n")
    (package / "config.py").write_text("from .schema import f\n")
    edges = graph(package)
    assert edges["raylf.schema"] == {"raylf.config"}
    assert edges["raylf.config"] == {"raylf.schema"}
    assert upward(edges) == ["raylf.schema (foundation) imports raylf.config (resolution)"]
    assert circles(edges) == ["raylf.config → raylf.schema → raylf.config"]


def test_the_floors_are_read_from_the_architecture_page():
    names = [name for name, _ in FLOORS]
    assert names[0] == "foundation" and names[-1] == "commands and tools"
    assert dict(FLOORS)["resolution"] == ("raylf.config",)
    assert "raylf.sweep" in dict(FLOORS)["commands and tools"]
