"""Two regions 100 ms apart, the stub behind each, started once for the module (topology.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.regions import Regions
from tests.gateway.redis_server import redis_binary
from tests.gateway.regional.topology import two_regions
from tests.gateway.stub_backend import MODEL_ID

RTT_MS = 100.0
PRICE = {"version": "regions-1", "input": "1000", "output": "1000"}  # per M tokens: 1000 micro-units a token


@pytest.fixture(scope="module")
def regions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Regions]:
    redis_binary()
    workdir: Path = tmp_path_factory.mktemp("regions")
    with two_regions(workdir, RTT_MS, EDGERUN_PRICES=json.dumps({MODEL_ID: PRICE}),
                     EDGERUN_BUDGET_LEASE_FRACTION="0.1") as started:  # fmt: skip
        yield started
