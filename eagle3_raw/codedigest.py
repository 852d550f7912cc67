"""The digest of the code that shapes rows: part of every set id and input key.

What is digested is the code's meaning, not its bytes or its place, so that moving code between
modules, renaming a module, editing a comment or a docstring, or reordering definitions keeps every
set id (users keep their caches), while a change to what a function does changes them:

- **Which code**: the modules :data:`ROOTS` name (the stages that turn a recipe's values and source
  rows into requests, and generations into rows) and every project module they import, found from
  their syntax trees (imports inside functions included, ``if TYPE_CHECKING:`` blocks not),
  stopping at the :data:`BOUNDARIES` (modules whose code cannot change a row, each with its reason).
- **What of it**: each top-level statement of those modules as a syntax tree without docstrings,
  string statements and import statements, serialized by node type and non-empty fields only (so a
  newer Python adding an optional field to a node changes nothing). The digest is the sha256 of the
  sorted digests of the statements: a definition counts once wherever it lives.

Only the standard library is used: it runs on every import of a set id, before anything else.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "eagle3_raw"
_PACKAGE_DIR = Path(__file__).resolve().parent

ROOTS = (
    "eagle3_raw.source.prompts",
    "eagle3_raw.run.mixture",
    "eagle3_raw.run.render",
    "eagle3_raw.sglang.chatpath",
    "eagle3_raw.run.plan",
    "eagle3_raw.run.rollout",
    "eagle3_raw.journal.assembly",
    "eagle3_raw.vllm.sampling",
)
"""Where rows are shaped: reading source rows, drawing the mixture, rendering prompts, planning
requests, rolling out later turns, assembling rows from generations, and saying a request's
sampling in vLLM's names (the request digest holds the recipe's)."""

BOUNDARIES = {
    "eagle3_raw.recipe": "the recipe's values enter every id through its fingerprint",
    "eagle3_raw.errors": "exception classes and their texts",
    "eagle3_raw.codedigest": "this module: it names modules, whose code it digests",
    "eagle3_raw.run.dispatch": "when and where a request is sent: the request digest covers what is sent",
    "eagle3_raw.run.retry": "when a request is tried again, and the run stopping meanwhile",
    "eagle3_raw.sglang.client": "the HTTP transport; responses are checked, never reshaped",
    "eagle3_raw.run.endpoints": "which endpoint serves a request",
    "eagle3_raw.run.progress": "progress display",
}
"""Modules (and their submodules) whose code is not digested, with the reason it cannot change a row."""


@dataclass(frozen=True)
class Statement:
    """One top-level statement of a digested module, by its normalized syntax tree's digest."""

    module: str
    line: int
    digest: str


def code_digest(package_dir: Path = _PACKAGE_DIR) -> str:
    """sha256 (16 hex digits) of the code that shapes rows, as the module docstring defines it
    (``package_dir``: the ``eagle3_raw`` package folder to read, this one by default)."""
    digest = hashlib.sha256(b"eagle3_raw/code/2\0")
    for statement_digest in sorted(statement.digest for statement in statements(package_dir)):
        digest.update(statement_digest.encode())
    return digest.hexdigest()[:16]


def statements(package_dir: Path = _PACKAGE_DIR) -> list[Statement]:
    """Every digested statement of the modules :func:`covered_modules` finds under ``package_dir``."""
    found = []
    for module in sorted(covered_modules(package_dir)):
        tree = ast.parse(_module_path(module, package_dir).read_bytes())
        for node in _top_level(tree.body):
            found.append(Statement(module, node.lineno, _node_digest(node)))
    return found


def module_digest(module: str, package_dir: Path = _PACKAGE_DIR) -> str:
    """sha256 (16 hex digits) of one module's statements, read as :func:`code_digest` reads them
    (its imports are not followed): the identity of code outside :data:`ROOTS` that a recipe opts
    into, such as a ``select`` section's rules (:mod:`eagle3_raw.selection`)."""
    digest = hashlib.sha256(b"eagle3_raw/module/1\0" + module.encode() + b"\0")
    tree = ast.parse(_module_path(module, package_dir).read_bytes())
    for statement_digest in sorted(_node_digest(node) for node in _top_level(tree.body)):
        digest.update(statement_digest.encode())
    return digest.hexdigest()[:16]


def covered_modules(package_dir: Path = _PACKAGE_DIR) -> set[str]:
    """The :data:`ROOTS` and the project modules they import, transitively, short of the boundaries."""
    seen: set[str] = set()
    todo = [root for root in ROOTS if not _is_boundary(root)]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        tree = ast.parse(_module_path(module, package_dir).read_bytes())
        for imported in _imports(tree, module, package_dir):
            if imported not in seen and not _is_boundary(imported):
                todo.append(imported)
    return seen


def _is_boundary(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in BOUNDARIES)


def _module_path(module: str, package_dir: Path) -> Path:
    parts = module.split(".")[1:]
    folder = package_dir.joinpath(*parts)
    if (folder / "__init__.py").is_file():
        return folder / "__init__.py"
    return folder.with_suffix(".py")


def _is_module(module: str, package_dir: Path) -> bool:
    return module == PACKAGE or _module_path(module, package_dir).is_file()


def _imports(tree: ast.Module, module: str, package_dir: Path) -> Iterator[str]:
    """The project modules ``tree`` imports at run time (anywhere but ``if TYPE_CHECKING:``)."""
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, package_dir)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            if name.split(".")[0] == PACKAGE and name != PACKAGE and _is_module(name, package_dir):
                yield name


def _absolute(node: ast.ImportFrom, module: str, package_dir: Path) -> str:
    if not node.level:
        return node.module or ""
    is_package = _module_path(module, package_dir).name == "__init__.py"
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    return ".".join([*parts[:keep], *([node.module] if node.module else [])])


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from (child for stmt in node.orelse for child in (stmt, *_runtime_nodes(stmt)))
            continue
        yield node
        yield from _runtime_nodes(node)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    for node in body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            continue
        if not _is_ignored(node):
            yield node


def _is_ignored(node: ast.AST) -> bool:
    """Imports (a move rewrites them) and bare string statements (docstrings) say nothing a row sees."""
    return isinstance(node, ast.Import | ast.ImportFrom) or (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _node_digest(node: ast.AST) -> str:
    return hashlib.sha256(_canonical(node).encode()).hexdigest()


def _canonical(value: object) -> str:
    """A node by type and its non-empty fields, positions left out; nested ignored statements dropped."""
    if isinstance(value, ast.AST):
        fields = []
        for name in value._fields:
            field = getattr(value, name, None)
            if isinstance(field, list):
                field = [item for item in field if not _is_ignored(item)]
            if field is None or field == []:
                continue
            fields.append(f"{name}={_canonical(field)}")
        return f"({type(value).__name__} {' '.join(fields)})"
    if isinstance(value, list):
        return "[" + ",".join(_canonical(item) for item in value) + "]"
    return repr(value)
