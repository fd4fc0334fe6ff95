"""infra/Dockerfile copies every first-party package that the commands it runs (`edgerun serve`,
`edgerun backend`) can import: followed statically, module by module, from the entry point."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = {p.parent.name for p in ROOT.glob("*/__init__.py")}


def module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path, module: str) -> set[str]:
    """First-party modules `path` imports, at any depth (lazy imports inside functions count)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {m for m in found if m.split(".")[0] in FIRST_PARTY and module_file(m) is not None}


def reachable_packages(roots: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # importing a.b.c runs a and a.b
        path = module_file(module)
        assert path is not None, module
        todo += sorted(imported_modules(path, module) - seen)
    return {m.split(".")[0] for m in seen}


def test_the_image_copies_every_package_its_commands_import() -> None:
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["edgerun"]
    main = entry.split(":")[0]
    needed = reachable_packages([main, "cli.serve", "cli.backend"])
    copied = {
        line.split()[1] for line in (ROOT / "infra" / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and (ROOT / line.split()[1]).is_dir()
    }
    assert {"cli", "gateway", "backends", "engines", "policies"} <= needed  # the walk found the real graph
    assert needed <= copied, f"infra/Dockerfile does not COPY {sorted(needed - copied)}"
