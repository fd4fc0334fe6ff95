"""The layout keeps its word: every package names each of its modules in its map (the `__init__`
docstring or a README.md beside it), and imports run the way docs/DESIGN.md draws them where a
wrong one would bring the lab into the product (no product package imports tests, benchmarks or
training; no test outside tests/benchmarks imports benchmarks)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("contracts", "gateway", "backends", "engines", "policies", "training", "cli", "loadtests", "benchmarks")
PRODUCT = ("contracts", "gateway", "backends", "engines", "policies")


def package_map(directory: Path) -> str:
    init = ast.get_docstring(ast.parse((directory / "__init__.py").read_text())) or ""
    readme = directory / "README.md"
    return init + "\n" + (readme.read_text() if readme.is_file() else "")


def unnamed(directory: Path) -> list[str]:
    """The modules (`x.py`) and subpackages (`x/`) of `directory` that its map does not name."""
    text = package_map(directory)
    entries = [p.name for p in directory.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    entries += [f"{p.name}/" for p in directory.iterdir() if (p / "__init__.py").is_file()]
    # named as itself, not as the tail of another path (`engine/kv_events.py` does not name `kv_events.py`)
    return sorted(e for e in entries if not re.search(rf"(?<![\w/.]){re.escape(e)}", text))


def packages() -> list[Path]:
    return sorted(init.parent for root in MAPPED for init in (ROOT / root).rglob("__init__.py")
                  if "__pycache__" not in init.parts)


def imported(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_every_package_map_names_each_of_its_modules() -> None:
    missing = {str(p.relative_to(ROOT)): names for p in packages() if (names := unnamed(p))}
    assert not missing, f"name these in the package's __init__ docstring or README.md: {missing}"


def test_a_module_left_out_of_its_map_is_found(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text('"""A package.\n\n    kept.py  named here\n    sub/     and this\n"""\n')
    for name in ("kept.py", "new.py", "__main__.py"):
        (tmp_path / name).write_text("")
    for sub in ("sub", "other"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "__init__.py").write_text("")
    assert unnamed(tmp_path) == ["new.py", "other/"]


def test_the_product_imports_no_lab() -> None:
    wrong = {str(path.relative_to(ROOT)): lab for root in PRODUCT for path in (ROOT / root).rglob("*.py")
             if (lab := imported(path) & {"tests", "benchmarks", "training", "loadtests"})}
    assert not wrong, f"product modules importing tests, benchmarks, training or load tests: {wrong}"


def test_tests_do_not_import_benchmarks() -> None:
    benchmarks_tests = ROOT / "tests" / "benchmarks"
    wrong = [str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("*.py")
             if benchmarks_tests not in path.parents and "benchmarks" in imported(path)]
    assert not wrong, f"tests that import benchmarks (move what they need under tests/): {wrong}"
