"""The house's layering, read from the source (so lazy imports inside functions count too).

- `zoo/` is the floor: it imports no other package of the project; `zoo/nn` holds no
  `torch.distributed` code.
- `trainers/` stands on `zoo/` alone; the domains (asr, nlp, vision, protein) on `zoo/` alone, never on
  each other nor on `trainers/`; `recipes/` compose them. So the packages import each other without a
  cycle, and so do the modules inside each package.
- Nothing imports `trainers.trainer` but the package face (`trainers/__init__.py`); the rest of the
  core, the estimator above all, steps through `trainers.step`.
- `trainers/` keeps at its top level only the specs, the trainer, the step and the one ordered
  application; everything else lives in sub-packages, and no module of it is over 400 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("zoo", "trainers", "asr", "nlp", "vision", "protein", "recipes")
ALLOWED = {"zoo": set(), "trainers": {"zoo"}, "asr": {"zoo"}, "nlp": {"zoo"}, "vision": {"zoo"}, "protein": {"zoo"},
           "recipes": {"zoo", "trainers", "asr", "nlp", "vision", "protein"}}
"""The project's packages each package may import."""
TRAINERS_TOP_LEVEL = {"__init__", "config", "strategy", "trainer", "step", "parallelize"}
TRAINERS_MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules `path` (module `name`) imports anywhere in it, under `if TYPE_CHECKING:` too (a
    type checker reads them; a cycle through one is a cycle of the design): `from a import b` counts
    as a.b where a.b is a module of the project, else as a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (its modules in order, the first again at the end), or None."""
    state: dict[str, str] = {}
    for start in sorted(graph):
        stack = [(start, iter(sorted(graph[start])))]
        if state.get(start):
            continue
        state[start] = "open"
        while stack:
            module, targets = stack[-1]
            target = next((t for t in targets if t in graph and state.get(t) != "done"), None)
            if target is None:
                state[module] = "done"
                stack.pop()
            elif state.get(target) == "open":
                trail = [m for m, _ in stack]
                return trail[trail.index(target):] + [target]
            else:
                state[target] = "open"
                stack.append((target, iter(sorted(graph[target]))))
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_packages_import_only_what_they_stand_on(graph):
    crossing = {name: sorted(t for t in targets if t.split(".")[0] in PACKAGES
                             and t.split(".")[0] not in ALLOWED[name.split(".")[0]] | {name.split(".")[0]})
                for name, targets in graph.items()}
    assert {name: found for name, found in crossing.items() if found} == {}


def test_modules_import_each_other_without_a_cycle(graph):
    inside = {name: {t for t in targets if t in graph} for name, targets in graph.items()}
    assert cycle(inside) is None


def test_zoo_nn_and_the_models_hold_no_distributed_code(graph):
    distributed = {name: sorted(t for t in targets if t.startswith("torch.distributed"))
                   for name, targets in graph.items()
                   if name.startswith("zoo.nn") or name.split(".")[0] in ("asr", "nlp", "vision", "protein")}
    assert {name: found for name, found in distributed.items() if found} == {}


def test_only_the_package_face_imports_the_trainer():
    modules = {module_name(path): path for path in ROOT.rglob("*.py") if ".venv" not in path.parts}
    importers = sorted(name for name, path in modules.items()
                       if "trainers.trainer" in imports_of(name, path, set(modules)))
    assert importers == ["trainers"]


def test_trainers_is_sub_packages_of_small_modules():
    top = {path.stem for path in (ROOT / "trainers").glob("*.py")}
    assert top == TRAINERS_TOP_LEVEL
    long = {str(path.relative_to(ROOT)): lines for path in (ROOT / "trainers").rglob("*.py")
            if (lines := len(path.read_text().splitlines())) > TRAINERS_MAX_LINES}
    assert long == {}
