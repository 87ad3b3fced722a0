"""docs/architecture.md names modules, classes and functions: every one of them must exist, so
that the map cannot drift from the code. A path ``src/oncelog/...`` must be a file or folder; a
dotted name ``oncelog.a.b`` must be a module or package, optionally followed by a name defined
at its top level and by a function or method of that class."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
SRC = ROOT / "src"


def named(text: str) -> tuple[set[str], set[str]]:
    spans = re.findall(r"`([^`]+)`", text)
    paths = {s.rstrip("/") for s in spans if s.startswith("src/oncelog")}
    dotted = {s for s in spans if re.fullmatch(r"oncelog(\.\w+)+", s)}
    return paths, dotted


def module_file(parts: list[str]) -> Path | None:
    base = SRC.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def top_level(path: Path) -> dict[str, ast.AST]:
    tree = ast.parse(path.read_text())
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    names[target.id] = node
    return names


def missing(name: str) -> str | None:
    """Why ``name`` (oncelog.x.y[.Name[.member]]) does not exist, or None."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        path = module_file(parts[:cut])
        if path is not None:
            break
    else:
        return "no such module"
    rest = parts[cut:]
    if not rest:
        return None
    if len(rest) > 2:
        return f"{'.'.join(rest)} is not a name in {path.relative_to(ROOT)}"
    defined = top_level(path)
    if rest[0] not in defined:
        return f"{rest[0]} is not defined in {path.relative_to(ROOT)}"
    if len(rest) == 2:
        cls = defined[rest[0]]
        members = {n.name for n in getattr(cls, "body", [])
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        if rest[1] not in members:
            return f"{rest[0]} has no {rest[1]} in {path.relative_to(ROOT)}"
    return None


def test_the_map_names_what_it_should():
    paths, dotted = named(DOC.read_text())
    assert len(paths) >= 10 and len(dotted) >= 40  # the scan finds the names it must check
    assert missing("oncelog.broker.apis.registry.HANDLERS") is None
    assert missing("oncelog.broker.apis.registry.NOT_THERE") is not None
    assert missing("oncelog.broker.partition.Partition.no_such_method") is not None
    assert missing("oncelog.no_such_package.module") is not None


def test_every_path_in_the_map_exists():
    paths, _ = named(DOC.read_text())
    gone = sorted(p for p in paths if not (ROOT / p).exists())
    assert not gone, f"docs/architecture.md names paths that do not exist: {gone}"


def test_every_module_and_function_in_the_map_exists():
    _, dotted = named(DOC.read_text())
    gone = {name: why for name in sorted(dotted) if (why := missing(name))}
    assert not gone, "docs/architecture.md names what does not exist:\n" + "\n".join(
        f"  {name}: {why}" for name, why in gone.items())
