"""The import rules of ARCHITECTURE.md, read from the source (every import, including the ones
inside functions): the engine never imports Qt or the app, views reach the engine only through
its shared vocabulary, and the shipped app never imports the test suite or the developer tools."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What views may import from the engine: plain records, enums, errors, and where model files live.
VIEW_ENGINE_MODULES = {
    "engine.types",
    "engine.events",
    "engine.errors",
    "engine.cancel",
    "engine.model_files",
}


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def top(module: str) -> str:
    return module.split(".")[0]


def violations(package: str, is_bad) -> dict[str, list[str]]:
    found = {}
    for path in sources(package):
        bad = sorted(m for m in imported_modules(path) if is_bad(m))
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


def test_the_engine_never_imports_qt_or_the_app():
    forbidden = {"PySide6", "shiboken6", "qasync", "app"}
    assert violations("engine", lambda m: top(m) in forbidden) == {}


def test_views_reach_the_engine_only_through_its_shared_types():
    # `from engine.types import X` also lists "engine.types.X": judge its module part too
    def reaches_in(m: str) -> bool:
        return (
            top(m) == "engine"
            and m not in VIEW_ENGINE_MODULES
            and m.rsplit(".", 1)[0] not in VIEW_ENGINE_MODULES
        )

    assert violations("app/views", reaches_in) == {}


def test_the_shipped_app_never_imports_tests_or_tools():
    assert violations("app", lambda m: top(m) in {"tests", "tools", "bench"}) == {}
