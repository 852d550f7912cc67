"""The shape of the house (issue 23): no import circle among the project's modules, imports at the top
of a module but where a reason is listed, and the boundaries of sglang/ and reference/.

The drawing is read from the syntax trees of every module: each import anywhere in a module (inside
functions too; ``if TYPE_CHECKING:`` blocks aside) is an edge, and importing ``a.b.c`` is an edge to
the packages ``a`` and ``a.b`` too, since Python runs them first."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import eagle3_raw

PACKAGE_DIR = Path(eagle3_raw.__file__).parent

#: The imports of project modules written inside functions, each with its reason.
INSIDE_FUNCTIONS = {
    ("eagle3_raw", "eagle3_raw.builder"): "`import eagle3_raw` stays light: datasets loads on first use",
    ("eagle3_raw", "eagle3_raw.hub"): "`import eagle3_raw` stays light: huggingface_hub loads on first use",
    ("eagle3_raw", "eagle3_raw.export"): "`import eagle3_raw` stays light: pyarrow loads on first use",
    ("eagle3_raw", "eagle3_raw.export.exporting"): "as above",
}

#: What an engine package and the reference server may import besides their own modules: leaves,
#: and the engine-neutral boundary (the types every engine returns, HTTP, statuses, id checks).
SGLANG_MAY_IMPORT = {
    "eagle3_raw.errors", "eagle3_raw.limits", "eagle3_raw.printable", "eagle3_raw.redact",
    "eagle3_raw.serving", "eagle3_raw.statuses", "eagle3_raw.transport", "eagle3_raw.idchecks",
}  # fmt: skip
#: vLLM's chat path reads a template's content format as SGLang's does, and raises its refusal.
VLLM_MAY_IMPORT = {*SGLANG_MAY_IMPORT, "eagle3_raw.sglang", "eagle3_raw.sglang.chatpath"}
REFERENCE_MAY_IMPORT = {
    "eagle3_raw.errors", "eagle3_raw.sglang", "eagle3_raw.sglang.protocol", "eagle3_raw.sglang.chatpath",
    "eagle3_raw.sglang.chatrequest", "eagle3_raw.sglang.chatschema", "eagle3_raw.sglang.parsers",
}  # fmt: skip


@dataclass(frozen=True)
class Edge:
    module: str
    imported: str
    line: int
    inside_function: bool


def _module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = ["eagle3_raw", *path.relative_to(PACKAGE_DIR).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


MODULES = _module_names()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        base = ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
    submodules = [f"{base}.{alias.name}" for alias in node.names]
    return submodules if all(name in MODULES for name in submodules) else [base, *submodules]


def _edges(module: str) -> Iterator[Edge]:
    def walk(node: ast.AST, inside: bool) -> Iterator[Edge]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    yield from walk(stmt, inside)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                for name in _targets(child, module):
                    parts = name.split(".")
                    for ancestor in [".".join(parts[:k]) for k in range(1, len(parts) + 1)]:
                        is_own_parent = module.startswith(ancestor + ".")
                        if ancestor in MODULES and ancestor != module and not is_own_parent:
                            yield Edge(module, ancestor, child.lineno, inside)
            function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from walk(child, inside or function)

    yield from walk(ast.parse(MODULES[module].read_bytes()), False)


EDGES = [edge for module in sorted(MODULES) for edge in _edges(module)]


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for edge in EDGES:
        graph[edge.module].add(edge.imported)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
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
            if child is None:
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
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_circle_among_the_projects_modules() -> None:
    assert _circles(_graph()) == []


def test_the_drawing_sees_circles_imports_inside_functions_and_packages_run_first() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}) == [["a", "b", "c"]]
    edges = {(e.module, e.imported, e.inside_function) for e in EDGES}
    assert ("eagle3_raw", "eagle3_raw.builder", True) in edges  # eagle3_raw.load's import
    assert ("eagle3_raw.run.build", "eagle3_raw.journal", False) in edges  # runs journal/__init__.py


def test_project_imports_are_at_the_top_of_a_module_but_where_a_reason_is_listed() -> None:
    inside = sorted({(e.module, e.imported) for e in EDGES if e.inside_function})
    unlisted = [pair for pair in inside if pair not in INSIDE_FUNCTIONS]
    assert unlisted == [], "move these imports to the top of the module, or list them with a reason"
    assert set(INSIDE_FUNCTIONS) <= set(inside), "a listed import is gone: take it off the list"


def _imports_from_outside(package: str, allowed: set[str]) -> set[tuple[str, str]]:
    """The imports of ``package``'s modules of anything but its own modules and ``allowed``."""
    return {
        (e.module, e.imported)
        for e in EDGES
        if e.module.startswith(package) and not e.imported.startswith(package) and e.imported not in allowed
    }


def test_sglang_is_one_package_that_imports_only_leaves() -> None:
    assert _imports_from_outside("eagle3_raw.sglang", SGLANG_MAY_IMPORT) == set()


def test_vllm_is_one_package_that_imports_only_leaves() -> None:
    assert _imports_from_outside("eagle3_raw.vllm", VLLM_MAY_IMPORT) == set()


def test_the_boundary_modules_import_no_engine() -> None:
    for module in (
        "eagle3_raw.serving",
        "eagle3_raw.transport",
        "eagle3_raw.statuses",
        "eagle3_raw.idchecks",
    ):
        assert not any(
            e.imported.startswith(("eagle3_raw.sglang", "eagle3_raw.vllm")) for e in _edges(module)
        ), module


def test_the_reference_server_imports_only_the_sglang_protocol_and_errors() -> None:
    assert _imports_from_outside("eagle3_raw.reference", REFERENCE_MAY_IMPORT) == set()
