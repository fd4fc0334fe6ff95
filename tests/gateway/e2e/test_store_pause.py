"""The Redis store stalls under load (`CLIENT PAUSE`, then `DEBUG SLEEP`, each longer than
`redis_timeout_s`) on a private redis-server, with the stub backend behind the gateway (the model
adds nothing here). Expected: requests that need the store while it stalls get 503 at once (no
pile-up); a request whose answer went out while it stalled has its record spooled and replayed;
every answered request ends up with exactly one ledger record and no refused one has any; a key's
requests-per-minute limit is never exceeded (the store is the limit: no store, no admission); and
the gateway recovers by itself as soon as Redis answers again. (Redis stopped and restarted:
tests/gateway/billing/test_e2e_spool.py; Redis full: tests/gateway/e2e/test_store_full.py.)"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from cli.processes import ChildProcess
from tests.gateway.fixtures_e2e import InProcessGateway, gateway_settings
from tests.gateway.redis_server import EPHEMERAL, redis_binary, start_redis
from tests.gateway.stub_backend import MODEL_ID as STUB_MODEL

pytestmark = pytest.mark.slow

STALL_S = 1.5  # each stall; the gateway's redis_timeout_s is 0.3
RPM = 8
DRIVE_S = 1.5 + STALL_S + 2.5 + STALL_S + 2.5  # drive()'s script


@dataclass
class Answer:
    key: str
    request_id: str
    status: int
    started: float  # time.monotonic()
    ended: float


def debug_command_option() -> list[str]:
    """Redis 7 turns DEBUG off unless asked; Redis 6 has it on and does not know the option."""
    version = subprocess.run([redis_binary(), "--version"], capture_output=True, text=True, check=True).stdout
    major = int(re.search(r"v=(\d+)", version).group(1))  # type: ignore[union-attr]
    return ["--enable-debug-command", "yes"] if major >= 7 else []


@pytest.fixture
def paused_redis(tmp_path: Path) -> Iterator[ChildProcess]:
    server = start_redis(tmp_path, [*EPHEMERAL, *debug_command_option()])
    try:
        yield server
    finally:
        server.stop(timeout_s=10)


def test_a_stalling_redis_loses_no_record_overshoots_no_limit_and_recovers(
    paused_redis: ChildProcess, stub_backend: ChildProcess, tmp_path: Path
) -> None:
    url = f"redis://127.0.0.1:{paused_redis.port}/0"
    backends = [{"id": "stub", "base_url": stub_backend.url, "region": "local", "models": [STUB_MODEL]}]
    settings = gateway_settings(
        tmp_path, backends, models=[{"id": STUB_MODEL, "backend_model": "stub", "block_size": 16}],
        redis_url=url, redis_timeout_s=0.3, key_prefix="pause-test:",
        ledger_spool_path=str(tmp_path / "spool.jsonl"), ledger_spool_replay_interval_s=0.3,
    )
    gw = InProcessGateway(settings).start()
    try:
        keys = {"free": gw.new_key("t-pause", "acc-pause"), "limited": gw.new_key("t-pause", "acc-pause", rpm=RPM)}
        clear_of_a_minute_boundary(url, DRIVE_S + 3)
        answers, stalls = drive(gw, keys, url)
        ok = {a.request_id for a in answers if a.status == 200}
        deadline = time.monotonic() + 30
        assert gw.store is not None
        while True:  # spooled records are replayed once the store answers
            recorded = {rid for rid in {a.request_id for a in answers} if gw.call(gw.store.ledger.get(rid)) is not None}
            if recorded >= ok or time.monotonic() > deadline:
                break
            time.sleep(0.3)
    finally:
        gw.stop()
    statuses = {s for a in answers for s in [a.status]}
    assert statuses <= {200, 429, 503}, statuses
    assert recorded == ok  # every answer has its record, no refused request has one
    with redis.Redis.from_url(url) as client:  # and only one: the stream holds no second entry
        assert client.xlen("pause-test:ledger") == len(ok)
    limited_ok = [a for a in answers if a.key == "limited" and a.status == 200]
    assert len(limited_ok) <= RPM and any(a.key == "limited" and a.status == 429 for a in answers)
    recoveries = [min(a.ended for a in answers if a.ended > end and a.status == 200) - end for _, end in stalls]
    print(f"store stalls: {len(answers)} requests, {len(ok)} answered (all recorded once), "
          f"{sum(a.status == 503 for a in answers)} refused 503, {sum(a.status == 429 for a in answers)} refused 429, "
          f"limited key {len(limited_ok)}/{RPM}, recovery after each stall {[round(r, 2) for r in recoveries]} s")
    for start, end in stalls:  # refused while stalled, answered again right after
        during = [a for a in answers if start + 0.1 < a.started and a.ended < end and a.key == "free"]
        after = [a for a in answers if a.started > end + 0.5 and a.key == "free"]
        assert during and all(a.status == 503 for a in during), [a.status for a in during]
        assert after and all(a.status == 200 for a in after[:5]), [a.status for a in after[:5]]


def clear_of_a_minute_boundary(url: str, need_s: float) -> None:
    """Wait, if need be, until Redis's clock has `need_s` left before its next minute starts. The rpm limit is
    a two-counter sliding window over minute windows (gateway/store/limits.py): `RPM` requests at the end of
    one minute weigh less as the next one goes on, so 7.5 s into it a 9th is admitted by design. Within one
    minute window the limit is exact, which is what this test checks while the store stalls."""
    with redis.Redis.from_url(url) as client:
        seconds, micros = client.time()
    into_minute = seconds % 60 + micros / 1e6
    if 60 - into_minute < need_s:
        time.sleep(60 - into_minute + 0.05)


def drive(gw: InProcessGateway, keys: dict[str, str], url: str) -> tuple[list[Answer], list[tuple[float, float]]]:
    """Requests from 4 clients for ~9 s; Redis stalls twice meanwhile. Returns the answers and the stalls."""
    answers: list[Answer] = []
    stalls: list[tuple[float, float]] = []
    stop = threading.Event()

    def client(name: str) -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                started = time.monotonic()
                response = http.post(
                    f"{gw.url}/client/v4/accounts/acc-pause/ai/run/{STUB_MODEL}",
                    json={"prompt": "hello", "max_tokens": 16, "stream": name == "free"},
                    headers={"authorization": f"Bearer {keys[name]}"},
                )
                answers.append(Answer(name, response.headers["cf-ray"], response.status_code, started, time.monotonic()))
                time.sleep(0.02)

    def stall(command: list[str]) -> None:
        started = time.monotonic()
        with redis.Redis.from_url(url, socket_timeout=10) as admin:
            admin.execute_command(*command)
            if command[0] == "CLIENT":  # CLIENT PAUSE returns at once; the pause lasts its time
                time.sleep(STALL_S)
        stalls.append((started, time.monotonic()))

    with ThreadPoolExecutor(5) as pool:
        clients = [pool.submit(client, name) for name in ("free", "free", "free", "limited")]
        time.sleep(1.5)
        stall(["CLIENT", "PAUSE", str(int(STALL_S * 1000)), "ALL"])
        time.sleep(2.5)
        stall(["DEBUG", "SLEEP", str(STALL_S)])
        time.sleep(2.5)
        stop.set()
        for c in clients:
            c.result()
    return answers, stalls
