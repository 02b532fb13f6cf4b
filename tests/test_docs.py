"""The docs name the modules that exist: docs/architecture.md's module map lists every module of
the package and nothing else, and the README's Layout names every package."""

from __future__ import annotations

import re
from pathlib import Path

import inflight

ROOT = Path(inflight.__file__).parent
DOCS = ROOT.parent / "docs"


def package_tree() -> set[str]:
    """Every module (`core/scheduler.py`) and package (`core/`) of `inflight/`, `__init__` aside."""
    names = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if p.name != "__init__.py"}
    packages = {str(p.parent.relative_to(ROOT)) + "/" for p in ROOT.rglob("__init__.py")}
    return names | (packages - {"./"})


def section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no '## {title}' section"
    return match.group(1)


def mapped_names(block: str) -> set[str]:
    """Names in a module map: unindented `x.py` or `pkg/`, indented modules of the last pkg/,
    several per line when separated by commas; descriptions follow two spaces."""
    names, package = set(), ""
    for line in block.splitlines():
        if not line.strip() or line.startswith("```"):
            continue
        head = re.split(r"\s{2,}", line.strip())[0]
        for name in (n.strip() for n in head.split(",")):
            if line[0] != " ":
                package = name if name.endswith("/") else ""
                names.add(name)
            else:
                names.add(package + name)
    return names


def test_the_architecture_maps_every_module_and_only_those():
    mapped = mapped_names(
        section((DOCS / "architecture.md").read_text(), "Module map (package `inflight/`)")
    )
    tree = package_tree()
    assert tree - mapped == set(), "modules missing from docs/architecture.md"
    assert mapped - tree == set(), "docs/architecture.md names modules that do not exist"


def test_the_readme_layout_names_every_package_and_points_to_the_architecture():
    layout = section((ROOT.parent / "README.md").read_text(), "Layout")
    assert "docs/architecture.md" in layout
    packages = {name for name in package_tree() if name.endswith("/") and name.count("/") == 1}
    named = set(re.findall(r"^  (\w+/)", layout, re.M))
    assert named == packages


def test_the_reader_finds_names():
    assert mapped_names("core/\n  a.py   x\n  b.py, c.py  y\ncli.py  z\n") == {
        "core/", "core/a.py", "core/b.py", "core/c.py", "cli.py"
    }  # fmt: skip
