"""The package's layers, read from its imports (function-level ones included): no import circle;
the core stays tensor- and front-end-free, with the step record (`metrics.stats`) its only
import from above; metrics and the model runner sit below the engine; the simulator shares
workloads and run results with `inflight bench` without importing it; routing and structured
outputs are plug-ins that the core does not know."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import inflight

ROOT = Path(inflight.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every `inflight.*` name a file imports: modules, and `from` imports' module.name pairs."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {n for n in names if n.startswith("inflight.")}


def imported_parts(path: Path) -> set[str]:
    """The first part below `inflight` of every `inflight.*` module a file imports."""
    return {name.split(".")[1] for name in imported_modules(path)}


def imports_of(part: str) -> set[str]:
    target = ROOT / part
    files = (
        [target.with_suffix(".py")]
        if target.with_suffix(".py").exists()
        else list(target.rglob("*.py"))
    )
    return set().union(*(imported_parts(f) for f in files)) - {part}


@pytest.mark.parametrize(
    ("part", "forbidden"),
    [
        ("core", {"model", "runner", "engine", "server", "bench", "sim", "attention", "kernels",
                  "structured", "routing", "workload"}),
        ("metrics", {"core", "engine", "server", "bench", "sim", "runner", "model"}),
        ("runner", {"engine", "server", "bench", "sim"}),
        ("routing", {"engine", "server", "bench", "sim", "runner", "model", "metrics"}),
        ("structured", {"engine", "server", "bench", "sim", "model"}),
        ("sim", {"bench", "engine", "server", "runner"}),
        ("workload", {"core", "engine", "server", "bench", "sim", "runner", "model"}),
    ],
)  # fmt: skip
def test_layers(part, forbidden):
    assert imports_of(part) & forbidden == set()


def test_the_core_takes_only_the_step_records_from_metrics():
    """The scheduler and its components fill pure records (`metrics.stats`); exporting them is
    the metrics package's job, which the core never calls."""
    modules = set().union(*(imported_modules(f) for f in (ROOT / "core").rglob("*.py")))
    from_metrics = {m for m in modules if m.startswith("inflight.metrics")}
    assert from_metrics and all(m.startswith("inflight.metrics.stats") for m in from_metrics)


def module_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a `from` import of a submodule counts)."""

    def name(path: Path) -> str:
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    files = {name(p): p for p in ROOT.rglob("*.py")}
    return {m: (imported_modules(p) & files.keys()) - {m} for m, p in files.items()}


def test_no_import_circle():
    graph = module_graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            pytest.fail("import circle: " + " -> ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_reader_finds_imports_and_circles():
    assert {"core", "routing", "workload"} <= imports_of("sim")
    graph = module_graph()
    assert "inflight.attention.paged_kernels" in graph["inflight.attention.cpu_kernel"]
