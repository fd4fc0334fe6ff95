from __future__ import annotations

from pathlib import Path

import pytest

TRACE = Path(__file__).resolve().parents[3] / "data" / "mooncake_synthetic_trace.jsonl"


@pytest.fixture(scope="session")
def trace_path() -> Path:
    assert TRACE.exists(), f"the Mooncake trace belongs in the repository at {TRACE}"
    return TRACE
