"""zoo/ is the floor: none of its modules imports a domain package, and its own modules import each
other without a cycle (read from the source, so lazy imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

ZOO = Path(__file__).resolve().parents[2] / "zoo"
DOMAINS = {"nlp", "vision", "asr", "protein", "recipes"}


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(ZOO.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_zoo_imports_no_domain_package():
    offending = {module_name(path): sorted(m for m in imported_modules(path) if m.split(".")[0] in DOMAINS)
                 for path in ZOO.rglob("*.py")}
    assert {name: found for name, found in offending.items() if found} == {}


def test_zoo_modules_import_each_other_without_a_cycle():
    graph = {module_name(path): {m for m in imported_modules(path) if m.startswith("zoo.")} for path in ZOO.rglob("*.py")}
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", f"import cycle: {' -> '.join(trail + [module])}"
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            visit(target, trail + [module])
        state[module] = "done"

    for module in sorted(graph):
        visit(module, [])
