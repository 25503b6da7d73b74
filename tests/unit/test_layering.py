"""The house's floors (docs/architecture.md, "Layout: the floors"): every import of a product module,
function-local and type-only ones included, points to its own floor or one below. A new import that
runs up (a drafter reaching into the engine loop, the reference backend into the cpu kernels, the config
into the drafters) fails here with the file, the line and the two floors."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "spec_backend"

#: module prefix -> floor (the longest matching prefix wins)
FLOORS = {
    "spec_backend.config": 1,
    "spec_backend.methods": 1,
    "spec_backend.verify_rules": 1,
    "spec_backend.graphs": 1,
    "spec_backend.metrics": 1,
    "spec_backend.paths": 1,
    "spec_backend.lazy": 1,
    "spec_backend.sampling": 2,
    "spec_backend.step": 3,
    "spec_backend.backends": 4,
    "spec_backend.runtime": 5,
    "spec_backend.models": 6,
    "spec_backend.proposers": 7,
    "spec_backend.cpu": 7,
    "spec_backend.engine": 8,
    "spec_backend.tools": 9,
    "spec_backend.integrations": 9,
    "spec_backend.testing": 9,
    "spec_backend.server": 9,
    "spec_backend.cli": 10,
    "spec_backend": 10,  # the package's face: lazy re-exports of the public API
}
#: the imports that run up, each type-only and named in docs/architecture.md
ALLOWED_UP = {("spec_backend.verify_rules", "spec_backend.sampling.ops")}


def floor(module: str) -> int:
    matches = [p for p in FLOORS if module == p or module.startswith(p + ".")]
    return FLOORS[max(matches, key=len)]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found += [(node.lineno, n) for n in names if n.startswith("spec_backend")]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("spec_backend")]
    return found


PRODUCT = sorted(p for p in ROOT.rglob("*.py") if "fixtures" not in p.parts)


@pytest.mark.parametrize("path", PRODUCT, ids=[str(p.relative_to(ROOT)) for p in PRODUCT])
def test_every_import_points_down(path: Path) -> None:
    here = module_name(path)
    up = []
    for line, target in project_imports(path):
        target_module = target if _is_module(target) else target.rsplit(".", 1)[0]
        if floor(target_module) > floor(here) and (here, target_module) not in ALLOWED_UP:
            up.append(f"line {line}: {target_module} (floor {floor(target_module)}) from floor {floor(here)}")
    assert not up, f"{path.relative_to(ROOT.parent)} imports up: " + "; ".join(up)


def _is_module(name: str) -> bool:
    relative = Path(*name.split("."))
    return (ROOT.parent / relative).with_suffix(".py").is_file() or (ROOT.parent / relative).is_dir()


def test_the_floors_cover_every_product_package() -> None:
    packages = {module_name(p).split(".")[1] for p in PRODUCT if module_name(p) != "spec_backend"}
    covered = {prefix.split(".")[1] for prefix in FLOORS if prefix != "spec_backend"}
    assert packages <= covered, f"modules without a floor: {sorted(packages - covered)}"


def test_a_reversed_import_is_caught(tmp_path: Path) -> None:
    """Negative control: a drafter importing the engine loop is reported."""
    source = tmp_path / "drafter.py"
    source.write_text("def f():\n    from spec_backend.engine.core import EngineCore\n")
    (line, target), *_ = project_imports(source)
    assert line == 2 and floor(target.rsplit(".", 1)[0]) > floor("spec_backend.proposers.x")


#: the one circle docs/architecture.md accepts (#37's acceptance: at most one): the config's trio
ALLOWED_CIRCLES = [
    {"spec_backend.config.draft", "spec_backend.config.sampler_methods", "spec_backend.config.speculative"}
]


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the product modules it imports (function-local and type-only imports included; a
    package's ``__init__`` only hands names on and is left out, as farm-studio draws it)."""
    graph: dict[str, set[str]] = {}
    for path in PRODUCT:
        if path.name == "__init__.py":
            continue
        targets = set()
        for _, target in project_imports(path):
            module = target if _is_module(target) else target.rsplit(".", 1)[0]
            if (ROOT.parent / Path(*module.split("."))).with_suffix(".py").is_file():
                targets.add(module)
        graph[module_name(path)] = targets - {module_name(path)}
    return graph


def test_no_new_circles() -> None:
    """Files that import each other in a loop (a type-only import or one inside a function counts: it
    still ties the two files together) are refused, but for the config's trio."""
    assert circles(import_graph()) == ALLOWED_CIRCLES


def test_a_circle_is_caught() -> None:
    """Negative control: a loop through three modules, and one through a type-only import, are found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [{"a", "b", "c"}]
    assert circles({"x": {"y"}, "y": {"x"}}) == [{"x", "y"}]
