from __future__ import annotations

from pathlib import Path

import os

import pytest

TRACE = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "mooncake_synthetic_trace.jsonl"


@pytest.fixture(scope="session")
def trace_path() -> Path:
    if not TRACE.exists():
        # CI always has shared/ beside the checkout: there a missing trace is a failure.
        if os.environ.get("CI") == "true":
            pytest.fail(f"the Mooncake trace is not at {TRACE}")
        pytest.skip(f"the Mooncake trace is not at {TRACE}")
    return TRACE
