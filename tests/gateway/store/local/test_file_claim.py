"""The claim of a SQLite file (gateway/store/local/file_claim.py): one per file however its path is
spelled, made on a file whose directory does not exist yet, none for a memory database, and free
again once its holder lets go. (tests/cli/test_serve.py: across processes.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.store.local.file_claim import FileInUse, claim


def test_one_claim_per_file_however_its_path_is_spelled(tmp_path: Path) -> None:
    sqlite = tmp_path / "new" / "gateway.sqlite3"  # its directory is made, as the store makes it
    held = claim(str(sqlite), "the first")
    assert held is not None
    try:
        sqlite.touch()
        (tmp_path / "link.sqlite3").symlink_to(sqlite)
        for spelling in (str(sqlite), str(tmp_path / "new" / ".." / "new" / "gateway.sqlite3"), str(tmp_path / "link.sqlite3")):
            with pytest.raises(FileInUse, match=f"the first, pid {os.getpid()}"):
                claim(spelling, "the second")
    finally:
        os.close(held)
    again = claim(str(tmp_path / "link.sqlite3"), "the second")  # free once let go
    assert again is not None
    os.close(again)
    assert claim(":memory:", "anyone") is None


def test_shared_claims_go_together_but_never_with_an_exclusive_one(tmp_path: Path) -> None:
    """flock locks of separate opens conflict within one process too, as between processes."""
    sqlite = str(tmp_path / "gateway.sqlite3")
    first, second = claim(sqlite, "shared one", shared=True), claim(sqlite, "shared two", shared=True)
    assert first is not None and second is not None
    try:
        with pytest.raises(FileInUse, match="shared"):
            claim(sqlite, "a lone serve")
    finally:
        os.close(first)
        os.close(second)
    alone = claim(sqlite, "a lone serve")
    assert alone is not None
    try:
        with pytest.raises(FileInUse, match="a lone serve"):
            claim(sqlite, "a shared serve", shared=True)
    finally:
        os.close(alone)
