"""The package's layers, read from its imports (function-level ones included): the core stays
tensor- and front-end-free, metrics sit below the engine, routing and structured outputs are
plug-ins that the core does not know."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import inflight

ROOT = Path(inflight.__file__).parent


def imported_parts(path: Path) -> set[str]:
    """The first part below `inflight` of every `inflight.*` module a file imports."""
    parts = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            pieces = name.split(".")
            if pieces[0] == "inflight" and len(pieces) > 1:
                parts.add(pieces[1])
    return parts


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
                  "structured", "metrics", "routing"}),
        ("metrics", {"engine", "server", "bench", "sim", "runner", "model"}),
        ("routing", {"engine", "server", "bench", "sim", "runner", "model", "metrics"}),
        ("structured", {"engine", "server", "bench", "sim", "model"}),
    ],
)  # fmt: skip
def test_layers(part, forbidden):
    assert imports_of(part) & forbidden == set()


def test_the_reader_finds_imports():
    assert {"core", "routing"} <= imports_of("sim")
