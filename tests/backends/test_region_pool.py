"""The region's shared KV pool, end to end: a real `mooncake_master` and two backend processes.

Backend A prefills a 1,000-token prompt and shares its blocks; backend B, another process, serves the
same tenant's prompt with `cached_tokens` covering it, fetched from the pool, and answers exactly as A
did (random:tiny in deterministic mode: quick to start, exact); another tenant gets none of it. Then
the master is killed: requests keep succeeding (recomputed); it comes back: the pool refills.
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cli.kv_pool import pool_flags, spawn_master
from cli.processes import free_port
from tests.gateway.fixtures_e2e import BackendProcess, serving

# Installed (make installs it): tested, and a broken install fails. Absent: skipped, except under CI=true.
MOONCAKE_MISSING = importlib.util.find_spec("mooncake") is None and os.environ.get("CI") != "true"
pytestmark = [pytest.mark.process, pytest.mark.skipif(
    MOONCAKE_MISSING, reason="mooncake-transfer-engine-non-cuda is not installed (pip install -e '.[kv]')")]

PROMPT = [(i * 37 + 11) % 500 for i in range(1000)]
BLOCK = 16


@pytest.fixture(scope="module")
def master_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def pool(master_port: int) -> Iterator[list[Any]]:
    """[master process, backend A, backend B]; the test may replace the master."""
    master = spawn_master(master_port)
    flags = ["--model", "random:tiny", "--mode", "deterministic", "--num-kv-blocks", "256", "--log-level", "warning",
             *pool_flags(master, host_tier_blocks=128, segment_mb=64)]
    env = {"EDGERUN_LOG_JSON": "false", "EDGERUN_KV_REGION_POOL_RETRY_S": "1"}
    backends = [BackendProcess.spawn(name, "backend", flags, env=env, threads=1) for name in ("pool-a", "pool-b")]
    processes: list[Any] = [master, *backends]
    try:
        with serving(backends):
            yield processes
    finally:
        processes[0].stop(timeout_s=5)  # the master now running


def complete(backend: BackendProcess, prompt: list[int], salt: str) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "cache_salt": salt}
    response = httpx.post(f"{backend.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def events(backend: BackendProcess) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = httpx.post(f"{backend.url}/kv_cache_events?consumer=test", timeout=10).json()
    return found


def metric(backend: BackendProcess, name: str, tier: str) -> float:
    text = httpx.get(f"{backend.url}/metrics", timeout=10).text
    found = re.search(rf'^edgerun_backend_{name}(?:_total)?{{[^}}]*tier="{tier}"[^}}]*}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def wait_shared(backend: BackendProcess, at_least: float) -> None:
    deadline = time.monotonic() + 20
    while metric(backend, "kv_tier_stored_blocks", "region") < at_least:
        assert time.monotonic() < deadline, f"{backend.name} shared fewer than {at_least} blocks:\n{backend.log_tail()}"
        time.sleep(0.1)


def test_a_prefix_computed_on_one_backend_is_served_from_the_pool_on_another(pool: list[Any], master_port: int) -> None:
    _, a, b = pool
    first = complete(a, PROMPT, "tenant-1")
    assert cached(first) == 0
    num_blocks = (len(PROMPT) - 1) // BLOCK
    wait_shared(a, num_blocks)
    second = complete(b, PROMPT, "tenant-1")
    assert cached(second) == num_blocks * BLOCK  # 992 of 1,000: all but the last partial block
    assert second["choices"][0]["text"] == first["choices"][0]["text"]  # the fetched KV is the computed KV
    assert metric(b, "kv_tier_hit_blocks", "region") == num_blocks
    assert metric(b, "kv_tier_bytes_out", "region") > 0
    assert metric(b, "kv_tier_capacity_blocks", "host") == 128  # the host tier it fetched into
    assert metric(b, "kv_tier_hit_blocks", "host") == num_blocks  # copied from there into its pool
    load = httpx.get(f"{b.url}/load", timeout=10).json()  # what the gateway's dashboard shows per backend
    assert load["kv_tier_hit_blocks"] == {"host": num_blocks, "region": num_blocks}
    media_a = {e["data"].get("medium") for e in events(a) if e["data"]["type"] == "stored"}
    assert media_a == {"GPU", "REGION"}  # computed into its pool, then put into the region's
    stored_b = [e["data"]["medium"] for e in events(b) if e["data"]["type"] == "stored"]
    assert stored_b[0] == "CPU" and set(stored_b) == {"CPU", "GPU"}  # fetched into its host tier, then into its pool
    other = complete(b, PROMPT, "tenant-2")
    assert cached(other) == 0  # another tenant's salt finds none of it

    # The master dies: both backends keep answering, from their own tiers or by recomputing.
    pool[0].kill()
    for i, backend in enumerate((a, b, a)):
        answer = complete(backend, [(t + 3 + i) % 500 for t in PROMPT[:300]], "tenant-1")
        assert answer["choices"][0]["text"] is not None
    # It comes back: the pool refills (its metadata died with it) and serves again.
    pool[0] = spawn_master(master_port)
    time.sleep(1.5)  # past the backends' retry interval
    fresh = [(t * 7 + 1) % 500 for t in PROMPT[:400]]
    stored_before = metric(a, "kv_tier_stored_blocks", "region")
    deadline = time.monotonic() + 30
    while True:  # the first call after the retry interval may still find the client reconnecting
        complete(a, fresh, "tenant-1")
        if metric(a, "kv_tier_stored_blocks", "region") >= stored_before + (len(fresh) - 1) // BLOCK:
            break
        assert time.monotonic() < deadline, a.log_tail()
        time.sleep(1.0)
    again = complete(b, fresh, "tenant-1")
    assert cached(again) == (len(fresh) - 1) // BLOCK * BLOCK
