"""The shape of the house, held: the library's floors (a module imports only from floors below),
the size of a module, the one door to redis-py, and a docstring on every public name."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "cancel_bus"
MAX_FLOORS = 7
MAX_LINES = 500


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _package_imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports relatively (``from ._x import``, ``from . import
    _x``), TYPE_CHECKING imports included: a type is a dependency too."""
    found: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
            found.update(name for name in names if name in modules)
    return found


def floors() -> dict[str, int]:
    """Each core module's floor: 1 + the highest floor it imports from."""
    paths = {path.stem: path for path in LIBRARY.glob("*.py")}
    imports = {name: _package_imports(path, set(paths)) for name, path in paths.items()}

    @functools.cache
    def floor(name: str) -> int:
        return 1 + max((floor(dep) for dep in imports[name]), default=0)

    return {name: floor(name) for name in paths}


def test_the_library_stands_on_at_most_seven_floors() -> None:
    # a cycle would recurse without end: functools.cache does not break it
    built = floors()
    assert max(built.values()) <= MAX_FLOORS, sorted(built.items(), key=lambda item: item[1])


def test_the_design_draws_the_floors_the_code_has() -> None:
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    section = design.split("## 13. Module map", 1)[1].split("\nnode/", 1)[0]
    drawn: dict[str, int] = {}
    floor = 0
    for line in section.splitlines():
        if line.startswith("  # floor "):
            floor = int(line.split()[2].rstrip(":"))
        elif line.startswith("  ") and line.split()[0].endswith(".py"):
            drawn[line.split()[0].removesuffix(".py")] = floor
    assert drawn == floors()


def _sources() -> list[Path]:
    return sorted([*LIBRARY.rglob("*.py"), *(ROOT / "node").rglob("*.py")])


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_longer_than_five_hundred_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_LINES


def _imported_top_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_redis_py_is_imported_by_the_redis_door_alone() -> None:
    """The library talks to redis-py through ``_redis.py``; the node never does."""
    importers = {
        str(path.relative_to(ROOT)) for path in _sources() if "redis" in _imported_top_names(path)
    }
    assert importers == {"cancel_bus/_redis.py"}


def _undocumented(path: Path, only: set[str] | None = None) -> list[str]:
    """Public classes, functions and methods (of public classes) without a docstring; in a
    private module, only those the package exports (``only``). A dunder, a protocol's member
    (``...``) and a property's setter are exempt."""
    missing: list[str] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name.startswith("_"):
                continue
            if only is not None and not prefix and node.name not in only:
                continue
            decorators = {ast.unparse(d) for d in node.decorator_list}
            if any(d.endswith((".setter", "overload", "override")) for d in decorators):
                continue
            if ast.get_docstring(node) is None and not _is_stub(node):
                missing.append(f"{prefix}{node.name}")
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(_tree(path).body, "")
    return missing


def _is_stub(node: ast.stmt) -> bool:
    """A protocol member: its body is ``...``."""
    body = getattr(node, "body", [])
    return (
        len(body) == 1
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and body[0].value.value is Ellipsis
    )


def _exported() -> set[str]:
    """The names ``cancel_bus`` exports (its ``__all__``), read from the source."""
    for node in _tree(LIBRARY / "__init__.py").body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__":
            return set(ast.literal_eval(node.value))
    raise AssertionError("cancel_bus has no __all__")


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_public_name_has_a_docstring(path: Path) -> None:
    """Public: what a public module defines, and what the package exports from a private one."""
    private = path.parent == LIBRARY and path.name.startswith("_") and path.name != "__init__.py"
    assert _undocumented(path, _exported() if private else None) == []
