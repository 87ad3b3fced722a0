"""Imports in src/oncelog only go down: no two modules import each other, directly or through
others. The graph is read from the source with ``ast``: every import statement counts, at
module level, inside functions and under ``if TYPE_CHECKING`` alike (a type-only import is
still one module knowing another; a Protocol in the lower module names what it needs instead).
Between packages, each imports only the layers under it (docs/architecture.md): the clients,
and what is built on them, never the broker.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the oncelog modules it imports (a name imported from a package counts as the
    submodule when there is one of that name, else as the package)."""
    files = {module_name(p): p for p in (SRC / "oncelog").rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in files
                           else source for alias in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in files and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


# The packages each package may import (besides itself): the layers of docs/architecture.md.
ALLOWED = {
    "protocol": set(),
    "log": {"protocol"},
    "producer_state": {"protocol", "log"},
    "metadata": set(),
    "coordinator": {"protocol", "metadata"},
    "cluster": {"protocol", "metadata"},
    "security": {"protocol", "metadata"},
    "broker": {"protocol", "log", "producer_state", "metadata", "coordinator", "cluster",
               "security"},
    "client": {"protocol", "security"},  # security.scram and sasl_client only: pure, shared
    "audit": {"protocol", "client"},
    "chaos": {"protocol", "client"},
    "spark": {"protocol", "client", "audit"},
    "cli": {"protocol", "metadata", "broker", "cluster", "security", "client", "audit", "chaos",
            "spark"},
}

# Inside a package, the layers of its parts (sub-packages and modules), where they have
# some: each part imports only those named for it. In client/, the network layer knows no
# role, and the roles build on one another upward: producer, admin, consumer, the reader.
INSIDE = {
    "client": {
        "topic_partition": set(),
        "metrics": set(),
        "network": {"topic_partition"},
        "producer": {"network", "metrics", "topic_partition"},
        "admin": {"network", "producer", "topic_partition"},
        "consumer": {"admin", "network", "producer", "metrics", "topic_partition"},
        "topic_reader": {"admin", "network", "topic_partition"},
    },
}


def test_the_graph_is_read():
    graph = import_graph()
    assert "oncelog.broker.apis.registry" in graph["oncelog.broker.server"]
    assert "oncelog.client.producer.txn_requests" in graph["oncelog.client.producer.sender"]
    # a function-level import counts
    assert "oncelog.broker.server" in graph["oncelog.cli.main"]


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others():
    graph = import_graph()
    found = cycles(graph)
    lines = [" <-> ".join(c) + "\n    " + "\n    ".join(
        f"{m} imports {sorted(graph[m] & set(c))}" for m in c) for c in found]
    assert not found, "import cycles in src/oncelog:\n" + "\n".join(lines)


def test_packages_import_only_the_layers_under_them():
    graph = import_graph()
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items() if module.count(".") >= 1
        for target in targets if target.count(".") >= 1
        and (package := module.split(".")[1]) in ALLOWED
        and (other := target.split(".")[1]) != package and other not in ALLOWED[package])
    assert not upward, "imports that go up or sideways:\n" + "\n".join(upward)
    assert set(ALLOWED) == {m.split(".")[1] for m in graph
                            if m.count(".") >= 1 and (SRC / "oncelog" / m.split(".")[1]).is_dir()}


def test_the_parts_of_a_package_import_only_the_layers_under_them():
    graph = import_graph()
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items() if module.count(".") >= 2
        and (package := module.split(".")[1]) in INSIDE
        for target in targets if target.count(".") >= 2 and target.split(".")[1] == package
        and (part := module.split(".")[2]) != (other := target.split(".")[2])
        and other not in INSIDE[package][part])
    assert not upward, "imports that go up or sideways inside a package:\n" + "\n".join(upward)
    for package, layers in INSIDE.items():
        assert set(layers) == {m.split(".")[2] for m in graph
                               if m.count(".") >= 2 and m.split(".")[1] == package}
