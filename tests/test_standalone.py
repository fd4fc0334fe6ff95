"""The repository stands alone: nothing it tracks reaches for a folder beside the clone.

A user's clone has no `shared/` next to it, so a link, a path or a test that reads from there
works only on the machine it was written on.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Written so that this file does not match itself.
OUTSIDE = re.compile(r"\.\.[/\\]shared\b|/work" + r"/shared\b")
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".pytest_cache", "reports"}


def tracked_files() -> list[Path]:
    """`git ls-files` in a clone; every file outside build folders in an unpacked tarball."""
    if (ROOT / ".git").exists():
        listing = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
        ).stdout.decode()
        return [ROOT / name for name in listing.split("\0") if name]
    return [p for p in ROOT.rglob("*") if p.is_file() and not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)]


@pytest.mark.process
def test_no_tracked_file_reaches_outside_the_repository() -> None:
    offenders = []
    for path in tracked_files():
        if not path.is_file():  # deleted in the work tree, not yet committed
            continue
        text = path.read_bytes().decode("utf-8", errors="ignore")
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not offenders, "files that read or link a folder outside the clone:\n" + "\n".join(offenders)


def test_the_design_document_and_the_trace_are_in_the_repository() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "(docs/DESIGN.md)" in readme
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    for section in ("## One request", "## Fixed wire formats", "## Shared state", "## The model"):
        assert section in design
    trace = ROOT / "data" / "mooncake_synthetic_trace.jsonl"
    assert len(trace.read_text().splitlines()) == 3993  # data/README.md
    notice = (ROOT / "data" / "LICENSE-mooncake-trace.txt").read_text()
    assert "Apache License" in notice and "Version 2.0" in notice


def test_the_pattern_catches_a_link_beside_the_clone() -> None:
    assert OUTSIDE.search("See `" + ".." + "/shared/DESIGN.md` for the map.")
    assert not OUTSIDE.search("the shared store (Redis)")
